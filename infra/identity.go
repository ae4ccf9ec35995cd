package infra

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/iam"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/kms"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ssm"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumix"

	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/infra/config"
)

// IdentityType is the type token of the Identity component.
const IdentityType = "dynk8s:infra:Identity"

// ParameterPath is the SSM path of a cluster's parameters: the join token and the gateway key, and nothing else.
func ParameterPath(clusterName string) string { return "/dynk8s/" + clusterName }

// ParameterARN is the ARN of the SSM parameter (or parameter path, or pattern) name in partition, region and account.
func ParameterARN(partition, region, account, name string) string {
	return fmt.Sprintf("arn:%s:ssm:%s:%s:parameter/%s", partition, region, account, strings.TrimPrefix(name, "/"))
}

// JoinTokenParameter is the SSM SecureString that holds "<token-id>.<token-secret>" for the nodes of a cluster.
func JoinTokenParameter(clusterName string) string { return ParameterPath(clusterName) + "/join-token" }

// JoinTokenPlaceholder is the join token parameter's value until the in-cluster rotator first writes a token: not a
// token, so a node that reads it retries (the node agent) instead of joining with something the cluster never issued.
const JoinTokenPlaceholder = "none: the dynk8s join token rotator has not written a token yet"

// GatewayKeyParameter is the SSM SecureString that holds the WireGuard gateway's private key.
func GatewayKeyParameter(clusterName string) string {
	return ParameterPath(clusterName) + "/wireguard-gateway-key"
}

// DeployerARN is the principal that runs the program, as policies name it: the caller's IAM user (or the account's
// root user), and for an assumed-role session the role's own IAM ARN, path included, which pulumi-aws's
// getSessionContext answers as issuerArn. That is both what a key policy's Principal takes (a role, not one of its
// sessions) and what the condition key aws:PrincipalArn holds for any session of the role (IAM User Guide, "AWS
// global condition context keys").
func DeployerARN(ctx *pulumi.Context, opts ...pulumi.InvokeOption) pulumi.StringOutput {
	caller := aws.GetCallerIdentityOutput(ctx, aws.GetCallerIdentityOutputArgs{}, opts...)
	return iam.GetSessionContextOutput(ctx, iam.GetSessionContextOutputArgs{Arn: caller.Arn()}, opts...).IssuerArn()
}

// Identity holds who may do what: the node and gateway roles (each may read exactly one SSM parameter; a node may
// also complete its own launch lifecycle action and mark itself Unhealthy in this cluster's groups), the IAM users of
// the workloads that run on-prem, outside AWS, and so need keys (the Cluster Autoscaler, the stale-node cleanup, the
// join token rotator), and the join token parameter, which only the rotator writes.
type Identity struct {
	pulumi.ResourceState

	NodeInstanceProfileARN     pulumi.StringOutput `pulumi:"nodeInstanceProfileArn"`
	GatewayInstanceProfileName pulumi.StringOutput `pulumi:"gatewayInstanceProfileName"`
	// NodeRoleName and GatewayRoleName are the two instance roles, for the policies the gateway adds (its idle
	// stop, and the nodes' permission to start it).
	NodeRoleName          pulumi.StringOutput `pulumi:"nodeRoleName"`
	GatewayRoleName       pulumi.StringOutput `pulumi:"gatewayRoleName"`
	AutoscalerAccessKeyID pulumi.StringOutput `pulumi:"autoscalerAccessKeyId"`
	// AutoscalerSecretAccessKey is secret.
	AutoscalerSecretAccessKey pulumi.StringOutput `pulumi:"autoscalerSecretAccessKey"`
	CleanupAccessKeyID        pulumi.StringOutput `pulumi:"cleanupAccessKeyId"`
	// CleanupUserName is the cleanup's IAM user, whose key the controller asks EC2 with and downloads itself with
	// (the agent bucket's ControllerReader).
	CleanupUserName pulumi.StringOutput
	// InstanceARNs is the ARN pattern of every instance of the stack's region and account
	// (arn:<partition>:ec2:<region>:<account>:instance/*), which the policies on instances scope by.
	InstanceARNs pulumi.StringOutput
	// CleanupSecretAccessKey is secret.
	CleanupSecretAccessKey  pulumi.StringOutput `pulumi:"cleanupSecretAccessKey"`
	TokenRotatorAccessKeyID pulumi.StringOutput `pulumi:"tokenRotatorAccessKeyId"`
	// TokenRotatorSecretAccessKey is secret.
	TokenRotatorSecretAccessKey pulumi.StringOutput `pulumi:"tokenRotatorSecretAccessKey"`
	// JoinTokenParameter is the SSM parameter name the nodes read the token from.
	JoinTokenParameter pulumi.StringOutput `pulumi:"joinTokenParameter"`
	// ParameterKeyARN is the KMS key of the SecureStrings, "" for SSM's own (identity.parameterKey).
	ParameterKeyARN pulumi.StringOutput `pulumi:"parameterKeyArn"`
	// DeployerARN is the principal running `pulumi up` (DeployerARN), which the stack's key policy and the agent
	// bucket's policy name.
	DeployerARN pulumi.StringOutput `pulumi:"deployerArn"`
	// JoinTokenParameterResource declares that parameter; the token rotator runs after it and writes with its key
	// (an addons.KeyedParameter).
	JoinTokenParameterResource pulumi.Resource
}

// IdentityArgs are the inputs of Identity: plain decisions from the validated config.
type IdentityArgs struct {
	// ClusterName prefixes IAM names and scopes the autoscaler's write permission (required).
	ClusterName string
	// Region is where the SSM parameters live (required).
	Region string
	// AutoscalerKeyRotation: a new value makes new access keys for the on-prem users (the autoscaler's and the
	// cleanup's), each created before the old one is deleted (required).
	AutoscalerKeyRotation string
	// BootstrapTokenRotation: a new value makes a new access key for the join token rotator, created before the old
	// one is deleted (required). The in-cluster half issues a new token for the same value.
	BootstrapTokenRotation string
	// ParameterKey is identity.parameterKey: config.ParameterKeyAWSManaged (or ""), config.ParameterKeyCreate, or a
	// key ARN.
	ParameterKey string
	// NodeCaches lets the nodes find, create and attach their pools' build cache volumes (a pool has a cache).
	NodeCaches bool
}

// NewIdentity declares the roles, the users and keys of the autoscaler and the token rotator, and the join token's
// SSM parameter.
func NewIdentity(ctx *pulumi.Context, name string, args *IdentityArgs, opts ...pulumi.ResourceOption) (*Identity, error) {
	if args == nil {
		return nil, errors.New("identity: args are required")
	}
	comp := &Identity{}
	if err := ctx.RegisterComponentResource(IdentityType, name, comp, opts...); err != nil {
		return nil, err
	}
	parent := pulumi.Parent(comp)
	fail := func(what string, err error) (*Identity, error) {
		return nil, fmt.Errorf("identity %q: %s: %w", name, what, err)
	}
	tags := func(suffix string) pulumi.StringMap {
		return awsTags(config.IdentityTags(args.ClusterName, "", args.ClusterName+"-"+suffix))
	}

	// ARNs are built from the caller's partition and account, so GovCloud and China work unchanged.
	partition := aws.GetPartitionOutput(ctx, aws.GetPartitionOutputArgs{}, parent)
	account := aws.GetCallerIdentityOutput(ctx, aws.GetCallerIdentityOutputArgs{}, parent).AccountId()
	parameterARN := func(parameter string) pulumi.StringOutput {
		return pulumi.All(partition.Partition(), account).ApplyT(func(v []any) string {
			return ParameterARN(v[0].(string), args.Region, v[1].(string), parameter)
		}).(pulumi.StringOutput)
	}
	comp.DeployerARN = DeployerARN(ctx, parent)
	ec2Service := pulumi.Sprintf("ec2.%s", partition.DnsSuffix())

	tokenParameter := JoinTokenParameter(args.ClusterName)
	// The operator's key, when identity.parameterKey names one: the readers' and the writer's IAM policies grant its
	// use for their parameter.
	operatorKey := ""
	if k := args.ParameterKey; k != "" && k != config.ParameterKeyAWSManaged && k != config.ParameterKeyCreate {
		operatorKey = k
	}

	nodeProfile, err := instanceRole(ctx, name+"-node", args.ClusterName+"-node", ec2Service,
		parameterARN(tokenParameter), operatorKey, tags("node"), parent)
	if err != nil {
		return fail("node role", err)
	}
	// The node's boot completes its launch lifecycle action and hands a failed instance back to its group.
	groupARNs := pulumi.Sprintf("arn:%s:autoscaling:%s:%s:autoScalingGroup:*:autoScalingGroupName/*",
		partition.Partition(), args.Region, account)
	lifecycle := groupARNs.ApplyT(func(arns string) (string, error) {
		return NodeLifecyclePolicy(args.ClusterName, arns).JSON()
	}).(pulumi.StringOutput)
	if _, err := iam.NewRolePolicy(ctx, name+"-node-lifecycle", &iam.RolePolicyArgs{
		Role:   nodeProfile.Role,
		Name:   pulumi.String("own-boot-in-group"),
		Policy: lifecycle,
	}, parent); err != nil {
		return fail("node lifecycle policy", err)
	}
	// The node's boot marks its own instance with its kubelet key's hash, which the controller binds the node's
	// name to (NodeKeyTagPolicy).
	comp.InstanceARNs = pulumi.Sprintf("arn:%s:ec2:%s:%s:instance/*", partition.Partition(), args.Region, account)
	keyTag := comp.InstanceARNs.ApplyT(
		func(arns string) (string, error) { return NodeKeyTagPolicy(arns, args.ClusterName).JSON() }).(pulumi.StringOutput)
	if _, err := iam.NewRolePolicy(ctx, name+"-node-key-tag", &iam.RolePolicyArgs{
		Role:   nodeProfile.Role,
		Name:   pulumi.String("mark-own-kubelet-key"),
		Policy: keyTag,
	}, parent); err != nil {
		return fail("node key tag policy", err)
	}
	volumeARNs := pulumi.Sprintf("arn:%s:ec2:%s:%s:volume/*", partition.Partition(), args.Region, account)
	if args.NodeCaches {
		cache := pulumix.Apply2Err(volumeARNs, comp.InstanceARNs, func(volumes, instances string) (string, error) {
			return NodeCachePolicy(volumes, instances, args.Region, args.ClusterName).JSON()
		})
		if _, err := iam.NewRolePolicy(ctx, name+"-node-cache", &iam.RolePolicyArgs{
			Role:   nodeProfile.Role,
			Name:   pulumi.String("attach-pool-cache"),
			Policy: pulumix.Cast[pulumi.StringOutput](cache),
		}, parent); err != nil {
			return fail("node cache policy", err)
		}
	}
	gatewayProfile, err := instanceRole(ctx, name+"-gateway", args.ClusterName+"-gateway", ec2Service,
		parameterARN(GatewayKeyParameter(args.ClusterName)), operatorKey, tags("gateway"), parent)
	if err != nil {
		return fail("gateway role", err)
	}

	// The Cluster Autoscaler and the stale-node cleanup run on-prem, so they cannot assume a role from instance
	// metadata: each gets a user of its own with only its own policy.
	autoscalerPolicy, err := AutoscalerPolicy(args.ClusterName, args.Region).JSON()
	if err != nil {
		return fail("autoscaler policy", err)
	}
	autoscalerKey, err := onPremUser(ctx, name+"-autoscaler", args.ClusterName+"-cluster-autoscaler",
		"cluster-autoscaler", "cluster-autoscaler", pulumi.String(autoscalerPolicy), args.AutoscalerKeyRotation,
		tags, parent)
	if err != nil {
		return fail("autoscaler user", err)
	}
	cleanupPolicy, err := CleanupPolicy(args.Region).JSON()
	if err != nil {
		return fail("node cleanup policy", err)
	}
	cleanupKey, err := onPremUser(ctx, name+"-cleanup", args.ClusterName+"-node-cleanup", "node-cleanup",
		"node-cleanup", pulumi.String(cleanupPolicy), args.AutoscalerKeyRotation, tags, parent)
	if err != nil {
		return fail("node cleanup user", err)
	}
	// The controller's cache loop runs in every stack, so that the volumes of a pool whose cache is turned off, or
	// of a pool that is gone, are deleted too (cluster/internal/caches).
	keeper := volumeARNs.ApplyT(func(volumes string) (string, error) {
		return CacheKeeperPolicy(volumes, args.Region, args.ClusterName).JSON()
	}).(pulumi.StringOutput)
	if _, err := iam.NewUserPolicy(ctx, name+"-cache-keeper", &iam.UserPolicyArgs{
		User:   cleanupKey.User,
		Name:   pulumi.String("keep-cache-volumes"),
		Policy: keeper,
	}, parent); err != nil {
		return fail("cache keeper policy", err)
	}

	// The token rotator runs on-prem too. It may overwrite the one parameter and do nothing else in AWS. Its key is
	// rotated with the token: an emergency rotation also retires the key that could write the parameter.
	rotatorPolicy := parameterARN(tokenParameter).ApplyT(func(arn string) (string, error) {
		return PutParameterPolicy(arn, operatorKey).JSON()
	}).(pulumi.StringOutput)
	rotatorKey, err := onPremUser(ctx, name+"-token-rotator", args.ClusterName+"-join-token-rotator",
		"join-token-rotator", "write-join-token", rotatorPolicy, args.BootstrapTokenRotation, tags, parent)
	if err != nil {
		return fail("token rotator user", err)
	}

	// The stack's own key (identity.parameterKey create), once its principals exist: KMS refuses a key policy that
	// names a principal it cannot find. Then the join token's parameter, encrypted with it. The deployer named is
	// whoever runs this `pulumi up`: another principal's first run rewrites the policy (through the account's
	// kms:PutKeyPolicy) before it touches a parameter, which depends on the key.
	switch {
	case args.ParameterKey == config.ParameterKeyCreate:
		keyPolicy := pulumi.All(partition.Partition(), account, nodeProfile.Arn, gatewayProfile.Arn,
			rotatorKey.User, parameterARN(tokenParameter), parameterARN(GatewayKeyParameter(args.ClusterName)),
			partition.DnsSuffix(), comp.DeployerARN).ApplyT(func(v []any) (string, error) {
			p, acct := v[0].(string), v[1].(string)
			return ParameterKeyPolicy(ParameterKeyPrincipals{
				Account:  fmt.Sprintf("arn:%s:iam::%s:root", p, acct),
				Deployer: v[8].(string),
				NodeRole: v[2].(string), GatewayRole: v[3].(string),
				Rotator:        fmt.Sprintf("arn:%s:iam::%s:user/dynk8s/%s", p, acct, v[4].(string)),
				TokenParameter: v[5].(string), GatewayKeyParameter: v[6].(string),
				SSMService: fmt.Sprintf("ssm.%s.%s", args.Region, v[7].(string)),
			}).JSON()
		}).(pulumi.StringOutput)
		key, err := kms.NewKey(ctx, name+"-parameter-key", &kms.KeyArgs{
			Description:          pulumi.Sprintf("dynk8s %s: encrypts the join token and the gateway key in SSM", args.ClusterName),
			EnableKeyRotation:    pulumi.Bool(true),
			DeletionWindowInDays: pulumi.Int(30),
			Policy:               keyPolicy,
			Tags:                 tags("parameter-key"),
		}, parent, pulumi.DependsOn([]pulumi.Resource{rotatorKey}))
		if err != nil {
			return fail("parameter key", err)
		}
		if _, err := kms.NewAlias(ctx, name+"-parameter-key", &kms.AliasArgs{
			Name:        pulumi.Sprintf("alias/dynk8s/%s/parameters", args.ClusterName),
			TargetKeyId: key.KeyId,
		}, parent); err != nil {
			return fail("parameter key alias", err)
		}
		comp.ParameterKeyARN = key.Arn
	case operatorKey != "":
		comp.ParameterKeyARN = pulumi.String(operatorKey).ToStringOutput()
	default:
		comp.ParameterKeyARN = pulumi.String("").ToStringOutput()
	}
	// The join token's parameter. Pulumi declares it, with a placeholder, and never writes it again: the rotator in
	// the cluster overwrites it with a fresh token every rotation period, so the value Pulumi last saw is stale by
	// design and must not count as a change (a second `pulumi up` after rotations shows no diff). Any other change
	// but tags would make the provider write the value again (PutParameter carries the value on every update),
	// and that value is the one in state, not the live token: the description is ignored too, and type, tier and
	// name must never change.
	tokenParam, err := ssm.NewParameter(ctx, name+"-join-token", &ssm.ParameterArgs{
		Name:        pulumi.String(tokenParameter),
		Type:        pulumi.String("SecureString"),
		Value:       pulumi.String(JoinTokenPlaceholder),
		Description: pulumi.String("dynk8s kubeadm bootstrap token (<id>.<secret>) read by joining nodes; written by the token rotator in the cluster"),
		KeyId:       parameterKeyID(comp.ParameterKeyARN),
		Tags:        tags("join-token"),
	}, parent, pulumi.IgnoreChanges([]string{"value", "description"}))
	if err != nil {
		return fail("join token parameter", err)
	}
	comp.JoinTokenParameterResource = keyedParameter{Parameter: tokenParam, key: comp.ParameterKeyARN}

	comp.NodeInstanceProfileARN = nodeProfile.Profile.Arn
	comp.GatewayInstanceProfileName = gatewayProfile.Profile.Name
	comp.NodeRoleName = nodeProfile.Role
	comp.GatewayRoleName = gatewayProfile.Role
	comp.AutoscalerAccessKeyID = autoscalerKey.ID().ToStringOutput()
	comp.AutoscalerSecretAccessKey = pulumi.ToSecret(autoscalerKey.Secret).(pulumi.StringOutput)
	comp.CleanupAccessKeyID = cleanupKey.ID().ToStringOutput()
	comp.CleanupUserName = cleanupKey.User
	comp.CleanupSecretAccessKey = pulumi.ToSecret(cleanupKey.Secret).(pulumi.StringOutput)
	comp.TokenRotatorAccessKeyID = rotatorKey.ID().ToStringOutput()
	comp.TokenRotatorSecretAccessKey = pulumi.ToSecret(rotatorKey.Secret).(pulumi.StringOutput)
	comp.JoinTokenParameter = pulumi.String(tokenParameter).ToStringOutput()
	if err := ctx.RegisterResourceOutputs(comp, pulumi.Map{
		"nodeInstanceProfileArn":      comp.NodeInstanceProfileARN,
		"gatewayInstanceProfileName":  comp.GatewayInstanceProfileName,
		"nodeRoleName":                comp.NodeRoleName,
		"gatewayRoleName":             comp.GatewayRoleName,
		"autoscalerAccessKeyId":       comp.AutoscalerAccessKeyID,
		"autoscalerSecretAccessKey":   comp.AutoscalerSecretAccessKey,
		"cleanupAccessKeyId":          comp.CleanupAccessKeyID,
		"cleanupSecretAccessKey":      comp.CleanupSecretAccessKey,
		"tokenRotatorAccessKeyId":     comp.TokenRotatorAccessKeyID,
		"tokenRotatorSecretAccessKey": comp.TokenRotatorSecretAccessKey,
		"joinTokenParameter":          comp.JoinTokenParameter,
		"parameterKeyArn":             comp.ParameterKeyARN,
		"deployerArn":                 comp.DeployerARN,
	}); err != nil {
		return fail("outputs", err)
	}
	return comp, nil
}

// keyedParameter is the join token's parameter with the key it is encrypted with (addons.KeyedParameter): the
// rotator runs after the one and writes with the other.
type keyedParameter struct {
	*ssm.Parameter
	key pulumi.StringOutput
}

// ParameterKeyID is the parameter's KMS key ARN, "" for SSM's own.
func (p keyedParameter) ParameterKeyID() pulumi.StringOutput { return p.key }

var _ addons.KeyedParameter = keyedParameter{}

// roleProfile is an instance role and its profile.
type roleProfile struct {
	Role    pulumi.StringOutput // role name
	Arn     pulumi.StringOutput
	Profile *iam.InstanceProfile
}

// instanceRole declares a role only EC2 may assume, allowed to read exactly one SSM parameter, and its profile.
func instanceRole(ctx *pulumi.Context, name, iamName string, service pulumi.StringOutput, parameterARN pulumi.StringOutput,
	keyARN string, tags pulumi.StringMap, opts ...pulumi.ResourceOption) (*roleProfile, error) {
	trust := service.ApplyT(func(s string) (string, error) { return AssumeRolePolicy(s).JSON() }).(pulumi.StringOutput)
	role, err := iam.NewRole(ctx, name+"-role", &iam.RoleArgs{
		Name:             pulumi.String(iamName),
		Path:             pulumi.String("/dynk8s/"),
		AssumeRolePolicy: trust,
		Tags:             tags,
	}, opts...)
	if err != nil {
		return nil, err
	}
	read := parameterARN.ApplyT(func(arn string) (string, error) { return ReadParameterPolicy(arn, keyARN).JSON() }).(pulumi.StringOutput)
	if _, err := iam.NewRolePolicy(ctx, name+"-read-parameter", &iam.RolePolicyArgs{
		Role:   role.Name,
		Name:   pulumi.String("read-own-parameter"),
		Policy: read,
	}, opts...); err != nil {
		return nil, err
	}
	profile, err := iam.NewInstanceProfile(ctx, name+"-profile", &iam.InstanceProfileArgs{
		Name: pulumi.String(iamName),
		Path: pulumi.String("/dynk8s/"),
		Role: role.Name,
		Tags: tags,
	}, opts...)
	if err != nil {
		return nil, err
	}
	return &roleProfile{Role: role.Name, Arn: role.Arn, Profile: profile}, nil
}

// onPremUser declares an IAM user for a workload that runs on-prem (tagged as the stack's tagName), with one inline
// policy (its JSON) and one access key. The rotation value is part of the key's name: a new value declares a new
// key, which Pulumi creates (and the cluster's Secret switches to) before it deletes the old one.
func onPremUser(ctx *pulumi.Context, name, iamName, tagName, policyName string, policy pulumi.StringInput,
	rotation string, tags func(string) pulumi.StringMap, opts ...pulumi.ResourceOption) (*iam.AccessKey, error) {
	user, err := iam.NewUser(ctx, name, &iam.UserArgs{
		Name: pulumi.String(iamName),
		Path: pulumi.String("/dynk8s/"),
		Tags: tags(tagName),
	}, opts...)
	if err != nil {
		return nil, err
	}
	if _, err := iam.NewUserPolicy(ctx, name, &iam.UserPolicyArgs{
		User:   user.Name,
		Name:   pulumi.String(policyName),
		Policy: policy,
	}, opts...); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	key, err := iam.NewAccessKey(ctx, name+"-key-"+rotation, &iam.AccessKeyArgs{
		User: user.Name,
	}, append(opts, pulumi.AdditionalSecretOutputs([]string{"secret"}))...)
	if err != nil {
		return nil, fmt.Errorf("access key: %w", err)
	}
	return key, nil
}
