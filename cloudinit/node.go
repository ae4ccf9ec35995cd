package cloudinit

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// NodeRender is what a pool's user data holds beside the agent's configuration (node.json, which infra builds): the
// Kubernetes version whose package repositories the user data writes, CRI-O's sandbox image, the on-prem DNS that
// systemd-resolved asks, and where the bootstrap fetches the agent. All values are plain and public: nothing secret.
type NodeRender struct {
	// KubernetesVersion is exact, 1.34.4; its minor must be supported (kube.Minors). node.json's packages follow it.
	KubernetesVersion kube.Version
	// PauseImage is the sandbox image CRI-O runs in every pod and the boot pre-pulls (optional; empty:
	// registry.k8s.io/pause of the minor's release, a tag; an operator's reference may pin it by digest).
	PauseImage string
	// DNS is the on-prem name service (optional; host.go).
	DNS OnPremDNS
	// Agent is where the boot installs the node agent from (agent.go). The stack always sets it; nil renders no
	// bootstrap (the real-engine tests that render a pool's user data without a bucket).
	Agent *Agent
}

// Where the node's files go. The agent derives the same paths (under DYNK8S_ROOT in tests).
const (
	libexecDir    = "/usr/local/libexec/dynk8s"
	agentBinary   = "/usr/local/bin/dynk8s-node"
	joinUnitName  = "dynk8s-join.service"
	joinTimerName = "dynk8s-join.timer"
	criSocket     = "unix:///var/run/crio/crio.sock"
)

// lifecycleHookRE is the EC2 Auto Scaling API's pattern for LifecycleHookName (API reference, PutLifecycleHook).
var lifecycleHookRE = regexp.MustCompile(`^[A-Za-z0-9_/-]{1,255}$`)

// Upstream rpm repositories for one Kubernetes minor, both gpg-checked against the repository's own key.
//   - Kubernetes (kubelet, kubeadm, cri-tools, kubernetes-cni): https://pkgs.k8s.io/core:/stable:/v1.NN/rpm/, key
//     repodata/repomd.xml.key (kubernetes.io "Installing kubeadm"; cri-o/packaging README, "Add the Kubernetes
//     repository").
//   - CRI-O: https://download.opensuse.org/repositories/isv:/cri-o:/stable:/v<stream>/rpm/, same key layout
//     (cri-o/packaging README, "Add the CRI-O repository", 2026; the streams moved there from pkgs.k8s.io/addons).
//
// They are written disabled: the agent enables them for its one dnf transaction only. Their priority (1, against
// Fedora's default 99) makes dnf take a package from them over one of the same name in Fedora's repositories (cri-o,
// cri-tools) that matches the same spec; it excludes nothing by name, so the agent also excludes the pinned names from
// Fedora's repositories in that transaction, and locks them at the installed versions after it (dnf versionlock):
// Fedora's newer cri-o would otherwise replace upstream's at the next `dnf upgrade`, repositories disabled or not.
// A repository dnf cannot reach fails the transaction (skip_if_unavailable false) rather than leave the pins to
// Fedora's builds.
const (
	kubernetesRepoURL = "https://pkgs.k8s.io/core:/stable:/v1.%d/rpm/"
	crioRepoURL       = "https://download.opensuse.org/repositories/isv:/cri-o:/stable:/v%s/rpm/"
	repoKeyPath       = "repodata/repomd.xml.key"
	kubernetesRepoID  = "dynk8s-kubernetes"
	crioRepoID        = "dynk8s-cri-o"
	upstreamPriority  = 1
)

// systemPackages are dependencies that come from Fedora rather than the upstream repos: CRI-O needs iptables and, on
// SELinux-enforcing Fedora, container-selinux (cri-o/packaging installs it first); the metadata lockdown runs nft
// (the agent's imds-lock), which nothing else pulls in. The agent installs those the image lacks (rpm -q) in the same dnf
// transaction as the upstream packages, from Fedora's release repository (systemRepos) alone: the stack boots the
// release's GA image (infra/ami.go), whose packages that repository matches, so nothing drags in an update such as
// a newer selinux-policy (container-selinux requires selinux-policy >= the one it was built against), and dnf reads
// one repository's metadata, not two. updateRepos join only a transaction that failed without them (a custom image
// newer than GA, a kernel from updates).
var (
	systemPackages = []string{"container-selinux", "iptables", "nftables"}
	systemRepos    = []string{"fedora"}
	updateRepos    = []string{"updates"}
)

// kernelModules and nodeSysctls are what the kubelet, kube-proxy (iptables mode) and bridge-based CNIs need.
var (
	kernelModules = []string{"overlay", "br_netfilter"}
	nodeSysctls   = map[string]string{
		"net.ipv4.ip_forward":                 "1",
		"net.bridge.bridge-nf-call-iptables":  "1",
		"net.bridge.bridge-nf-call-ip6tables": "1",
	}
	cniPluginDirs = []string{"/opt/cni/bin", "/usr/libexec/cni"}
)

// Node validates a pool's node.json as infra builds it and r, and renders the pool's cloud-config
// ("#cloud-config\n..."), node.json completed with what every dynk8s node of r's version runs (NodeConfig).
func Node(node nodeconfig.Node, r NodeRender) ([]byte, error) {
	in, err := NodeConfig(node, r)
	if err != nil {
		return nil, err
	}
	minor, _ := kube.LookupMinor(r.KubernetesVersion) // NodeConfig has checked it
	cfg, err := in.Encode()
	if err != nil {
		return nil, fmt.Errorf("node pool %q: %w", in.PoolName, err)
	}
	unit, err := joinUnit(in, r.Agent != nil).marshal()
	if err != nil {
		return nil, fmt.Errorf("node pool %q: join unit: %w", in.PoolName, err)
	}
	cc, err := preparation(minor, r, writeFile{Path: nodeconfig.Path, Content: string(cfg), Permissions: "0644"})
	if err != nil {
		return nil, fmt.Errorf("node pool %q: %w", in.PoolName, err)
	}
	cc.WriteFiles = append(cc.WriteFiles,
		writeFile{Path: "/etc/systemd/system/" + joinUnitName, Content: unit, Permissions: "0644"},
		// Fedora Cloud swaps to zram, and the kubelet refuses to start with swap on. A zram-generator.conf with no
		// [zram*] section creates no device from the next boot on; the agent turns this boot's swap off before it
		// joins (not while it prepares: a warm pool's hibernation needs swap).
		writeFile{Path: "/etc/systemd/zram-generator.conf", Content: "", Permissions: "0644"},
		// NetworkManager (Fedora Cloud's network stack) must leave the CNI's interfaces alone, or it can take
		// their routes or links down (Calico's and Cilium's docs ask for the same).
		writeFile{Path: "/etc/NetworkManager/conf.d/90-dynk8s-cni.conf", Content: networkManagerCNI(), Permissions: "0644"},
	)
	host, err := hostConfig(r.DNS, r.Agent != nil)
	if err != nil {
		return nil, fmt.Errorf("node pool %q: %w", in.PoolName, err)
	}
	cc.WriteFiles = append(cc.WriteFiles, host.files...)
	enable := slices.Concat(host.enable, []string{joinUnitName})
	var startAgent [][]string
	failedUnits := []string{routesUnitName, joinUnitName, imdsUnitName}
	if r.Agent != nil {
		if err := addAgent(&cc, *r.Agent, nodeconfig.NodeAgentFetch); err != nil {
			return nil, fmt.Errorf("node pool %q: %w", in.PoolName, err)
		}
		enable = append(enable, agentUnitName)
		startAgent = [][]string{{"systemctl", "start", agentUnitName}}
		failedUnits = append(failedUnits, agentUnitName)
	}
	var startTimer [][]string
	if in.LaunchHook != "" {
		// A warm pool's instance waiting Running or Hibernated enters service without booting: the timer runs the
		// join again (it returns at once while the instance waits) until the node has joined.
		timer, err := joinTimer().marshal()
		if err != nil {
			return nil, fmt.Errorf("node pool %q: join timer: %w", in.PoolName, err)
		}
		cc.WriteFiles = append(cc.WriteFiles, writeFile{Path: "/etc/systemd/system/" + joinTimerName, Content: timer,
			Permissions: "0644"})
		enable = append(enable, joinTimerName)
		// Started before the join: a successful join stops and disables it (the agent), and nothing may start it again
		// after that. Its clock runs from the join unit's first deactivation (OnUnitInactiveSec).
		startTimer = [][]string{{"systemctl", "start", joinTimerName}}
	}
	// Every unit is enabled for the boots to come before anything starts: a warm-pool instance prepares, completes
	// its lifecycle action and may be stopped by its group at once, cutting runcmd short. The unit, not runcmd, runs
	// the join: its output lands in the journal under its own name and on the console, its Condition makes a reboot
	// of a joined node a no-op, and systemd enforces a hard timeout. `start` blocks until the join is done;
	// runcmdFailsOnFailedUnits makes a failed one cloud-init's. No reload of the manager, neither `daemon-reload` nor
	// the one `systemctl enable` does unless --no-reload (src/systemctl/systemctl-enable.c): each cost every cold boot
	// 0.3-0.4 s in the box. The units write_files wrote are new to the manager, which loads a unit from disk when a
	// start first names it, and retries one that a dependency named before its file was there once the unit
	// directories changed (src/core/transaction.c, transaction_add_job_and_dependencies: "The time-based cache allows
	// new units to be started without daemon-reload"); none of the files is a drop-in for a unit loaded at boot
	// (kubelet.service's comes with its package, and kubeadm reloads the manager before it starts the kubelet).
	cc.RunCmd = slices.Concat(
		[][]string{slices.Concat([]string{"systemctl", "enable", "--no-reload"}, enable)},
		startAgent,
		host.beforeJoin,
		startTimer,
		[][]string{
			{"systemctl", "start", joinUnitName},
			runcmdFailsOnFailedUnits(failedUnits...),
		})
	out, err := cc.marshal()
	if err != nil {
		return nil, fmt.Errorf("node pool %q: %w", in.PoolName, err)
	}
	return out, nil
}

// preparation is the part of a cloud-config that a node's prepare step and a bake's read: the upstream repositories
// of the minor, and the files in the order a node's user data has always written them, config (node.json or
// bake.json) second.
func preparation(minor kube.Minor, r NodeRender, config writeFile) (cloudConfig, error) {
	var crio crioDropIn
	crio.Crio.Image.PauseImage = pauseImage(r, minor)
	crio.Crio.Network.PluginDirs = cniPluginDirs
	crio.Crio.Runtime.CgroupManager = "systemd"
	// SELinux stays enforcing on the host (host processes keep their confinement), but pods get no SELinux
	// separation: a decision, documented in the README's security model, not a default that may change under us.
	crio.Crio.Runtime.SELinux = false
	crioConf, err := crio.marshal()
	if err != nil {
		return cloudConfig{}, err
	}
	return cloudConfig{
		YumRepos: map[string]yumRepo{
			kubernetesRepoID: upstreamRepo("Kubernetes", fmt.Sprintf(kubernetesRepoURL, minor.Minor), "1."+strconv.Itoa(minor.Minor)),
			crioRepoID:       upstreamRepo("CRI-O", fmt.Sprintf(crioRepoURL, minor.CRIO), minor.CRIO),
		},
		WriteFiles: []writeFile{
			{Path: "/etc/crio/crio.conf.d/90-dynk8s.conf", Content: crioConf, Permissions: "0644"},
			config,
			{Path: "/etc/modules-load.d/dynk8s.conf", Content: strings.Join(kernelModules, "\n") + "\n", Permissions: "0644"},
			{Path: "/etc/sysctl.d/90-dynk8s.conf", Content: sysctlFile(nodeSysctls), Permissions: "0644"},
		},
	}, nil
}

// runcmdFailsOnFailedUnits is runcmd's last command: it fails when one of the units runcmd started has failed.
// cloud-init runs runcmd as one shell script with no `set -e`, whose exit status is its last command's
// (cloudinit/config/cc_runcmd.py writes it with util.shellify; cc_scripts_user runs it), so a failed join in the
// middle would otherwise leave `cloud-init status` at done with no error. `systemctl is-failed` exits 0 when at
// least one of the units given is failed (systemctl(1)).
func runcmdFailsOnFailedUnits(units ...string) []string {
	return []string{"sh", "-c", "! systemctl is-failed --quiet " + strings.Join(units, " ")}
}

// cniInterfaces are the interfaces the common CNIs create: Calico, Flannel, the bridge plugin, Cilium.
var cniInterfaces = []string{
	"cali*", "tunl*", "vxlan.calico", "vxlan-v6.calico", "wireguard.cali", "flannel*", "cni0", "veth*", "cilium*",
	"lxc*",
}

// networkManagerCNI is a NetworkManager drop-in that marks the CNI interfaces unmanaged.
func networkManagerCNI() string {
	var b strings.Builder
	b.WriteString("[keyfile]\nunmanaged-devices=")
	for _, iface := range cniInterfaces {
		b.WriteString("interface-name:" + iface + ";")
	}
	b.WriteString("\n")
	return b.String()
}

// nodePackages pins kubelet and kubeadm to the exact version, and cri-tools and CRI-O to its minor: their patch
// releases are numbered independently. kubernetes-cni comes in as kubelet's dependency; kubectl is not needed.
// kubeadm does not need cri-tools since 1.32 (kubernetes/release, cmd/krel/templates/latest/metadata.yaml), but the
// boot's image pre-pull runs crictl.
func nodePackages(version kube.Version, minor kube.Minor) []string {
	m := "1." + strconv.Itoa(minor.Minor) + ".*"
	return []string{"kubelet-" + version.String(), "kubeadm-" + version.String(), "cri-tools-" + m,
		"cri-o-" + minor.CRIO + ".*"}
}

// prePullImages are the images the boot pulls while it joins: the sandbox (pause) image and kube-proxy of the node's
// version, which every node runs, then the pool's own, each once, in that order.
func prePullImages(pool []string, r NodeRender, minor kube.Minor) []string {
	out := []string{pauseImage(r, minor), "registry.k8s.io/kube-proxy:v" + r.KubernetesVersion.String()}
	for _, img := range pool {
		// validate has parsed every one.
		if n, err := kube.NormalizeImage(img); err == nil && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// pauseImage is the node's sandbox image: the input's, fully qualified as CRI-O resolves no short names here, else
// registry.k8s.io's of the minor.
func pauseImage(r NodeRender, minor kube.Minor) string {
	if n, err := kube.NormalizeImage(r.PauseImage); r.PauseImage != "" && err == nil { // validate has parsed it
		return n
	}
	return "registry.k8s.io/pause:" + minor.Pause
}

func upstreamRepo(name, base, stream string) yumRepo {
	return yumRepo{
		Name:     fmt.Sprintf("%s v%s (dynk8s)", name, stream),
		BaseURL:  base,
		Enabled:  false,
		GPGCheck: true,
		GPGKey:   base + repoKeyPath,
		Priority: upstreamPriority,
		// Written out, never omitted: an image's dnf.conf may say true.
		SkipIfUnavailable: false,
	}
}

func joinUnit(in nodeconfig.Node, fetched bool) unitFile {
	unit := []unitEntry{
		{"Description", fmt.Sprintf("dynk8s: join this node (pool %s) to cluster %s", in.PoolName, in.ClusterName)},
		{"Wants", "network-online.target"},
		{"After", "network-online.target"},
	}
	if fetched {
		// The bootstrap installs the agent, hash-pinned; the join never runs an agent it did not check.
		unit = append(unit, unitEntry{"Requires", agentUnitName}, unitEntry{"After", agentUnitName})
	}
	return unitFile{
		{Name: "Unit", Entries: append(unit, unitEntry{"ConditionPathExists", "!/etc/kubernetes/kubelet.conf"})},
		{Name: "Service", Entries: []unitEntry{
			{"Type", "oneshot"},
			// No ExecStartPre: the modules, sysctls and swap that the files cloud-init wrote (after systemd loaded
			// modules and sysctls at this first boot) call for are the agent's, after its check that a warm instance
			// still waits, so the timer's runs on a waiting instance do nothing else.
			{"ExecStart", agentCommand("join")},
			{"StandardOutput", "journal+console"},
			{"StandardError", "journal+console"},
			{"SyslogIdentifier", "dynk8s-join"},
			{"TimeoutStartSec", unitSeconds(nodeconfig.DefaultDeadlines.UnitTimeout())},
		}},
		{Name: "Install", Entries: []unitEntry{
			{"WantedBy", "multi-user.target"},
		}},
	}
}

// joinTimer re-runs the join unit 2 s after each run while the node has not joined (the unit's Condition stops it
// from running once it has, and the join stops the timer); a failed run lasts a minute at least
// (boot.FailedRunLasts), so a failure that comes at once is retried once a minute. A run on a waiting warm instance
// reads its lifecycle state every second for most of a minute (boot.WarmPollWindow), so the join starts within
// about a second of the group putting the instance in service, and the unit starts about once a minute. Monotonic
// clocks do not advance while the instance is hibernated: a run waiting when it hibernated reads the state again
// about a second after the resume.
//
// AccuracySec is 1 s: systemd's default, 1 minute, lets a timer elapse anywhere in the minute after its time (at a
// host-specific point shared by every timer, to coalesce wake-ups; systemd.timer(5)), and so left a Running warm
// instance with no run reading its state for up to a minute between two runs (its Node registered 41 s after it
// entered service in the box's burst benchmark).
func joinTimer() unitFile {
	return unitFile{
		{Name: "Unit", Entries: []unitEntry{
			{"Description", "dynk8s: join this warm-pool instance once it enters service without a boot"},
		}},
		{Name: "Timer", Entries: []unitEntry{
			{"OnUnitInactiveSec", "2s"},
			{"AccuracySec", "1s"},
			{"Unit", joinUnitName},
		}},
		{Name: "Install", Entries: []unitEntry{
			{"WantedBy", "timers.target"},
		}},
	}
}

// The JoinConfiguration's types are the agent's (node/nodeconfig): the renderer writes the same document the
// agent marshals at boot.
type (
	joinConfiguration       = nodeconfig.JoinConfiguration
	kubeadmPatches          = nodeconfig.Patches
	discovery               = nodeconfig.Discovery
	bootstrapTokenDiscovery = nodeconfig.BootstrapTokenDiscovery
	nodeRegistration        = nodeconfig.NodeRegistration
	kubeletArg              = nodeconfig.KubeletArg
)

// NodeConfig validates a pool's node.json as infra builds it (the pool's names, endpoint, token parameter, gateway,
// launch hook, join labels, taints and CA pins, host settings and pre-pull images) and r, and completes it with what
// every dynk8s node of r's version runs: the packages and the repositories the user data writes, CRI-O's socket,
// the kernel modules, Fedora's packages and repositories, the sandbox and kube-proxy images first among the
// pre-pulls, the kubelet patches' directory and the deadlines. It is /etc/dynk8s/node.json as the agent reads it.
func NodeConfig(node nodeconfig.Node, r NodeRender) (nodeconfig.Node, error) {
	minor, err := validate(node, r)
	if err != nil {
		return nodeconfig.Node{}, err
	}
	n := node
	completePrepare(&n, r, minor)
	n.Join = nodeconfig.Join{
		CACertHashes:     slices.Sorted(slices.Values(node.Join.CACertHashes)),
		Labels:           maps.Clone(node.Join.Labels),
		Taints:           kube.SortedTaints(node.Join.Taints),
		PatchesDirectory: kubeadmPatchDir,
	}
	if n.Join.Taints == nil {
		n.Join.Taints = []kube.Taint{}
	}
	n.Host = nodeconfig.Host{OnPremCIDRs: slices.Clone(node.Host.OnPremCIDRs), TunnelMTU: node.Host.TunnelMTU,
		MetadataUIDs: slices.Compact(slices.Sorted(slices.Values(node.Host.MetadataUIDs)))}
	n.Deadlines = nodeconfig.DefaultDeadlines
	return n, nil
}

// completePrepare completes n's prepare fields (its pre-pulls are the pool's) with what every dynk8s node of r's
// version runs.
func completePrepare(n *nodeconfig.Node, r NodeRender, minor kube.Minor) {
	n.CRISocket = criSocket
	n.KernelModules = kernelModules
	n.Packages = nodePackages(r.KubernetesVersion, minor)
	n.Repos = []string{kubernetesRepoID, crioRepoID}
	n.SystemPackages, n.SystemRepos, n.UpdateRepos = systemPackages, systemRepos, updateRepos
	n.PrePullImages = prePullImages(n.PrePullImages, r, minor)
}

// validatePrepare checks what both a node's and a bake's user data encode of the pool: its names, its pre-pull
// images, the sandbox image and the agent's pin.
func validatePrepare(e *errs, in nodeconfig.Node, r NodeRender) {
	e.add("ClusterName", validateDNSLabel(in.ClusterName))
	e.add("PoolName", validateDNSLabel(in.PoolName))
	for i, img := range in.PrePullImages {
		_, err := kube.NormalizeImage(img)
		e.add(fmt.Sprintf("PrePullImages[%d]", i), err)
	}
	if r.PauseImage != "" {
		_, err := kube.NormalizeImage(r.PauseImage)
		e.add("PauseImage", err)
	}
	if r.Agent != nil {
		r.Agent.validate(e)
	}
}

// validate checks the pool's values that the user data encodes and reports all problems at once; node.json's own
// rules (its required values, the host's ranges, MTU and users) are nodeconfig.Node.Validate's, which Encode runs.
// It returns the Kubernetes minor's facts.
func validate(in nodeconfig.Node, r NodeRender) (kube.Minor, error) {
	var e errs
	minor, err := kube.LookupMinor(r.KubernetesVersion)
	e.add("KubernetesVersion", err)
	if in.APIServerEndpoint.IsZero() {
		e.add("APIServerEndpoint", errors.New("is required"))
	}
	hashes := in.Join.CACertHashes
	if len(hashes) == 0 {
		e.add("Join.CACertHashes", errors.New("at least one is required: kubeadm would otherwise trust any API server"))
	}
	for i, h := range hashes {
		if slices.Index(hashes, h) < i {
			e.add(fmt.Sprintf("Join.CACertHashes[%d]", i), fmt.Errorf("%q is listed twice", h))
		} else {
			e.add(fmt.Sprintf("Join.CACertHashes[%d]", i), kube.CheckCACertHash(h))
		}
	}
	e.add("JoinTokenParameter", validateSSMName(in.JoinTokenParameter))
	if in.GatewayInstanceID != "" && !names.IsInstanceID(in.GatewayInstanceID) {
		e.add("GatewayInstanceID", fmt.Errorf("%q is not an EC2 instance id", in.GatewayInstanceID))
	}
	validatePrepare(&e, in, r)
	// The labels' and taints' own rules (NodeRestriction's, the ones the boot sets, the key and value forms, one
	// taint per key and effect) are the config's, which runs before any renderer (infra/config,
	// validateLabelsAndTaints); what is left here is the public-data tripwire and the pool label's agreement with
	// the pool's name.
	labels := in.Join.Labels
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		e.add(fmt.Sprintf("Join.Labels[%q]", k), noSecret(labels[k]))
	}
	if v, ok := labels[kube.LabelPool]; !ok || v != in.PoolName {
		e.add("Join.Labels", fmt.Errorf("%s must be the pool name %q", kube.LabelPool, in.PoolName))
	}
	for i, t := range in.Join.Taints {
		e.add(fmt.Sprintf("Join.Taints[%d].value", i), noSecret(t.Value))
	}
	if in.LaunchHook != "" && !lifecycleHookRE.MatchString(in.LaunchHook) {
		e.add("LaunchHook", fmt.Errorf("%q is not a lifecycle hook name (1-255 of [A-Za-z0-9_/-])", in.LaunchHook))
	}
	r.DNS.validate(&e)
	if err := e.join("node user data"); err != nil {
		return kube.Minor{}, err
	}
	return minor, nil
}
