package infra

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/cloudwatch"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ssm"
	"github.com/pulumi/pulumi-random/sdk/v4/go/random"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumix"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/wireguard"
)

// WireGuardGatewayType is the type token of the WireGuardGateway component.
const WireGuardGatewayType = "dynk8s:infra:WireGuardGateway"

// Constants of the tunnel.
const (
	gatewayVolumeGiB = 10
	// onPremKeyFile is where the on-prem host keeps its own private key when it brings its own key pair.
	onPremKeyFile = "/etc/wireguard/dynk8s.key"
)

// WireGuardGateway is the EC2 instance that carries the site-to-site tunnel between the VPC and the on-prem
// network. Its keys, interface and Elastic IP outlive the instance: a replaced, rebooted or auto-recovered gateway
// comes back with the same address and the same identity, and the on-prem peer reconnects by itself.
type WireGuardGateway struct {
	pulumi.ResourceState

	PublicIP pulumi.StringOutput `pulumi:"publicIp"`
	// PublicKey is the gateway's WireGuard public key (not secret).
	PublicKey  pulumi.StringOutput `pulumi:"publicKey"`
	InstanceID pulumi.StringOutput `pulumi:"instanceId"`
	// OnPremConfig is the complete wg-quick file for the on-prem peer (secret: it may hold the peer's private key).
	OnPremConfig pulumi.StringOutput `pulumi:"onPremConfig"`
}

// WireGuardGatewayArgs are the inputs of a WireGuardGateway.
type WireGuardGatewayArgs struct {
	// ClusterName names and tags the gateway's resources and its key parameter (required).
	ClusterName string
	// Region is the gateway's region, for its alarm's reboot action (required).
	Region string
	// InstanceType is the gateway's EC2 type (required).
	InstanceType string
	// Image is the Fedora image it boots (required).
	Image FedoraImageQuery
	// WireGuard is the validated tunnel config (required).
	WireGuard config.WireGuard
	// VPCCIDR is the range the on-prem peer routes to the gateway (required).
	VPCCIDR netip.Prefix
	// InterfaceID is the gateway's network interface from the Network (required).
	InterfaceID pulumi.StringInput
	// InternetGateway is the VPC's internet gateway (required): the Elastic IP waits for it.
	InternetGateway pulumi.Resource
	// InstanceProfileName is the gateway's instance profile, allowed to read only the key parameter (required).
	InstanceProfileName pulumi.StringInput
}

// TunnelAddresses are the gateway's and the on-prem peer's tunnel addresses: the first two hosts of the tunnel's
// range (config refuses a range too small for them).
func TunnelAddresses(tunnel netip.Prefix) (gateway, onPrem netip.Prefix) {
	first := tunnel.Masked().Addr().Next()
	return netip.PrefixFrom(first, tunnel.Bits()), netip.PrefixFrom(first.Next(), tunnel.Bits())
}

// NewWireGuardGateway declares the gateway: its keys, the key's SSM parameter, the instance and its Elastic IP.
func NewWireGuardGateway(ctx *pulumi.Context, name string, args *WireGuardGatewayArgs, opts ...pulumi.ResourceOption) (*WireGuardGateway, error) {
	if args == nil || args.InternetGateway == nil {
		return nil, errors.New("wireguard gateway: args and args.InternetGateway are required")
	}
	wg := args.WireGuard
	comp := &WireGuardGateway{}
	if err := ctx.RegisterComponentResource(WireGuardGatewayType, name, comp, opts...); err != nil {
		return nil, err
	}
	parent := pulumi.Parent(comp)
	fail := func(what string, err error) (*WireGuardGateway, error) {
		return nil, fmt.Errorf("wireguard gateway %q: %s: %w", name, what, err)
	}
	gatewayAddr, onPremAddr := TunnelAddresses(wg.TunnelCIDR)
	tags := awsTags(config.IdentityTags(args.ClusterName, "", args.ClusterName+"-wireguard-gateway"))

	gatewayKey, err := newKeyPair(ctx, name+"-key", parent)
	if err != nil {
		return fail("key", err)
	}
	keyParameter := GatewayKeyParameter(args.ClusterName)
	param, err := ssm.NewParameter(ctx, name+"-key", &ssm.ParameterArgs{
		Name:        pulumi.String(keyParameter),
		Type:        pulumi.String("SecureString"),
		Value:       gatewayKey.Private,
		Description: pulumi.String("dynk8s WireGuard gateway private key, read by the gateway at boot"),
		Tags:        awsTags(config.IdentityTags(args.ClusterName, "", args.ClusterName+"-wireguard-gateway-key")),
	}, parent)
	if err != nil {
		return fail("key parameter", err)
	}

	// The on-prem peer's key pair: generated here unless the operator brings a public key (and keeps the private
	// key on the on-prem host, where the rendered config reads it from a file).
	var onPremPublic, onPremPrivate pulumi.StringOutput
	if wg.OnPremPublicKey != nil {
		onPremPublic = pulumi.String(wg.OnPremPublicKey.String()).ToStringOutput()
		onPremPrivate = pulumi.String("").ToStringOutput()
	} else {
		pair, err := newKeyPair(ctx, name+"-onprem-key", parent)
		if err != nil {
			return fail("on-prem key", err)
		}
		onPremPublic, onPremPrivate = pair.Public, pair.Private
	}

	peerAllowed := append(slices.Clone(wg.OnPremCIDRs), netip.PrefixFrom(onPremAddr.Addr(), 32))
	peerEndpoint := ""
	if wg.OnPremEndpoint != nil {
		peerEndpoint = wg.OnPremEndpoint.String()
	}
	userData := onPremPublic.ApplyT(func(peerKey string) (string, error) {
		raw, err := cloudinit.Gateway(cloudinit.GatewayInput{
			ListenPort:          wg.ListenPort,
			MTU:                 wg.MTU,
			TunnelAddress:       gatewayAddr,
			PeerPublicKey:       peerKey,
			PeerAllowedIPs:      peerAllowed,
			PeerEndpoint:        peerEndpoint,
			PrivateKeyParameter: keyParameter,
		})
		if err != nil {
			return "", fmt.Errorf("wireguard gateway %q: user data: %w", name, err)
		}
		return cloudinit.Encode(raw)
	}).(pulumi.StringOutput)

	image := lookupImage(ctx, args.Image, "", parent)
	eip, err := ec2.NewEip(ctx, name+"-eip", &ec2.EipArgs{
		Domain:           pulumi.String("vpc"),
		NetworkInterface: args.InterfaceID,
		Tags:             tags,
		// An Elastic IP may need the internet gateway attached before it associates (pulumi-aws ec2.Eip docs).
	}, parent, pulumi.DependsOn([]pulumi.Resource{args.InternetGateway}))
	if err != nil {
		return fail("elastic ip", err)
	}

	instance, err := ec2.NewInstance(ctx, name, &ec2.InstanceArgs{
		Ami:          image.Id(),
		InstanceType: pulumi.String(args.InstanceType),
		// Source/destination check is off on this interface (see Network): it forwards for the whole VPC.
		NetworkInterfaces: ec2.InstanceNetworkInterfaceArray{&ec2.InstanceNetworkInterfaceArgs{
			DeviceIndex: pulumi.Int(0), NetworkInterfaceId: args.InterfaceID,
		}},
		IamInstanceProfile: args.InstanceProfileName,
		MetadataOptions: &ec2.InstanceMetadataOptionsArgs{
			HttpEndpoint:            pulumi.String("enabled"),
			HttpTokens:              pulumi.String("required"),
			HttpPutResponseHopLimit: pulumi.Int(1),
		},
		RootBlockDevice: &ec2.InstanceRootBlockDeviceArgs{
			VolumeType:          pulumi.String("gp3"),
			VolumeSize:          pulumi.Int(gatewayVolumeGiB),
			Encrypted:           pulumi.Bool(true),
			DeleteOnTermination: pulumi.Bool(true),
		},
		UserDataBase64: userData,
		// cloud-init runs once per instance: a changed tunnel config needs a new instance to take effect. The
		// interface, address and keys survive the replacement.
		UserDataReplaceOnChange: pulumi.Bool(true),
		MaintenanceOptions:      &ec2.InstanceMaintenanceOptionsArgs{AutoRecovery: pulumi.String("default")},
		Tags:                    tags,
		VolumeTags:              tags,
	}, parent,
		// The interface it boots with is the only one of its address: a replacement must release it first, which
		// costs the tunnel the minutes of a new boot (README, "On-prem side").
		pulumi.DeleteBeforeReplace(true),
		// An instance booted on an existing interface gets no public address of its own: it must boot with the
		// Elastic IP, which its package install and the SSM key fetch need.
		pulumi.DependsOn([]pulumi.Resource{param, eip}))
	if err != nil {
		return fail("instance", err)
	}

	// EC2 automatic recovery acts on a failed host (the system status check); a hung guest fails the instance
	// status check instead, and only a reboot brings it back (EC2 alarm actions, "Reboot").
	partition := aws.GetPartitionOutput(ctx, aws.GetPartitionOutputArgs{}, parent).Partition()
	if _, err := cloudwatch.NewMetricAlarm(ctx, name+"-status", &cloudwatch.MetricAlarmArgs{
		AlarmDescription:   pulumi.String("dynk8s WireGuard gateway: reboot when the instance status check fails"),
		Namespace:          pulumi.String("AWS/EC2"),
		MetricName:         pulumi.String("StatusCheckFailed_Instance"),
		Dimensions:         pulumi.StringMap{"InstanceId": instance.ID()},
		Statistic:          pulumi.String("Maximum"),
		Period:             pulumi.Int(60),
		EvaluationPeriods:  pulumi.Int(3),
		ComparisonOperator: pulumi.String("GreaterThanOrEqualToThreshold"),
		Threshold:          pulumi.Float64(1),
		AlarmActions:       pulumi.Array{pulumi.Sprintf("arn:%s:automate:%s:ec2:reboot", partition, args.Region)},
		Tags:               tags,
	}, parent); err != nil {
		return fail("status alarm", err)
	}

	onPremConfig := pulumix.Apply3Err(onPremPrivate, gatewayKey.Public, eip.PublicIp,
		func(private, gatewayPublic, gatewayIP string) (string, error) {
			return onPremWireGuardConfig(wg, args.VPCCIDR, private, gatewayPublic, gatewayIP)
		}).Untyped().(pulumi.StringOutput)

	comp.PublicIP = eip.PublicIp
	comp.PublicKey = gatewayKey.Public
	comp.InstanceID = instance.ID().ToStringOutput()
	comp.OnPremConfig = pulumi.ToSecret(onPremConfig).(pulumi.StringOutput)
	if err := ctx.RegisterResourceOutputs(comp, pulumi.Map{
		"publicIp":     comp.PublicIP,
		"publicKey":    comp.PublicKey,
		"instanceId":   comp.InstanceID,
		"onPremConfig": comp.OnPremConfig,
	}); err != nil {
		return fail("outputs", err)
	}
	return comp, nil
}

// onPremWireGuardConfig renders the on-prem peer's wg-quick file. With a generated key pair it carries the private
// key; with the operator's own key it reads the key from onPremKeyFile instead.
func onPremWireGuardConfig(wg config.WireGuard, vpc netip.Prefix, privateKey, gatewayPublicKey, gatewayIP string) (string, error) {
	gatewayAddr, onPremAddr := TunnelAddresses(wg.TunnelCIDR)
	iface := wireguard.Interface{
		PrivateKey: privateKey,
		Address:    []string{onPremAddr.String()},
		MTU:        wg.MTU,
	}
	if privateKey == "" {
		iface.PostUp = []string{"wg set %i private-key " + onPremKeyFile}
	}
	if wg.OnPremEndpoint != nil {
		iface.ListenPort = int(wg.OnPremEndpoint.Port)
	}
	out, err := wireguard.Config{
		Interface: iface,
		Peers: []wireguard.Peer{{
			PublicKey: gatewayPublicKey,
			// The VPC, and the gateway's own tunnel address.
			AllowedIPs:          []string{vpc.String(), netip.PrefixFrom(gatewayAddr.Addr(), 32).String()},
			Endpoint:            net.JoinHostPort(gatewayIP, strconv.Itoa(wg.ListenPort)),
			PersistentKeepalive: wireguard.PersistentKeepalive,
		}},
	}.Marshal()
	if err != nil {
		return "", fmt.Errorf("on-prem wireguard config: %w", err)
	}
	return string(out), nil
}

// keyPair is a WireGuard key pair generated by the stack.
type keyPair struct {
	Private pulumi.StringOutput // secret
	Public  pulumi.StringOutput // not secret
}

// newKeyPair draws 32 random bytes with pulumi-random (kept secret in state) and derives the key pair in Go.
func newKeyPair(ctx *pulumi.Context, name string, opts ...pulumi.ResourceOption) (*keyPair, error) {
	raw, err := random.NewRandomBytes(ctx, name, &random.RandomBytesArgs{Length: pulumi.Int(32)}, opts...)
	if err != nil {
		return nil, err
	}
	private := raw.Base64.ApplyT(wireguard.PrivateKeyFromBytes).(pulumi.StringOutput)
	public := private.ApplyT(wireguard.PublicKey).(pulumi.StringOutput)
	return &keyPair{
		Private: pulumi.ToSecret(private).(pulumi.StringOutput),
		// A public key derived from a secret is itself secret to Pulumi; it is meant to be published.
		Public: pulumi.Unsecret(public).(pulumi.StringOutput),
	}, nil
}
