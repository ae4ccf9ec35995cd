package cloud

import (
	"testing"

	"gotest.tools/v3/assert"
)

// The endpoints follow the partition's DNS suffix from IMDS, unless a test overrides them.
func TestEndpointsFollowTheDomain(t *testing.T) {
	assert.Equal(t, endpoint("ssm", "cn-north-1", "amazonaws.com.cn"), "https://ssm.cn-north-1.amazonaws.com.cn")
	assert.Equal(t, endpoint("autoscaling", "eu-central-1", "amazonaws.com"), "https://autoscaling.eu-central-1.amazonaws.com")
	t.Setenv("DYNK8S_EC2_ENDPOINT", "http://127.0.0.1:1234")
	assert.Equal(t, endpoint("ec2", "eu-central-1", "amazonaws.com"), "http://127.0.0.1:1234")
}
