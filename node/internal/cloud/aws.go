// Package cloud is the instance's view of AWS: IMDSv2, and the signed services (SSM, Auto Scaling, EC2) in the
// instance's region and partition, as small interfaces the SDK's clients satisfy and cloudfake fakes, with errors
// that say what answered.
package cloud

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// LifecyclePath is where IMDS has the Auto Scaling target lifecycle state (after "latest/meta-data/"): "the state
// it is transitioning to" (EC2 Auto Scaling User Guide, "Retrieve the target lifecycle state through instance
// metadata").
const LifecyclePath = "autoscaling/target-lifecycle-state"

// The AWS calls of the boot, as small interfaces the SDK's clients satisfy and the tests fake.

// metadata reads IMDSv2 paths (after "latest/meta-data/").
type metadata interface {
	Get(ctx context.Context, path string) (string, error)
}

type parameters interface {
	GetParameter(ctx context.Context, in *ssm.GetParameterInput, opts ...func(*ssm.Options)) (*ssm.GetParameterOutput, error)
}

type groups interface {
	DescribeAutoScalingInstances(ctx context.Context, in *autoscaling.DescribeAutoScalingInstancesInput,
		opts ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingInstancesOutput, error)
	DescribeAutoScalingGroups(ctx context.Context, in *autoscaling.DescribeAutoScalingGroupsInput,
		opts ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error)
	CompleteLifecycleAction(ctx context.Context, in *autoscaling.CompleteLifecycleActionInput,
		opts ...func(*autoscaling.Options)) (*autoscaling.CompleteLifecycleActionOutput, error)
	SetInstanceHealth(ctx context.Context, in *autoscaling.SetInstanceHealthInput,
		opts ...func(*autoscaling.Options)) (*autoscaling.SetInstanceHealthOutput, error)
}

type instances interface {
	StartInstances(ctx context.Context, in *ec2.StartInstancesInput, opts ...func(*ec2.Options)) (*ec2.StartInstancesOutput, error)
	// DescribeInstances is the gateway's idle check's.
	DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
	// CreateTags is the join's: the instance tags itself with its kubelet key's hash.
	CreateTags(ctx context.Context, in *ec2.CreateTagsInput, opts ...func(*ec2.Options)) (*ec2.CreateTagsOutput, error)
	// The volume calls are the build cache's (node/internal/cache).
	DescribeVolumes(ctx context.Context, in *ec2.DescribeVolumesInput, opts ...func(*ec2.Options)) (*ec2.DescribeVolumesOutput, error)
	CreateVolume(ctx context.Context, in *ec2.CreateVolumeInput, opts ...func(*ec2.Options)) (*ec2.CreateVolumeOutput, error)
	AttachVolume(ctx context.Context, in *ec2.AttachVolumeInput, opts ...func(*ec2.Options)) (*ec2.AttachVolumeOutput, error)
}

// Cloud is the instance's view of AWS: IMDS now, and the signed services once the region and the partition's
// domain are known (connect).
type Cloud struct {
	IMDS   metadata
	SSM    parameters
	ASG    groups
	EC2    instances
	client *http.Client
	// creds are the instance role's, from IMDS, cached until they expire; a 403 drops them (forget).
	creds *aws.CredentialsCache
	// Connect builds the signed clients for a region and domain (fakes in tests).
	Connect func(c *Cloud, region, domain string)
}

// New is the real AWS: IMDS at DYNK8S_IMDS_ENDPOINT (default the link-local address), the services at
// DYNK8S_<SERVICE>_ENDPOINT or https://<service>.<region>.<domain>. The SDK's own retries are off: every step
// retries under the boot's one deadline and logs each failed attempt.
func New() *Cloud {
	client := &http.Client{Timeout: 30 * time.Second}
	im := imds.New(imds.Options{
		Endpoint:       os.Getenv("DYNK8S_IMDS_ENDPOINT"),
		HTTPClient:     client,
		Retryer:        aws.NopRetryer{},
		EnableFallback: aws.FalseTernary, // IMDSv1 is off on dynk8s instances
	})
	c := &Cloud{IMDS: imdsReader{im}, client: client}
	c.creds = aws.NewCredentialsCache(ec2rolecreds.New(func(o *ec2rolecreds.Options) { o.Client = im }))
	c.Connect = connectSDK
	return c
}

func connectSDK(c *Cloud, region, domain string) {
	cfg := aws.Config{Region: region, Credentials: c.creds, HTTPClient: c.client, Retryer: func() aws.Retryer {
		return aws.NopRetryer{}
	}}
	c.SSM = ssm.NewFromConfig(cfg, func(o *ssm.Options) { o.BaseEndpoint = aws.String(endpoint("ssm", region, domain)) })
	c.ASG = autoscaling.NewFromConfig(cfg, func(o *autoscaling.Options) {
		o.BaseEndpoint = aws.String(endpoint("autoscaling", region, domain))
	})
	c.EC2 = ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(endpoint("ec2", region, domain)) })
}

// endpoint is the service's endpoint in the instance's partition (IMDS meta-data/services/domain: amazonaws.com,
// amazonaws.com.cn, ...), or the override DYNK8S_<SERVICE>_ENDPOINT.
func endpoint(service, region, domain string) string {
	if v := os.Getenv("DYNK8S_" + strings.ToUpper(service) + "_ENDPOINT"); v != "" {
		return v
	}
	return "https://" + service + "." + region + "." + domain
}

// Forget drops the cached role credentials after a 403, so the next attempt reads them from IMDS again.
func (c *Cloud) Forget(err error) {
	if c.creds != nil && httpStatus(err) == http.StatusForbidden {
		c.creds.Invalidate()
	}
}

// imdsReader is the SDK's IMDS client with errors that say what failed: the path or the token, and the status.
type imdsReader struct{ c *imds.Client }

func (r imdsReader) Get(ctx context.Context, path string) (string, error) {
	out, err := r.c.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
	if err != nil {
		return "", imdsError(path, err)
	}
	defer out.Content.Close()
	b, err := io.ReadAll(out.Content)
	if err != nil {
		return "", fmt.Errorf("IMDS %s: %w", path, err)
	}
	return string(b), nil
}

// IMDSErr is an IMDS answer other than 200; Status 404 means the path is absent.
type IMDSErr struct {
	What   string // "IMDSv2 token" or "IMDS <path>"
	Status int
	Err    error
}

func (e *IMDSErr) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("%s: HTTP %d", e.What, e.Status)
	}
	return fmt.Sprintf("%s: %v", e.What, e.Err)
}

func imdsError(path string, err error) error {
	status := httpStatus(err)
	// A failed token comes wrapped in the SDK's retryableError, which does not unwrap (feature/ec2/imds,
	// token_provider.go): its text is all there is to read, "failed to get API token, ... StatusCode: 503, ...".
	if strings.Contains(err.Error(), "failed to get API token") {
		if m := tokenStatusRE.FindStringSubmatch(err.Error()); m != nil {
			status, _ = strconv.Atoi(m[1])
		}
		return &IMDSErr{What: "IMDSv2 token", Status: status, Err: err}
	}
	return &IMDSErr{What: "IMDS meta-data/" + path, Status: status, Err: err}
}

var tokenStatusRE = regexp.MustCompile(`StatusCode: (\d+)`)

// httpStatus is the HTTP status of a service's answer in err, 0 for none (a transport error).
func httpStatus(err error) int {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// APIError says what an AWS call answered: "<what>: HTTP <status> <code> <message>", or the transport error.
func APIError(what string, err error) error {
	status := httpStatus(err)
	var ae smithy.APIError
	if status == 0 || !errors.As(err, &ae) {
		if status != 0 {
			return fmt.Errorf("%s: HTTP %d: %w", what, status, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	return &awsErr{what: what, status: status, code: ae.ErrorCode(), message: ae.ErrorMessage()}
}

type awsErr struct {
	what, code, message string
	status              int
}

func (e *awsErr) Error() string {
	s := fmt.Sprintf("%s: HTTP %d", e.what, e.status)
	if e.code != "" {
		s += " " + e.code
	}
	if e.message != "" {
		s += ": " + e.message
	}
	return s
}

// ErrorCode is the AWS error code of err ("" for none).
func ErrorCode(err error) string {
	var ae *awsErr
	if errors.As(err, &ae) {
		return ae.code
	}
	return ""
}
