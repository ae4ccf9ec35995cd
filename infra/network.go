package infra

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
)

// NetworkType is the type token of the Network component.
const NetworkType = "dynk8s:infra:Network"

// Network is the stack's VPC: one public subnet per zone (nodes egress through the internet gateway with their own
// public IPv4, so there is no NAT gateway to pay for), one route table (the WireGuard gateway adds the routes of the
// on-prem ranges and the tunnel's range to its own interface), and the security groups of nodes and gateway.
type Network struct {
	pulumi.ResourceState

	VPCID                  pulumi.StringOutput      `pulumi:"vpcId"`
	SubnetIDs              pulumi.StringArrayOutput `pulumi:"subnetIds"`
	NodeSecurityGroupID    pulumi.StringOutput      `pulumi:"nodeSecurityGroupId"`
	GatewaySecurityGroupID pulumi.StringOutput      `pulumi:"gatewaySecurityGroupId"`
	// RouteTableID is the subnets' route table, where the gateway routes the on-prem ranges to itself.
	RouteTableID pulumi.StringOutput `pulumi:"routeTableId"`
	// GatewaySubnetID is the first zone's subnet, where the gateway runs.
	GatewaySubnetID pulumi.StringOutput `pulumi:"gatewaySubnetId"`
	// GatewayAddress reserves the gateway's fixed address in that subnet: the gateway and the groups depend on it,
	// so nothing launches there before it exists.
	GatewayAddress pulumi.Resource
	// InternetGatewayID is the VPC's internet gateway: public addresses need it attached first.
	InternetGatewayID pulumi.StringOutput `pulumi:"internetGatewayId"`
	// Internet are the resources an instance in the gateway's subnet needs to reach the internet (the internet
	// gateway, the default route, the subnet's route table association), for dependsOn.
	Internet []pulumi.Resource
	// OnPremCIDRs are the ranges the VPC sends through the tunnel: the on-prem ranges and the tunnel's own.
	OnPremCIDRs []netip.Prefix
}

// NetworkArgs are the inputs of a Network. All are plain decisions from the validated config.
type NetworkArgs struct {
	// ClusterName tags every resource (required).
	ClusterName string
	// VPCCIDR is the VPC's range (required).
	VPCCIDR netip.Prefix
	// Zones are the availability zone names, one subnet each (required, at least one).
	Zones []string
	// OnPremCIDRs are routed to the gateway interface, as is TunnelCIDR (required).
	OnPremCIDRs []netip.Prefix
	// TunnelCIDR is the WireGuard tunnel's range; nodes accept traffic from it like from on-prem (required).
	TunnelCIDR netip.Prefix
	// ListenPort is the gateway's WireGuard UDP port (required).
	ListenPort int
	// WireGuardSource limits who may reach the WireGuard port (optional; zero: 0.0.0.0/0, as an on-prem peer
	// behind NAT dials out from an address nobody knows in advance).
	WireGuardSource netip.Prefix
}

// NewNetwork declares the VPC and everything routed in it.
func NewNetwork(ctx *pulumi.Context, name string, args *NetworkArgs, opts ...pulumi.ResourceOption) (*Network, error) {
	if args == nil {
		return nil, errors.New("network: args are required")
	}
	if len(args.Zones) == 0 {
		return nil, errors.New("network: at least one zone is required")
	}
	comp := &Network{}
	if err := ctx.RegisterComponentResource(NetworkType, name, comp, opts...); err != nil {
		return nil, err
	}
	parent := pulumi.Parent(comp)
	tags := func(suffix string) pulumi.StringMap {
		return awsTags(config.IdentityTags(args.ClusterName, "", args.ClusterName+"-"+suffix))
	}

	vpc, err := ec2.NewVpc(ctx, name+"-vpc", &ec2.VpcArgs{
		CidrBlock:          pulumi.String(args.VPCCIDR.String()),
		EnableDnsSupport:   pulumi.Bool(true),
		EnableDnsHostnames: pulumi.Bool(true),
		Tags:               tags("vpc"),
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("network %q: vpc: %w", name, err)
	}
	igw, err := ec2.NewInternetGateway(ctx, name+"-igw", &ec2.InternetGatewayArgs{
		VpcId: vpc.ID(),
		Tags:  tags("igw"),
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("network %q: internet gateway: %w", name, err)
	}
	rt, err := ec2.NewRouteTable(ctx, name+"-rt", &ec2.RouteTableArgs{
		VpcId: vpc.ID(),
		Tags:  tags("rt"),
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("network %q: route table: %w", name, err)
	}
	defaultRoute, err := ec2.NewRoute(ctx, name+"-route-default", &ec2.RouteArgs{
		RouteTableId:         rt.ID(),
		DestinationCidrBlock: pulumi.String("0.0.0.0/0"),
		GatewayId:            igw.ID(),
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("network %q: default route: %w", name, err)
	}
	comp.Internet = []pulumi.Resource{igw, defaultRoute}

	var subnetIDs pulumi.StringArray
	var firstSubnet *ec2.Subnet
	for _, zone := range args.Zones {
		cidr, err := ZoneSubnet(args.VPCCIDR, zone)
		if err != nil {
			return nil, fmt.Errorf("network %q: %w", name, err)
		}
		// Keyed by zone name, with a CIDR chosen by the zone's letter: reordering or extending the zone list never
		// renumbers an existing subnet.
		subnet, err := ec2.NewSubnet(ctx, name+"-subnet-"+zone, &ec2.SubnetArgs{
			VpcId:               vpc.ID(),
			AvailabilityZone:    pulumi.String(zone),
			CidrBlock:           pulumi.String(cidr.String()),
			MapPublicIpOnLaunch: pulumi.Bool(true),
			// Hostnames, and so Node names, are instance ids: never reused, unlike a private address, so a new
			// instance never meets the stale Node of an old one.
			PrivateDnsHostnameTypeOnLaunch: pulumi.String("resource-name"),
			Tags:                           tags("subnet-" + zone),
		}, parent)
		if err != nil {
			return nil, fmt.Errorf("network %q: subnet %s: %w", name, zone, err)
		}
		rta, err := ec2.NewRouteTableAssociation(ctx, name+"-rta-"+zone, &ec2.RouteTableAssociationArgs{
			SubnetId:     subnet.ID(),
			RouteTableId: rt.ID(),
		}, parent)
		if err != nil {
			return nil, fmt.Errorf("network %q: route table association %s: %w", name, zone, err)
		}
		if firstSubnet == nil {
			firstSubnet = subnet
			comp.Internet = append(comp.Internet, rta)
			if comp.GatewayAddress, err = reserveGatewayAddress(ctx, name, args, subnet, parent); err != nil {
				return nil, fmt.Errorf("network %q: %w", name, err)
			}
		}
		subnetIDs = append(subnetIDs, subnet.ID())
	}

	// The tunnel's own range counts as on-prem: an on-prem host that is itself the WireGuard peer (a control plane
	// node, say) talks to the VPC from its tunnel address, and the replies must find their way back.
	onPrem := append(slices.Clone(args.OnPremCIDRs), args.TunnelCIDR)
	nodeSG, err := ec2.NewSecurityGroup(ctx, name+"-node-sg", &ec2.SecurityGroupArgs{
		VpcId:       vpc.ID(),
		Description: pulumi.String("dynk8s nodes: all traffic from on-prem (through the gateway) and each other"),
		Ingress: ec2.SecurityGroupIngressArray{
			&ec2.SecurityGroupIngressArgs{
				Description: pulumi.String("on-prem cluster and tunnel"),
				Protocol:    pulumi.String("-1"), FromPort: pulumi.Int(0), ToPort: pulumi.Int(0),
				CidrBlocks: prefixes(onPrem),
			},
			&ec2.SecurityGroupIngressArgs{
				Description: pulumi.String("other dynk8s nodes"),
				Protocol:    pulumi.String("-1"), FromPort: pulumi.Int(0), ToPort: pulumi.Int(0),
				Self: pulumi.Bool(true),
			},
			// Path MTU discovery: the nodes' interfaces run at 9001, the tunnel at its MTU, and the gateway's
			// "fragmentation needed" (ICMP type 3 code 4; EC2 reads fromPort as the type, toPort as the code)
			// must reach the sender or large packets with DF set vanish.
			&ec2.SecurityGroupIngressArgs{
				Description: pulumi.String("path MTU discovery: fragmentation needed, from the gateway"),
				Protocol:    pulumi.String("icmp"), FromPort: pulumi.Int(3), ToPort: pulumi.Int(4),
				CidrBlocks: prefixes([]netip.Prefix{args.VPCCIDR}),
			},
		},
		Egress: allEgress(),
		Tags:   tags("node-sg"),
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("network %q: node security group: %w", name, err)
	}

	wgSource := args.WireGuardSource
	if !wgSource.IsValid() {
		wgSource = netip.MustParsePrefix("0.0.0.0/0")
	}
	gatewaySG, err := ec2.NewSecurityGroup(ctx, name+"-gateway-sg", &ec2.SecurityGroupArgs{
		VpcId:       vpc.ID(),
		Description: pulumi.String("dynk8s WireGuard gateway: the tunnel port, and everything from the nodes"),
		Ingress: ec2.SecurityGroupIngressArray{
			&ec2.SecurityGroupIngressArgs{
				Description: pulumi.String("WireGuard from the on-prem peer"),
				Protocol:    pulumi.String("udp"),
				FromPort:    pulumi.Int(args.ListenPort), ToPort: pulumi.Int(args.ListenPort),
				CidrBlocks: prefixes([]netip.Prefix{wgSource}),
			},
			&ec2.SecurityGroupIngressArgs{
				Description: pulumi.String("nodes, forwarded to on-prem"),
				Protocol:    pulumi.String("-1"), FromPort: pulumi.Int(0), ToPort: pulumi.Int(0),
				SecurityGroups: pulumi.StringArray{nodeSG.ID()},
			},
		},
		Egress: allEgress(),
		Tags:   tags("gateway-sg"),
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("network %q: gateway security group: %w", name, err)
	}

	comp.VPCID = vpc.ID().ToStringOutput()
	comp.SubnetIDs = subnetIDs.ToStringArrayOutput()
	comp.NodeSecurityGroupID = nodeSG.ID().ToStringOutput()
	comp.GatewaySecurityGroupID = gatewaySG.ID().ToStringOutput()
	comp.RouteTableID = rt.ID().ToStringOutput()
	comp.GatewaySubnetID = firstSubnet.ID().ToStringOutput()
	comp.InternetGatewayID = igw.ID().ToStringOutput()
	comp.OnPremCIDRs = onPrem
	if err := ctx.RegisterResourceOutputs(comp, pulumi.Map{
		"vpcId":                  comp.VPCID,
		"subnetIds":              comp.SubnetIDs,
		"nodeSecurityGroupId":    comp.NodeSecurityGroupID,
		"gatewaySecurityGroupId": comp.GatewaySecurityGroupID,
		"routeTableId":           comp.RouteTableID,
		"gatewaySubnetId":        comp.GatewaySubnetID,
		"internetGatewayId":      comp.InternetGatewayID,
	}); err != nil {
		return nil, fmt.Errorf("network %q: outputs: %w", name, err)
	}
	return comp, nil
}

// ZoneSubnet is the subnet of a zone: the VPC split into 16 and the part numbered by the zone's letter (a=0).
func ZoneSubnet(vpc netip.Prefix, zone string) (netip.Prefix, error) {
	if zone == "" {
		return netip.Prefix{}, errors.New("empty zone name")
	}
	index := int(zone[len(zone)-1] - 'a')
	if index < 0 || index >= 1<<config.SubnetExtraBits {
		return netip.Prefix{}, fmt.Errorf("zone %q: its letter has no subnet slot", zone)
	}
	bits := vpc.Bits() + config.SubnetExtraBits
	base := vpc.Addr().As4()
	binary.BigEndian.PutUint32(base[:], binary.BigEndian.Uint32(base[:])+uint32(index)<<(32-bits))
	return netip.PrefixFrom(netip.AddrFrom4(base), bits), nil
}

// reserveGatewayAddress keeps the gateway's fixed address (GatewayPrivateIP) out of EC2's automatic assignment in
// the first subnet: an explicit subnet CIDR reservation, whose addresses only a launch that names them gets (Amazon
// VPC User Guide, "Subnet CIDR reservations"; it may cover an address already in use, so a running gateway keeps
// its own). Without it a node launched while the gateway is being replaced, or before its first launch, could take
// the address, and the gateway's RunInstances would fail (InvalidIPAddress.InUse). Whatever launches into the subnet
// depends on it explicitly rather than through the subnet's id: an id that waits for a reservation still to be
// created would be unknown in the preview of an upgrade, which would then show the gateway replaced.
func reserveGatewayAddress(ctx *pulumi.Context, name string, args *NetworkArgs, subnet *ec2.Subnet,
	parent pulumi.ResourceOption) (*ec2.SubnetCidrReservation, error) {
	ip, err := GatewayPrivateIP(args.VPCCIDR, args.Zones[0])
	if err != nil {
		return nil, err
	}
	reservation, err := ec2.NewSubnetCidrReservation(ctx, name+"-gateway-address", &ec2.SubnetCidrReservationArgs{
		SubnetId:        subnet.ID(),
		CidrBlock:       pulumi.String(netip.PrefixFrom(ip, ip.BitLen()).String()),
		ReservationType: pulumi.String("explicit"),
		Description:     pulumi.String("dynk8s " + args.ClusterName + " WireGuard gateway's fixed address"),
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("gateway address reservation: %w", err)
	}
	return reservation, nil
}

// GatewayPrivateIP is the gateway's fixed address: the tenth address of the first zone's subnet (AWS reserves the
// first four). The gateway instance keeps it through stops and starts; a replacement gets it again.
func GatewayPrivateIP(vpc netip.Prefix, zone string) (netip.Addr, error) {
	subnet, err := ZoneSubnet(vpc, zone)
	if err != nil {
		return netip.Addr{}, err
	}
	addr := subnet.Addr()
	for range 10 {
		addr = addr.Next()
	}
	return addr, nil
}

// routeKey makes a CIDR usable in a resource name: 192.168.10.0/24 -> 192-168-10-0-24.
func routeKey(cidr netip.Prefix) string {
	out := []byte(cidr.String())
	for i, c := range out {
		if c == '.' || c == '/' {
			out[i] = '-'
		}
	}
	return string(out)
}

func allEgress() ec2.SecurityGroupEgressArray {
	return ec2.SecurityGroupEgressArray{&ec2.SecurityGroupEgressArgs{
		Protocol: pulumi.String("-1"), FromPort: pulumi.Int(0), ToPort: pulumi.Int(0),
		CidrBlocks: pulumi.StringArray{pulumi.String("0.0.0.0/0")},
	}}
}

// awsTags are tags as a resource's Tags input.
func awsTags(tags []config.Tag) pulumi.StringMap {
	m := pulumi.StringMap{}
	for _, t := range tags {
		m[t.Key] = pulumi.String(t.Value)
	}
	return m
}

// prefixes are network ranges as a CidrBlocks input.
func prefixes(ps []netip.Prefix) pulumi.StringArray {
	out := make(pulumi.StringArray, len(ps))
	for i, p := range ps {
		out[i] = pulumi.String(p.String())
	}
	return out
}
