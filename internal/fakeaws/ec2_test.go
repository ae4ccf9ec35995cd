package fakeaws

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// ec2Client is the SDK's EC2 client for e, signing with sig's credentials.
func ec2Client(e *EC2, sig SigV4) *ec2.Client {
	return ec2.NewFromConfig(aws.Config{Region: sig.Region, RetryMaxAttempts: 1,
		Credentials: credentials.NewStaticCredentialsProvider(sig.Credentials.AccessKeyID, sig.Credentials.SecretAccessKey, "")},
		func(o *ec2.Options) { o.BaseEndpoint = aws.String(e.URL) })
}

var ec2Sig = SigV4{Region: "eu-central-1", Credentials: aws.Credentials{AccessKeyID: "AKIAFAKEEC2TEST00001",
	SecretAccessKey: "fake/ec2/secret"}}

// CreateTags through the SDK's Query API: the tags land on the instance (a key already there takes the new value,
// the instance's other tags stay, the test's own map is left alone), a later DescribeInstances shows them and
// filters by them, and the call is recorded with its parameters.
func TestEC2CreateTags(t *testing.T) {
	t.Parallel()
	own := map[string]string{"dynk8s:cluster": "homelab", "dynk8s:kubelet-key-sha256": "old"}
	e := NewEC2(t, ec2Sig, EC2Instance{ID: "i-0123456789abcdef0", State: "running", Tags: own},
		EC2Instance{ID: "i-0fedcba9876543210", State: "running"})
	c := ec2Client(e, ec2Sig)
	_, err := c.CreateTags(context.Background(), &ec2.CreateTagsInput{Resources: []string{"i-0123456789abcdef0"},
		Tags: []ec2types.Tag{{Key: aws.String("dynk8s:kubelet-key-sha256"), Value: aws.String("abc123")}}})
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(e.Tags("i-0123456789abcdef0"),
		map[string]string{"dynk8s:cluster": "homelab", "dynk8s:kubelet-key-sha256": "abc123"}))
	assert.Check(t, is.Equal(own["dynk8s:kubelet-key-sha256"], "old"), "the test's map changed")
	assert.Check(t, is.Len(e.Tags("i-0fedcba9876543210"), 0))
	assert.Check(t, is.DeepEqual(e.TagCalls(), []string{"CreateTags ResourceId.1=i-0123456789abcdef0 " +
		"Tag.1.Key=dynk8s:kubelet-key-sha256 Tag.1.Value=abc123"}))

	out, err := c.DescribeInstances(context.Background(), &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
		{Name: aws.String("tag:dynk8s:kubelet-key-sha256"), Values: []string{"abc123"}}}})
	assert.NilError(t, err)
	assert.Assert(t, is.Len(out.Reservations, 1))
	got := map[string]string{}
	for _, tag := range out.Reservations[0].Instances[0].Tags {
		got[aws.ToString(tag.Key)] = aws.ToString(tag.Value)
	}
	assert.Check(t, is.Equal(aws.ToString(out.Reservations[0].Instances[0].InstanceId), "i-0123456789abcdef0"))
	assert.Check(t, is.Equal(got["dynk8s:kubelet-key-sha256"], "abc123"))
}

// An instance the fake does not know is InvalidInstanceID.NotFound, as EC2 answers, and nothing is tagged, not even
// the known instance of the same call; a failure set with Fail answers CreateTags too, and is recorded.
func TestEC2CreateTagsRefused(t *testing.T) {
	t.Parallel()
	e := NewEC2(t, ec2Sig, EC2Instance{ID: "i-0123456789abcdef0", State: "running"})
	c := ec2Client(e, ec2Sig)
	tag := func(ids ...string) error {
		_, err := c.CreateTags(context.Background(), &ec2.CreateTagsInput{Resources: ids,
			Tags: []ec2types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}})
		return err
	}
	code := func(err error) string {
		var ae smithy.APIError
		if errors.As(err, &ae) {
			return ae.ErrorCode()
		}
		return ""
	}
	err := tag("i-0123456789abcdef0", "i-0000000000000dead")
	assert.Check(t, is.Equal(code(err), "InvalidInstanceID.NotFound"), "%v", err)
	assert.Check(t, is.ErrorContains(err, "The instance ID 'i-0000000000000dead' does not exist"))
	assert.Check(t, is.Len(e.Tags("i-0123456789abcdef0"), 0))

	e.Fail(1, 403, "UnauthorizedOperation")
	assert.Check(t, is.Equal(code(tag("i-0123456789abcdef0")), "UnauthorizedOperation"))
	assert.Check(t, is.Len(e.Tags("i-0123456789abcdef0"), 0))
	assert.NilError(t, tag("i-0123456789abcdef0"))
	assert.Check(t, is.DeepEqual(e.Tags("i-0123456789abcdef0"), map[string]string{"k": "v"}))
	assert.Check(t, is.Len(e.TagCalls(), 3))
	assert.Check(t, is.DeepEqual(e.Actions(), []string{"CreateTags", "CreateTags", "CreateTags"}))
}
