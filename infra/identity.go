package infra

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/iam"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ssm"
	"github.com/pulumi/pulumi-random/sdk/v4/go/random"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
)

// IdentityType is the type token of the Identity component.
const IdentityType = "dynk8s:infra:Identity"

// JoinTokenParameter is the SSM SecureString that holds "<token-id>.<token-secret>" for the nodes of a cluster.
func JoinTokenParameter(clusterName string) string { return "/dynk8s/" + clusterName + "/join-token" }

// GatewayKeyParameter is the SSM SecureString that holds the WireGuard gateway's private key.
func GatewayKeyParameter(clusterName string) string {
	return "/dynk8s/" + clusterName + "/wireguard-gateway-key"
}

// Identity holds who may do what: the node and gateway roles (each may read exactly one SSM parameter), the
// Cluster Autoscaler's IAM user (it runs on-prem, outside AWS, so it needs a key) and the join token.
type Identity struct {
	pulumi.ResourceState

	NodeInstanceProfileARN     pulumi.StringOutput `pulumi:"nodeInstanceProfileArn"`
	GatewayInstanceProfileName pulumi.StringOutput `pulumi:"gatewayInstanceProfileName"`
	AutoscalerAccessKeyID      pulumi.StringOutput `pulumi:"autoscalerAccessKeyId"`
	// AutoscalerSecretAccessKey is secret.
	AutoscalerSecretAccessKey pulumi.StringOutput `pulumi:"autoscalerSecretAccessKey"`
	// BootstrapTokenID is the public half of the join token.
	BootstrapTokenID pulumi.StringOutput `pulumi:"bootstrapTokenId"`
	// BootstrapTokenSecret is secret.
	BootstrapTokenSecret pulumi.StringOutput `pulumi:"bootstrapTokenSecret"`
	// JoinTokenParameter is the SSM parameter name the nodes read the token from.
	JoinTokenParameter pulumi.StringOutput `pulumi:"joinTokenParameter"`
}

// IdentityArgs are the inputs of Identity: plain decisions from the validated config.
type IdentityArgs struct {
	// ClusterName prefixes IAM names and scopes the autoscaler's write permission (required).
	ClusterName string
	// Region is where the SSM parameters live (required).
	Region string
	// AutoscalerKeyRotation: a new value makes a new autoscaler access key, created before the old one is deleted
	// (required).
	AutoscalerKeyRotation string
	// BootstrapTokenRotation: a new value makes a new join token (required).
	BootstrapTokenRotation string
}

// NewIdentity declares the roles, the autoscaler's user and key, and the join token with its SSM parameter.
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
		return pulumi.Sprintf("arn:%s:ssm:%s:%s:parameter/%s", partition.Partition(), args.Region, account,
			strings.TrimPrefix(parameter, "/"))
	}
	ec2Service := pulumi.Sprintf("ec2.%s", partition.DnsSuffix())

	// The join token. Both halves come from pulumi-random; changing the rotation value replaces both, and with
	// them the SSM parameter's value and the in-cluster token Secret, in one `pulumi up`.
	keepers := pulumi.StringMap{"rotation": pulumi.String(args.BootstrapTokenRotation)}
	tokenID, err := random.NewRandomString(ctx, name+"-token-id", &random.RandomStringArgs{
		Length: pulumi.Int(6), Lower: pulumi.Bool(true), Numeric: pulumi.Bool(true),
		Upper: pulumi.Bool(false), Special: pulumi.Bool(false), Keepers: keepers,
	}, parent)
	if err != nil {
		return fail("token id", err)
	}
	tokenSecret, err := random.NewRandomString(ctx, name+"-token-secret", &random.RandomStringArgs{
		Length: pulumi.Int(16), Lower: pulumi.Bool(true), Numeric: pulumi.Bool(true),
		Upper: pulumi.Bool(false), Special: pulumi.Bool(false), Keepers: keepers,
	}, parent, pulumi.AdditionalSecretOutputs([]string{"result"}))
	if err != nil {
		return fail("token secret", err)
	}
	secret := pulumi.ToSecret(tokenSecret.Result).(pulumi.StringOutput)
	tokenParameter := JoinTokenParameter(args.ClusterName)
	if _, err := ssm.NewParameter(ctx, name+"-join-token", &ssm.ParameterArgs{
		Name:        pulumi.String(tokenParameter),
		Type:        pulumi.String("SecureString"),
		Value:       pulumi.Sprintf("%s.%s", tokenID.Result, secret),
		Description: pulumi.String("dynk8s kubeadm bootstrap token (<id>.<secret>) read by joining nodes"),
		Tags:        tags("join-token"),
	}, parent); err != nil {
		return fail("join token parameter", err)
	}

	nodeProfile, err := instanceRole(ctx, name+"-node", args.ClusterName+"-node", ec2Service,
		parameterARN(tokenParameter), tags("node"), parent)
	if err != nil {
		return fail("node role", err)
	}
	gatewayProfile, err := instanceRole(ctx, name+"-gateway", args.ClusterName+"-gateway", ec2Service,
		parameterARN(GatewayKeyParameter(args.ClusterName)), tags("gateway"), parent)
	if err != nil {
		return fail("gateway role", err)
	}

	// The Cluster Autoscaler runs on-prem, so it cannot assume a role from instance metadata: it gets a user.
	autoscalerPolicy, err := AutoscalerPolicy(args.ClusterName).JSON()
	if err != nil {
		return fail("autoscaler policy", err)
	}
	user, err := iam.NewUser(ctx, name+"-autoscaler", &iam.UserArgs{
		Name: pulumi.String(args.ClusterName + "-cluster-autoscaler"),
		Path: pulumi.String("/dynk8s/"),
		Tags: tags("cluster-autoscaler"),
	}, parent)
	if err != nil {
		return fail("autoscaler user", err)
	}
	if _, err := iam.NewUserPolicy(ctx, name+"-autoscaler", &iam.UserPolicyArgs{
		User:   user.Name,
		Name:   pulumi.String("cluster-autoscaler"),
		Policy: pulumi.String(autoscalerPolicy),
	}, parent); err != nil {
		return fail("autoscaler user policy", err)
	}
	// The rotation value is part of the key's name: a new value declares a new key, which Pulumi creates (and the
	// cluster's Secret switches to) before it deletes the old one.
	key, err := iam.NewAccessKey(ctx, name+"-autoscaler-key-"+args.AutoscalerKeyRotation, &iam.AccessKeyArgs{
		User: user.Name,
	}, parent, pulumi.AdditionalSecretOutputs([]string{"secret"}))
	if err != nil {
		return fail("autoscaler access key", err)
	}

	comp.NodeInstanceProfileARN = nodeProfile.Profile.Arn
	comp.GatewayInstanceProfileName = gatewayProfile.Profile.Name
	comp.AutoscalerAccessKeyID = key.ID().ToStringOutput()
	comp.AutoscalerSecretAccessKey = pulumi.ToSecret(key.Secret).(pulumi.StringOutput)
	comp.BootstrapTokenID = tokenID.Result
	comp.BootstrapTokenSecret = secret
	comp.JoinTokenParameter = pulumi.String(tokenParameter).ToStringOutput()
	if err := ctx.RegisterResourceOutputs(comp, pulumi.Map{
		"nodeInstanceProfileArn":     comp.NodeInstanceProfileARN,
		"gatewayInstanceProfileName": comp.GatewayInstanceProfileName,
		"autoscalerAccessKeyId":      comp.AutoscalerAccessKeyID,
		"autoscalerSecretAccessKey":  comp.AutoscalerSecretAccessKey,
		"bootstrapTokenId":           comp.BootstrapTokenID,
		"bootstrapTokenSecret":       comp.BootstrapTokenSecret,
		"joinTokenParameter":         comp.JoinTokenParameter,
	}); err != nil {
		return fail("outputs", err)
	}
	return comp, nil
}

// roleProfile is an instance role and its profile.
type roleProfile struct {
	Role    pulumi.StringOutput // role name
	Profile *iam.InstanceProfile
}

// instanceRole declares a role only EC2 may assume, allowed to read exactly one SSM parameter, and its profile.
func instanceRole(ctx *pulumi.Context, name, iamName string, service pulumi.StringOutput, parameterARN pulumi.StringOutput,
	tags pulumi.StringMap, opts ...pulumi.ResourceOption) (*roleProfile, error) {
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
	read := parameterARN.ApplyT(func(arn string) (string, error) { return ReadParameterPolicy(arn).JSON() }).(pulumi.StringOutput)
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
	return &roleProfile{Role: role.Name, Profile: profile}, nil
}
