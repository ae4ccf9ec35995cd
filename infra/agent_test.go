package infra_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// The agent bucket on its own: private, encrypted, versioned, replaced versions expired after the retention, one
// object per architecture, and each reader role may get exactly its architectures' objects.
func TestAgentBucketComponent(t *testing.T) {
	dir := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "dynk8s-node-linux-arm64"), []byte("arm agent"), 0o755))
	arm, err := infra.AgentOrStandIn(dir)(infra.NodeAgent, kube.ArchArm64)
	assert.NilError(t, err)
	assert.Equal(t, arm.SHA256, sha256Hex("arm agent"))
	x86, err := infra.AgentOrStandIn(dir)(infra.NodeAgent, kube.ArchX86_64)
	assert.NilError(t, err)
	assert.Check(t, x86.StandIn(), "not built: the stand-in")
	assert.Equal(t, x86.SHA256, sha256Hex(""))

	var objects map[kube.Arch]infra.AgentObject
	cloud := runComponent(t, func(ctx *pulumi.Context) error {
		b, err := infra.NewAgentBucket(ctx, "agent", &infra.AgentBucketArgs{
			ClusterName: "a-cluster-name-longer-than-a-bucket-prefix-takes", Binaries: []infra.AgentBinary{x86, arm},
			RetentionDays: 9, Deployer: pulumi.String("arn:aws:iam::123456789012:role/deploy/pulumi"),
			Readers: []infra.AgentReader{
				{Name: "node", Role: pulumi.String("lab-node"), Arches: []kube.Arch{kube.ArchX86_64, kube.ArchArm64}},
				{Name: "gateway", Role: pulumi.String("lab-gateway"), Arches: []kube.Arch{kube.ArchArm64}},
			},
		})
		if b != nil {
			objects = b.Objects
		}
		return err
	})
	bucket := mustFind(t, cloud, "aws:s3/bucketV2:BucketV2", "agent")
	assert.Equal(t, in(bucket, "bucketPrefix"), "dynk8s-a-cluster-name-longer-t-agent-")
	assert.Check(t, len(in(bucket, "bucketPrefix").(string)) <= 37)
	block := mustFind(t, cloud, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", "agent")
	for _, k := range []string{"blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"} {
		assert.Check(t, is.Equal(in(block, k), true), k)
	}
	ownership := mustFind(t, cloud, "aws:s3/bucketOwnershipControls:BucketOwnershipControls", "agent")
	assert.Equal(t, asMap(in(ownership, "rule"))["objectOwnership"], "BucketOwnerEnforced")
	sse := mustFind(t, cloud, "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2", "agent")
	assert.Equal(t, asMap(asMap(asList(in(sse, "rules"))[0])["applyServerSideEncryptionByDefault"])["sseAlgorithm"], "AES256")
	versioning := mustFind(t, cloud, "aws:s3/bucketVersioningV2:BucketVersioningV2", "agent")
	assert.Equal(t, asMap(in(versioning, "versioningConfiguration"))["status"], "Enabled")
	lifecycle := mustFind(t, cloud, "aws:s3/bucketLifecycleConfigurationV2:BucketLifecycleConfigurationV2", "agent")
	rules := asList(in(lifecycle, "rules"))
	assert.Equal(t, len(rules), 1)
	rule := asMap(rules[0])
	assert.Equal(t, rule["status"], "Enabled")
	assert.DeepEqual(t, rule["filter"], map[string]any{"prefix": "dynk8s-node/"})
	assert.DeepEqual(t, rule["noncurrentVersionExpiration"], map[string]any{"noncurrentDays": float64(9)})
	assert.Check(t, rule["expiration"] == nil, "the live version never expires")
	assert.Check(t, is.Contains(lifecycle.DependsOn, "agent"), "after versioning is on")
	bucketPolicy := mustFind(t, cloud, "aws:s3/bucketPolicy:BucketPolicy", "agent")
	tls := policy(t, bucketPolicy, "policy")
	assert.DeepEqual(t, tls.Statement[0].Condition, map[string]map[string]string{"Bool": {"aws:SecureTransport": "false"}})
	assert.Equal(t, tls.Statement[0].Effect, "Deny")
	// Only the deployer writes (TestOnlyTheDeployerWritesTheAgent has the stack's).
	assert.Equal(t, len(tls.Statement), 3)
	for _, s := range tls.Statement[1:] {
		assert.Equal(t, s.Effect, "Deny")
		assert.DeepEqual(t, s.Condition, map[string]map[string]string{
			"StringNotEquals": {"aws:PrincipalArn": "arn:aws:iam::123456789012:role/deploy/pulumi"}})
	}

	armObject := mustFind(t, cloud, "aws:s3/bucketObjectv2:BucketObjectv2", "agent-linux-arm64")
	assert.Equal(t, in(armObject, "key"), "dynk8s-node/linux-arm64")
	assert.Equal(t, armObject.Inputs["source"].AssetValue().Path, filepath.Join(dir, "dynk8s-node-linux-arm64"))
	assert.Check(t, is.Contains(armObject.DependsOnURNs, bucketPolicy.URN), "uploaded before the bucket policy")
	assert.DeepEqual(t, in(armObject, "metadata"), map[string]any{"sha256": sha256Hex("arm agent")})
	x86Object := mustFind(t, cloud, "aws:s3/bucketObjectv2:BucketObjectv2", "agent-linux-amd64")
	assert.Equal(t, in(x86Object, "key"), "dynk8s-node/linux-amd64")
	assert.Equal(t, in(x86Object, "content"), "")
	assert.Equal(t, asMap(in(x86Object, "metadata"))["sha256"], sha256Hex(""))
	assert.Check(t, is.Contains(asMap(in(x86Object, "metadata"))["stand-in"], "not built"))
	assert.Check(t, objects[kube.ArchX86_64].StandIn && !objects[kube.ArchArm64].StandIn)
	assert.Equal(t, objects[kube.ArchArm64].SHA256, sha256Hex("arm agent"))

	name := in(bucket, "bucketPrefix").(string)
	arn := func(arch string) string {
		return "arn:aws:s3:::" + mustFind(t, cloud, "aws:s3/bucketV2:BucketV2", "agent").ID + "/dynk8s-node/linux-" + arch
	}
	assert.Check(t, is.Contains(arn("arm64"), name))
	node := mustFind(t, cloud, "aws:iam/rolePolicy:RolePolicy", "agent-node-read")
	assert.Equal(t, in(node, "role"), "lab-node")
	assert.DeepEqual(t, policy(t, node, "policy"), infra.PolicyDocument{Version: "2012-10-17", Statement: []infra.PolicyStatement{{
		Sid: "ReadTheNodeAgent", Effect: "Allow", Action: []string{"s3:GetObject", "s3:GetObjectVersion"},
		Resource: []string{arn("amd64"), arn("arm64")},
	}}})
	gateway := mustFind(t, cloud, "aws:iam/rolePolicy:RolePolicy", "agent-gateway-read")
	assert.Equal(t, in(gateway, "role"), "lab-gateway")
	assert.DeepEqual(t, policy(t, gateway, "policy").Statement[0].Resource, []string{arn("arm64")})
}

// A binary that is there but empty is refused, as is a retention under a day, or a bucket without its deployer.
func TestAgentBucketRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "dynk8s-node-linux-arm64"), nil, 0o755))
	_, err := infra.BuiltAgent(dir)(infra.NodeAgent, kube.ArchArm64)
	assert.ErrorContains(t, err, "dynk8s-node-linux-arm64 is empty")
	_, err = infra.AgentOrStandIn(dir)(infra.NodeAgent, kube.ArchArm64)
	assert.ErrorContains(t, err, "is empty", "an empty build is no stand-in")
	_, err = infra.BuiltAgent(dir)(infra.NodeAgent, kube.ArchX86_64)
	assert.ErrorContains(t, err, "is not built: run `make build` first")

	cloud := runComponent(t, func(ctx *pulumi.Context) error {
		_, err := infra.NewAgentBucket(ctx, "agent", &infra.AgentBucketArgs{ClusterName: "lab", RetentionDays: 0,
			Binaries: []infra.AgentBinary{{Arch: kube.ArchArm64, SHA256: infra.StandInSHA256}},
			Deployer: pulumi.String("arn:aws:iam::123456789012:user/operator")})
		assert.Check(t, is.ErrorContains(err, "retention of 0 days"))
		_, err = infra.NewAgentBucket(ctx, "agent", &infra.AgentBucketArgs{ClusterName: "lab", RetentionDays: 9,
			Binaries: []infra.AgentBinary{{Arch: kube.ArchArm64, SHA256: infra.StandInSHA256}}})
		assert.Check(t, is.ErrorContains(err, "the deployer are required"))
		return nil
	})
	assert.Equal(t, len(cloud.Resources()), 0)
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
