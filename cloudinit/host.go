package cloudinit

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// The node's host settings beyond the join itself: what kubeadm patches into the kubelet's configuration, the
// routes and DNS toward on-prem, and the lockdown of the instance metadata service before any kubelet runs. Each is a
// file of its own and, where something must run, a unit of its own running the agent's subcommand for it
// (onprem-routes, imds-lock) with node.json's host section, so the agent's join stays about the join.

// OnPremDNS are on-prem name servers (optional): the node asks them for names under Domains, and only for those.
// The config keeps them inside the on-prem ranges, at most 3, and with Domains. node.json's host section (the ranges
// the VPC routes through the tunnel, its MTU, the users that may reach the metadata service) is the agent's
// (nodeconfig.Host).
type OnPremDNS struct {
	Servers []netip.Addr
	Domains []string
}

// Where the host settings go on the node.
const (
	// kubeadmPatchDir is the JoinConfiguration's patches.directory: under /etc/kubernetes, which kubeadm reset
	// leaves alone (it removes only its own files there), so a retried join finds the patches again.
	kubeadmPatchDir = "/etc/kubernetes/patches"
	// resolvedResolvConf is systemd-resolved's list of the real upstream servers. Fedora resolves through resolved,
	// whose /etc/resolv.conf names only the 127.0.0.53 stub, which means nothing inside a pod.
	resolvedResolvConf = "/run/systemd/resolve/resolv.conf"
	routesUnitName     = "dynk8s-onprem-routes.service"
	resolvedDropInPath = "/etc/systemd/resolved.conf.d/90-dynk8s-onprem.conf"
	imdsUnitName       = "dynk8s-imds-lock.service"
	// kubeletLockDropIn makes the kubelet's unit (from its package) require the lockdown, whoever starts it.
	kubeletLockDropIn = "/etc/systemd/system/kubelet.service.d/90-dynk8s-imds-lock.conf"
)

// kubeletPatch is a JSON merge patch (RFC 7386) of the node's KubeletConfiguration: the per-node settings that the
// cluster's kubelet-config ConfigMap would otherwise decide. kubeadm join applies it (target kubeletconfiguration,
// `kubeadm join --help` at v1.31 and later) to the config it writes to /var/lib/kubelet/config.yaml. A merge patch,
// not kubeadm's default strategic one: KubeletConfiguration is not a type with strategic-merge metadata.
//
// resolvConf: kubeadm picks resolved's file itself only when the cluster's kubelet-config leaves resolvConf unset
// (cmd/kubeadm/app/componentconfigs/kubelet.go, mutateResolverConfig); a cluster initialised on a host without
// resolved may pin /etc/resolv.conf, which on Fedora hands pods with dnsPolicy Default the unusable stub.
//
// serializeImagePulls and maxParallelImagePulls: the kubelet pulls one image at a time by default, so a new node's
// CNI, termination handler and fuse images queue behind each other before it is Ready; in parallel (at most
// maxParallelImagePulls, which needs serializeImagePulls false: KubeletConfiguration, kubelet/config/v1beta1).
//
// rotateCertificates false: the kubelet then bootstraps its client certificate with the key the agent wrote to
// <cert dir>/kubelet-client.key.tmp and marked its instance with (pkg/kubelet/certificate/bootstrap LoadClientCert,
// which reuses that file), the key the controller binds the node's name to. With it true, which kubeadm sets, the
// kubelet's certificate manager makes a fresh key for every request and never reads the file
// (cmd/kubelet/app/server.go buildKubeletClientConfig; client-go util/certificate certificate_manager.go generateCSR),
// and the binding could not hold. The price: the client certificate is not renewed, so a pool node lasts the
// cluster signer's duration (kube-controller-manager --cluster-signing-duration, a year by default), far beyond a
// burst node's life; docs/security.md says so.
//
// nodeStatusUpdateFrequency 1s: a new node's github.com/fuse allocatable, which lifts its startup taint and lets the
// build pod be scheduled, reaches the API server on the kubelet's next node status update after the plugin
// registers, every 10 s by default (after the node is Ready: the kubelet's fast updates stop there,
// pkg/kubelet/kubelet.go fastStatusUpdateOnce). Each update computes the status and reads the Node from the kubelet's
// own informer cache, and PATCHes only when the status changed or nodeStatusReportFrequency has passed
// (pkg/kubelet/kubelet_node_status.go tryUpdateNodeStatus, at v1.34.4): the API cost is at most one PATCH a second
// per node while its status changes (a boot's capacity, images and conditions: a handful), none at rest.
// nodeStatusReportFrequency is set explicitly at its default, 5 minutes, because it defaults to an explicitly set
// nodeStatusUpdateFrequency (pkg/kubelet/apis/config/v1beta1/defaults.go), which would be a PATCH a second per node
// for ever. The node lifecycle controller's grace (kube-controller-manager --node-monitor-grace-period) watches the
// node's Lease, which these settings do not change.
type kubeletPatch struct {
	ResolvConf                string `json:"resolvConf"`
	SerializeImagePulls       bool   `json:"serializeImagePulls"`
	MaxParallelImagePulls     int    `json:"maxParallelImagePulls"`
	RotateCertificates        bool   `json:"rotateCertificates"`
	NodeStatusUpdateFrequency string `json:"nodeStatusUpdateFrequency"`
	NodeStatusReportFrequency string `json:"nodeStatusReportFrequency"`
}

// The kubelet's node status timing (kubeletPatch).
const (
	nodeStatusUpdateFrequency = time.Second
	nodeStatusReportFrequency = 5 * time.Minute
)

// maxParallelImagePulls bounds a new node's concurrent pulls (bandwidth shared with the packages and the pre-pull).
const maxParallelImagePulls = 4

// hostSetup is what hostConfig adds to a node's cloud-config: files, the units runcmd enables for the boots to come,
// and the commands runcmd runs before it starts the join unit.
type hostSetup struct {
	files      []writeFile
	enable     []string
	beforeJoin [][]string
}

// hostConfig renders the host's files and units; fetched says the agent comes from the bootstrap's unit, which the
// host's units then require as the join's does.
func hostConfig(dns OnPremDNS, fetched bool) (hostSetup, error) {
	var h hostSetup
	patch, err := yaml.Marshal(kubeletPatch{ResolvConf: resolvedResolvConf, MaxParallelImagePulls: maxParallelImagePulls,
		NodeStatusUpdateFrequency: nodeStatusUpdateFrequency.String(),
		NodeStatusReportFrequency: nodeStatusReportFrequency.String()})
	if err != nil {
		return h, fmt.Errorf("kubelet patch: %w", err)
	}
	routes, err := routesUnit(fetched).marshal()
	if err != nil {
		return h, fmt.Errorf("routes unit: %w", err)
	}
	lock, err := imdsUnit(fetched).marshal()
	if err != nil {
		return h, fmt.Errorf("metadata lock unit: %w", err)
	}
	kubeletLock, err := kubeletNeedsLock().marshal()
	if err != nil {
		return h, fmt.Errorf("kubelet drop-in: %w", err)
	}
	h.files = []writeFile{
		{Path: kubeadmPatchDir + "/kubeletconfiguration+merge.yaml", Content: string(patch), Permissions: "0644"},
		{Path: "/etc/systemd/system/" + routesUnitName, Content: routes, Permissions: "0644"},
		{Path: "/etc/systemd/system/" + imdsUnitName, Content: lock, Permissions: "0644"},
		{Path: kubeletLockDropIn, Content: kubeletLock, Permissions: "0644"},
	}
	h.enable = []string{routesUnitName}
	// NetworkManager read its configuration before cloud-init wrote the CNI drop-in (node.go): without a reload it
	// would apply only from the next boot, which most nodes never have. A no-op where NetworkManager does not run.
	h.beforeJoin = [][]string{{"systemctl", "start", routesUnitName},
		{"systemctl", "try-reload-or-restart", "NetworkManager.service"}}
	if len(dns.Servers) > 0 {
		dropIn, err := resolvedDropIn(dns).marshal()
		if err != nil {
			return h, fmt.Errorf("resolved drop-in: %w", err)
		}
		h.files = append(h.files, writeFile{Path: resolvedDropInPath, Content: dropIn, Permissions: "0644"})
		// resolved read its configuration before cloud-init wrote the drop-in.
		h.beforeJoin = append(h.beforeJoin, []string{"systemctl", "try-restart", "systemd-resolved.service"})
	}
	return h, nil
}

// needsAgent orders a unit that runs the agent after the bootstrap that installs it, and fails it with the bootstrap.
// The bootstrap is ordered after nothing of the node's own (only network-online.target), so this adds no ordering
// the join could wait on.
func needsAgent(fetched bool) []unitEntry {
	if !fetched {
		return nil
	}
	return []unitEntry{{"Requires", agentUnitName}, {"After", agentUnitName}}
}

// agentCommand is how a unit runs one of the agent's subcommands on the node's configuration.
func agentCommand(sub string) string { return agentBinary + " " + sub + " --config " + nodeconfig.Path }

// routesUnit caps the path MTU toward on-prem at every boot (routes do not persist), before the join and the
// kubelet. A failure is logged but blocks neither: too large a packet is a slow path, not a dead node.
func routesUnit(fetched bool) unitFile {
	return unitFile{
		{Name: "Unit", Entries: slices.Concat([]unitEntry{
			{"Description", "dynk8s: cap the path MTU toward the on-prem ranges at the tunnel's"},
			{"Wants", "network-online.target"},
			{"After", "network-online.target"},
		}, needsAgent(fetched), []unitEntry{
			{"Before", joinUnitName + " kubelet.service"},
		})},
		{Name: "Service", Entries: []unitEntry{
			{"Type", "oneshot"},
			{"RemainAfterExit", "yes"},
			{"ExecStart", agentCommand("onprem-routes")},
			{"StandardOutput", "journal+console"},
			{"StandardError", "journal+console"},
			{"SyslogIdentifier", "dynk8s-onprem-routes"},
			{"TimeoutStartSec", unitSeconds(nodeconfig.DefaultDeadlines.RoutesUnitTimeout())},
		}},
		{Name: "Install", Entries: []unitEntry{
			{"WantedBy", "multi-user.target"},
		}},
	}
}

// imdsUnit loads the metadata lockdown. Nothing enables it: the kubelet requires it (kubeletNeedsLock), so every
// start of the kubelet, at a boot or by kubeadm join, loads it first or fails, and the agent's join starts it before kubeadm
// join on every path that joins (a cold boot, a Stopped warm instance's boot into service, a Running or Hibernated
// one's timer) so that a failure stops the join with its reason. Everything before the kubelet runs as root, which
// the lockdown lets through (the agent, dnf, CRI-O's pulls, the gateway wake-up). It is ordered after nothing but
// systemd's defaults and the agent's bootstrap: on a boot that starts the join with kubelet already enabled (a
// Stopped warm instance entering service), a lock ordered after the join would hold kubelet's start job, and
// kubeadm's blocking restart of the kubelet with it (TestNodeUnitsNeverOrderWhatTheJoinStartsAfterTheJoin).
func imdsUnit(fetched bool) unitFile {
	return unitFile{
		{Name: "Unit", Entries: append([]unitEntry{
			{"Description", "dynk8s: keep the instance metadata service from pods and non-root users"},
		}, needsAgent(fetched)...)},
		{Name: "Service", Entries: []unitEntry{
			{"Type", "oneshot"},
			{"RemainAfterExit", "yes"},
			{"ExecStart", agentCommand("imds-lock")},
			{"StandardOutput", "journal+console"},
			{"StandardError", "journal+console"},
			{"SyslogIdentifier", "dynk8s-imds-lock"},
		}},
	}
}

// kubeletNeedsLock is a drop-in for the kubelet's unit: the kubelet starts only once the lockdown is loaded, and not
// at all when it failed (systemd.unit(5), Requires=: "If one of the other units fails to activate, and an ordering
// dependency After= on the failing unit is set, this unit will not be started"). So no pod runs on a node whose
// metadata service is open: the lockdown fails closed.
func kubeletNeedsLock() unitFile {
	return unitFile{{Name: "Unit", Entries: []unitEntry{
		{"Requires", imdsUnitName},
		{"After", imdsUnitName},
	}}}
}

// resolvedDropIn gives systemd-resolved's global scope the on-prem servers with the on-prem domains as route-only
// ("~") domains, so names under them are asked of those servers alone. resolved also treats its global servers as a
// default route (src/resolve/resolved-dns-scope.c, dns_scope_is_default_route: "The global DNS scope is always
// suitable as default route"), so other names go to them and to the VPC resolver alike, first answer winning: the
// on-prem servers must answer public names too (a forwarding server does). A per-link setting would not do: resolved
// sends a link's queries out of that link, and the VPC resolver's link is the only one.
func resolvedDropIn(dns OnPremDNS) unitFile {
	servers := make([]string, len(dns.Servers))
	for i, a := range dns.Servers {
		servers[i] = a.String()
	}
	domains := make([]string, len(dns.Domains))
	for i, d := range dns.Domains {
		domains[i] = "~" + d
	}
	return unitFile{{Name: "Resolve", Entries: []unitEntry{
		{"DNS", strings.Join(servers, " ")},
		{"Domains", strings.Join(domains, " ")},
	}}}
}

// validate checks only what the encoding needs: the servers and domains go into resolved's space-separated lists.
// The rules about them (at most three servers, inside the on-prem ranges, servers and domains together, no
// duplicates) are the config's (infra/config, validateOnPremDNS); the ranges, the MTU and the users are node.json's
// (nodeconfig.Node.Validate, which Encode runs).
func (dns OnPremDNS) validate(e *errs) {
	for i, a := range dns.Servers {
		if !a.IsValid() {
			e.add(fmt.Sprintf("DNS.Servers[%d]", i), errors.New("is not an IP address"))
		}
	}
	for i, d := range dns.Domains {
		if !kube.IsDNSSubdomain(d) {
			e.add(fmt.Sprintf("DNS.Domains[%d]", i), fmt.Errorf("%q is not a DNS domain (lower case, no leading '~' or trailing '.')", d))
		}
	}
}
