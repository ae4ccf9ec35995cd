// Package nodeconfig is the node's boot configuration: what the renderer (cloudinit) writes to /etc/dynk8s/node.json
// and the node agent (node/cmd/dynk8s-node) decodes, strictly, at boot. It is a leaf package: both sides import it, and it
// imports nothing of this module, so the contract between them is this one type and not a set of string keys.
package nodeconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// Path is where cloud-init writes the node's configuration.
const Path = "/etc/dynk8s/node.json"

// Node is everything the agent's join needs that the instance cannot find out itself. All values are public: the
// join token is read from SSM at boot, never written here.
type Node struct {
	ClusterName string `json:"clusterName"`
	PoolName    string `json:"poolName"`
	// APIServerEndpoint is "host:port", reached through the WireGuard gateway.
	APIServerEndpoint endpoint.HostPort `json:"apiServerEndpoint"`
	// JoinTokenParameter is the SSM SecureString holding "<id>.<secret>", written by the cluster's token rotator.
	JoinTokenParameter string `json:"joinTokenParameter"`
	// GatewayInstanceID is the gateway the boot starts ("": it never sleeps).
	GatewayInstanceID string `json:"gatewayInstanceId,omitempty"`
	// LaunchHook is the group's EC2_INSTANCE_LAUNCHING lifecycle hook ("": none).
	LaunchHook string `json:"launchHook,omitempty"`
	// CRISocket is the container runtime's endpoint, for crictl and kubeadm.
	CRISocket string `json:"criSocket"`
	// KernelModules are loaded first; a missing one brings in kernel-modules-extra of the running kernel.
	KernelModules []string `json:"kernelModules"`
	// Packages are installed from Repos (the pinned upstream repositories) in one dnf transaction, with those of
	// SystemPackages the image lacks (rpm -q) from SystemRepos; UpdateRepos join a transaction that failed without.
	Packages       []string `json:"packages"`
	Repos          []string `json:"repos"`
	SystemPackages []string `json:"systemPackages"`
	SystemRepos    []string `json:"systemRepos"`
	UpdateRepos    []string `json:"updateRepos"`
	// PrePullImages are pulled in the background once CRI-O runs.
	PrePullImages []string `json:"prePullImages"`
	// Join is the pool's part of the kubeadm JoinConfiguration; the instance's identity and the token are added
	// at boot (JoinConfig).
	Join Join `json:"join"`
	// Host is what the node's own units apply before the join and every kubelet: the routes toward on-prem and the
	// lockdown of the instance metadata service.
	Host Host `json:"host"`
	// Cache is the pool's build cache volume, attached and mounted before the join (nil: the pool keeps none).
	Cache *Cache `json:"cache,omitempty"`
	// Deadlines bound the boot's steps.
	Deadlines Deadlines `json:"deadlines"`
}

// Cache is a pool's build cache: one EBS volume per node, kept by the pool while it scales to zero, found again by
// the next node in the same zone (node/internal/cache).
type Cache struct {
	// SizeGiB, VolumeType, IOPS and Throughput are what a new volume is created with (IOPS and Throughput 0: the
	// type's baseline).
	SizeGiB    int    `json:"sizeGiB"`
	VolumeType string `json:"volumeType"`
	IOPS       int    `json:"iops,omitempty"`
	Throughput int    `json:"throughput,omitempty"`
	// MountPath is where the node mounts it.
	MountPath string `json:"mountPath"`
	// MaxVolumes is the most volumes the pool keeps, in all its zones: a node that finds none free and the pool at
	// its most boots without one.
	MaxVolumes int `json:"maxVolumes"`
}

// Join is what the JoinConfiguration takes from the pool.
type Join struct {
	CACertHashes []string `json:"caCertHashes"`
	// Labels are the pool's node labels; the zone, region and instance type are added at boot (RuntimeLabels).
	Labels map[string]string `json:"labels"`
	Taints []kube.Taint      `json:"taints"`
	// PatchesDirectory holds kubeadm's patch files (the kubelet configuration's).
	PatchesDirectory string `json:"patchesDirectory"`
}

// Host is the node's network and metadata settings.
type Host struct {
	// OnPremCIDRs are the ranges the VPC routes through the tunnel: the routes unit caps the path MTU toward them at
	// TunnelMTU.
	OnPremCIDRs []netip.Prefix `json:"onPremCidrs"`
	TunnelMTU   uint16         `json:"tunnelMtu"`
	// MetadataUIDs are the users besides root that may reach the instance metadata service once it is locked.
	MetadataUIDs []int `json:"metadataUids"`
}

// Deadlines are the boot's time limits. The join unit's TimeoutStartSec is derived from Join (UnitTimeout).
type Deadlines struct {
	// Join bounds the whole boot: every network step retries until then.
	Join Duration `json:"join"`
	// Wake bounds the start of the gateway, inside Join: a gateway that cannot start by then fails the join anyway.
	Wake Duration `json:"wake"`
	// WakeSettle is how long a gateway that answers "was running" is started again, in case it is powering off;
	// WakeInterval is the pause between those starts.
	WakeSettle   Duration `json:"wakeSettle"`
	WakeInterval Duration `json:"wakeInterval"`
	// BackoffInitial and BackoffMax bound the exponential pause between a step's attempts.
	BackoffInitial Duration `json:"backoffInitial"`
	BackoffMax     Duration `json:"backoffMax"`
	// Routes bounds the wait for the default route the on-prem routes go via; the routes unit's TimeoutStartSec is
	// derived from it (RoutesUnitTimeout).
	Routes Duration `json:"routes"`
}

// JoinDeadline is the join's default deadline: 12 minutes, counted from the join unit's start (BootWorstCase is
// the whole boot's). UnitSlack is what the join unit's hard timeout adds to it (UnitTimeout), room for the
// step it was in to stop (kubeadm reset, the hand-back of the lifecycle action).
const (
	JoinDeadline = 12 * time.Minute
	UnitSlack    = 2 * time.Minute
)

// DefaultDeadlines are the boot's.
var DefaultDeadlines = Deadlines{
	Join:           Duration(JoinDeadline),
	Wake:           Duration(10 * time.Minute),
	WakeSettle:     Duration(3 * time.Minute),
	WakeInterval:   Duration(20 * time.Second),
	BackoffInitial: Duration(time.Second),
	BackoffMax:     Duration(5 * time.Second),
	Routes:         Duration(2 * time.Minute),
}

// How long a boot's bootstrap may try to install the agent (fetch-agent.sh's DYNK8S_AGENT_DEADLINE_SECONDS), per
// kind of boot, and what its unit's hard timeout adds (AgentFetchUnitTimeout), the last attempt's download.
//
// A node's fetch is short: it sits in the boot's worst case (BootWorstCase), which the launch hook's heartbeat and
// the autoscaler's max-node-provision-time must outlast, and a node that cannot fetch its agent in two minutes is
// better left to the autoscaler's timeout. A bake's is long: it runs right after the stack first enables
// versioning on the agent bucket, and for up to 15 minutes after that a GET of an object written since may answer
// 404 NoSuchKey ("Enabling versioning on buckets", Amazon S3 User Guide).
const (
	NodeAgentFetch      = 2 * time.Minute
	GatewayAgentFetch   = 5 * time.Minute
	BakeAgentFetch      = 20 * time.Minute
	AgentFetchUnitSlack = 30 * time.Second
	// LaunchEstimate is the time from a group's launch to the agent fetch's start (EC2's pending state, firmware,
	// kernel, cloud-init's early stages, network-online): an estimate with room, not measured on EC2 here.
	LaunchEstimate = 2 * time.Minute
)

// AgentFetchUnitTimeout is the agent bootstrap unit's hard timeout for a fetch deadline.
func AgentFetchUnitTimeout(fetch time.Duration) time.Duration { return fetch + AgentFetchUnitSlack }

// BootWorstCase is the longest a pool node's boot can take from its launch to a Ready kubelet, or to its one
// reason for failing: the launch, then the units that run one after the other on their hard timeouts (the agent's
// fetch, the on-prem routes, the join). A launch lifecycle hook's heartbeat must outlast it, or the hook's default
// result ends a boot still within its deadlines, and so must the autoscaler's max-node-provision-time, or the
// autoscaler removes a node that would still join.
func BootWorstCase() time.Duration {
	d := DefaultDeadlines
	return LaunchEstimate + AgentFetchUnitTimeout(NodeAgentFetch) + d.RoutesUnitTimeout() + d.UnitTimeout()
}

// UnitTimeout is the join unit's hard timeout: the agent's own deadline and UnitSlack.
func (d Deadlines) UnitTimeout() time.Duration { return d.Join.D() + UnitSlack }

// RoutesUnitTimeout is the routes unit's hard timeout: the wait for the default route and a minute for the rest.
func (d Deadlines) RoutesUnitTimeout() time.Duration { return d.Routes.D() + time.Minute }

// Duration is a time.Duration written as Go writes it ("12m0s").
type Duration time.Duration

// D is the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalText writes the duration as time.Duration.String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads what time.ParseDuration reads.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Decode reads a Node strictly: an unknown key (in any case: encoding/json matches keys without regard to case), a
// second document or a missing value is an error that names its key.
func Decode(r io.Reader) (Node, error) {
	var n Node
	if err := decodeStrict(r, &n, "node config"); err != nil {
		return Node{}, err
	}
	if err := n.Validate(); err != nil {
		return Node{}, err
	}
	return n, nil
}

// decodeStrict decodes one JSON object from r into the struct into points to, refusing unknown keys in any case,
// a second document and values of the wrong type; its errors start with what.
func decodeStrict(r io.Reader, into any, what string) error {
	dec := json.NewDecoder(r)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New(what + ": data after the JSON object")
	}
	if err := exactKeys(raw, reflect.TypeOf(into).Elem(), ""); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	strict := json.NewDecoder(bytes.NewReader(raw))
	strict.DisallowUnknownFields()
	if err := strict.Decode(into); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// exactKeys checks that every key of the objects in raw is a JSON name of t's fields, spelt exactly.
func exactKeys(raw json.RawMessage, t reflect.Type, path string) error {
	switch t.Kind() {
	case reflect.Pointer:
		return exactKeys(raw, t.Elem(), path)
	case reflect.Struct:
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil // not an object: the typed decode says why
		}
		fields := map[string]reflect.Type{}
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			fields[name] = f.Type
		}
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			ft, ok := fields[k]
			if !ok {
				return fmt.Errorf("unknown key %q", path+k)
			}
			if err := exactKeys(obj[k], ft, path+k+"."); err != nil {
				return err
			}
		}
	case reflect.Slice:
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			return nil
		}
		for i, item := range items {
			if err := exactKeys(item, t.Elem(), fmt.Sprintf("%s%d.", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Encode writes n as the renderer puts it in user data: indented, keys in a fixed order, so the same config
// renders byte-identical files.
func (n Node) Encode() ([]byte, error) {
	if err := n.Validate(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(n, "", " ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Validate checks that every value the agent needs is there.
func (n Node) Validate() error {
	var missing []string
	for key, v := range map[string]string{
		"clusterName": n.ClusterName, "poolName": n.PoolName, "joinTokenParameter": n.JoinTokenParameter,
		"criSocket": n.CRISocket,
	} {
		if v == "" {
			missing = append(missing, key)
		}
	}
	if n.APIServerEndpoint.IsZero() {
		missing = append(missing, "apiServerEndpoint")
	}
	if len(n.Packages) == 0 {
		missing = append(missing, "packages")
	}
	if len(n.Join.CACertHashes) == 0 {
		missing = append(missing, "join.caCertHashes")
	}
	for key, d := range map[string]Duration{
		"deadlines.join": n.Deadlines.Join, "deadlines.wake": n.Deadlines.Wake,
		"deadlines.wakeInterval": n.Deadlines.WakeInterval, "deadlines.backoffInitial": n.Deadlines.BackoffInitial,
		"deadlines.backoffMax": n.Deadlines.BackoffMax, "deadlines.routes": n.Deadlines.Routes,
	} {
		if d <= 0 {
			missing = append(missing, key+" (a positive duration)")
		}
	}
	if len(n.Host.OnPremCIDRs) == 0 {
		missing = append(missing, "host.onPremCidrs")
	}
	for i, p := range n.Host.OnPremCIDRs {
		if !p.IsValid() || !p.Addr().Is4() || p.Masked() != p {
			missing = append(missing, fmt.Sprintf("host.onPremCidrs.%d (an IPv4 network address, not %s)", i, p))
		}
	}
	// The tunnel's range is the renderer's to check (wireguard.MinMTU..MaxMTU); the routes need a number ip takes.
	if n.Host.TunnelMTU == 0 {
		missing = append(missing, "host.tunnelMtu (a positive MTU)")
	}
	for i, u := range n.Host.MetadataUIDs {
		if u < 1 || u > 1<<32-2 {
			missing = append(missing, fmt.Sprintf("host.metadataUids.%d (a non-root UID, not %d)", i, u))
		}
	}
	if c := n.Cache; c != nil {
		if c.SizeGiB < 1 || c.VolumeType == "" || c.MaxVolumes < 1 || !strings.HasPrefix(c.MountPath, "/") {
			missing = append(missing, "cache (a size, a volume type, an absolute mount path and at least one volume)")
		}
	}
	if n.Deadlines.WakeSettle < 0 {
		missing = append(missing, "deadlines.wakeSettle (a duration, 0 or more)")
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return fmt.Errorf("node config: missing or invalid: %s", strings.Join(missing, ", "))
}

// Identity is what the instance learns about itself from IMDS at boot.
type Identity struct {
	InstanceID, InstanceType, Region, Zone string
	// NodeIP is the instance's private IPv4 address (local-ipv4), the kubelet's node IP.
	NodeIP netip.Addr
	// Cache says the boot mounted the pool's build cache: the Node is labelled kube.LabelCache.
	Cache bool
}

// RuntimeLabels are the labels only the instance knows.
func RuntimeLabels(id Identity) map[string]string {
	// They are the labels the Cluster Autoscaler puts on its template node.
	return map[string]string{kube.LabelZone: id.Zone, kube.LabelRegion: id.Region, kube.LabelInstanceType: id.InstanceType}
}

// JoinConfig is the kubeadm JoinConfiguration of this node: the pool's part with the instance's identity and the
// token. root prefixes the patches directory (a test's temporary root; "" on a node).
func (n Node) JoinConfig(id Identity, token, root string) JoinConfiguration {
	labels := maps.Clone(n.Join.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, RuntimeLabels(id))
	if id.Cache {
		labels[kube.LabelCache] = "true"
	}
	keys := slices.Sorted(maps.Keys(labels))
	pairs := make([]string, len(keys))
	for i, k := range keys {
		pairs[i] = k + "=" + labels[k]
	}
	taints := slices.Clone(n.Join.Taints)
	if taints == nil {
		taints = []kube.Taint{}
	}
	return JoinConfiguration{
		APIVersion: "kubeadm.k8s.io/v1beta4",
		Kind:       "JoinConfiguration",
		Discovery: Discovery{BootstrapToken: BootstrapTokenDiscovery{
			APIServerEndpoint: n.APIServerEndpoint.String(),
			CACertHashes:      slices.Sorted(slices.Values(n.Join.CACertHashes)),
			Token:             token,
		}},
		NodeRegistration: NodeRegistration{
			Name:      id.InstanceID,
			CRISocket: n.CRISocket,
			KubeletExtraArgs: []KubeletArg{
				{Name: "node-ip", Value: id.NodeIP.String()},
				{Name: "node-labels", Value: strings.Join(pairs, ",")},
				// The Cluster Autoscaler maps nodes to ASG instances by this ID; no cloud provider sets it here.
				{Name: "provider-id", Value: "aws:///" + id.Zone + "/" + id.InstanceID},
			},
			Taints: taints,
		},
		Patches: Patches{Directory: root + n.Join.PatchesDirectory},
	}
}

// JoinConfiguration is the subset of kubeadm.k8s.io/v1beta4 JoinConfiguration dynk8s writes (field names and JSON
// tags as in cmd/kubeadm/app/apis/kubeadm/v1beta4/types.go).
type JoinConfiguration struct {
	APIVersion       string           `json:"apiVersion"`
	Kind             string           `json:"kind"`
	Discovery        Discovery        `json:"discovery"`
	NodeRegistration NodeRegistration `json:"nodeRegistration"`
	Patches          Patches          `json:"patches"`
}

// Patches names kubeadm's patch directory ("target[suffix][+patchtype].extension" files).
type Patches struct {
	Directory string `json:"directory"`
}

// Discovery is how the node finds and trusts the cluster: a bootstrap token, with the CA pinned.
type Discovery struct {
	BootstrapToken BootstrapTokenDiscovery `json:"bootstrapToken"`
}

// BootstrapTokenDiscovery pins the cluster CA by hash; it never skips the check (unsafeSkipCAVerification).
type BootstrapTokenDiscovery struct {
	APIServerEndpoint string   `json:"apiServerEndpoint"`
	CACertHashes      []string `json:"caCertHashes"`
	Token             string   `json:"token"`
}

// NodeRegistration is the node's name, runtime, kubelet flags and taints.
type NodeRegistration struct {
	// Name is the Node's name and its kubelet's identity (system:node:<name>): the instance id, which the CSR
	// approver finds in EC2, rather than the hostname, which the image and the VPC's DNS settings decide.
	Name      string `json:"name"`
	CRISocket string `json:"criSocket"`
	// KubeletExtraArgs is a list of {name, value} in v1beta4 (a map in v1beta3).
	KubeletExtraArgs []KubeletArg `json:"kubeletExtraArgs"`
	// Taints is always a list: for a worker, kubeadm treats nil and [] alike, and [] says "none" plainly.
	Taints []kube.Taint `json:"taints"`
}

// KubeletArg is one kubelet flag.
type KubeletArg struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}
