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

	"github.com/dynk8s/dynk8s/internal/kube"
)

// Namespace is the Pulumi config namespace of dynk8s keys.
const Namespace = "dynk8s"

// DrainGraceSeconds is how long the termination handler may take to drain a node: the two minutes of a spot
// interruption notice. The groups hold a terminating instance longer than that (infra), so a drain the group
// started itself also completes.
const DrainGraceSeconds = 120

// Config is the whole stack configuration (namespace "dynk8s" plus aws:region), with defaults applied and validated.
// Every decision in the program is taken from it; nothing reads the Pulumi config after Parse.
type Config struct {
	// Region is aws:region (required).
	Region string `key:"aws:region"`
	// ClusterName is the Cluster Autoscaler tag segment and the prefix of AWS names (required).
	ClusterName string `key:"clusterName"`

	Kubernetes Kubernetes `key:"kubernetes"`
	Network    Network    `key:"network"`
	WireGuard  WireGuard  `key:"wireguard"`
	Gateway    Gateway    `key:"gateway"`
	Fedora     Fedora     `key:"fedora"`
	// NodePools are the pools, at least one, in config order.
	NodePools          []NodePool         `key:"nodePools"`
	Autoscaler         Autoscaler         `key:"autoscaler"`
	Fuse               Fuse               `key:"fuse"`
	Identity           Identity           `key:"identity"`
	Cleanup            Cleanup            `key:"cleanup"`
	TerminationHandler TerminationHandler `key:"terminationHandler"`
	Images             Images             `key:"images"`
	Agent              Agent              `key:"agent"`

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
	// Version is the exact Kubernetes version of the nodes (required).
	Version kube.Version `key:"version"`
	// APIServerEndpoint is host:port of the API server as reached through the tunnel (required).
	APIServerEndpoint Endpoint `key:"apiServerEndpoint"`
	// CACertHash is kubeadm's CA pin, sha256:<64 hex> (optional: read from kube-public/cluster-info when empty).
	CACertHash string `key:"caCertHash"`
	// PodCIDR is the cluster's pod range (required; overlap checks).
	PodCIDR netip.Prefix `key:"podCidr"`
	// ServiceCIDR is the cluster's service range (overlap checks); the default is kubeadm's.
	ServiceCIDR netip.Prefix `key:"serviceCidr" default:"10.96.0.0/12"`
	// Kubeconfig is the admin kubeconfig of the on-prem cluster (optional, secret; nil: the ambient one).
	Kubeconfig *string `key:"kubeconfig"`
	// ServerNameResolvesInVpc states that the API server name kube-public/cluster-info gives (when it is a name)
	// resolves from the VPC to an address the tunnel reaches; without it, such a name fails the preview.
	ServerNameResolvesInVpc bool `key:"serverNameResolvesInVpc" default:"false"`
	// BootstrapTokenTTL is how long each join token the in-cluster rotator issues stays valid; the rotator issues
	// a new one every BootstrapTokenRotationPeriod.
	BootstrapTokenTTL time.Duration `key:"bootstrapTokenTTL" default:"2h"`
	// BootstrapTokenRotation is an opaque value; changing it makes the rotator issue a new join token at once (an
	// emergency "rotate now") and gives it a new AWS access key.
	BootstrapTokenRotation string `key:"bootstrapTokenRotation" default:"1"`
	// OnPremNodes are the names of the on-prem Nodes (optional): with it set, a kubelet may register a Node without
	// the pool label only under one of these names.
	OnPremNodes []string `key:"onPremNodes"`
}

// Network is dynk8s:network.
type Network struct {
	// VPCCIDR is the VPC's range, /16 to /24.
	VPCCIDR netip.Prefix `key:"vpcCidr" default:"10.200.0.0/16"`
	// AvailabilityZones are zone names, or a count of the region's zones.
	AvailabilityZones Zones `key:"availabilityZones" default:"2"`
	// OnPremDNS sends the nodes' lookups of on-prem domains to on-prem name servers (optional).
	OnPremDNS OnPremDNS `key:"onPremDns"`
}

// OnPremDNS is dynk8s:network.onPremDns: name servers reached through the tunnel, and the domains they answer for.
type OnPremDNS struct {
	// Servers are IPv4 addresses inside wireguard.onPremCidrs (optional, at most 3; required with Domains).
	Servers []netip.Addr `key:"servers"`
	// Domains are the on-prem domains asked of Servers alone (optional; required with Servers).
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
	// OnPremCIDRs are routed from the VPC through the tunnel (required, at least one).
	OnPremCIDRs []netip.Prefix `key:"onPremCidrs"`
	// TunnelCIDR holds the two tunnel addresses: the gateway takes the first host, on-prem the second.
	TunnelCIDR netip.Prefix `key:"tunnelCidr" default:"10.201.0.0/30"`
	// MTU of the tunnel on both ends: 1500 minus WireGuard's 80 bytes of IPv6+UDP overhead.
	MTU int `key:"mtu" default:"1420"`
	// OnPremPublicKey is the on-prem peer's public key (optional; nil: the stack generates the pair).
	OnPremPublicKey *wgtypes.Key `key:"onPremPublicKey"`
	// OnPremEndpoint is host:port of the on-prem peer (optional; nil: the on-prem side dials out). An address must
	// be public and outside OnPremCIDRs: the gateway reaches it through the internet gateway.
	OnPremEndpoint *Endpoint `key:"onPremEndpoint"`
	// AllowPublicOnPremCIDRs accepts OnPremCIDRs outside the private ranges (RFC 1918, RFC 6598), for an on-prem
	// network that really uses public addresses: the node security group admits them on every port.
	AllowPublicOnPremCIDRs bool `key:"allowPublicOnPremCidrs" default:"false"`
	// OnPremForward is what the gateway forwards from the VPC toward on-prem.
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
	// Mode is ForwardAll or ForwardCluster.
	Mode string `key:"mode" default:"all"`
	// Allow are further destinations new connections from the VPC may reach in ForwardCluster mode (optional).
	Allow []ForwardAllow `key:"allow"`
}

// ForwardAllow is one entry of wireguard.onPremForward.allow: a range inside OnPremCIDRs, a protocol, and ports.
type ForwardAllow struct {
	// CIDR is the destination range, inside one of OnPremCIDRs (required).
	CIDR netip.Prefix `key:"cidr"`
	// Protocol is tcp, udp or all.
	Protocol string `key:"protocol" default:"tcp"`
	// Ports are the destination ports, "8080" or "8080,50000" or "8000-8100" (optional: every port; none with all).
	Ports string `key:"ports"`
}

// Gateway is dynk8s:gateway.
type Gateway struct {
	// InstanceType of the WireGuard gateway; its architecture picks the image.
	InstanceType string `key:"instanceType" default:"t4g.micro"`
	// IdleStop is how long no pool instance may be pending or running, and no packet cross the tunnel, before the
	// gateway stops itself (a booting node starts it again); 0 keeps it running.
	IdleStop time.Duration `key:"idleStop" default:"15m"`
}

// MinIdleStop is the shortest gateway.idleStop: the gateway checks once a minute, and a shorter window would stop it
// in the pauses of a burst (between a scale-down and the next scale-up), each stop costing the next node the
// gateway's boot.
const MinIdleStop = 5 * time.Minute

// Fedora is dynk8s:fedora.
type Fedora struct {
	// Release is the pinned Fedora release, e.g. 42 (required).
	Release int `key:"release"`
}

// NodePool is one entry of dynk8s:nodePools: one launch template and one Auto Scaling Group.
type NodePool struct {
	// Name is a DNS label, unique among pools (required).
	Name string `key:"name"`
	// Arch is x86_64 or arm64 (required).
	Arch kube.Arch `key:"arch"`
	// InstanceTypes are the EC2 types of the pool, all of one shape (required, at least one).
	InstanceTypes []string `key:"instanceTypes"`
	// MinSize and MaxSize bound the group.
	MinSize int `key:"minSize" default:"0"`
	MaxSize int `key:"maxSize" default:"3"`
	// Spot makes the pool a spot pool.
	Spot bool `key:"spot" default:"false"`
	// VolumeSizeGiB is the root volume size.
	VolumeSizeGiB int `key:"volumeSizeGiB" default:"50"`
	// Labels are the pool's node labels, as the kubelet sets them (optional).
	Labels map[string]string `key:"labels"`
	// Taints are the pool's node taints (optional).
	Taints []kube.Taint `key:"taints"`
	// AMIID skips the Fedora image lookup (optional).
	AMIID string `key:"amiId"`
	// InstanceRefresh opts the pool into group instance refresh on launch template changes.
	InstanceRefresh bool `key:"instanceRefresh" default:"false"`
	// Autoscaling are the autoscaler's options for this pool (optional).
	Autoscaling PoolAutoscaling `key:"autoscaling"`
	// WarmPool keeps prepared, stopped instances beside the group (optional; nil: every scale-up boots cold).
	WarmPool *WarmPool `key:"warmPool"`
	// PrePullImages are pulled at boot, in the background as soon as CRI-O runs, besides the pause, kube-proxy and
	// fuse plugin images (optional; image references).
	PrePullImages []string `key:"prePullImages"`
}

// Warm pool states: what a prepared instance waits in (the group's warm pool PoolState).
const (
	WarmStopped    = "Stopped"
	WarmHibernated = "Hibernated"
	WarmRunning    = "Running"
)

// WarmPool is dynk8s:nodePools[i].warmPool: the group's warm pool. Its instances boot, prepare (everything that does
// not need the cluster) and wait in State; a scale-up takes one from there and it only joins.
type WarmPool struct {
	// Size is how many prepared instances wait, whatever the group runs: the warm pool's minimum size and its
	// maximum prepared capacity both (only then is the warm pool's size absolute, per the PutWarmPool API).
	Size int `key:"size" default:"1"`
	// State is what they wait in: Stopped (volumes billed), Hibernated (volumes billed, memory kept) or Running
	// (billed as a running instance).
	State string `key:"state" default:"Stopped"`
	// ReuseOnScaleIn would return a scaled-in node to the warm pool instead of terminating it: refused, see
	// validateWarmPool.
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
	// Version overrides the Cluster Autoscaler version (optional; Derived.AutoscalerVersion is the one to run).
	Version string `key:"version"`
	// ScaleDownUnneededTime is how long a node is unneeded before removal, as the autoscaler's flag takes it.
	ScaleDownUnneededTime string `key:"scaleDownUnneededTime" default:"10m"`
	// Expander is the autoscaler's expander, or a comma-separated chain.
	Expander string `key:"expander" default:"least-waste"`
	// MaxNodeProvisionTime is how long the autoscaler waits for a launched node to register before it gives up on
	// it; it must exceed the join's own timeout.
	MaxNodeProvisionTime time.Duration `key:"maxNodeProvisionTime" default:"15m"`
	// ScaleDownDelayAfterAdd is how long after a scale-up no node is removed.
	ScaleDownDelayAfterAdd time.Duration `key:"scaleDownDelayAfterAdd" default:"10m"`
	// MaxNodesTotal caps the nodes of the whole cluster, on-prem ones included (0: no cap).
	MaxNodesTotal int `key:"maxNodesTotal" default:"0"`
	// NewPodScaleUpDelay is how old a pending pod must be before it counts for a scale-up.
	NewPodScaleUpDelay time.Duration `key:"newPodScaleUpDelay" default:"0s"`
	// SkipNodesWithSystemPods keeps nodes that run kube-system pods (other than DaemonSets) from scaling down. Off
	// here: a CoreDNS replica that landed on a pool node must not keep it billing.
	SkipNodesWithSystemPods bool `key:"skipNodesWithSystemPods" default:"false"`
}

// PoolAutoscaling is dynk8s:nodePools[i].autoscaling: the autoscaler's per-group options, which it reads from the
// group's node-template autoscaling-options tags (cloudprovider/aws/aws_manager.go at cluster-autoscaler-1.34.5).
type PoolAutoscaling struct {
	// ScaleDownUnneededTime overrides autoscaler.scaleDownUnneededTime for the pool (optional).
	ScaleDownUnneededTime *time.Duration `key:"scaleDownUnneededTime"`
	// ScaleDownUtilizationThreshold is the utilization under which a node of the pool counts as unneeded
	// (optional; the autoscaler's default is 0.5).
	ScaleDownUtilizationThreshold *float64 `key:"scaleDownUtilizationThreshold"`
}

// Fuse is dynk8s:fuse.
type Fuse struct {
	// Enabled deploys the fuse device plugin and advertises github.com/fuse on the groups.
	Enabled bool `key:"enabled" default:"true"`
	// Capacity is the number of github.com/fuse devices per node: what the upstream plugin image advertises.
	Capacity int `key:"capacity" default:"5000"`
	// Images are the device plugin images by arch (optional; the addons hold the defaults).
	Images map[kube.Arch]string `key:"images"`
}

// Identity is dynk8s:identity.
type Identity struct {
	// AutoscalerKeyRotation is an opaque value; changing it creates a new autoscaler access key before deleting
	// the old one.
	AutoscalerKeyRotation string `key:"autoscalerKeyRotation" default:"1"`
	// CustomerManagedEBSKey states that the region's default EBS encryption key, which encrypts every volume the
	// stack launches, is a customer-managed key whose policy lets the Auto Scaling service-linked role and the node
	// role use it (README, "Encrypted volumes"). Without it such a key fails the preview.
	CustomerManagedEBSKey bool `key:"customerManagedEbsKey" default:"false"`
	// ParameterKey is the KMS key that encrypts the two SecureStrings (the join token, the gateway's key):
	// ParameterKeyAWSManaged (SSM's aws/ssm key, which every principal allowed ssm:GetParameter may decrypt with),
	// ParameterKeyCreate (a customer-managed key of the stack's own, whose policy names the readers and writers), or
	// the ARN of a key of the operator's in the stack's region (README, "Security model").
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
		"through the tunnel instead (README, \"When a node does not join\")",
	Namespace + ":identity.ecrReadOnly": "was removed: since Kubernetes 1.27 the kubelet pulls from ECR only " +
		"through the ecr-credential-provider plugin, which dynk8s cannot install with a verified checksum, so the " +
		"policy granted nothing the kubelet could use; pull private images with an imagePullSecret, or boot an " +
		"image that carries the plugin (nodePools[i].amiId)",
}

// Cleanup is dynk8s:cleanup.
type Cleanup struct {
	// NotReadyAfter is how long a dynk8s node may stay NotReady before its Node object is deleted, once EC2 says
	// its instance is gone (at least 5m). EC2's answer, not the wait, keeps a rebooting or cut-off node: the
	// default is the minimum, because a stale Node counts as unready for the Cluster Autoscaler, which stops
	// scaling up while more than 3 nodes and 45% of the cluster are unready (--ok-total-unready-count,
	// --max-total-unready-percentage).
	NotReadyAfter time.Duration `key:"notReadyAfter" default:"5m"`
}

// Images is dynk8s:images: the images the stack runs, besides the fuse plugin's (fuse.images), each optional (empty:
// the default, which names a tag; the addons and the node renderer hold the defaults). A reference with a digest
// (name@sha256:<hex>, or name:tag@sha256:<hex>) pins the image: the runtime pulls exactly that content, whatever
// the tag points at later.
type Images struct {
	// Autoscaler is the Cluster Autoscaler's image (default: registry.k8s.io's of Derived.AutoscalerVersion).
	Autoscaler string `key:"autoscaler"`
	// TerminationHandler is aws-node-termination-handler's image.
	TerminationHandler string `key:"terminationHandler"`
	// Scripts runs the token rotator, the stale-node cleanup and the fuse plugin's untaint container: it needs
	// bash, kubectl, curl, jq and coreutils.
	Scripts string `key:"scripts"`
	// Pause is the nodes' sandbox image, which CRI-O runs in every pod and the boot pre-pulls (default:
	// registry.k8s.io's of the Kubernetes minor).
	Pause string `key:"pause"`
}

// Agent is dynk8s:agent: the node agent's delivery (docs/agent-delivery.md).
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
	// Enabled deploys aws-node-termination-handler on every pool node: it drains on spot interruptions, scheduled
	// events and terminations the group starts.
	Enabled bool `key:"enabled" default:"true"`
}
