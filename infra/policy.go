package infra

import (
	"encoding/json"
	"fmt"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/names"
)

// PolicyDocument is an IAM policy document. dynk8s builds every policy from these types and marshals it, so a
// policy is never assembled from strings and its tests can parse it back into the same types.
type PolicyDocument struct {
	Version   string            `json:"Version"`
	Statement []PolicyStatement `json:"Statement"`
}

// PolicyStatement is one statement of a PolicyDocument.
type PolicyStatement struct {
	Sid       string                       `json:"Sid,omitempty"`
	Effect    string                       `json:"Effect"`
	Principal map[string][]string          `json:"Principal,omitempty"`
	Action    []string                     `json:"Action"`
	Resource  []string                     `json:"Resource,omitempty"`
	Condition map[string]map[string]string `json:"Condition,omitempty"`
}

// policyVersion is the current IAM policy language version.
const policyVersion = "2012-10-17"

// JSON marshals the document (map keys sorted by encoding/json, so the text is stable).
func (d PolicyDocument) JSON() (string, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return "", fmt.Errorf("marshal policy: %w", err)
	}
	return string(b), nil
}

// AssumeRolePolicy lets one AWS service principal assume a role, and nothing else.
func AssumeRolePolicy(service string) PolicyDocument {
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{{
		Effect:    "Allow",
		Principal: map[string][]string{"Service": {service}},
		Action:    []string{"sts:AssumeRole"},
	}}}
}

// ReadParameterPolicy allows reading (and decrypting, through SSM with the AWS managed key) exactly one parameter.
func ReadParameterPolicy(parameterARN, keyARN string) PolicyDocument {
	return PolicyDocument{Version: policyVersion, Statement: append([]PolicyStatement{{
		Sid:      "ReadOneParameter",
		Effect:   "Allow",
		Action:   []string{"ssm:GetParameter"},
		Resource: []string{parameterARN},
	}}, parameterKeyStatement("DecryptOneParameter", "kms:Decrypt", parameterARN, keyARN)...)}
}

// parameterKeyStatement lets the policy's holder use keyARN (the operator's key of identity.parameterKey) through SSM
// for parameterARN only: SSM passes the parameter's ARN as the encryption context PARAMETER_ARN ("How AWS Systems
// Manager Parameter Store uses AWS KMS", AWS KMS Developer Guide). None for SSM's own key or the stack's, whose key
// policy names its principals itself.
func parameterKeyStatement(sid, action, parameterARN, keyARN string) []PolicyStatement {
	if keyARN == "" {
		return nil
	}
	return []PolicyStatement{{
		Sid:      sid,
		Effect:   "Allow",
		Action:   []string{action},
		Resource: []string{keyARN},
		Condition: map[string]map[string]string{
			"StringEquals": {"kms:EncryptionContext:PARAMETER_ARN": parameterARN},
		},
	}}
}

// ParameterKeyPrincipals are who may use the stack's own parameter key (identity.parameterKey create), by ARN.
type ParameterKeyPrincipals struct {
	// Account is the account's root ARN: it administers the key (KMS refuses a key policy that would lock the
	// account out of it) but may not use it.
	Account string
	// Deployer is the principal that runs `pulumi up` (DeployerARN: an IAM user, or a role by its IAM ARN, path
	// included): Pulumi writes and reads back both parameters.
	Deployer string
	// NodeRole, GatewayRole and Rotator are the readers and the writer of the parameters.
	NodeRole, GatewayRole, Rotator string
	// TokenParameter and GatewayKeyParameter are the parameters' ARNs; SSMService is "ssm.<region>.<DNS suffix>".
	TokenParameter, GatewayKeyParameter, SSMService string
}

// parameterKeyAdminActions are what the account may do with the stack's parameter key: the KMS console's "key
// administrators" statement ("Default key policy", AWS KMS Developer Guide) spelled out for a symmetric,
// single-Region key with KMS's own key material, so that no wildcard brings in an action that hands out the key's use
// (each name is a key-resource action of "Actions, resources, and condition keys for AWS Key Management Service",
// Service Authorization Reference). Left out: kms:CreateGrant, by which any principal whose IAM policy allows it
// would grant itself or anyone Decrypt (no AWS service needs a grant on this key: SSM uses none), and the
// import, asymmetric and multi-Region actions, which do not apply. kms:PutKeyPolicy stays, and with it the account's
// power to rewrite this policy, Decrypt included: that cannot be taken away without the key becoming unmanageable,
// and KMS's policy lockout safety check refuses a policy whose creator could not put another one (CreateKey,
// BypassPolicyLockoutSafetyCheck, AWS KMS API Reference). Whoever holds kms:PutKeyPolicy on this key is as trusted
// as the deployer.
var parameterKeyAdminActions = []string{
	"kms:CancelKeyDeletion", "kms:CreateAlias", "kms:DeleteAlias", "kms:DescribeKey", "kms:DisableKey",
	"kms:DisableKeyRotation", "kms:EnableKey", "kms:EnableKeyRotation", "kms:GetKeyPolicy", "kms:GetKeyRotationStatus",
	"kms:ListGrants", "kms:ListKeyPolicies", "kms:ListKeyRotations", "kms:ListResourceTags", "kms:PutKeyPolicy",
	"kms:RevokeGrant", "kms:RotateKeyOnDemand", "kms:ScheduleKeyDeletion", "kms:TagResource", "kms:UntagResource",
	"kms:UpdateAlias", "kms:UpdateKeyDescription",
}

// ParameterKeyPolicy is the key policy of the stack's parameter key. The account administers it but may not use it;
// the deploying principal may encrypt and decrypt both parameters (Pulumi writes them and reads them back), the node
// role may decrypt only the join token, the gateway role only its key, and the rotator encrypt only the join token,
// each through SSM for that parameter only. Unlike SSM's aws/ssm key, whose policy lets every principal of the
// account that may call SSM use it, and unlike a key whose policy names the account root (which hands its use to
// every IAM policy that allows kms:Decrypt on "*"), a principal with ssm:GetParameter on a parameter cannot decrypt
// it unless it is one of these: naming a principal other than the root in a key policy grants only that principal
// ("Key policies in AWS KMS", AWS KMS Developer Guide).
func ParameterKeyPolicy(p ParameterKeyPrincipals) PolicyDocument {
	via := func(parameter string) map[string]map[string]string {
		return map[string]map[string]string{"StringEquals": {
			"kms:ViaService": p.SSMService, "kms:EncryptionContext:PARAMETER_ARN": parameter}}
	}
	use := func(sid, who string, actions []string, parameter string) PolicyStatement {
		return PolicyStatement{Sid: sid, Effect: "Allow", Principal: map[string][]string{"AWS": {who}},
			Action: actions, Resource: []string{"*"}, Condition: via(parameter)}
	}
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{
		{Sid: "AdministerTheKey", Effect: "Allow", Principal: map[string][]string{"AWS": {p.Account}},
			Action: parameterKeyAdminActions, Resource: []string{"*"}},
		use("PulumiWritesTheJoinToken", p.Deployer, []string{"kms:Encrypt", "kms:Decrypt"}, p.TokenParameter),
		use("PulumiWritesTheGatewayKey", p.Deployer, []string{"kms:Encrypt", "kms:Decrypt"}, p.GatewayKeyParameter),
		use("NodesReadTheJoinToken", p.NodeRole, []string{"kms:Decrypt"}, p.TokenParameter),
		use("TheGatewayReadsItsKey", p.GatewayRole, []string{"kms:Decrypt"}, p.GatewayKeyParameter),
		use("TheRotatorWritesTheJoinToken", p.Rotator, []string{"kms:Encrypt"}, p.TokenParameter),
	}}
}

// PutParameterPolicy allows overwriting exactly one parameter, and nothing else: not reading it back, not deleting
// it, not tagging it. It is the join token rotator's whole AWS permission. PutParameter takes more than a value, and
// SSM's two condition keys for it ("Preventing access to Parameter Store API operations", Systems Manager User
// Guide) narrow it further: ssm:Overwrite true, so the key can only overwrite the parameter Pulumi created, never
// create one; and no ssm:Policies, so it cannot attach an expiration policy that makes the parameter vanish.
func PutParameterPolicy(parameterARN, keyARN string) PolicyDocument {
	return PolicyDocument{Version: policyVersion, Statement: append([]PolicyStatement{{
		Sid:      "WriteOneParameter",
		Effect:   "Allow",
		Action:   []string{"ssm:PutParameter"},
		Resource: []string{parameterARN},
		Condition: map[string]map[string]string{
			"Bool": {"ssm:Overwrite": "true"},
			"Null": {"ssm:Policies": "true"},
		},
	}}, parameterKeyStatement("EncryptOneParameter", "kms:Encrypt", parameterARN, keyARN)...)}
}

// AutoscalerPolicy is the Cluster Autoscaler's policy for clusterName in region: the read calls of its AWS provider
// (its README's "full features" policy, minus eks:DescribeNodegroup, which only matters on EKS) on everything, as
// Describe calls support no resource-level permissions; and the only two calls that change anything, only on groups
// tagged as this cluster's. Both only in the stack's region, through the global condition key aws:RequestedRegion
// (IAM User Guide, "AWS global condition context keys"): ec2:DescribeLaunchTemplateVersions returns every launch
// template's user data, so a leaked key should not read the account's other regions.
func AutoscalerPolicy(clusterName, region string) PolicyDocument {
	read := []string{
		"autoscaling:DescribeAutoScalingGroups",
		"autoscaling:DescribeAutoScalingInstances",
		"autoscaling:DescribeLaunchConfigurations",
		"autoscaling:DescribeScalingActivities",
		"ec2:DescribeImages",
		"ec2:DescribeInstanceTypes",
		"ec2:DescribeLaunchTemplateVersions",
		"ec2:GetInstanceTypesFromInstanceRequirements",
	}
	write := []string{"autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"}
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{
		{
			Sid:       "DiscoverGroupsAndShapes",
			Effect:    "Allow",
			Action:    read,
			Resource:  []string{"*"},
			Condition: map[string]map[string]string{"StringEquals": {"aws:RequestedRegion": region}},
		},
		{
			Sid:      "ScaleOnlyThisClustersGroups",
			Effect:   "Allow",
			Action:   write,
			Resource: []string{"*"},
			Condition: map[string]map[string]string{"StringEquals": {
				"autoscaling:ResourceTag/" + config.AutoscalerClusterTag(clusterName): "owned",
				"aws:RequestedRegion": region,
			}},
		},
	}}
}

// CleanupPolicy is the stale-node cleanup's policy: it only asks EC2 whether an instance still exists before it
// deletes that instance's Node.
func CleanupPolicy(region string) PolicyDocument {
	return describeInstancesIn("AskWhetherInstancesAreGone", region)
}

// GatewayIdleCheckPolicy lets the WireGuard gateway list the instances of its region, to see whether a pool instance
// is pending or running before it stops itself.
func GatewayIdleCheckPolicy(region string) PolicyDocument {
	return describeInstancesIn("ListInstancesOfThisRegion", region)
}

// describeInstancesIn allows ec2:DescribeInstances in one region. DescribeInstances supports no resource-level
// permissions and no resource tag conditions (AWS Service Authorization Reference, Amazon EC2: DescribeInstances lists
// no resource type), so the statement is on "*" and a caller's filter on the stack's tags is its own choice, not
// enforced by IAM; the region is. It reveals instance metadata only (no user data, which is another call), and
// changes nothing.
func describeInstancesIn(sid, region string) PolicyDocument {
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{{
		Sid:       sid,
		Effect:    "Allow",
		Action:    []string{"ec2:DescribeInstances"},
		Resource:  []string{"*"},
		Condition: map[string]map[string]string{"StringEquals": {"aws:RequestedRegion": region}},
	}}}
}

// WakeGatewayPolicy lets the pool nodes (and dynk8s-controller, at a scale-up decision) start the WireGuard
// gateway: StartInstances on that one instance, and only while it carries the gateway's cluster and Name tags (a
// replaced gateway's ARN is a new one; the policy follows).
func WakeGatewayPolicy(instanceARN, clusterName, gatewayName string) PolicyDocument {
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{{
		Sid:      "StartTheWireGuardGateway",
		Effect:   "Allow",
		Action:   []string{"ec2:StartInstances"},
		Resource: []string{instanceARN},
		Condition: map[string]map[string]string{"StringEquals": {
			"aws:ResourceTag/" + names.TagCluster: clusterName,
			"aws:ResourceTag/Name":                gatewayName,
		}},
	}}}
}

// ReplaceStaleWarmInstancesPolicy lets dynk8s-controller's warm loop replace the stale instances of one pool's warm
// pool: read the group and its warm pool (Describe calls support no resource-level permissions: the Service
// Authorization Reference for EC2 Auto Scaling; the region is scoped), and terminate instances of that group only,
// within instanceARNs (the stack's region and account). An instance is the group's by the aws:autoscaling:groupName
// tag EC2 Auto Scaling puts on every instance it launches; a tag key that begins with aws: cannot be created,
// changed or removed by anyone (Amazon EC2 User Guide, "Tag restrictions"), so no principal of the stack can make
// another instance pass. The cluster's own tag is required as well.
func ReplaceStaleWarmInstancesPolicy(instanceARNs, region, clusterName, group string) PolicyDocument {
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{
		{
			Sid:       "ReadTheGroupAndItsWarmPool",
			Effect:    "Allow",
			Action:    []string{"autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeWarmPool"},
			Resource:  []string{"*"},
			Condition: map[string]map[string]string{"StringEquals": {"aws:RequestedRegion": region}},
		},
		{
			Sid:      "TerminateTheGroupsInstances",
			Effect:   "Allow",
			Action:   []string{"ec2:TerminateInstances"},
			Resource: []string{instanceARNs},
			Condition: map[string]map[string]string{"StringEquals": {
				"aws:ResourceTag/" + autoscalingGroupTag: group,
				"aws:ResourceTag/" + names.TagCluster:    clusterName,
			}},
		},
	}}
}

// autoscalingGroupTag is the tag EC2 Auto Scaling puts on every instance it launches: its group's name.
const autoscalingGroupTag = "aws:autoscaling:groupName"

// NodeLifecyclePolicy lets a node act on its own boot in its group (the node agent's join): complete the launch lifecycle
// hook's action (CONTINUE once prepared or joined, or when it fails; ABANDON when it was prepared from an older launch
// template) and mark such a stale instance Unhealthy when it has no hook, so the group replaces it at once. Both only on groups tagged as this cluster's, within
// groupARNs (the stack's region and account); both support that scoping (the Service Authorization Reference for
// EC2 Auto Scaling; kops scopes CompleteLifecycleAction by the same kind of tag, pkg/model/iam/iam_builder.go).
// Finding its group's name takes DescribeAutoScalingInstances, and telling whether a warm instance was launched from
// the group's current launch template version DescribeAutoScalingGroups; neither supports resource-level
// permissions.
func NodeLifecyclePolicy(clusterName, groupARNs string) PolicyDocument {
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{
		{
			Sid:      "FindOwnGroup",
			Effect:   "Allow",
			Action:   []string{"autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances"},
			Resource: []string{"*"},
		},
		{
			Sid:      "HandOwnBootBackToThisClustersGroups",
			Effect:   "Allow",
			Action:   []string{"autoscaling:CompleteLifecycleAction", "autoscaling:SetInstanceHealth"},
			Resource: []string{groupARNs},
			Condition: map[string]map[string]string{
				"StringEquals": {"autoscaling:ResourceTag/" + config.AutoscalerClusterTag(clusterName): "owned"},
			},
		},
	}}
}

// ReadAgentPolicy lets an instance role download the node agent: exactly the objects of its architectures, at any
// of their versions (the user data pins one; GetObject with a versionId needs s3:GetObjectVersion), and nothing
// else of the bucket, not even a listing.
func ReadAgentPolicy(objectARNs []string) PolicyDocument {
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{{
		Sid:      "ReadTheNodeAgent",
		Effect:   "Allow",
		Action:   []string{"s3:GetObject", "s3:GetObjectVersion"},
		Resource: objectARNs,
	}}}
}

// agentWriteActions are what could take the pinned agent away from the nodes at once or within retentionDays: a
// PutObject or a DeleteObject without a version makes the pinned version noncurrent, and the lifecycle rule then
// expires it; a DeleteObjectVersion deletes it.
var agentWriteActions = []string{"s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutObject"}

// agentBucketConfigActions are the bucket settings whose change would do the same: a lifecycle rule that expires
// current versions, or versioning suspended (the deployer's next upload would then overwrite the "null" version a
// launch template pins, where it now adds a version).
var agentBucketConfigActions = []string{"s3:PutBucketVersioning", "s3:PutLifecycleConfiguration"}

// AgentBucketPolicy is the agent bucket's own policy. No request without TLS, whoever makes it (the usual S3 guard,
// "Security best practices for Amazon S3", S3 User Guide). And only the deploying principal may write, delete or
// supersede an object, or change versioning or the lifecycle rule: every other principal of the account is denied,
// whatever its IAM policies allow (an explicit deny in a resource policy wins, "Policy evaluation logic", IAM User
// Guide). The deployer is compared by aws:PrincipalArn, which for a role session is the role's ARN, not the
// session's (IAM User Guide, "AWS global condition context keys"), so that any session of the deploying role may
// run `pulumi up` and `pulumi destroy`. The bucket policy itself is not guarded: another principal's first
// `pulumi up` must be able to name itself here before it uploads, and a principal that may rewrite bucket policies
// is an administrator anyway (the account's root user may always delete a bucket policy, so none locks the account
// out). The readers' grants are in their IAM policies.
func AgentBucketPolicy(bucketARN, deployerARN string) PolicyDocument {
	notDeployer := map[string]map[string]string{"StringNotEquals": {"aws:PrincipalArn": deployerARN}}
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{
		{
			Sid:       "DenyWithoutTLS",
			Effect:    "Deny",
			Principal: map[string][]string{"AWS": {"*"}},
			Action:    []string{"s3:*"},
			Resource:  []string{bucketARN, bucketARN + "/*"},
			Condition: map[string]map[string]string{"Bool": {"aws:SecureTransport": "false"}},
		},
		{
			Sid:       "OnlyTheDeployerWritesTheAgent",
			Effect:    "Deny",
			Principal: map[string][]string{"AWS": {"*"}},
			Action:    agentWriteActions,
			Resource:  []string{bucketARN + "/*"},
			Condition: notDeployer,
		},
		{
			Sid:       "OnlyTheDeployerConfiguresTheBucket",
			Effect:    "Deny",
			Principal: map[string][]string{"AWS": {"*"}},
			Action:    agentBucketConfigActions,
			Resource:  []string{bucketARN},
			Condition: notDeployer,
		},
	}}
}

// NodeKeyTagPolicy lets a pool node tag itself with its kubelet key's hash (names.TagKubeletKey, which the
// controller compares with the public key of the node's bootstrap certificate request) and do nothing else with
// tags: ec2:CreateTags on instanceARNs (arn:<partition>:ec2:<region>:<account>:instance/*) only when
//   - the instance tagged is the caller's own: aws:ARN, the ARN of the resource acted on, equals the policy variable
//     ${ec2:SourceInstanceARN}, the ARN of the instance whose role credentials signed the request ("Condition keys
//     for Amazon EC2", EC2 User Guide, and "Allow a specific instance to view resources in other AWS services",
//     "Example policies to control access the Amazon EC2 API"). aws:ARN is not in the global condition key list;
//     this form is the one the EC2 community uses for "an instance may act only on itself", and the stack tests
//     cannot prove it against IAM: the e2e (moto) evaluates no policy. ec2:SourceInstanceARN comes with the role
//     session EC2 delivered to the instance, so credentials taken off it still mark only that instance;
//   - the instance is this cluster's (aws:ResourceTag/dynk8s:cluster), so another stack's role reaches none of ours;
//   - every tag key in the request is names.TagKubeletKey (ForAllValues:StringEquals on aws:TagKeys), and the
//     request has tag keys at all: ForAllValues is true for a request without any, which Null aws:TagKeys false
//     refuses ("Multivalued context key examples", IAM User Guide).
//
// A node can therefore rewrite only its own instance's hash, which binds only its own node name.
func NodeKeyTagPolicy(instanceARNs, clusterName string) PolicyDocument {
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{{
		Sid:      "TagOwnInstanceWithItsKubeletKey",
		Effect:   "Allow",
		Action:   []string{"ec2:CreateTags"},
		Resource: []string{instanceARNs},
		Condition: map[string]map[string]string{
			"StringEquals": {
				"aws:ARN":                             "${ec2:SourceInstanceARN}",
				"aws:ResourceTag/" + names.TagCluster: clusterName,
			},
			"ForAllValues:StringEquals": {"aws:TagKeys": names.TagKubeletKey},
			"Null":                      {"aws:TagKeys": "false"},
		},
	}}}
}

// NodeCachePolicy lets a pool node find, create and attach its pool's build cache volume (node/internal/cache), in
// volumeARNs (arn:<partition>:ec2:<region>:<account>:volume/*) and on instanceARNs, and nothing else of EBS:
//   - ec2:DescribeVolumes, which supports no resource-level permissions (AWS Service Authorization Reference, Amazon
//     EC2: DescribeVolumes lists no resource type), in the stack's region;
//   - ec2:CreateVolume only encrypted (ec2:Encrypted) and tagged at creation with this cluster's tag and the cache
//     tag (aws:RequestTag, "Grant permission to tag Amazon EC2 resources during creation", EC2 User Guide), and
//     ec2:CreateTags only as part of that creation (ec2:CreateAction CreateVolume): a node can tag no existing
//     resource;
//   - ec2:AttachVolume, which authorizes the volume and the instance both: of volumes, only the cluster's cache
//     volumes (aws:ResourceTag); of instances, only the caller's own (aws:ARN equals ${ec2:SourceInstanceARN}, as in
//     NodeKeyTagPolicy) of this cluster.
//
// The node role is every pool's, so a node of one pool could attach another pool's cache volume of its cluster;
// the agent never asks for one.
func NodeCachePolicy(volumeARNs, instanceARNs, region, clusterName string) PolicyDocument {
	cacheVolume := map[string]map[string]string{
		"StringEquals": {"aws:ResourceTag/" + names.TagCluster: clusterName},
		"Null":         {"aws:ResourceTag/" + names.TagCache: "false"},
	}
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{
		{
			Sid: "ListVolumesOfThisRegion", Effect: "Allow", Action: []string{"ec2:DescribeVolumes"},
			Resource:  []string{"*"},
			Condition: map[string]map[string]string{"StringEquals": {"aws:RequestedRegion": region}},
		},
		{
			Sid: "CreateEncryptedCacheVolumes", Effect: "Allow", Action: []string{"ec2:CreateVolume"},
			Resource: []string{volumeARNs},
			Condition: map[string]map[string]string{
				"StringEquals": {"aws:RequestTag/" + names.TagCluster: clusterName},
				"Null":         {"aws:RequestTag/" + names.TagCache: "false"},
				"Bool":         {"ec2:Encrypted": "true"},
			},
		},
		{
			Sid: "TagOnlyAtCreation", Effect: "Allow", Action: []string{"ec2:CreateTags"},
			Resource:  []string{volumeARNs},
			Condition: map[string]map[string]string{"StringEquals": {"ec2:CreateAction": "CreateVolume"}},
		},
		{
			Sid: "AttachTheClustersCacheVolumes", Effect: "Allow", Action: []string{"ec2:AttachVolume"},
			Resource: []string{volumeARNs}, Condition: cacheVolume,
		},
		{
			Sid: "AttachToItselfOnly", Effect: "Allow", Action: []string{"ec2:AttachVolume"},
			Resource: []string{instanceARNs},
			Condition: map[string]map[string]string{"StringEquals": {
				"aws:ARN":                             "${ec2:SourceInstanceARN}",
				"aws:ResourceTag/" + names.TagCluster: clusterName,
			}},
		},
	}}
}

// CacheKeeperPolicy lets dynk8s-controller's cache loop keep the cluster's cache volumes in order: list the
// region's volumes (no resource-level permissions, as above), delete the cluster's cache volumes (EC2 refuses an
// attached one), and mark them with the time it saw them in use, that one tag key and no other (ForAllValues on
// aws:TagKeys, with Null false so that a request without tags is no match: "Multivalued context key examples",
// IAM User Guide).
func CacheKeeperPolicy(volumeARNs, region, clusterName string) PolicyDocument {
	cacheVolume := func() map[string]map[string]string {
		return map[string]map[string]string{
			"StringEquals": {"aws:ResourceTag/" + names.TagCluster: clusterName},
			"Null":         {"aws:ResourceTag/" + names.TagCache: "false"},
		}
	}
	mark := cacheVolume()
	mark["ForAllValues:StringEquals"] = map[string]string{"aws:TagKeys": names.TagCacheUsed}
	mark["Null"]["aws:TagKeys"] = "false"
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{
		{
			Sid: "ListVolumesOfThisRegion", Effect: "Allow", Action: []string{"ec2:DescribeVolumes"},
			Resource:  []string{"*"},
			Condition: map[string]map[string]string{"StringEquals": {"aws:RequestedRegion": region}},
		},
		{
			Sid: "DeleteTheClustersCacheVolumes", Effect: "Allow", Action: []string{"ec2:DeleteVolume"},
			Resource: []string{volumeARNs}, Condition: cacheVolume(),
		},
		{
			Sid: "MarkCacheVolumesInUse", Effect: "Allow", Action: []string{"ec2:CreateTags"},
			Resource: []string{volumeARNs}, Condition: mark,
		},
	}}
}
