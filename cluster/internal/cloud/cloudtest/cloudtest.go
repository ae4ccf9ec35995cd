// Package cloudtest gives the controller's tests the real SDK clients against internal/fakeaws' wire fakes, which
// check each request's SigV4 signature: what the controller sends is what EC2, SSM and Auto Scaling would be sent.
package cloudtest

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/dynk8s/dynk8s/internal/fakeaws"
)

// Region and the IAM user's key the fakes take requests signed with.
const (
	Region    = "eu-central-1"
	KeyID     = "AKIAFAKECONTROLLER01"
	SecretKey = "fake/controller/secret+key0123456789ABCD"
)

// Sig is what the fakes check every request's signature against.
var Sig = fakeaws.SigV4{Region: Region, Credentials: aws.Credentials{AccessKeyID: KeyID, SecretAccessKey: SecretKey}}

func config() aws.Config {
	return aws.Config{
		Region:           Region,
		Credentials:      credentials.NewStaticCredentialsProvider(KeyID, SecretKey, ""),
		RetryMaxAttempts: 1,
	}
}

// EC2 starts a fake EC2 that knows instances and returns it with an SDK client for it.
func EC2(t testing.TB, instances ...fakeaws.EC2Instance) (*fakeaws.EC2, *ec2.Client) {
	t.Helper()
	fake := fakeaws.NewEC2(t, Sig, instances...)
	return fake, ec2.NewFromConfig(config(), func(o *ec2.Options) { o.BaseEndpoint = aws.String(fake.URL) })
}

// SSM starts a fake SSM and returns it with an SDK client for it.
func SSM(t testing.TB) (*fakeaws.SSM, *ssm.Client) {
	t.Helper()
	fake := fakeaws.NewSSM(t, Sig)
	return fake, ssm.NewFromConfig(config(), func(o *ssm.Options) { o.BaseEndpoint = aws.String(fake.URL) })
}

// WarmPools starts a fake EC2 Auto Scaling that knows groups and returns it with an SDK client for it.
func WarmPools(t testing.TB, groups map[string]fakeaws.WarmGroup) (*fakeaws.WarmPools, *autoscaling.Client) {
	t.Helper()
	fake := fakeaws.NewWarmPools(t, Sig, groups)
	return fake, autoscaling.NewFromConfig(config(), func(o *autoscaling.Options) { o.BaseEndpoint = aws.String(fake.URL) })
}
