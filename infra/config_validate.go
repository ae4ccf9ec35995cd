package infra

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

var (
	regionRE      = regexp.MustCompile(`^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d+$`)
	clusterNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)
	poolNameRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,28}[a-z0-9])?$`)
	versionRE     = regexp.MustCompile(`^1\.(\d+)\.(\d+)$`)
	caHashRE      = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	amiIDRE       = regexp.MustCompile(`^ami-([0-9a-f]{8}|[0-9a-f]{17})$`)
	dnsNameRE     = regexp.MustCompile(`^([a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?\.)*[a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?$`)
	labelNameRE   = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
	labelValueRE  = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	dnsSubdomRE   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	imageRefRE    = regexp.MustCompile(`^[a-z0-9]+([._/:@-][A-Za-z0-9_.-]+)+$`)
	zoneSuffixRE  = regexp.MustCompile(`^[a-z]$`)
)

// MinKubernetesMinor is the oldest minor dynk8s joins: the kubeadm v1beta4 JoinConfiguration appeared in 1.31.
const MinKubernetesMinor = 31

// Fedora AMI naming schemes by release (domain facts 3): fedimg names up to 39, Kiwi names from 40 on.
const (
	oldestFedoraRelease = 28
	newestFedoraRelease = 45
)

// kubeletLabelAllowed are the kubernetes.io / k8s.io label keys and prefixes NodeRestriction lets a kubelet set on
// its own Node (kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction).
var (
	kubeletLabelAllowedKeys = map[string]bool{
		"kubernetes.io/hostname": true, "kubernetes.io/arch": true, "kubernetes.io/os": true,
		"beta.kubernetes.io/instance-type": true, "node.kubernetes.io/instance-type": true,
		"failure-domain.beta.kubernetes.io/region": true, "failure-domain.beta.kubernetes.io/zone": true,
		"topology.kubernetes.io/region": true, "topology.kubernetes.io/zone": true,
	}
	kubeletLabelAllowedPrefixes = []string{"kubelet.kubernetes.io/", "node.kubernetes.io/"}
	// dynk8sSetLabels are set by dynk8s itself on every pool node; a pool may not set them.
	dynk8sSetLabels = map[string]bool{
		LabelPool: true, LabelCapacityType: true, "kubernetes.io/arch": true, "kubernetes.io/os": true,
		"kubernetes.io/hostname": true, "topology.kubernetes.io/zone": true, "topology.kubernetes.io/region": true,
		"node.kubernetes.io/instance-type": true,
	}
	taintEffects = map[string]bool{"NoSchedule": true, "PreferNoSchedule": true, "NoExecute": true}
	expanders    = map[string]bool{"least-waste": true, "most-pods": true, "random": true, "priority": true, "price": true}
	archs        = map[string]bool{"x86_64": true, "arm64": true}
)

// validate checks the semantics of a parsed config and completes it with derived values (resolved autoscaler
// version, instance shapes, gateway arch). Every problem is recorded with its key path.
func validate(p *parser, cfg *Config) {
	ns := Namespace + ":"
	required := func(path, v string) bool {
		if v == "" {
			p.addf(path, "is required")
			return false
		}
		return true
	}

	if required("aws:region", cfg.Region) && !regionRE.MatchString(cfg.Region) {
		p.addf("aws:region", "%q is not an AWS region name (e.g. eu-central-1)", cfg.Region)
	}
	if required(ns+"clusterName", cfg.ClusterName) && !clusterNameRE.MatchString(cfg.ClusterName) {
		p.addf(ns+"clusterName", "%q must be 1-32 lowercase letters, digits and '-', starting and ending with a "+
			"letter or digit: it is a segment of the autoscaler's tag key and a prefix of IAM names", cfg.ClusterName)
	}

	// Kubernetes
	k := cfg.Kubernetes
	kp := ns + "kubernetes."
	minor := -1
	if required(kp+"version", k.Version) {
		if m := versionRE.FindStringSubmatch(k.Version); m == nil {
			p.addf(kp+"version", "%q must be an exact version like 1.34.4 (no 'v', no wildcard)", k.Version)
		} else if minor, _ = strconv.Atoi(m[1]); minor < MinKubernetesMinor {
			p.addf(kp+"version", "%s is too old: dynk8s joins nodes with kubeadm's v1beta4 JoinConfiguration, which "+
				"needs Kubernetes 1.%d or newer", k.Version, MinKubernetesMinor)
			minor = -1
		}
	}
	var apiHost string
	if required(kp+"apiServerEndpoint", k.APIServerEndpoint) {
		apiHost = validateEndpoint(p, kp+"apiServerEndpoint", k.APIServerEndpoint)
	}
	if k.CACertHash != "" && !caHashRE.MatchString(k.CACertHash) {
		p.addf(kp+"caCertHash", "must be sha256:<64 lowercase hex digits> (kubeadm's discovery hash of the CA's "+
			"public key), got %q", truncate(k.CACertHash, 80))
	}
	if k.KubeconfigSet && strings.TrimSpace(k.Kubeconfig) == "" {
		p.addf(kp+"kubeconfig", "is set but empty; remove the key to use the ambient kubeconfig")
	}
	if k.BootstrapTokenRotation == "" {
		p.addf(kp+"bootstrapTokenRotation", "must not be empty")
	}

	// Network and CIDRs
	ranges := map[string]netip.Prefix{}
	prefix := func(path, v string) (netip.Prefix, bool) {
		pr, ok := parseCIDR(p, path, v)
		if ok {
			ranges[path] = pr
		}
		return pr, ok
	}
	if required(ns+"network.vpcCidr", cfg.Network.VPCCIDR) {
		if vpc, ok := prefix(ns+"network.vpcCidr", cfg.Network.VPCCIDR); ok && (vpc.Bits() < 16 || vpc.Bits() > 24) {
			p.addf(ns+"network.vpcCidr", "%s: the prefix must be /16 to /24 (AWS allows /16-/28; dynk8s carves "+
				"one /%d-smaller subnet per zone)", cfg.Network.VPCCIDR, subnetExtraBits)
		}
	}
	validateZones(p, cfg)
	if required(kp+"podCidr", k.PodCIDR) {
		prefix(kp+"podCidr", k.PodCIDR)
	}
	if required(kp+"serviceCidr", k.ServiceCIDR) {
		prefix(kp+"serviceCidr", k.ServiceCIDR)
	}

	// WireGuard
	w := cfg.WireGuard
	wp := ns + "wireguard."
	if w.ListenPort < 1 || w.ListenPort > 65535 {
		p.addf(wp+"listenPort", "must be a UDP port 1..65535, got %d", w.ListenPort)
	}
	if w.MTU < 1280 || w.MTU > 8920 {
		p.addf(wp+"mtu", "must be 1280..8920 (IPv6's minimum to the EC2 jumbo MTU less WireGuard's overhead), "+
			"got %d", w.MTU)
	}
	if len(w.OnPremCIDRs) == 0 {
		p.addf(wp+"onPremCidrs", "is required: at least one on-prem range to route through the tunnel")
	}
	seen := map[netip.Prefix]int{}
	for i, c := range w.OnPremCIDRs {
		path := fmt.Sprintf("%sonPremCidrs[%d]", wp, i)
		if pr, ok := prefix(path, c); ok {
			if j, dup := seen[pr]; dup {
				p.addf(path, "%s is listed twice (also onPremCidrs[%d])", c, j)
			}
			seen[pr] = i
		}
	}
	if tun, ok := prefix(wp+"tunnelCidr", w.TunnelCIDR); ok && tun.Bits() > 30 {
		p.addf(wp+"tunnelCidr", "%s is too small: the tunnel needs two peer addresses besides the network and "+
			"broadcast addresses (/30 or larger)", w.TunnelCIDR)
	}
	if w.OnPremPublicKey != "" {
		if _, err := wgtypes.ParseKey(w.OnPremPublicKey); err != nil {
			p.addf(wp+"onPremPublicKey", "must be a WireGuard public key (32 bytes, base64, 44 characters as "+
				"`wg pubkey` prints it)")
		}
	}
	if w.OnPremEndpoint != "" {
		validateEndpoint(p, wp+"onPremEndpoint", w.OnPremEndpoint)
	}
	checkOverlaps(p, ranges)
	if addr, err := netip.ParseAddr(apiHost); err == nil && !p.failed(wp+"onPremCidrs") {
		inside := false
		for i := range w.OnPremCIDRs {
			if pr, ok := ranges[fmt.Sprintf("%sonPremCidrs[%d]", wp, i)]; ok && pr.Contains(addr) {
				inside = true
			}
		}
		if !inside {
			p.addf(kp+"apiServerEndpoint", "%s is not inside any of %sonPremCidrs: the nodes reach the API server "+
				"through the tunnel, which routes only those ranges", apiHost, wp)
		}
	}

	// Gateway
	if shape, err := LookupInstanceType(cfg.Gateway.InstanceType); err != nil {
		p.addf(ns+"gateway.instanceType", "%v", err)
	} else {
		cfg.Gateway.Arch = shape.Arch
	}

	// Fedora
	r := cfg.Fedora.Release
	if r == 0 {
		p.addf(ns+"fedora.release", "is required: the Fedora release to boot, e.g. 42")
	} else if r < oldestFedoraRelease || r > newestFedoraRelease {
		p.addf(ns+"fedora.release", "%d has no known Fedora Cloud AMI naming scheme (known: %d..%d); pin an image "+
			"per pool with nodePools[*].amiId or pick a known release", r, oldestFedoraRelease, newestFedoraRelease)
	}

	validatePools(p, cfg)

	// Autoscaler
	ap := ns + "autoscaler."
	if minor >= 0 {
		v, err := ResolveAutoscalerVersion(k.Version, cfg.Autoscaler.Version, cfg.Fuse.Enabled)
		if err != nil {
			path := ap + "version"
			if cfg.Autoscaler.Version == "" {
				path = kp + "version"
			}
			p.addf(path, "%v", err)
		} else {
			cfg.Autoscaler.Version = v
		}
	}
	if d, err := time.ParseDuration(cfg.Autoscaler.ScaleDownUnneededTime); err != nil || d <= 0 {
		p.addf(ap+"scaleDownUnneededTime", "must be a positive duration such as 10m, got %q",
			cfg.Autoscaler.ScaleDownUnneededTime)
	}
	for _, e := range strings.Split(cfg.Autoscaler.Expander, ",") {
		if !expanders[e] {
			p.addf(ap+"expander", "%q is not a Cluster Autoscaler expander (one or a comma-separated chain of: "+
				"least-waste, most-pods, random, priority, price)", e)
		}
	}

	// Fuse
	if cfg.Fuse.Capacity <= 0 {
		p.addf(ns+"fuse.capacity", "must be > 0 (the devices per node the plugin advertises), got %d",
			cfg.Fuse.Capacity)
	}
	for _, arch := range slices.Sorted(maps.Keys(cfg.Fuse.Images)) {
		path := childPath(ns+"fuse.images", arch)
		if !archs[arch] {
			p.addf(path, "unknown arch (want x86_64 or arm64)")
		} else if !imageRefRE.MatchString(cfg.Fuse.Images[arch]) {
			p.addf(path, "%q is not an image reference", cfg.Fuse.Images[arch])
		}
	}

	if cfg.Identity.AutoscalerKeyRotation == "" {
		p.addf(ns+"identity.autoscalerKeyRotation", "must not be empty")
	}
	if cfg.Cleanup.NotReadyAfter < 5*time.Minute {
		p.addf(ns+"cleanup.notReadyAfter", "must be at least 5m: a node rebooting or briefly cut off must not lose "+
			"its Node object, got %s", cfg.Cleanup.NotReadyAfter)
	}
}

// subnetExtraBits is how much smaller than the VPC each zone's subnet is: up to 16 zones.
const subnetExtraBits = 4

func validateZones(p *parser, cfg *Config) {
	path := Namespace + ":network.availabilityZones"
	n := cfg.Network
	if n.AvailabilityZones == nil {
		if n.AvailabilityZoneCount < 1 || n.AvailabilityZoneCount > 6 {
			p.addf(path, "a zone count must be 1..6, got %d", n.AvailabilityZoneCount)
		}
		return
	}
	if len(n.AvailabilityZones) == 0 {
		p.addf(path, "the zone list is empty")
	}
	seen := map[string]bool{}
	for i, z := range n.AvailabilityZones {
		zp := fmt.Sprintf("%s[%d]", path, i)
		suffix, ok := strings.CutPrefix(z, cfg.Region)
		if cfg.Region != "" && (!ok || !zoneSuffixRE.MatchString(suffix)) {
			p.addf(zp, "%q is not a zone of %s (e.g. %sa)", z, cfg.Region, cfg.Region)
		}
		if seen[z] {
			p.addf(zp, "%q is listed twice", z)
		}
		seen[z] = true
	}
}

func validatePools(p *parser, cfg *Config) {
	path := Namespace + ":nodePools"
	if len(cfg.NodePools) == 0 && !p.failed(path) {
		p.addf(path, "is required: at least one node pool")
	}
	names := map[string]int{}
	for i := range cfg.NodePools {
		pool := &cfg.NodePools[i]
		pp := fmt.Sprintf("%s[%d].", path, i)
		if pool.Name == "" {
			p.addf(pp+"name", "is required")
		} else if !poolNameRE.MatchString(pool.Name) {
			p.addf(pp+"name", "%q must be a DNS label of at most 30 characters (lowercase letters, digits, '-')",
				pool.Name)
		} else if j, dup := names[pool.Name]; dup {
			p.addf(pp+"name", "%q is already the name of nodePools[%d]", pool.Name, j)
		} else {
			names[pool.Name] = i
		}

		if pool.Arch == "" {
			p.addf(pp+"arch", "is required: x86_64 or arm64")
		} else if !archs[pool.Arch] {
			hint := ""
			if pool.Arch == "aarch64" || pool.Arch == "amd64" {
				hint = " (dynk8s uses the EC2 names)"
			}
			p.addf(pp+"arch", "%q is not x86_64 or arm64%s", pool.Arch, hint)
		}
		validateInstanceTypes(p, pp, pool)

		if pool.MinSize < 0 {
			p.addf(pp+"minSize", "must be >= 0, got %d", pool.MinSize)
		}
		if pool.MaxSize < pool.MinSize {
			p.addf(pp+"maxSize", "must be >= minSize (%d), got %d", pool.MinSize, pool.MaxSize)
		} else if pool.MaxSize < 1 || pool.MaxSize > 1000 {
			p.addf(pp+"maxSize", "must be 1..1000, got %d", pool.MaxSize)
		}
		if pool.VolumeSizeGiB < 20 || pool.VolumeSizeGiB > 16384 {
			p.addf(pp+"volumeSizeGiB", "must be 20..16384 GiB (images and the kubelet need room), got %d",
				pool.VolumeSizeGiB)
		}
		if pool.AMIID != "" && !amiIDRE.MatchString(pool.AMIID) {
			p.addf(pp+"amiId", "%q is not an AMI id (ami- and 8 or 17 hex digits)", pool.AMIID)
		}
		for _, key := range slices.Sorted(maps.Keys(pool.Labels)) {
			lp := childPath(pp+"labels", key)
			if err := kubeletKeyError(key); err != "" {
				p.addf(lp, "%s", err)
			} else if dynk8sSetLabels[key] {
				p.addf(lp, "is set by dynk8s on every pool node; remove it from the pool")
			} else if v := pool.Labels[key]; len(v) > 63 || !labelValueRE.MatchString(v) {
				p.addf(lp, "value %q is not a label value (at most 63 characters: letters, digits, '-', '_', '.')", v)
			}
		}
		seenTaints := map[string]int{}
		for j, t := range pool.Taints {
			tp := fmt.Sprintf("%staints[%d].", pp, j)
			if t.Key == "" {
				p.addf(tp+"key", "is required")
			} else if err := kubeletKeyError(t.Key); err != "" {
				p.addf(tp+"key", "%s", err)
			}
			if len(t.Value) > 63 || !labelValueRE.MatchString(t.Value) {
				p.addf(tp+"value", "%q is not a taint value (at most 63 characters: letters, digits, '-', '_', '.')",
					t.Value)
			}
			if !taintEffects[t.Effect] {
				p.addf(tp+"effect", "%q must be NoSchedule, PreferNoSchedule or NoExecute", t.Effect)
			}
			if k, dup := seenTaints[t.Key+":"+t.Effect]; dup {
				p.addf(tp+"key", "taint %s:%s is already taints[%d]", t.Key, t.Effect, k)
			}
			seenTaints[t.Key+":"+t.Effect] = j
		}
		if n := len(ASGTags(cfg, *pool)); n > maxASGTags {
			p.addf(pp+"labels", "the pool needs %d Auto Scaling Group tags (one per label and taint plus %d of "+
				"dynk8s's own), over the limit of %d: drop labels or taints", n,
				n-len(pool.Labels)-len(pool.Taints), maxASGTags)
		}
	}
}

func validateInstanceTypes(p *parser, pp string, pool *NodePoolConfig) {
	if len(pool.InstanceTypes) == 0 {
		p.addf(pp+"instanceTypes", "is required: at least one EC2 instance type")
		return
	}
	var first InstanceShape
	seen := map[string]bool{}
	for j, it := range pool.InstanceTypes {
		ip := fmt.Sprintf("%sinstanceTypes[%d]", pp, j)
		shape, err := LookupInstanceType(it)
		if err != nil {
			p.addf(ip, "%v", err)
			continue
		}
		if seen[it] {
			p.addf(ip, "%s is listed twice", it)
		}
		seen[it] = true
		if archs[pool.Arch] && shape.Arch != pool.Arch {
			p.addf(ip, "%s is an %s type but the pool's arch is %s", it, shape.Arch, pool.Arch)
			continue
		}
		if first.VCPU == 0 {
			first = shape
			pool.VCPU, pool.MemoryMiB = shape.VCPU, shape.MemoryMiB
			continue
		}
		if shape.VCPU != first.VCPU || shape.MemoryMiB != first.MemoryMiB {
			p.addf(ip, "%s has %d vCPU/%d MiB but %s has %d vCPU/%d MiB: the Cluster Autoscaler sizes a group by "+
				"its first type, so every type of a pool must have the same shape (make another pool)", it,
				shape.VCPU, shape.MemoryMiB, pool.InstanceTypes[0], first.VCPU, first.MemoryMiB)
		}
	}
}

// kubeletKeyError says why a label or taint key cannot be set by a joining kubelet, or "" when it can.
func kubeletKeyError(key string) string {
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	if len(name) > 63 || !labelNameRE.MatchString(name) {
		return fmt.Sprintf("%q is not a valid key: the name part must be at most 63 characters of letters, "+
			"digits, '-', '_', '.'", key)
	}
	if hasPrefix && (len(prefix) > 253 || !dnsSubdomRE.MatchString(prefix)) {
		return fmt.Sprintf("%q is not a valid key: the prefix must be a DNS subdomain", key)
	}
	if strings.HasPrefix(key, "node-role.kubernetes.io/") {
		return fmt.Sprintf("%q cannot be set by the kubelet (NodeRestriction forbids node-role.kubernetes.io/*); "+
			"use your own prefix, e.g. example.com/role", key)
	}
	reserved := func(domain string) bool { return prefix == domain || strings.HasSuffix(prefix, "."+domain) }
	if reserved("kubernetes.io") || reserved("k8s.io") {
		if kubeletLabelAllowedKeys[key] {
			return ""
		}
		for _, allowed := range kubeletLabelAllowedPrefixes {
			if strings.HasPrefix(key, allowed) {
				return ""
			}
		}
		return fmt.Sprintf("%q is in the kubernetes.io/k8s.io namespace, which NodeRestriction forbids the "+
			"kubelet to set (allowed: kubelet.kubernetes.io/*, node.kubernetes.io/* and the well-known "+
			"topology/arch/os/instance-type keys); use your own prefix", key)
	}
	return ""
}

// validateEndpoint checks host:port and returns the host.
func validateEndpoint(p *parser, path, v string) string {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		p.addf(path, "%q must be host:port (e.g. 192.168.10.10:6443)", v)
		return ""
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		p.addf(path, "%q: port must be 1..65535", v)
		return ""
	}
	if _, err := netip.ParseAddr(host); err != nil && !dnsNameRE.MatchString(host) {
		p.addf(path, "%q: host must be an IP address or a DNS name", v)
		return ""
	}
	return host
}

// parseCIDR parses an IPv4 network in canonical form (no host bits set).
func parseCIDR(p *parser, path, v string) (netip.Prefix, bool) {
	pr, err := netip.ParsePrefix(v)
	if err != nil {
		p.addf(path, "%q is not a CIDR (e.g. 10.200.0.0/16)", v)
		return netip.Prefix{}, false
	}
	if !pr.Addr().Is4() {
		p.addf(path, "%s: only IPv4 ranges are supported", v)
		return netip.Prefix{}, false
	}
	if pr.Masked() != pr {
		p.addf(path, "%s has host bits set; did you mean %s?", v, pr.Masked())
		return netip.Prefix{}, false
	}
	return pr, true
}

// checkOverlaps reports every pair of overlapping ranges once, on the later key path.
func checkOverlaps(p *parser, ranges map[string]netip.Prefix) {
	paths := slices.Sorted(maps.Keys(ranges))
	sort.SliceStable(paths, func(i, j int) bool { return pathLess(paths[i], paths[j]) })
	for i, a := range paths {
		for _, b := range paths[i+1:] {
			if ranges[a].Overlaps(ranges[b]) {
				p.addf(b, "%s overlaps %s (%s): the VPC, tunnel, on-prem, pod and service ranges must be disjoint",
					ranges[b], a, ranges[a])
			}
		}
	}
}
