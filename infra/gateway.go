package infra

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/cloudwatch"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/iam"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ssm"
	"github.com/pulumi/pulumi-random/sdk/v4/go/random"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/wireguard"
)

// WireGuardGatewayType is the type token of the WireGuardGateway component.
const WireGuardGatewayType = "dynk8s:infra:WireGuardGateway"

// Constants of the tunnel.
const (
	// onPremKeyFile is where the on-prem host keeps its own private key when it brings its own key pair.
	onPremKeyFile = "/etc/wireguard/dynk8s.key"
)

// WireGuardGateway is the EC2 instance that carries the site-to-site tunnel between the VPC and the on-prem
// network, and the VPC routes to it. Its keys (and, when on-prem dials in, its Elastic IP) outlive the instance: a
// replaced, rebooted, stopped or auto-recovered gateway comes back with the same identity and private address, and
// the tunnel comes back by itself.
//
// With gateway.idleStop the gateway stops itself when the pools are empty and the tunnel quiet, and the first node
// that boots starts it again (the node agent's gateway-idle and wake-gateway). The instance then has no public address
// that bills while it is stopped: when the gateway dials out, its address is the one EC2 assigns at each start (its
// subnet maps one on launch), and WireGuard's roaming takes the on-prem peer to it. Only a dialling-in on-prem peer
// needs the fixed address of an Elastic IP, which bills while the gateway is stopped.
//
// The routes point at the instance's own primary network interface: it keeps its ID and address through every stop
// and start, and a replacement instance's new interface updates the routes in place. (An interface created before
// the instance cannot get an address EC2 assigns at launch, which dialling out without an Elastic IP needs: the
// public IPv4 "can only be assigned to a new network interface, not an existing one", EC2 API reference,
// InstanceNetworkInterfaceSpecification.AssociatePublicIpAddress.)
type WireGuardGateway struct {
	pulumi.ResourceState

	// PublicIP is the Elastic IP the on-prem peer dials; empty when the gateway dials out (its address changes with
	// every start).
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
	// IdleStop is how long the pools may be empty and the tunnel quiet before the gateway stops itself; 0 keeps it
	// running (optional).
	IdleStop time.Duration
	// SubnetID, SecurityGroupID and PrivateIP place the instance's own interface (required).
	SubnetID        pulumi.StringInput
	SecurityGroupID pulumi.StringInput
	PrivateIP       string
	// RouteTableID is the VPC's route table; RoutedCIDRs the ranges it sends to the gateway (required).
	RouteTableID pulumi.StringInput
	RoutedCIDRs  []netip.Prefix
	// Internet are what the instance needs to reach the internet at boot, and the Elastic IP to associate (required).
	Internet []pulumi.Resource
	// InstanceProfileName is the gateway's instance profile (required); GatewayRoleName its role, which may read
	// only the key parameter, and with IdleStop also list instances (required with IdleStop).
	InstanceProfileName pulumi.StringInput
	GatewayRoleName     pulumi.StringInput
	// NodeRoleName is the pool nodes' role, which with IdleStop may start this instance and no other (required
	// with IdleStop).
	NodeRoleName pulumi.StringInput
	// WakerUserName is the IAM user whose key dynk8s-controller calls EC2 with, which with IdleStop may start this
	// instance and no other too, at the autoscaler's scale-up decision (optional: nil, only the nodes wake it).
	WakerUserName pulumi.StringInput
	// ParameterKeyARN is the KMS key of its key's SecureString ("" or unset: SSM's own; identity.parameterKey).
	ParameterKeyARN pulumi.StringInput
	// Forward limits what the gateway forwards from the VPC toward on-prem (optional; nil: everything).
	Forward *cloudinit.GatewayForward
	// AddressReservation keeps PrivateIP from EC2's automatic assignment (optional): the instance is created after it.
	AddressReservation pulumi.Resource
	// FormerRouteParent is the component that declared the routes to on-prem before the gateway did, as
	// <its name>-route-<cidr> (optional): each route keeps that URN as an alias, so a stack of that layout updates its
	// routes in place rather than creating them beside the old ones (EC2: RouteAlreadyExists).
	FormerRouteParent pulumi.Resource
	// FormerRouteParentName is that component's name.
	FormerRouteParentName string
	// Agent is the node agent's object for the gateway's architecture (AgentBucket.Objects; required): the
	// gateway's key, packages and idle check are its commands.
	Agent AgentObject
}

// TunnelAddresses are the gateway's and the on-prem peer's tunnel addresses: the first two hosts of the tunnel's
// range (config refuses a range too small for them).
func TunnelAddresses(tunnel netip.Prefix) (gateway, onPrem netip.Prefix) {
	first := tunnel.Masked().Addr().Next()
	return netip.PrefixFrom(first, tunnel.Bits()), netip.PrefixFrom(first.Next(), tunnel.Bits())
}

// NewWireGuardGateway declares the gateway: its keys, the key's SSM parameter, the instance and its Elastic IP.
func NewWireGuardGateway(ctx *pulumi.Context, name string, args *WireGuardGatewayArgs, opts ...pulumi.ResourceOption) (*WireGuardGateway, error) {
	if args == nil || len(args.Internet) == 0 || len(args.RoutedCIDRs) == 0 || args.Agent.Key == "" {
		return nil, errors.New("wireguard gateway: args, args.Internet, args.RoutedCIDRs and args.Agent are required")
	}
	if args.IdleStop > 0 && (args.GatewayRoleName == nil || args.NodeRoleName == nil) {
		return nil, errors.New("wireguard gateway: an idle stop needs args.GatewayRoleName and args.NodeRoleName")
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
	gatewayName := GatewayName(args.ClusterName)
	tags := awsTags(config.IdentityTags(args.ClusterName, "", gatewayName))

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
		KeyId:       parameterKeyID(args.ParameterKeyARN),
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
	userData := pulumix.Apply3Err(onPremPublic, args.Agent.Bucket, args.Agent.VersionID, func(peer, bucket, version string) (string, error) {
		peerKey, err := wgtypes.ParseKey(peer)
		if err != nil {
			return "", fmt.Errorf("wireguard gateway %q: the on-prem public key: %w", name, err)
		}
		raw, err := cloudinit.Gateway(cloudinit.GatewayInput{
			// The config holds both in range (validate.go: 1..65535, wireguard.MinMTU..MaxMTU).
			ListenPort:          uint16(wg.ListenPort),
			MTU:                 uint16(wg.MTU),
			TunnelAddress:       gatewayAddr,
			PeerPublicKey:       peerKey,
			PeerAllowedIPs:      peerAllowed,
			PeerEndpoint:        wg.OnPremEndpoint,
			PrivateKeyParameter: keyParameter,
			IdleStop:            args.IdleStop,
			ClusterName:         args.ClusterName,
			Forward:             args.Forward,
			Agent:               &cloudinit.Agent{Bucket: bucket, Key: args.Agent.Key, VersionID: version, SHA256: args.Agent.SHA256},
		})
		if err != nil {
			return "", fmt.Errorf("wireguard gateway %q: user data: %w", name, err)
		}
		return cloudinit.Encode(raw)
	}).Untyped().(pulumi.StringOutput)

	image := lookupImage(ctx, args.Image, "", parent)
	// The smallest root volume the image allows: its own snapshot's size. Growing it would bill GiB-months for
	// nothing; the gateway installs two small packages.
	volumeGiB := image.ApplyT(func(im ec2.LookupAmiResult) (int, error) {
		return imageVolumeGiB(im.RootDeviceName, im.BlockDeviceMappings)
	}).(pulumi.IntOutput)

	instanceTags := awsTags(append(config.IdentityTags(args.ClusterName, "", gatewayName),
		config.Tag{Key: IdleStopTag, Value: args.IdleStop.String()}))
	instance, err := ec2.NewInstance(ctx, name, &ec2.InstanceArgs{
		Ami:          image.Id(),
		InstanceType: pulumi.String(args.InstanceType),
		// Its own primary interface, with a fixed address; the subnet gives it a public IPv4 at every start.
		// associatePublicIpAddress is deliberately not set: a stopped instance reads back as false, and the
		// attribute forces a new instance, so a refresh of a stopped gateway would replace it
		// (hashicorp/terraform-provider-aws#33775).
		SubnetId:            args.SubnetID,
		PrivateIp:           pulumi.String(args.PrivateIP),
		VpcSecurityGroupIds: pulumi.StringArray{args.SecurityGroupID},
		// It forwards packets that are neither from nor to itself.
		SourceDestCheck: pulumi.Bool(false),
		// `systemctl poweroff` on the gateway stops the instance rather than terminating it (the idle stop).
		InstanceInitiatedShutdownBehavior: pulumi.String("stop"),
		IamInstanceProfile:                args.InstanceProfileName,
		MetadataOptions: &ec2.InstanceMetadataOptionsArgs{
			HttpEndpoint:            pulumi.String("enabled"),
			HttpTokens:              pulumi.String("required"),
			HttpPutResponseHopLimit: pulumi.Int(1),
		},
		RootBlockDevice: &ec2.InstanceRootBlockDeviceArgs{
			VolumeType:          pulumi.String("gp3"),
			VolumeSize:          volumeGiB,
			Encrypted:           pulumi.Bool(true),
			DeleteOnTermination: pulumi.Bool(true),
		},
		UserDataBase64: userData,
		// cloud-init runs once per instance: a changed tunnel config needs a new instance to take effect. The keys,
		// the private address and the routes survive the replacement.
		UserDataReplaceOnChange: pulumi.Bool(true),
		MaintenanceOptions:      &ec2.InstanceMaintenanceOptionsArgs{AutoRecovery: pulumi.String("default")},
		Tags:                    instanceTags,
		VolumeTags:              tags,
	}, parent,
		// Its fixed address allows one instance at a time: a replacement must terminate the old one first, which
		// costs the tunnel the minutes of a new boot (docs/networking.md, "When the gateway is replaced").
		pulumi.DeleteBeforeReplace(true),
		// Its first boot installs packages and reads its key from SSM: the parameter and the way out must exist;
		// and its address must be reserved.
		pulumi.DependsOn(launchAfter(append([]pulumi.Resource{param}, args.Internet...), args.AddressReservation)))
	if err != nil {
		return fail("instance", err)
	}
	// The interface keeps its ID through every stop and start; a replacement instance updates the routes in place.
	for _, cidr := range args.RoutedCIDRs {
		routeOpts := []pulumi.ResourceOption{parent}
		if args.FormerRouteParent != nil {
			routeOpts = append(routeOpts, pulumi.Aliases([]pulumi.Alias{{
				Name:   pulumi.String(args.FormerRouteParentName + "-route-" + routeKey(cidr)),
				Parent: args.FormerRouteParent,
			}}))
		}
		if _, err := ec2.NewRoute(ctx, name+"-route-"+routeKey(cidr), &ec2.RouteArgs{
			RouteTableId:         args.RouteTableID,
			DestinationCidrBlock: pulumi.String(cidr.String()),
			NetworkInterfaceId:   instance.PrimaryNetworkInterfaceId,
		}, routeOpts...); err != nil {
			return fail("route to "+cidr.String(), err)
		}
	}

	// A dialling-in on-prem peer needs an address that stays: an Elastic IP on the gateway's interface. It bills
	// while the gateway is stopped too, the price of dialling in. A dialling-out gateway needs none.
	publicIP := pulumi.String("").ToStringOutput()
	if wg.OnPremEndpoint == nil {
		eip, err := ec2.NewEip(ctx, name+"-eip", &ec2.EipArgs{
			Domain:           pulumi.String("vpc"),
			NetworkInterface: instance.PrimaryNetworkInterfaceId,
			Tags:             tags,
			// An Elastic IP may need the internet gateway attached before it associates (pulumi-aws ec2.Eip docs).
		}, parent, pulumi.DependsOn(args.Internet))
		if err != nil {
			return fail("elastic ip", err)
		}
		publicIP = eip.PublicIp
	}

	partition := aws.GetPartitionOutput(ctx, aws.GetPartitionOutputArgs{}, parent).Partition()
	if args.IdleStop > 0 {
		if err := sleepPolicies(ctx, name, args, instance, partition, parent); err != nil {
			return fail("idle stop", err)
		}
	}

	// EC2 automatic recovery acts on a failed host (the system status check); a hung guest fails the instance
	// status check instead, and only a reboot brings it back (EC2 alarm actions, "Reboot"). A stopped instance
	// reports no status checks, so the alarm has no data and does nothing while the gateway sleeps.
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

	onPremConfig := pulumix.Apply3Err(onPremPrivate, gatewayKey.Public, publicIP,
		func(private, gatewayPublic, gatewayIP string) (string, error) {
			return onPremWireGuardConfig(wg, args.VPCCIDR, private, gatewayPublic, gatewayIP)
		}).Untyped().(pulumi.StringOutput)

	comp.PublicIP = publicIP
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
// key; with the operator's own key it reads the key from onPremKeyFile instead. When on-prem dials in it names the
// gateway's Elastic IP and keeps the path open; when the gateway dials out, the on-prem peer listens and learns the
// gateway's address of the day from its handshakes (gatewayIP is empty), and the gateway keeps the path open.
func onPremWireGuardConfig(wg config.WireGuard, vpc netip.Prefix, privateKey, gatewayPublicKey, gatewayIP string) (string, error) {
	gatewayAddr, onPremAddr := TunnelAddresses(wg.TunnelCIDR)
	gatewayKey, err := wgtypes.ParseKey(gatewayPublicKey)
	if err != nil {
		return "", fmt.Errorf("on-prem wireguard config: the gateway's public key: %w", err)
	}
	iface := wireguard.Interface{
		Address: []netip.Prefix{onPremAddr},
		MTU:     uint16(wg.MTU), // in range: the config's wireguard.mtu
	}
	if privateKey == "" {
		iface.PostUp = []string{"wg set %i private-key " + onPremKeyFile}
	} else {
		k, err := wgtypes.ParseKey(privateKey)
		if err != nil {
			return "", errors.New("on-prem wireguard config: the on-prem private key is not a WireGuard key")
		}
		iface.PrivateKey = &k
	}
	peer := wireguard.Peer{
		PublicKey: gatewayKey,
		// The VPC, and the gateway's own tunnel address.
		AllowedIPs: []netip.Prefix{vpc, netip.PrefixFrom(gatewayAddr.Addr(), 32)},
	}
	if wg.OnPremEndpoint != nil {
		iface.ListenPort = wg.OnPremEndpoint.Port
	} else {
		peer.Endpoint = &endpoint.HostPort{Host: gatewayIP, Port: uint16(wg.ListenPort)}
		peer.PersistentKeepalive = wireguard.PersistentKeepalive
	}
	out, err := wireguard.Config{Interface: iface, Peers: []wireguard.Peer{peer}}.Marshal()
	if err != nil {
		return "", fmt.Errorf("on-prem wireguard config: %w", err)
	}
	return string(out), nil
}

// GatewayName is the gateway instance's Name tag (and its volume's, its alarm's): with names.TagCluster it is how
// the wake-up's policy, the operator's status view and the console find the stack's gateway.
func GatewayName(clusterName string) string { return clusterName + "-wireguard-gateway" }

// IdleStopTag is the gateway instance's tag that says after how long idle it stops itself ("0s": never). Operators
// see in the console why a gateway is stopped; the plan's idle bill reads it.
const IdleStopTag = "dynk8s:idleStop"

// imageVolumeGiB is the size of an image's root snapshot: the ebs volume_size of its root device's mapping (the
// aws_ami data source's map keys, terraform-provider-aws internal/service/ec2/ec2_ami.go,
// flattenAMIBlockDeviceMappings).
func imageVolumeGiB(root string, mappings []ec2.GetAmiBlockDeviceMapping) (int, error) {
	for _, m := range mappings {
		if m.DeviceName != root {
			continue
		}
		gib, err := strconv.Atoi(m.Ebs["volume_size"])
		if err != nil || gib < 1 {
			return 0, fmt.Errorf("image root device %s: no snapshot size (ebs %v)", root, m.Ebs)
		}
		return gib, nil
	}
	return 0, fmt.Errorf("image: no block device mapping for its root device %q", root)
}

// sleepPolicies let the gateway and the nodes take turns: the gateway may list instances (to see that no pool
// instance is left), and the nodes, and dynk8s-controller's user when args.WakerUserName is set, may start this
// gateway instance and no other.
func sleepPolicies(ctx *pulumi.Context, name string, args *WireGuardGatewayArgs, instance *ec2.Instance,
	partition pulumi.StringOutput, parent pulumi.ResourceOrInvokeOption) error {
	check, err := GatewayIdleCheckPolicy(args.Region).JSON()
	if err != nil {
		return err
	}
	if _, err := iam.NewRolePolicy(ctx, name+"-idle-check", &iam.RolePolicyArgs{
		Role:   args.GatewayRoleName,
		Name:   pulumi.String("list-instances-for-idle-stop"),
		Policy: pulumi.String(check),
	}, parent); err != nil {
		return err
	}
	account := aws.GetCallerIdentityOutput(ctx, aws.GetCallerIdentityOutputArgs{}, parent).AccountId()
	wake := pulumix.Apply3Err(partition, account, instance.ID().ToStringOutput(),
		func(partition, account, id string) (string, error) {
			arn := fmt.Sprintf("arn:%s:ec2:%s:%s:instance/%s", partition, args.Region, account, id)
			return WakeGatewayPolicy(arn, args.ClusterName, GatewayName(args.ClusterName)).JSON()
		})
	if _, err := iam.NewRolePolicy(ctx, name+"-wake", &iam.RolePolicyArgs{
		Role:   args.NodeRoleName,
		Name:   pulumi.String(wakePolicyName),
		Policy: pulumix.Cast[pulumi.StringOutput](wake),
	}, parent); err != nil {
		return err
	}
	if args.WakerUserName == nil {
		return nil
	}
	_, err = iam.NewUserPolicy(ctx, name+"-wake-controller", &iam.UserPolicyArgs{
		User:   args.WakerUserName,
		Name:   pulumi.String(wakePolicyName),
		Policy: pulumix.Cast[pulumi.StringOutput](wake),
	}, parent)
	return err
}

// wakePolicyName names the inline policy that lets its role or user start the gateway.
const wakePolicyName = "start-the-wireguard-gateway"

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

// launchAfter is deps and, when set, the reservation of the address a launch may need.
func launchAfter(deps []pulumi.Resource, reservation pulumi.Resource) []pulumi.Resource {
	if reservation == nil {
		return deps
	}
	return append(deps, reservation)
}

// parameterKeyID is a SecureString's KeyId: the key's ARN, or nil for SSM's own key (an empty KeyId is not the same
// to the provider as none).
func parameterKeyID(arn pulumi.StringInput) pulumi.StringPtrInput {
	if arn == nil {
		return nil
	}
	return arn.ToStringOutput().ApplyT(func(a string) *string {
		if a == "" {
			return nil
		}
		return &a
	}).(pulumi.StringPtrOutput)
}
