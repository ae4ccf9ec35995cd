package infra_test

import (
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra"
)

// iamMatch reports whether an IAM pattern matches s: * any run of characters (slashes included), ? any one
// (IAM User Guide, "IAM JSON policy elements: Resource"). Actions compare without regard to case.
func iamMatch(pattern, s string, foldCase bool) bool {
	re := "^" + strings.NewReplacer(`\*`, ".*", `\?`, ".").Replace(regexp.QuoteMeta(pattern)) + "$"
	if foldCase {
		re = "(?i)" + re
	}
	return regexp.MustCompile(re).MatchString(s)
}

// matchingStatements are the statements of doc with effect that name action on resource (a statement without a
// Resource, as in a key policy, is on "*").
func matchingStatements(doc infra.PolicyDocument, effect, action, resource string) []infra.PolicyStatement {
	var out []infra.PolicyStatement
	for _, s := range doc.Statement {
		if s.Effect != effect {
			continue
		}
		actionOK, resourceOK := false, len(s.Resource) == 0
		for _, a := range s.Action {
			actionOK = actionOK || iamMatch(a, action, true)
		}
		for _, r := range s.Resource {
			resourceOK = resourceOK || iamMatch(r, resource, false)
		}
		if actionOK && resourceOK {
			out = append(out, s)
		}
	}
	return out
}

// deployedBy runs the dev stack deployed by caller (an IAM user's or a role session's ARN; a role at rolePath).
func deployedBy(t *testing.T, values map[string]any, caller, rolePath string) *plan.Result {
	t.Helper()
	cfg, err := mockcloud.ConfigFromMap(values)
	assert.NilError(t, err)
	cfg.Caller, cfg.CallerRolePath = caller, rolePath
	res, err := plan.RunConfig("dev", cfg)
	assert.NilError(t, err)
	return res
}

// TestOnlyTheDeployerWritesTheAgent: the agent bucket's policy denies every principal but the deploying one (the
// IAM user, or for a role session the role, by aws:PrincipalArn) writing, deleting or superseding an object, and
// suspending versioning or changing the lifecycle rule, which would expire the pinned version later; the readers and
// the bucket policy itself are left alone. The objects are uploaded after the policy, so a new deployer names itself
// first.
func TestOnlyTheDeployerWritesTheAgent(t *testing.T) {
	for name, tc := range map[string]struct{ caller, rolePath, deployer string }{
		"an IAM user": {"", "", "arn:aws:iam::" + mockcloud.Account + ":user/operator"},
		"a role session": {"arn:aws:sts::" + mockcloud.Account + ":assumed-role/dynk8s-deploy/ci-1234", "/ci/",
			"arn:aws:iam::" + mockcloud.Account + ":role/ci/dynk8s-deploy"},
	} {
		t.Run(name, func(t *testing.T) {
			res := deployedBy(t, devConfig(t), tc.caller, tc.rolePath)
			bucketPolicy := find(t, res, "aws:s3/bucketPolicy:BucketPolicy", "agent")
			doc := policy(t, bucketPolicy, "policy")
			bucket := "arn:aws:s3:::" + find(t, res, "aws:s3/bucketV2:BucketV2", "agent").ID
			object := bucket + "/dynk8s-node/linux-amd64"
			deniedToOthers := func(action, resource string) bool {
				for _, s := range matchingStatements(doc, "Deny", action, resource) {
					if strings.Join(s.Principal["AWS"], ",") == "*" && len(s.Condition) == 1 &&
						len(s.Condition["StringNotEquals"]) == 1 &&
						s.Condition["StringNotEquals"]["aws:PrincipalArn"] == tc.deployer {
						return true
					}
				}
				return false
			}
			for _, action := range []string{"s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion"} {
				assert.Check(t, deniedToOthers(action, object), "%s is not denied to all but %s", action, tc.deployer)
			}
			for _, action := range []string{"s3:PutBucketVersioning", "s3:PutLifecycleConfiguration"} {
				assert.Check(t, deniedToOthers(action, bucket), "%s is not denied to all but %s", action, tc.deployer)
			}
			for _, action := range []string{"s3:GetObject", "s3:GetObjectVersion", "s3:PutBucketPolicy",
				"s3:DeleteBucketPolicy"} {
				for _, resource := range []string{bucket, object} {
					assert.Check(t, !deniedToOthers(action, resource), "%s on %s is denied", action, resource)
				}
			}
			objects := res.Cloud.ByType("aws:s3/bucketObjectv2:BucketObjectv2")
			assert.Assert(t, len(objects) > 0)
			for _, o := range objects {
				assert.Check(t, is.Contains(o.DependsOnURNs, bucketPolicy.URN), "%s is uploaded before the policy", o.Name)
			}
		})
	}
}
