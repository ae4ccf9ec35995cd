package config

import (
	"fmt"
	"maps"
	"net/netip"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/wireguard"
)

var (
	clusterNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)
	poolNameRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,28}[a-z0-9])?$`)
	amiIDRE       = regexp.MustCompile(`^ami-([0-9a-f]{8}|[0-9a-f]{17})$`)
	zoneSuffixRE  = regexp.MustCompile(`^[a-z]$`)
)

// Fedora AMI naming schemes by release: fedimg names up to 39, Kiwi names from 40 on (see infra.FedoraImage).
const (
	OldestFedoraRelease = 28
	NewestFedoraRelease = 45
)

// SubnetExtraBits is how much smaller than the VPC each zone's subnet is: up to 16 zones.
const SubnetExtraBits = 4

// expanders are the Cluster Autoscaler expanders that work with its AWS provider (expander/expander.go at
// cluster-autoscaler-1.34.5). Not price: the AWS provider has no pricing, and the autoscaler exits at start with it
// (expander/factory/expander_factory.go); not grpc, which needs flags dynk8s does not set.
var expanders = []string{"least-nodes", "least-waste", "most-pods", "priority", "random"}

// isoRegionRE is the region names of AWS's isolated partitions (aws-iso, aws-iso-b, aws-iso-e, aws-iso-f:
// us-iso-east-1, us-isob-east-1, eu-isoe-west-1, us-isof-south-1), whose service endpoints are under domains of
// their own (c2s.ic.gov, sc2s.sgov.gov, ...; the partitions' dnsSuffix in the AWS SDKs' endpoint rules).
var isoRegionRE = regexp.MustCompile(`^[a-z]{2}-iso[a-z]?-`)

// validate checks the semantics of a decoded config, records every problem with its key path, and fills in Derived.
func validate(r *reader, c *Config) {
	ns := Namespace + ":"
	if r.required("aws:region", c.Region != "") && !names.IsRegion(c.Region) {
		r.addf("aws:region", "%q is not an AWS region name (e.g. eu-central-1)", c.Region)
	} else if isoRegionRE.MatchString(c.Region) {
		r.addf("aws:region", "%q is a region of an isolated partition (aws-iso*): dynk8s supports the aws, aws-cn "+
			"and aws-us-gov partitions, whose endpoints the controller's bootstrap knows", c.Region)
	}
	if r.required(ns+"clusterName", c.ClusterName != "") && !clusterNameRE.MatchString(c.ClusterName) {
		r.addf(ns+"clusterName", "%q must be 1-32 lowercase letters, digits and '-', starting and ending with a "+
			"letter or digit: it is a segment of the autoscaler's tag key and a prefix of IAM names", c.ClusterName)
	}
	validateKubernetes(r, c)
	validateWireGuard(r, c)
	validateRanges(r, c)
	validateOnPremDNS(r, c)
	checkInstanceTypeName(r, ns+"gateway.instanceType", c.Gateway.InstanceType)
	if d := c.Agent.RetentionDays; d < MinAgentRetentionDays {
		r.addf(ns+"agent.retentionDays", "must be at least %d day, got %d", MinAgentRetentionDays, d)
	}
	if d := c.Gateway.IdleStop; d != 0 && d < MinIdleStop {
		r.addf(ns+"gateway.idleStop", "must be 0 (always on) or at least %s, got %s", MinIdleStop, d)
	}
	if rel := c.Fedora.Release; rel == 0 {
		r.addf(ns+"fedora.release", "is required: the Fedora release to boot, e.g. 44")
	} else if rel < OldestFedoraRelease || rel > NewestFedoraRelease {
		r.addf(ns+"fedora.release", "%d has no known Fedora Cloud AMI naming scheme (known: %d..%d); pin an image "+
			"per pool with nodePools[*].amiId or pick a known release", rel, OldestFedoraRelease, NewestFedoraRelease)
	}
	validatePools(r, c)
	validateAutoscaler(r, c)
	validateFuse(r, c)
	validateImages(r, c.Images)
	if c.Identity.AutoscalerKeyRotation == "" {
		r.addf(ns+"identity.autoscalerKeyRotation", "must not be empty")
	}
	validateParameterKey(r, c)
	if c.Cleanup.NotReadyAfter < 5*time.Minute {
		r.addf(ns+"cleanup.notReadyAfter", "must be at least 5m: a node rebooting or briefly cut off must not lose "+
			"its Node object, got %s", c.Cleanup.NotReadyAfter)
	}
}

// required records "is required" at path unless ok, and returns ok.
func (r *reader) required(path string, ok bool) bool {
	if !ok {
		r.addf(path, "is required")
	}
	return ok
}

func validateKubernetes(r *reader, c *Config) {
	kp := Namespace + ":kubernetes."
	k := c.Kubernetes
	if r.required(kp+"version", !k.Version.IsZero()) {
		if m, err := kube.LookupMinor(k.Version); err != nil {
			r.addf(kp+"version", "%v", err)
		} else {
			c.Derived.Kubernetes = m
		}
	}
	r.required(kp+"apiServerEndpoint", !k.APIServerEndpoint.IsZero())
	if k.CACertHash != "" {
		if err := kube.CheckCACertHash(k.CACertHash); err != nil {
			r.addf(kp+"caCertHash", "%v", err)
		}
	}
	if k.Kubeconfig != nil && strings.TrimSpace(*k.Kubeconfig) == "" {
		r.addf(kp+"kubeconfig", "is set but empty; remove the key to use the ambient kubeconfig")
	}
	if k.BootstrapTokenRotation == "" {
		r.addf(kp+"bootstrapTokenRotation", "must not be empty")
	}
	validateTokenTTL(r, kp+"bootstrapTokenTTL", k.BootstrapTokenTTL)
	r.required(kp+"podCidr", k.PodCIDR.IsValid())
	for i, n := range k.OnPremNodes {
		np := fmt.Sprintf("%sonPremNodes[%d]", kp, i)
		switch errs := validation.IsDNS1123Subdomain(n); {
		case len(errs) > 0:
			r.addf(np, "%q is not a Node name: %s", n, strings.Join(errs, "; "))
		case names.IsInstanceID(n):
			r.addf(np, "%q is an EC2 instance id: pool nodes register with their pool label and need no entry", n)
		case slices.Index(k.OnPremNodes, n) < i:
			r.addf(np, "%q is listed twice", n)
		}
	}
}

// Bounds of kubernetes.bootstrapTokenTTL. The floor keeps the rotation period (a third of the TTL) at ten minutes or
// more; the ceiling is kubeadm's own default token TTL (24h), beyond which a short-lived token is no longer short.
const (
	MinBootstrapTokenTTL = 30 * time.Minute
	MaxBootstrapTokenTTL = 24 * time.Hour
)

// BootstrapTokenRotationPeriod is how often dynk8s-controller issues a new join token for a TTL: a third of it,
// so the token in SSM always has at least two thirds of its life left, in whole minutes.
func BootstrapTokenRotationPeriod(ttl time.Duration) time.Duration {
	return (ttl / 3).Truncate(time.Minute)
}

// validateTokenTTL checks the join token TTL against its bounds. The floor also keeps the oldest token SSM can hold
// (one rotation period old) valid for longer than a node may take to join with it; a test pins that.
func validateTokenTTL(r *reader, path string, ttl time.Duration) {
	if ttl < MinBootstrapTokenTTL || ttl > MaxBootstrapTokenTTL {
		r.addf(path, "must be %s..%s, got %s", shortDuration(MinBootstrapTokenTTL),
			shortDuration(MaxBootstrapTokenTTL), shortDuration(ttl))
	}
}

// shortDuration is time.Duration's String without its zero minutes and seconds: 30m, 24h, 2h30m.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// validateRanges checks the VPC's size and zones, and that no two of the VPC, tunnel, on-prem, pod and service
// ranges overlap.
func validateRanges(r *reader, c *Config) {
	ns := Namespace + ":"
	if vpc := c.Network.VPCCIDR; vpc.IsValid() && (vpc.Bits() < 16 || vpc.Bits() > 24) {
		r.addf(ns+"network.vpcCidr", "%s: the prefix must be /16 to /24 (AWS allows /16-/28; dynk8s carves one "+
			"/%d-smaller subnet per zone)", vpc, SubnetExtraBits)
	}
	validateZones(r, c)
	if tun := c.WireGuard.TunnelCIDR; tun.IsValid() && tun.Bits() > 30 {
		r.addf(ns+"wireguard.tunnelCidr", "%s is too small: the tunnel needs two peer addresses besides the "+
			"network and broadcast addresses (/30 or larger)", tun)
	}
	ranges := map[string]netip.Prefix{
		ns + "network.vpcCidr":        c.Network.VPCCIDR,
		ns + "kubernetes.podCidr":     c.Kubernetes.PodCIDR,
		ns + "kubernetes.serviceCidr": c.Kubernetes.ServiceCIDR,
		ns + "wireguard.tunnelCidr":   c.WireGuard.TunnelCIDR,
	}
	for i, p := range c.WireGuard.OnPremCIDRs {
		ranges[fmt.Sprintf("%swireguard.onPremCidrs[%d]", ns, i)] = p
	}
	paths := slices.SortedFunc(maps.Keys(ranges), comparePaths)
	for _, path := range paths {
		if p := ranges[path]; p.IsValid() {
			if u := unusable(p); u != "" {
				r.addf(path, "%s overlaps %s: no network of the stack or the cluster can be there", p, u)
			}
		}
	}
	// The node security group admits the on-prem and tunnel ranges on every port, and the nodes have public
	// addresses: a public range there is admitted from the internet, not only through the tunnel.
	if tun := c.WireGuard.TunnelCIDR; tun.IsValid() && !isPrivateRange(tun) {
		r.addf(ns+"wireguard.tunnelCidr", "%s is not a private range (RFC 1918 or RFC 6598's 100.64.0.0/10): the "+
			"tunnel's two addresses are the peers' own, and the node security group admits the range on every port",
			tun)
	}
	for i, p := range c.WireGuard.OnPremCIDRs {
		if p.IsValid() && !isPrivateRange(p) && !c.WireGuard.AllowPublicOnPremCIDRs {
			r.addf(fmt.Sprintf("%swireguard.onPremCidrs[%d]", ns, i), "%s is not a private range (RFC 1918 or RFC "+
				"6598's 100.64.0.0/10): the node security group admits it on every port and the nodes have public "+
				"addresses, so hosts of that range on the internet would reach them too; if the on-prem network "+
				"really uses public addresses, set %swireguard.allowPublicOnPremCidrs", p, ns)
		}
	}
	for i, a := range paths {
		for _, b := range paths[i+1:] {
			if ranges[a].IsValid() && ranges[b].IsValid() && ranges[a].Overlaps(ranges[b]) {
				r.addf(b, "%s overlaps %s (%s): the VPC, tunnel, on-prem, pod and service ranges must be disjoint",
					ranges[b], a, ranges[a])
			}
		}
	}
}

// validateOnPremDNS checks that the on-prem name servers are reached through the tunnel and that servers and domains
// come together.
func validateOnPremDNS(r *reader, c *Config) {
	dp := Namespace + ":network.onPremDns."
	d := c.Network.OnPremDNS
	if len(d.Servers) > kube.MaxDNSServers {
		r.addf(dp+"servers", "%d servers, at most %d (a resolv.conf holds three, and the kubelet passes only three "+
			"on to pods)", len(d.Servers), kube.MaxDNSServers)
	}
	for i, a := range d.Servers {
		sp := fmt.Sprintf("%sservers[%d]", dp, i)
		if j := slices.Index(d.Servers, a); j < i {
			r.addf(sp, "%s is listed twice (also servers[%d])", a, j)
		} else if !r.failed(Namespace+":wireguard.onPremCidrs") && !slices.ContainsFunc(c.WireGuard.OnPremCIDRs,
			func(p netip.Prefix) bool { return p.Contains(a) }) {
			r.addf(sp, "%s is not inside any of %s:wireguard.onPremCidrs: the nodes reach on-prem name servers "+
				"through the tunnel, which routes only those ranges", a, Namespace)
		}
	}
	if len(d.Servers) > 0 && len(d.Domains) == 0 {
		r.addf(dp+"domains", "is required with servers: the on-prem domains the servers answer for (only those "+
			"are sent to them)")
	}
	if len(d.Domains) > 0 && len(d.Servers) == 0 && !r.failed(dp+"servers") {
		r.addf(dp+"servers", "is required with domains: the on-prem name servers that answer for them")
	}
	for i, dom := range d.Domains {
		dmp := fmt.Sprintf("%sdomains[%d]", dp, i)
		switch {
		case !kube.IsDNSSubdomain(dom):
			r.addf(dmp, "%q is not a DNS domain (lower-case labels such as corp.example.com; no leading '~', no "+
				"trailing '.')", dom)
		case slices.Index(d.Domains, dom) < i:
			r.addf(dmp, "%q is listed twice", dom)
		}
	}
}

func validateZones(r *reader, c *Config) {
	path := Namespace + ":network.availabilityZones"
	z := c.Network.AvailabilityZones
	if z.Names == nil {
		if z.Count < 1 || z.Count > 6 {
			r.addf(path, "a zone count must be 1..6, got %d", z.Count)
		}
		return
	}
	if len(z.Names) == 0 {
		r.addf(path, "the zone list is empty")
	}
	for i, name := range z.Names {
		zp := fmt.Sprintf("%s[%d]", path, i)
		suffix, ok := strings.CutPrefix(name, c.Region)
		if c.Region != "" && (!ok || !zoneSuffixRE.MatchString(suffix)) {
			r.addf(zp, "%q is not a zone of %s (e.g. %sa)", name, c.Region, c.Region)
		}
		if j := slices.Index(z.Names, name); j < i {
			r.addf(zp, "%q is listed twice", name)
		}
	}
}

func validateWireGuard(r *reader, c *Config) {
	wp := Namespace + ":wireguard."
	w := c.WireGuard
	if w.ListenPort < 1 || w.ListenPort > 65535 {
		r.addf(wp+"listenPort", "must be a UDP port 1..65535, got %d", w.ListenPort)
	}
	if w.MTU < wireguard.MinMTU || w.MTU > wireguard.MaxMTU {
		r.addf(wp+"mtu", "must be %d..%d (IPv6's minimum to the EC2 jumbo MTU less WireGuard's overhead), got %d",
			wireguard.MinMTU, wireguard.MaxMTU, w.MTU)
	}
	if len(w.OnPremCIDRs) == 0 {
		r.addf(wp+"onPremCidrs", "is required: at least one on-prem range to route through the tunnel")
	}
	for i, p := range w.OnPremCIDRs {
		if j := slices.Index(w.OnPremCIDRs, p); j < i && p.IsValid() {
			r.addf(fmt.Sprintf("%sonPremCidrs[%d]", wp, i), "%s is listed twice (also onPremCidrs[%d])", p, j)
		}
	}
	if ep := w.OnPremEndpoint; ep != nil {
		if a, ok := ep.Addr(); ok && !a.Unmap().Is4() {
			r.addf(wp+"onPremEndpoint", "%s is an IPv6 address, but the gateway has an IPv4 address only: give the "+
				"on-prem peer's IPv4 address, or a name that resolves to one", ep)
		} else if ok {
			validateOnPremEndpoint(r, c, a.Unmap())
		}
	}
	validateOnPremForward(r, c)
	addr, isIP := c.Kubernetes.APIServerEndpoint.Addr()
	if isIP && !r.failed(wp+"onPremCidrs") && !slices.ContainsFunc(w.OnPremCIDRs, func(p netip.Prefix) bool {
		return p.Contains(addr)
	}) {
		r.addf(Namespace+":kubernetes.apiServerEndpoint", "%s is not inside any of %sonPremCidrs: the nodes reach "+
			"the API server through the tunnel, which routes only those ranges", addr, wp)
	}
}

// validateOnPremEndpoint checks the on-prem peer's address, when the endpoint is one (a name resolves on the
// gateway, at each handshake). The gateway sends its handshakes from its public address through the internet gateway
// (its subnet's default route): the address must be one the internet carries, and outside every range the VPC routes
// elsewhere, or the handshakes would go into the tunnel they are to build (the VPC routes onPremCidrs to the
// gateway, and the gateway routes them into wg0) or stay in the VPC.
func validateOnPremEndpoint(r *reader, c *Config, a netip.Addr) {
	path := Namespace + ":wireguard.onPremEndpoint"
	host := netip.PrefixFrom(a, a.BitLen())
	if u := unusable(host); u != "" {
		r.addf(path, "%s is in %s: the gateway cannot reach an on-prem peer there", a, u)
		return
	}
	for i, p := range c.WireGuard.OnPremCIDRs {
		if p.Contains(a) {
			r.addf(path, "%s is inside wireguard.onPremCidrs[%d] (%s): the gateway would route its handshakes to the "+
				"peer into the tunnel they are to build; give the address the on-prem peer has on the internet", a, i, p)
			return
		}
	}
	for _, own := range []struct {
		key string
		p   netip.Prefix
	}{{"wireguard.tunnelCidr", c.WireGuard.TunnelCIDR}, {"network.vpcCidr", c.Network.VPCCIDR}} {
		if own.p.Contains(a) {
			r.addf(path, "%s is inside %s (%s): that is the tunnel's or the VPC's own range, not the on-prem "+
				"peer's address on the internet", a, own.key, own.p)
			return
		}
	}
	if isPrivateAddr(a) {
		r.addf(path, "%s is a private address: the gateway reaches the on-prem peer through the internet gateway, "+
			"which carries public addresses only; give the peer's public address (or the NAT's in front of it), or "+
			"leave the endpoint unset and let the on-prem side dial out", a)
	}
}

// maxPrePullImages bounds nodePools[i].prePullImages: the list is part of the pool's user data.
const maxPrePullImages = 20

func validatePools(r *reader, c *Config) {
	path := Namespace + ":nodePools"
	if len(c.NodePools) == 0 && !r.failed(path) {
		r.addf(path, "is required: at least one node pool")
	}
	for i, p := range c.NodePools {
		pp := fmt.Sprintf("%s[%d].", path, i)
		first := slices.IndexFunc(c.NodePools, func(o NodePool) bool { return o.Name == p.Name })
		switch {
		case !r.required(pp+"name", p.Name != ""):
		case !poolNameRE.MatchString(p.Name):
			r.addf(pp+"name", "%q must be a DNS label of at most 30 characters (lowercase letters, digits, '-')",
				p.Name)
		case first < i:
			r.addf(pp+"name", "%q is already the name of nodePools[%d]", p.Name, first)
		case IsStackResourceName(p.Name):
			r.addf(pp+"name", "%q would name the pool's instances %s-%s, the Name of one of the stack's own "+
				"resources: pick another name", p.Name, c.ClusterName, p.Name)
		}
		if p.Arch == "" {
			r.addf(pp+"arch", "is required: x86_64 or arm64")
		}
		validateInstanceTypes(r, pp, p)
		if p.MinSize < 0 {
			r.addf(pp+"minSize", "must be >= 0, got %d", p.MinSize)
		}
		if p.MaxSize < p.MinSize {
			r.addf(pp+"maxSize", "must be >= minSize (%d), got %d", p.MinSize, p.MaxSize)
		} else if p.MaxSize < 1 || p.MaxSize > 1000 {
			r.addf(pp+"maxSize", "must be 1..1000, got %d", p.MaxSize)
		}
		if p.VolumeSizeGiB < 20 || p.VolumeSizeGiB > 16384 {
			r.addf(pp+"volumeSizeGiB", "must be 20..16384 GiB (images and the kubelet need room), got %d",
				p.VolumeSizeGiB)
		}
		if p.AMIID != "" && !amiIDRE.MatchString(p.AMIID) {
			r.addf(pp+"amiId", "%q is not an AMI id (ami- and 8 or 17 hex digits)", p.AMIID)
		}
		validateImage(r, pp, p)
		validateLabelsAndTaints(r, pp, p)
		if d := p.Autoscaling.ScaleDownUnneededTime; d != nil && *d <= 0 {
			r.addf(pp+"autoscaling.scaleDownUnneededTime", "must be a positive duration, got %s", *d)
		}
		if u := p.Autoscaling.ScaleDownUtilizationThreshold; u != nil && (*u <= 0 || *u > 1) {
			r.addf(pp+"autoscaling.scaleDownUtilizationThreshold", "must be in (0, 1], got %v", *u)
		}
		validateWarmPool(r, pp, p)
		validateCache(r, pp, p)
		if len(p.PrePullImages) > maxPrePullImages {
			r.addf(pp+"prePullImages", "at most %d images (they go into the user data, limited to 16 KiB), got %d",
				maxPrePullImages, len(p.PrePullImages))
		}
		for j, img := range p.PrePullImages {
			if _, err := kube.NormalizeImage(img); err != nil {
				r.addf(fmt.Sprintf("%sprePullImages[%d]", pp, j), "%v", err)
			}
		}
		validateTagLimits(r, pp, c, p)
		if n := len(c.GroupTags(p, tagCountShape)); n > maxGroupTags {
			r.addf(pp+"labels", "the pool needs %d Auto Scaling Group tags (one per label and taint plus %d of "+
				"dynk8s's own), over the limit of %d: drop labels or taints", n,
				n-len(p.Labels)-len(p.Taints), maxGroupTags)
		}
	}
}

// validateImage checks what the pool boots: a baked image is built from the pinned Fedora image, so it cannot also
// boot the operator's own image.
func validateImage(r *reader, pp string, p NodePool) {
	switch p.Image {
	case ImageStock:
	case ImageBaked:
		if p.AMIID != "" {
			r.addf(pp+"image", "baked builds the pool's image from the pinned Fedora image, and amiId boots "+
				"an image of your own instead: set one of them")
		}
	default:
		r.addf(pp+"image", "must be %s or %s, got %q", ImageStock, ImageBaked, p.Image)
	}
}

// cacheMountForbidden are the paths a cache may not be mounted at or under: the system's own, and what the node
// runs before its cache is mounted (CRI-O's storage, the kubelet's, the agent's).
var cacheMountForbidden = []string{"/etc", "/usr", "/boot", "/proc", "/sys", "/dev", "/run", "/tmp", "/var/log",
	"/var/lib/containers", "/var/lib/kubelet", "/var/lib/dynk8s", "/var/lib/cloud", "/opt/cni"}

// validateCache checks a pool's cache against gp3's limits (Amazon EBS User Guide, "Amazon EBS volume types",
// General Purpose SSD volumes: 1 GiB..16 TiB, 3000..16000 IOPS at 500 per GiB, 125..1000 MiB/s at 0.25 MiB/s per
// IOPS) and where a node can mount it.
func validateCache(r *reader, pp string, p NodePool) {
	c := p.Cache
	if c == nil {
		return
	}
	cp := pp + "cache."
	if c.SizeGiB < 1 || c.SizeGiB > 16384 {
		r.addf(cp+"sizeGiB", "must be 1..16384 (gp3), got %d", c.SizeGiB)
	}
	switch {
	case c.IOPS < 3000 || c.IOPS > 16000:
		r.addf(cp+"iops", "must be 3000..16000 (gp3), got %d", c.IOPS)
	case c.IOPS > 500*c.SizeGiB:
		r.addf(cp+"iops", "must be at most 500 per GiB of sizeGiB (%d), got %d", 500*c.SizeGiB, c.IOPS)
	}
	switch {
	case c.Throughput < 125 || c.Throughput > 1000:
		r.addf(cp+"throughput", "must be 125..1000 MiB/s (gp3), got %d", c.Throughput)
	case 4*c.Throughput > c.IOPS:
		r.addf(cp+"throughput", "must be at most a quarter of iops (%d MiB/s), got %d", c.IOPS/4, c.Throughput)
	}
	clean := path.Clean(c.MountPath)
	switch {
	case !path.IsAbs(c.MountPath) || clean != c.MountPath || clean == "/" || clean == "/var" || clean == "/var/lib" ||
		clean == "/opt":
		r.addf(cp+"mountPath", "must be a clean absolute path of a directory of its own, got %q", c.MountPath)
	default:
		for _, f := range cacheMountForbidden {
			if clean == f || strings.HasPrefix(clean, f+"/") {
				r.addf(cp+"mountPath", "%s is under %s, which the system or the node uses before the cache is "+
					"mounted: choose a directory of its own, such as /var/lib/dynk8s-cache", c.MountPath, f)
				break
			}
		}
	}
	if c.MaxVolumes < 0 {
		r.addf(cp+"maxVolumes", "must be 0 (the pool's maxSize) or more, got %d", c.MaxVolumes)
	}
	if c.MaxIdleDays < 1 || c.MaxIdleDays > 3650 {
		r.addf(cp+"maxIdleDays", "must be 1..3650, got %d", c.MaxIdleDays)
	}
}

// maxHibernationMemoryMiB is the most RAM EC2 hibernates a Linux instance with (EC2 User Guide, "Prerequisites for
// EC2 instance hibernation": instance RAM size).
const maxHibernationMemoryMiB = 150 * 1024

// validateWarmPool checks a pool's warm pool against what AWS accepts and what a node that joins from it needs.
func validateWarmPool(r *reader, pp string, p NodePool) {
	w := p.WarmPool
	if w == nil {
		return
	}
	wp := pp + "warmPool."
	if p.Spot || len(p.InstanceTypes) > 1 {
		// PutWarmPool "cannot be called on an Auto Scaling group that has a mixed instances policy or a launch
		// template or launch configuration that requests Spot Instances" (EC2 Auto Scaling API reference); a pool
		// with spot or with several types is such a group here.
		r.addf(pp+"warmPool", "needs an on-demand pool of one instance type: AWS refuses a warm pool on a group "+
			"that requests spot instances or has a mixed instances policy (spot: %t, %d instance types)",
			p.Spot, len(p.InstanceTypes))
	}
	if w.Size < 1 || w.Size > p.MaxSize {
		r.addf(wp+"size", "must be 1..maxSize (%d): the warm instances wait to become the group's nodes, got %d",
			p.MaxSize, w.Size)
	}
	switch w.State {
	case WarmStopped, WarmRunning:
	case WarmHibernated:
		validateHibernation(r, wp+"state", p)
	default:
		r.addf(wp+"state", "must be %s, %s or %s, got %q", WarmStopped, WarmHibernated, WarmRunning, w.State)
	}
	if w.ReuseOnScaleIn {
		// A node the autoscaler scales in has been drained, cordoned and tainted ToBeDeletedByClusterAutoscaler; its
		// kubelet keeps /etc/kubernetes/kubelet.conf and its Node object stays. Returned to the warm pool and started
		// again, it would come back as that cordoned Node (or, past cleanup.notReadyAfter, as a kubelet whose Node
		// the controller's cleanup deleted), and the boot, which does nothing on a node that has joined, would not repair it.
		r.addf(wp+"reuseOnScaleIn", "is not supported: a scaled-in node keeps its kubelet credentials and its "+
			"cordoned, tainted Node object, and nothing resets them before it would serve again; scaled-in "+
			"nodes are terminated and the warm pool refills with fresh instances")
	}
}

// validateHibernation checks the hibernation prerequisites the config can see: an Intel or AMD type of a family
// that hibernates Fedora, RAM within the limit, a root volume (always encrypted here, as hibernation requires) with
// room for the RAM, and an image prepared for hibernation: AWS requires additional configuration on Fedora, which
// the stock Fedora Cloud image lacks, so the pool must name its own image.
func validateHibernation(r *reader, path string, p NodePool) {
	if p.AMIID == "" {
		r.addf(path, "Hibernated needs an image configured for hibernation (AWS requires additional configuration "+
			"on Fedora: a swap area for the RAM and the resume setup, which the stock Fedora Cloud image lacks): "+
			"set amiId to such an image, or use Stopped")
		return
	}
	// The type's part (EC2's hibernationSupported, RAM, the volume's room for it) is checked with what EC2 says of
	// the type, at preview: hibernationPrerequisites.
}

// hibernationPrerequisites are the prerequisites of a hibernated warm pool that depend on the instance type:
// EC2 lists the type as hibernating, AWS hibernates Fedora on Nitro Intel and AMD types only (its Graviton list
// names Amazon Linux and Ubuntu images alone: EC2 User Guide, "Prerequisites for EC2 instance hibernation",
// https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/hibernating-prerequisites.html), RAM within the limit, and a
// root volume (always encrypted here, as hibernation requires) with room for the RAM.
func hibernationPrerequisites(p NodePool, t InstanceType) string {
	switch {
	case !t.Hibernation || t.Arch != kube.ArchX86_64:
		return fmt.Sprintf("Hibernated: %s cannot hibernate a Fedora instance (AWS supports it on Nitro Intel and "+
			"AMD types only); use Stopped", t.Name)
	case t.MemoryMiB > maxHibernationMemoryMiB:
		return fmt.Sprintf("Hibernated: %s has %d MiB of RAM, above the %d MiB EC2 hibernates; use Stopped", t.Name,
			t.MemoryMiB, maxHibernationMemoryMiB)
	case p.VolumeSizeGiB < ceilGiB(t.MemoryMiB)+diskHeldBackGiB:
		return fmt.Sprintf("Hibernated: the root volume (volumeSizeGiB %d) must hold the RAM of %s (%d GiB) besides "+
			"the %d GiB of OS and images", p.VolumeSizeGiB, t.Name, ceilGiB(t.MemoryMiB), diskHeldBackGiB)
	}
	return ""
}

func ceilGiB(mib int) int { return (mib + 1023) / 1024 }

func validateLabelsAndTaints(r *reader, pp string, p NodePool) {
	for _, key := range slices.Sorted(maps.Keys(p.Labels)) {
		lp := childPath(pp+"labels", key)
		if err := kube.CheckKey(key); err != nil {
			r.addf(lp, "%v", err)
		} else if kube.SetOnEveryNode(key) {
			r.addf(lp, "is set by dynk8s on every pool node; remove it from the pool")
		} else if err := kube.CheckValue(p.Labels[key]); err != nil {
			r.addf(lp, "value %v", err)
		}
	}
	for _, p := range kube.CheckTaints(p.Taints) {
		r.addf(fmt.Sprintf("%staints[%d].%s", pp, p.Index, p.Field), "%v", p.Err)
	}
}

// AWS tag limits (the Auto Scaling Tag type): a label or taint key becomes part of a node-template tag's key.
const (
	maxTagKey   = 128
	maxTagValue = 256
)

// validateTagLimits checks every tag of the pool's group against AWS's limits, and reports a tag too long on the
// label, taint or name it comes from.
func validateTagLimits(r *reader, pp string, c *Config, p NodePool) {
	for _, tag := range c.GroupTags(p, tagCountShape) {
		if len(tag.Key) <= maxTagKey && len(tag.Value) <= maxTagValue {
			continue
		}
		path := pp + "name"
		if k, ok := strings.CutPrefix(tag.Key, nodeTemplateLabelTag); ok {
			if _, own := p.Labels[k]; own {
				path = childPath(pp+"labels", k)
			}
		}
		if k, ok := strings.CutPrefix(tag.Key, nodeTemplateTaintTag); ok {
			if j := slices.IndexFunc(p.Taints, func(t kube.Taint) bool { return t.Key == k }); j >= 0 {
				path = fmt.Sprintf("%staints[%d].key", pp, j)
			}
		}
		r.addf(path, "makes the Auto Scaling Group tag %q (%d characters, value %d): AWS allows keys of at most %d "+
			"and values of at most %d characters", truncate(tag.Key, 60), len(tag.Key), len(tag.Value), maxTagKey,
			maxTagValue)
	}
}

// validateInstanceTypes checks the form of a pool's instance types; whether they exist, their architecture, shape
// and zones are EC2's to say (CheckInstanceTypes, at preview).
func validateInstanceTypes(r *reader, pp string, p NodePool) {
	if len(p.InstanceTypes) == 0 {
		r.addf(pp+"instanceTypes", "is required: at least one EC2 instance type")
		return
	}
	for j, it := range p.InstanceTypes {
		ip := fmt.Sprintf("%sinstanceTypes[%d]", pp, j)
		checkInstanceTypeName(r, ip, it)
		if slices.Index(p.InstanceTypes, it) < j {
			r.addf(ip, "%s is listed twice", it)
		}
	}
}

func validateAutoscaler(r *reader, c *Config) {
	ap := Namespace + ":autoscaler."
	if !c.Kubernetes.Version.IsZero() && c.Derived.Kubernetes.Minor != 0 {
		v, err := kube.AutoscalerVersion(c.Kubernetes.Version, c.Autoscaler.Version)
		if err != nil {
			path := ap + "version"
			if c.Autoscaler.Version == "" {
				// The key to set is autoscaler.version, the key at fault kubernetes.version.
				path = Namespace + ":kubernetes.version"
				err = fmt.Errorf("%w (set %s)", err, ap+"version")
			}
			r.addf(path, "%v", err)
		} else {
			c.Derived.AutoscalerVersion = v
		}
	}
	a := c.Autoscaler
	if worst := nodeconfig.BootWorstCase(); a.MaxNodeProvisionTime <= worst {
		r.addf(ap+"maxNodeProvisionTime", "must be longer than a node's boot at its worst (%s: the launch, the "+
			"agent's fetch, the on-prem routes and the join on their deadlines): the autoscaler would give up on "+
			"nodes that still join, got %s", worst, a.MaxNodeProvisionTime)
	}
	if a.ScaleDownDelayAfterAdd < 0 {
		r.addf(ap+"scaleDownDelayAfterAdd", "must not be negative, got %s", a.ScaleDownDelayAfterAdd)
	}
	if a.ScaleDownUnreadyTime < MinScaleDownUnreadyTime {
		r.addf(ap+"scaleDownUnreadyTime", "must be at least %s: a node cut off by a tunnel outage the gateway "+
			"recovers from (its alarm reboots it after 3 failed minutes) must not be removed with its builds, got %s",
			MinScaleDownUnreadyTime, a.ScaleDownUnreadyTime)
	}
	if a.NewPodScaleUpDelay < 0 {
		r.addf(ap+"newPodScaleUpDelay", "must not be negative, got %s", a.NewPodScaleUpDelay)
	}
	if a.ScanInterval < MinScanInterval || a.ScanInterval > MaxScanInterval {
		r.addf(ap+"scanInterval", "must be from %s to %s (each loop writes the autoscaler's status; a pending pod "+
			"waits half of it on average), got %s", MinScanInterval, MaxScanInterval, a.ScanInterval)
	}
	if a.MaxNodesTotal < 0 {
		r.addf(ap+"maxNodesTotal", "must be 0 (no cap) or more, got %d", a.MaxNodesTotal)
	}
	if d, err := time.ParseDuration(c.Autoscaler.ScaleDownUnneededTime); err != nil || d <= 0 {
		r.addf(ap+"scaleDownUnneededTime", "must be a positive duration such as 10m, got %q",
			c.Autoscaler.ScaleDownUnneededTime)
	}
	chain := strings.Split(c.Autoscaler.Expander, ",")
	for _, e := range chain {
		switch {
		case e == "price":
			r.addf(ap+"expander", "price needs cloud pricing, which the autoscaler's AWS provider lacks: the "+
				"autoscaler would exit at start (use least-waste)")
		case !slices.Contains(expanders, e):
			r.addf(ap+"expander", "%q is not a Cluster Autoscaler expander for AWS (one or a comma-separated chain "+
				"of: %s)", e, strings.Join(expanders, ", "))
		}
	}
	validatePriorities(r, c, slices.Contains(chain, PriorityExpander))
}

// MinScaleDownUnreadyTime is the shortest autoscaler.scaleDownUnreadyTime: twice the 10 minutes or so a hung
// gateway takes to be rebooted by its alarm and bring the tunnel back.
const MinScaleDownUnreadyTime = 20 * time.Minute

// MinScanInterval and MaxScanInterval bound autoscaler.scanInterval: below a second the loops (and the status
// writes) come faster than a loop over a few hundred pods may take; above a minute a scale-up waits longer than
// the AWS provider's own refresh.
const (
	MinScanInterval = time.Second
	MaxScanInterval = time.Minute
)

// PriorityExpander is the expander that ranks pools by nodePools[i].autoscaling.priority.
const PriorityExpander = "priority"

// validatePriorities: with the priority expander every pool has a rank, and without it none has. The expander
// raises no group its ConfigMap does not rank while a ranked one fits (it logs a warning event for it on every
// scale-up), so a pool left out would be a pool silently never raised; a rank without the expander would be a
// setting that does nothing.
func validatePriorities(r *reader, c *Config, ranked bool) {
	for i, p := range c.NodePools {
		path := fmt.Sprintf("%s:nodePools[%d].autoscaling.priority", Namespace, i)
		switch rank := p.Autoscaling.Priority; {
		case ranked && rank == nil:
			r.addf(path, "is required with autoscaler.expander %q: the priority expander ranks every pool "+
				"(0 or more, higher first), and one it does not rank is not raised while a ranked pool fits",
				c.Autoscaler.Expander)
		case !ranked && rank != nil:
			r.addf(path, "ranks the pool for the priority expander, which autoscaler.expander %q does not use: "+
				"set autoscaler.expander to priority (or a chain with it), or drop the rank",
				c.Autoscaler.Expander)
		case rank != nil && *rank < 0:
			// The expander starts from -1 as the best rank seen (expander/priority/priority.go): a pool ranked
			// below that is never chosen.
			r.addf(path, "must be 0 or more, got %d", *rank)
		}
	}
}

func validateFuse(r *reader, c *Config) {
	if c.Fuse.Capacity <= 0 {
		r.addf(Namespace+":fuse.capacity", "must be > 0 (the devices per node the plugin advertises), got %d",
			c.Fuse.Capacity)
	}
	for _, arch := range slices.Sorted(maps.Keys(c.Fuse.Images)) {
		if _, err := kube.NormalizeImage(c.Fuse.Images[arch]); err != nil {
			r.addf(childPath(Namespace+":fuse.images", string(arch)), "%v", err)
		}
	}
}

// kmsKeyARN is a KMS key's ARN (not an alias's: IAM grants name keys).
var kmsKeyARN = regexp.MustCompile(`^arn:aws(-cn|-us-gov)?:kms:([a-z0-9-]+):[0-9]{12}:key/[0-9a-f-]{36}$`)

// validateParameterKey: aws-managed, create, or a key ARN in the stack's region (SSM encrypts a parameter with a
// key of its own region only).
func validateParameterKey(r *reader, c *Config) {
	k := c.Identity.ParameterKey
	if k == ParameterKeyAWSManaged || k == ParameterKeyCreate {
		return
	}
	m := kmsKeyARN.FindStringSubmatch(k)
	switch {
	case m == nil:
		r.addf(Namespace+":identity.parameterKey", "%q is none of %s, %s or a KMS key ARN "+
			"(arn:aws:kms:<region>:<account>:key/<key id>)", k, ParameterKeyAWSManaged, ParameterKeyCreate)
	case m[2] != c.Region:
		r.addf(Namespace+":identity.parameterKey", "the key is in %s, not in the stack's region %s: SSM encrypts "+
			"with a key of the parameter's own region", m[2], c.Region)
	}
}

// validateImages parses every image the operator names, as the runtimes will (a digest must be a well-formed one).
func validateImages(r *reader, images Images) {
	v := reflect.ValueOf(images)
	for i := range v.NumField() {
		if ref := v.Field(i).String(); ref != "" {
			if _, err := kube.NormalizeImage(ref); err != nil {
				r.addf(Namespace+":images."+v.Type().Field(i).Tag.Get("key"), "%v", err)
			}
		}
	}
}

// ForwardProtocols are the protocols an onPremForward.allow entry may name.
var ForwardProtocols = []string{"tcp", "udp", "all"}

// validateOnPremForward checks the gateway's forward filter: a known mode, and allow entries only with the filter
// on, each inside a range the tunnel carries (any other destination is never forwarded at all).
func validateOnPremForward(r *reader, c *Config) {
	fp := Namespace + ":wireguard.onPremForward."
	f := c.WireGuard.OnPremForward
	switch f.Mode {
	case ForwardAll, ForwardCluster:
	default:
		r.addf(fp+"mode", "must be %s or %s, got %q", ForwardAll, ForwardCluster, f.Mode)
		return
	}
	if f.Mode == ForwardAll && len(f.Allow) > 0 {
		r.addf(fp+"allow", "has no effect with mode %s, which forwards everything: set mode %s", ForwardAll,
			ForwardCluster)
		return
	}
	for i, a := range f.Allow {
		ap := fmt.Sprintf("%sallow[%d].", fp, i)
		if !a.CIDR.IsValid() {
			r.addf(ap+"cidr", "is required: the on-prem range new connections may reach")
		} else if !slices.ContainsFunc(c.WireGuard.OnPremCIDRs, func(p netip.Prefix) bool {
			return p.Bits() <= a.CIDR.Bits() && p.Contains(a.CIDR.Addr())
		}) {
			r.addf(ap+"cidr", "%s is not inside any of wireguard.onPremCidrs: the tunnel carries nothing else", a.CIDR)
		}
		switch {
		case !slices.Contains(ForwardProtocols, a.Protocol):
			r.addf(ap+"protocol", "must be one of %s, got %q", strings.Join(ForwardProtocols, ", "), a.Protocol)
		case a.Protocol == "all" && a.Ports != "":
			r.addf(ap+"ports", "must be empty with protocol all (every protocol and port)")
		case a.Ports != "":
			validatePorts(r, ap+"ports", a.Ports)
		}
	}
}

// validatePorts checks "80,443,8000-8100": ports 1..65535, each range low to high.
func validatePorts(r *reader, path, ports string) {
	if !endpoint.IsPortList(ports) {
		r.addf(path, "%q must be ports and ranges, e.g. 8080,50000 or 8000-8100", ports)
		return
	}
	for _, item := range strings.Split(ports, ",") {
		lo, hi, isRange := strings.Cut(item, "-")
		if !isRange {
			hi = lo
		}
		l, errL := strconv.Atoi(lo)
		h, errH := strconv.Atoi(hi)
		if errL != nil || errH != nil || l < 1 || h > 65535 || l > h {
			r.addf(path, "%q: ports are 1..65535, a range low-high", item)
			return
		}
	}
}
