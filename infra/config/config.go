// Package config is the stack's configuration: its types are the schema (each field's `key` tag is its config key,
// its `default` tag the default the docs must state), Parse reads every key once, applies the defaults and validates
// the whole config, reporting every problem with its key path. Validated values are typed (network ranges, endpoints,
// keys, versions, architectures, taints): nothing downstream parses a string again. The package is pure: the
// Pulumi-side loader lives in infra.
package config

import (
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// Namespace is the Pulumi config namespace of dynk8s keys.
const Namespace = "dynk8s"

// DrainGraceSeconds is how long the termination handler may take to drain a node: the two minutes of a spot
// interruption notice. The groups hold a terminating instance longer than that (infra), so a drain the group
// started itself also completes.
const DrainGraceSeconds = 120

// Config is the whole stack configuration (namespace "dynk8s" plus aws:region), with defaults applied and validated.
// Every decision in the program is taken from it; nothing reads the Pulumi config after Parse. The doc comment of
// each keyed field is the operator's reference (docs/configuration.md and Pulumi.yaml are generated from them), so
// it says what the key does in the operator's words and names other keys by their key paths.
type Config struct {
	// Region is the AWS region of the VPC and the node pools (aws:region, the AWS provider's key).
	Region string `key:"aws:region" required:"true"`
	// ClusterName is the on-prem cluster's name, 1-32 of [a-z0-9-]: it names the Cluster Autoscaler's discovery tag
	// k8s.io/cluster-autoscaler/<clusterName>=owned and prefixes the IAM names, SSM parameters and instance names.
	// One per AWS account: IAM names are account-wide.
	ClusterName string `key:"clusterName" required:"true"`

	// Kubernetes is the on-prem cluster the nodes join.
	Kubernetes Kubernetes `key:"kubernetes"`
	// Network is the stack's VPC, and how nodes resolve on-prem names.
	Network Network `key:"network"`
	// WireGuard is the site-to-site tunnel between the gateway and the on-prem peer.
	WireGuard WireGuard `key:"wireguard"`
	// Gateway is the WireGuard gateway instance.
	Gateway Gateway `key:"gateway"`
	// Fedora is the operating system of the nodes and the gateway.
	Fedora Fedora `key:"fedora"`
	// NodePools are the pools, at least one, in config order: one launch template and Auto Scaling Group each.
	NodePools []NodePool `key:"nodePools" required:"true"`
	// Autoscaler is the Cluster Autoscaler the stack runs on-prem.
	Autoscaler Autoscaler `key:"autoscaler"`
	// Fuse is the fuse device plugin and the github.com/fuse extended resource.
	Fuse Fuse `key:"fuse"`
	// Identity is IAM and the keys that encrypt the stack's secrets.
	Identity Identity `key:"identity"`
	// Cleanup is the stale-node cleanup.
	Cleanup Cleanup `key:"cleanup"`
	// TerminationHandler is the drain before a node goes away.
	TerminationHandler TerminationHandler `key:"terminationHandler"`
	// Images are the images the stack runs, besides the fuse plugin's (fuse.images). Each default names a tag, which
	// its publisher can move; a reference with a digest (name@sha256:<hex> or name:tag@sha256:<hex>) pins it
	// (docs/operations.md, the task "Pin the images").
	Images Images `key:"images"`
	// Agent is the node agent's delivery: the binary every node downloads at boot (docs/agent-delivery.md).
	Agent Agent `key:"agent"`

	// Derived are the values validation computes from the keys above.
	Derived Derived
}

// Derived are values computed from a valid config.
type Derived struct {
	// Kubernetes is the supported minor's row of facts (pause image, CRI-O stream, autoscaler release).
	Kubernetes kube.Minor
	// AutoscalerVersion is autoscaler.version, or the known latest patch of the Kubernetes minor.
	AutoscalerVersion kube.Version
}

// Kubernetes is dynk8s:kubernetes: the on-prem cluster the nodes join.
type Kubernetes struct {
	// Version is the exact Kubernetes version of the nodes, e.g. 1.34.4 (1.31 to 1.37; 1.37 needs
	// autoscaler.version, no autoscaler release of it being known here); CRI-O and the autoscaler
	// follow its minor. It must not be of a newer minor than the control plane's (kube-system/kubeadm-config): nodes
	// may trail the control plane, never lead it. A minor past its end of life, or within 60 days of it, is warned
	// about at every preview.
	Version kube.Version `key:"version" required:"true"`
	// APIServerEndpoint is host:port of the API server as reached through the tunnel; an address must be inside
	// wireguard.onPremCidrs.
	APIServerEndpoint endpoint.HostPort `key:"apiServerEndpoint" required:"true"`
	// CACertHash is kubeadm's CA pin for the nodes' discovery, sha256:<64 hex>; when empty, the preview computes it
	// from the cluster's kube-public/cluster-info through the kubeconfig.
	CACertHash string `key:"caCertHash"`
	// PodCIDR is the cluster's pod range (checked not to overlap the stack's ranges).
	PodCIDR netip.Prefix `key:"podCidr" required:"true"`
	// ServiceCIDR is the cluster's service range (checked not to overlap the stack's ranges); the default is
	// kubeadm's.
	ServiceCIDR netip.Prefix `key:"serviceCidr" default:"10.96.0.0/12"`
	// Kubeconfig is the admin kubeconfig of the on-prem cluster, set as a secret (pulumi config set --secret; one
	// in the clear is warned about at every preview); when unset, the ambient kubeconfig.
	Kubeconfig *string `key:"kubeconfig"`
	// ServerNameResolvesInVpc states that the API server name kube-public/cluster-info gives resolves from the VPC
	// to an address the tunnel reaches; without it, a name there (rather than apiServerEndpoint's address) fails the
	// preview, because joining nodes talk to the server cluster-info names.
	ServerNameResolvesInVpc bool `key:"serverNameResolvesInVpc" default:"false"`
	// BootstrapTokenTTL is the lifetime of each node join token, 30m..24h. dynk8s-controller issues a new token
	// every third of it (and when a replica becomes its leader) and writes it to SSM; the controller manager's token
	// cleaner deletes expired ones.
	BootstrapTokenTTL time.Duration `key:"bootstrapTokenTTL" default:"2h"`
	// BootstrapTokenRotation is an opaque value: change it to issue a new join token at once (an emergency "rotate
	// now": it rolls dynk8s-controller, whose new leader issues one; tokens issued before stay valid until they
	// expire) and a new AWS access key for the token writer.
	BootstrapTokenRotation string `key:"bootstrapTokenRotation" default:"1"`
	// OnPremNodes are the names of the cluster's on-prem Nodes. With it set, a kubelet may register a Node without
	// the dynk8s.io/pool label only under one of these names (add a new on-prem node here before it joins); without
	// it, under any. Kubelets may never add, change or remove dynk8s.io/pool (docs/security.md, "Node identity").
	OnPremNodes []string `key:"onPremNodes"`
}

// Network is dynk8s:network.
type Network struct {
	// VPCCIDR is the VPC's range, /16 to /24; one subnet per zone is carved from it.
	VPCCIDR netip.Prefix `key:"vpcCidr" default:"10.200.0.0/16"`
	// AvailabilityZones are a count of the region's zones, or zone names.
	AvailabilityZones Zones `key:"availabilityZones" default:"2"`
	// OnPremDNS sends the nodes' lookups of on-prem domains to on-prem name servers through the tunnel
	// (docs/networking.md, "DNS and MTU").
	OnPremDNS OnPremDNS `key:"onPremDns"`
}

// OnPremDNS is dynk8s:network.onPremDns: name servers reached through the tunnel, and the domains they answer for.
type OnPremDNS struct {
	// Servers are the on-prem name servers, IPv4 addresses inside wireguard.onPremCidrs, at most 3 (required with
	// domains).
	Servers []netip.Addr `key:"servers"`
	// Domains are the on-prem domains, e.g. corp.example.com, asked of the servers alone (required with servers).
	Domains []string `key:"domains"`
}

// Zones is either a list of zone names or a count of zones the stack picks from the region.
type Zones struct {
	Names []string
	Count int
}

// WireGuard is dynk8s:wireguard: the site-to-site tunnel between the gateway and the on-prem peer.
type WireGuard struct {
	// ListenPort is the gateway's UDP port.
	ListenPort int `key:"listenPort" default:"51820"`
	// OnPremCIDRs are the on-prem ranges routed from the VPC through the tunnel: they must contain every on-prem
	// node's IP and the API server's address (README, "1. Prepare the on-prem side"). Private (RFC 1918 or
	// 100.64.0.0/10) unless allowPublicOnPremCidrs, since the node security group admits them on every port.
	// Loopback, link-local, multicast, 0.0.0.0/8 and 240.0.0.0/4 are refused for every range key.
	OnPremCIDRs []netip.Prefix `key:"onPremCidrs" required:"true"`
	// TunnelCIDR is the tunnel's own range, private: the gateway takes the first host, on-prem the second.
	TunnelCIDR netip.Prefix `key:"tunnelCidr" default:"10.201.0.0/30"`
	// MTU is the tunnel's MTU on both ends, 1280..8920: 1500 minus WireGuard's 80 bytes of IPv6+UDP overhead by
	// default. Set the cluster CNI's MTU below it.
	MTU int `key:"mtu" default:"1420"`
	// OnPremPublicKey is the on-prem peer's public key, to bring your own key pair; when unset, the stack generates
	// the pair.
	OnPremPublicKey *wgtypes.Key `key:"onPremPublicKey"`
	// OnPremEndpoint is host:port where the gateway reaches the on-prem peer over the internet; an address must be
	// public and outside onPremCidrs, tunnelCidr and the VPC (the gateway would send its handshakes into the tunnel
	// they are to build). When unset, the on-prem peer dials out to the gateway (which works behind NAT).
	OnPremEndpoint *endpoint.HostPort `key:"onPremEndpoint"`
	// AllowPublicOnPremCIDRs accepts public onPremCidrs, for an on-prem network that really uses public addresses:
	// the nodes, which have public IPs, then admit those ranges on every port from the internet as well as through
	// the tunnel.
	AllowPublicOnPremCIDRs bool `key:"allowPublicOnPremCidrs" default:"false"`
	// OnPremForward is what the gateway forwards from the VPC toward onPremCidrs (docs/security.md, "What the
	// gateway forwards").
	OnPremForward OnPremForward `key:"onPremForward"`
}

// What the gateway forwards from the VPC toward OnPremCIDRs (wireguard.onPremForward.mode).
const (
	// ForwardAll forwards every packet: a build on a pool node reaches every on-prem host and port in the ranges.
	ForwardAll = "all"
	// ForwardCluster forwards new connections only to what the nodes need of on-prem (the API server's port, the
	// CNI's encapsulation, the on-prem name servers) and to the operator's Allow list; replies to connections that
	// on-prem opens always pass.
	ForwardCluster = "cluster"
)

// OnPremForward is dynk8s:wireguard.onPremForward: the gateway's filter on what it forwards into the tunnel.
type OnPremForward struct {
	// Mode is all or cluster. All forwards everything, so a build on a pool node reaches every on-prem host and
	// port in onPremCidrs; cluster forwards new connections only to the API server's ports (the endpoint's and
	// 6443), the CNI's encapsulation (UDP 4789, 6081, 8472, IP-in-IP, BGP TCP 179), the network.onPremDns servers on
	// port 53, ICMP, and allow. Replies always pass.
	Mode string `key:"mode" default:"all"`
	// Allow are further destinations new connections from the VPC may reach in mode cluster (a Jenkins controller,
	// a registry).
	Allow []ForwardAllow `key:"allow"`
}

// ForwardAllow is one entry of wireguard.onPremForward.allow: a range inside OnPremCIDRs, a protocol, and ports.
type ForwardAllow struct {
	// CIDR is the destination range, inside one of onPremCidrs.
	CIDR netip.Prefix `key:"cidr" required:"true"`
	// Protocol is tcp, udp or all.
	Protocol string `key:"protocol" default:"tcp"`
	// Ports are the destination ports, e.g. 8080,50000 or 8000-8100; when unset, every port (none with protocol
	// all).
	Ports string `key:"ports"`
}

// Gateway is dynk8s:gateway.
type Gateway struct {
	// InstanceType is the gateway's EC2 type; its architecture picks the Fedora image. Size it for the traffic the
	// builds send through the tunnel (docs/networking.md, "Sizing the gateway").
	InstanceType string `key:"instanceType" default:"t4g.micro"`
	// IdleStop is how long no pool instance may be pending or running, and no packet cross the tunnel, before the
	// gateway stops itself; a booting node starts it again. 0 keeps it running, else at least 5m (docs/costs.md,
	// "The gateway sleeps").
	IdleStop time.Duration `key:"idleStop" default:"15m"`
}

// MinIdleStop is the shortest gateway.idleStop: the gateway checks once a minute, and a shorter window would stop it
// in the pauses of a burst (between a scale-down and the next scale-up), each stop costing the next node the
// gateway's boot.
const MinIdleStop = 5 * time.Minute

// Fedora is dynk8s:fedora.
type Fedora struct {
	// Release is the pinned Fedora Cloud release, e.g. 44 (28..45). Pin a maintained one (Fedora keeps a release
	// about 13 months, until four weeks after the next-but-one is out): an end-of-life release still boots, but its
	// GA image and packages get no fixes and its repositories move to the slower archive mirrors the boot then reads.
	// A release known to be past its end of life is warned about at every preview.
	Release int `key:"release" required:"true"`
}

// NodePool is one entry of dynk8s:nodePools: one launch template and one Auto Scaling Group.
type NodePool struct {
	// Name is a DNS label, unique among pools, not the name of one of the stack's own resources (vpc,
	// wireguard-gateway, subnet-...). Its nodes carry the label dynk8s.io/pool=<name>, its instances are named
	// <clusterName>-<name>.
	Name string `key:"name" required:"true"`
	// Arch is x86_64 or arm64.
	Arch kube.Arch `key:"arch" required:"true"`
	// InstanceTypes are the EC2 types of the pool, of that arch and all of one vCPU and memory shape, checked with
	// EC2 at preview; a type of less than 2 GiB of memory, below what kubeadm asks of a node, is warned about.
	InstanceTypes []string `key:"instanceTypes" required:"true"`
	// MinSize is the group's minimum.
	MinSize int `key:"minSize" default:"0"`
	// MaxSize is the group's maximum.
	MaxSize int `key:"maxSize" default:"3"`
	// Spot makes the pool a spot pool (price-capacity-optimized; no capacity rebalancing).
	Spot bool `key:"spot" default:"false"`
	// VolumeSizeGiB is the size of the encrypted gp3 root volume.
	VolumeSizeGiB int `key:"volumeSizeGiB" default:"50"`
	// Labels are the pool's node labels, as the kubelet sets them (NodeRestriction-safe keys only).
	Labels map[string]string `key:"labels"`
	// Taints are the pool's node taints, which its nodes register with: any qualified key (NodeRestriction lets a
	// kubelet register with any taint; it refuses only changes to them later).
	Taints []kube.Taint `key:"taints"`
	// AMIID boots this image instead of the Fedora image lookup.
	AMIID string `key:"amiId"`
	// InstanceRefresh replaces the pool's nodes on launch template changes: each node is drained first, but the
	// builds running there end, so opt in only if that is acceptable.
	InstanceRefresh bool `key:"instanceRefresh" default:"false"`
	// Autoscaling are the autoscaler's options for this pool, as node-template tags.
	Autoscaling PoolAutoscaling `key:"autoscaling"`
	// WarmPool keeps prepared instances waiting beside the group, so a scale-up only joins; on-demand pools of one
	// instance type only (AWS refuses a warm pool with spot or mixed instances). When unset, every scale-up boots
	// cold (docs/warm-pools.md).
	WarmPool *WarmPool `key:"warmPool"`
	// PrePullImages are image references (at most 20) each node pulls at boot, in the background as soon as CRI-O
	// runs, besides the pause, kube-proxy and fuse plugin images; a failed pull never fails the boot.
	PrePullImages []string `key:"prePullImages"`
	// Image is what the pool's nodes boot: stock (the pinned Fedora GA image; every boot installs the packages and
	// pulls the images) or baked (an image of that same Fedora release with the node's prepare step already run in
	// it, so a boot skips the package install). A baked image is built outside the program, before pulumi up, by
	// `go run ./cmd/bake -stack STACK -pool POOL`, which tags it with the identity of what it prepared; the program
	// only looks the image up by its tags, and the preview fails, naming that command, when the account has none
	// for the current config (a change of what the image holds, such as the Kubernetes version, the Fedora
	// release, the architecture or the images the nodes pre-pull, needs a new bake; a change of the join's
	// settings does not): docs/baked-images.md.
	// Not with amiId.
	Image string `key:"image" default:"stock"`
	// Cache gives each node a build cache, an EBS volume the pool keeps while it scales to zero, mounted before the
	// kubelet starts: container layers and the language caches (Go, Maven, Gradle, npm, ccache) survive from one
	// node to the next (docs/build-caches.md). The kept volumes bill at zero nodes. Off when unset.
	Cache *Cache `key:"cache"`
}

// Cache is dynk8s:nodePools[i].cache: the pool's build cache volumes, one per node, gp3, encrypted.
type Cache struct {
	// SizeGiB is each volume's size (1..16384).
	SizeGiB int `key:"sizeGiB" default:"100"`
	// IOPS is each volume's provisioned IOPS, 3000..16000 and at most 500 per GiB: gp3's baseline of 3000 is in its
	// price, more bills.
	IOPS int `key:"iops" default:"3000"`
	// Throughput is each volume's provisioned throughput in MiB/s, 125..1000 and at most a quarter of the IOPS:
	// gp3's baseline of 125 is in its price, more bills.
	Throughput int `key:"throughput" default:"125"`
	// MountPath is where a node mounts its cache: pods reach it as a hostPath.
	MountPath string `key:"mountPath" default:"/var/lib/dynk8s-cache"`
	// MaxVolumes is the most volumes the pool keeps, in all its zones (0: the pool's maxSize); a node that finds
	// none free and the pool at its most boots without a cache.
	MaxVolumes int `key:"maxVolumes" default:"0"`
	// MaxIdleDays deletes a volume no node has used for that many days (1..3650).
	MaxIdleDays int `key:"maxIdleDays" default:"14"`
}

// CacheVolumes is the most cache volumes the pool keeps (0 without a cache).
func (p NodePool) CacheVolumes() int {
	switch {
	case p.Cache == nil:
		return 0
	case p.Cache.MaxVolumes > 0:
		return p.Cache.MaxVolumes
	default:
		return p.MaxSize
	}
}

// What a pool boots (nodePools[i].image).
const (
	// ImageStock is the pinned Fedora GA image, prepared at every boot.
	ImageStock = "stock"
	// ImageBaked is an image cmd/bake builds from the stock one with the node's prepare step run in it, and the
	// program looks up by its tags.
	ImageBaked = "baked"
)

// Baked reports whether the pool boots an image baked for it (cmd/bake).
func (p NodePool) Baked() bool { return p.Image == ImageBaked }

// Warm pool states: what a prepared instance waits in (the group's warm pool PoolState).
const (
	WarmStopped    = "Stopped"
	WarmHibernated = "Hibernated"
	WarmRunning    = "Running"
)

// WarmPool is dynk8s:nodePools[i].warmPool: the group's warm pool. Its instances boot, prepare (everything that does
// not need the cluster) and wait in State; a scale-up takes one from there and it only joins.
type WarmPool struct {
	// Size is how many prepared instances wait, 1..maxSize, whatever the group runs: the warm pool's minimum size
	// and its maximum prepared capacity both (only then is the warm pool's size absolute, per the PutWarmPool API).
	Size int `key:"size" default:"1"`
	// State is what they wait in: Stopped (volumes billed), Hibernated (volumes billed, memory kept: an x86_64 type,
	// RAM up to 150 GiB, a root volume with room for it, and amiId naming an image configured for hibernation) or
	// Running (billed as a running instance).
	State string `key:"state" default:"Stopped"`
	// ReuseOnScaleIn is refused when true: a scaled-in node keeps its kubelet credentials and its cordoned Node, so
	// scaled-in nodes are terminated rather than returned to the warm pool.
	ReuseOnScaleIn bool `key:"reuseOnScaleIn" default:"false"`
}

// WarmInstances is how many warm instances the pool keeps when it runs no node (0 without a warm pool): each bills
// its root volume, and in the Running state the instance too.
func (p NodePool) WarmInstances() int {
	if p.WarmPool == nil {
		return 0
	}
	return p.WarmPool.Size
}

// Autoscaler is dynk8s:autoscaler.
type Autoscaler struct {
	// Version is the Cluster Autoscaler version, e.g. 1.34.5; when unset, the known latest patch of the nodes'
	// Kubernetes minor (Derived.AutoscalerVersion is the one to run). Its minor must be the control plane's, which
	// the preview reads: set it when the nodes trail the control plane.
	Version string `key:"version"`
	// ScaleDownUnneededTime is how long a node is unneeded before it is removed, as the autoscaler's flag takes it.
	ScaleDownUnneededTime string `key:"scaleDownUnneededTime" default:"10m"`
	// Expander is the autoscaler's expander: least-waste, least-nodes, most-pods, priority or random, or a
	// comma-separated chain (not price: the AWS provider has no pricing).
	Expander string `key:"expander" default:"least-waste"`
	// MaxNodeProvisionTime is how long the autoscaler waits for a launched node to register before it gives up on
	// it, counted from the scale-up; it must exceed a node's boot at its worst, 21m30s (a 2-minute launch estimate,
	// then the agent's fetch, the on-prem routes and the join on their units' hard timeouts).
	MaxNodeProvisionTime time.Duration `key:"maxNodeProvisionTime" default:"25m"`
	// ScaleDownDelayAfterAdd is how long after a scale-up no node is removed.
	ScaleDownDelayAfterAdd time.Duration `key:"scaleDownDelayAfterAdd" default:"10m"`
	// MaxNodesTotal caps the nodes of the whole cluster, on-prem ones included (0: no cap).
	MaxNodesTotal int `key:"maxNodesTotal" default:"0"`
	// NewPodScaleUpDelay is how old a pending pod must be before it counts for a scale-up.
	NewPodScaleUpDelay time.Duration `key:"newPodScaleUpDelay" default:"0s"`
	// ScanInterval is how often the autoscaler looks at the cluster (its --scan-interval; upstream's default is
	// 10s). A pending pod waits half of it on average before the loop that raises a group; each loop costs the
	// autoscaler a simulation over its informers' caches and one write of its status ConfigMap, and asks AWS
	// nothing (the AWS provider refreshes its groups once a minute whatever the interval). 5s halves upstream's
	// wait for about 12 status writes a minute.
	ScanInterval time.Duration `key:"scanInterval" default:"5s"`
	// ScaleDownUnreadyTime is how long a node may be NotReady before the autoscaler removes it (its flag's default is
	// 20 minutes). Well above the tunnel outages the gateway recovers from by itself: a hung gateway fails its
	// instance status check, its alarm reboots it after 3 failed minutes, and the boot and the tunnel take a few
	// more; a failed host is recovered by EC2 in minutes. A pool node cut off meanwhile keeps running its builds,
	// and removing it would end them. The cost of the margin: a node whose kubelet really died bills up to this
	// long before it goes.
	ScaleDownUnreadyTime time.Duration `key:"scaleDownUnreadyTime" default:"1h"`
	// SkipNodesWithSystemPods keeps nodes that run kube-system pods (other than DaemonSets) from scaling down. Off
	// by default: a stray CoreDNS replica on a pool node must not keep it billing.
	SkipNodesWithSystemPods bool `key:"skipNodesWithSystemPods" default:"false"`
}

// PoolAutoscaling is dynk8s:nodePools[i].autoscaling: the autoscaler's per-group options, which it reads from the
// group's node-template autoscaling-options tags (cloudprovider/aws/aws_manager.go at cluster-autoscaler-1.34.5).
type PoolAutoscaling struct {
	// ScaleDownUnneededTime is this pool's idle time before scale-down, overriding autoscaler.scaleDownUnneededTime.
	ScaleDownUnneededTime *time.Duration `key:"scaleDownUnneededTime"`
	// ScaleDownUtilizationThreshold is the utilization, in (0, 1], under which a node of the pool counts as
	// unneeded (the autoscaler's default is 0.5).
	ScaleDownUtilizationThreshold *float64 `key:"scaleDownUtilizationThreshold"`
	// Priority ranks the pool for the priority expander (autoscaler.expander priority, alone or first in a chain):
	// of the pools that fit a pending pod, the autoscaler raises one of the highest rank, and a pool it has backed
	// off after a failed launch (spot without capacity) is no option, so the next rank takes over. Equal ranks leave
	// the choice to the next expander of the chain. Required on every pool with the priority expander, refused
	// without it (optional otherwise; 0 or more, higher wins).
	Priority *int `key:"priority"`
}

// Fuse is dynk8s:fuse.
type Fuse struct {
	// Enabled deploys the fuse device plugin and advertises github.com/fuse on the groups.
	Enabled bool `key:"enabled" default:"true"`
	// Capacity is the number of github.com/fuse devices per node: what the upstream plugin image advertises.
	Capacity int `key:"capacity" default:"5000"`
	// Images are the device plugin images by arch (x86_64, arm64). The defaults are tags of
	// soolaugust/fuse-device-plugin, the arm64 one unverified (infra/addons, defaultFuseImage): mirror an image you
	// trust and set it here.
	Images map[kube.Arch]string `key:"images"`
}

// Identity is dynk8s:identity.
type Identity struct {
	// AutoscalerKeyRotation is an opaque value: change it to rotate the on-prem IAM users' access keys, the
	// autoscaler's and the node cleanup's (each new key is created before the old one is deleted).
	AutoscalerKeyRotation string `key:"autoscalerKeyRotation" default:"1"`
	// CustomerManagedEBSKey states that the region's default EBS encryption key, which encrypts every volume the
	// stack launches, is a customer-managed key whose policy lets the Auto Scaling service-linked role and the node
	// role use it (docs/security.md, "Encrypted volumes"). Without it such a key fails the preview.
	CustomerManagedEBSKey bool `key:"customerManagedEbsKey" default:"false"`
	// ParameterKey is the KMS key of the two SecureStrings, the join token and the gateway's key: aws-managed (SSM's
	// aws/ssm key; whoever may read the parameter may decrypt it), create (a key of the stack's own that only the
	// node role (the token), the gateway role (its key) and the principal running `pulumi up` may decrypt with,
	// about $1 a month) or a key ARN in the stack's region (docs/security.md, "Secrets at rest").
	ParameterKey string `key:"parameterKey" default:"aws-managed"`
}

// The named values of identity.parameterKey; any other value is a key ARN.
const (
	ParameterKeyAWSManaged = "aws-managed"
	ParameterKeyCreate     = "create"
)

// removedKeys are keys earlier versions read, with why they went and what to do instead: a stack file that still
// sets one gets that reason rather than a bare "unknown key".
var removedKeys = map[string]string{
	Namespace + ":identity.sessionManager": "was removed: Session Manager needs amazon-ssm-agent, which Fedora " +
		"Cloud does not ship, so the policy only widened the node role; reach a node with EC2 Instance Connect " +
		"through the tunnel instead (docs/troubleshooting.md)",
	Namespace + ":identity.ecrReadOnly": "was removed: since Kubernetes 1.27 the kubelet pulls from ECR only " +
		"through the ecr-credential-provider plugin, which dynk8s cannot install with a verified checksum, so the " +
		"policy granted nothing the kubelet could use; pull private images with an imagePullSecret, or boot an " +
		"image that carries the plugin (nodePools[i].amiId)",
}

// Cleanup is dynk8s:cleanup.
type Cleanup struct {
	// NotReadyAfter is how long a dynk8s node may stay NotReady before its Node object is deleted, once EC2 says
	// its instance is gone; at least 5m. EC2's answer, not the wait, keeps a rebooting or cut-off node: the default
	// is the minimum, because a stale Node counts as unready for the Cluster Autoscaler, which stops scaling up
	// while more than 3 nodes and 45% of the cluster are unready (--ok-total-unready-count,
	// --max-total-unready-percentage).
	NotReadyAfter time.Duration `key:"notReadyAfter" default:"5m"`
}

// Images is dynk8s:images: the images the stack runs, besides the fuse plugin's (fuse.images), each optional (empty:
// the default, which names a tag; the addons and the node renderer hold the defaults). A reference with a digest
// (name@sha256:<hex>, or name:tag@sha256:<hex>) pins the image: the runtime pulls exactly that content, whatever
// the tag points at later.
type Images struct {
	// Autoscaler is the Cluster Autoscaler's image; default
	// registry.k8s.io/autoscaling/cluster-autoscaler:v<the autoscaler's version>.
	Autoscaler string `key:"autoscaler"`
	// TerminationHandler is aws-node-termination-handler's image; default
	// public.ecr.aws/aws-ec2/aws-node-termination-handler at the tag infra/addons pins (go run ./cmd/plan shows it).
	TerminationHandler string `key:"terminationHandler"`
	// Scripts is the image dynk8s-controller's init container fetches the controller in and the controller runs in:
	// it needs bash, curl (with --aws-sigv4) and coreutils; default docker.io/alpine/k8s at the tag infra/addons
	// pins.
	Scripts string `key:"scripts"`
	// Pause is the nodes' sandbox image, CRI-O's pause_image, which it runs in every pod and the boot pre-pulls;
	// default registry.k8s.io/pause:<the Kubernetes minor's>.
	Pause string `key:"pause"`
}

// Agent is dynk8s:agent.
type Agent struct {
	// RetentionDays is how long a node agent binary the stack has replaced stays downloadable from the agent bucket
	// before S3 expires it. An instance launched from an older launch template version fetches the older binary,
	// and a group launches that version until the `pulumi up` that replaced the binary has moved it to the new one:
	// minutes when the update goes through, for as long as nobody re-runs it when it fails in between. A month
	// covers a failed update left over a holiday; each retained binary costs a fraction of a cent a month.
	RetentionDays int `key:"retentionDays" default:"30"`
}

// MinAgentRetentionDays is the shortest agent.retentionDays: S3 expires noncurrent versions in whole days, at least
// one.
const MinAgentRetentionDays = 1

// TerminationHandler is dynk8s:terminationHandler.
type TerminationHandler struct {
	// Enabled runs aws-node-termination-handler on every pool node: it drains the node on a spot interruption, a
	// scheduled event, or a termination the group starts itself.
	Enabled bool `key:"enabled" default:"true"`
}
