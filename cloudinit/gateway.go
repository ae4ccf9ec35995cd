package cloudinit

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"text/template"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/wireguard"
)

// GatewayInput is everything the WireGuard gateway instance's user data depends on; nothing secret.
type GatewayInput struct {
	ListenPort          uint16             // UDP
	MTU                 uint16             // explicit tunnel MTU (never wg-quick's auto MTU); the config's range
	TunnelAddress       netip.Prefix       // the gateway's address with prefix, 10.99.0.1/30
	PeerPublicKey       wgtypes.Key        // the on-prem peer's public key
	PeerAllowedIPs      []netip.Prefix     // on-prem CIDRs + on-prem tunnel /32
	PeerEndpoint        *endpoint.HostPort // optional: where the gateway dials the on-prem peer
	PrivateKeyParameter string             // SSM SecureString name holding the gateway's private key
	// IdleStop is how long the gateway stays up with no pool instance pending or running and no packet forwarded
	// through the tunnel before it powers off (its instance stops); 0 keeps it running and renders no idle check.
	IdleStop time.Duration
	// ClusterName is the dynk8s:cluster tag value of the pool instances the idle check looks for (required with
	// IdleStop).
	ClusterName string
	// Forward, when set, limits what the gateway forwards from the VPC into the tunnel (forward.go); nil forwards
	// everything.
	Forward *GatewayForward
	// Agent is where the gateway installs the node agent from, whose gateway commands fetch the key, install the
	// packages and run the idle check (agent.go). The stack always sets it; nil renders no bootstrap (the agent is
	// then expected at /usr/local/bin/dynk8s-node, as in tests that bind it there).
	Agent *Agent
}

const (
	wgInterface = "wg0"
	wgConfPath  = "/etc/wireguard/wg0.conf"
	// wgKeyPath is written at boot by the agent's gateway-key and loaded by PostUp; wg0.conf itself holds no key.
	wgKeyPath  = "/etc/wireguard/wg0.key"
	wgMSSPath  = "/etc/dynk8s/wg0-mss.nft"
	wgMSSTable = "dynk8s_wg0_mss"
	wgUnit     = "wg-quick@wg0.service"
	// The idle check: the agent's gateway-idle, run once a minute by a timer.
	idleUnitName  = "dynk8s-gateway-idle.service"
	idleTimerName = "dynk8s-gateway-idle.timer"

	gatewayPackagesUnitName = "dynk8s-gateway-packages.service"
)

// gatewayAgent is how the gateway's units run one of the agent's gateway commands, with the gateway's config.
func gatewayAgent(command string) string {
	return agentBinary + " " + command + " --config " + nodeconfig.GatewayPath
}

// agentFirst are the [Unit] entries of a unit that runs the agent: the bootstrap installs it, hash-pinned, before
// (none without a bootstrap). A later boot's bootstrap finds the pinned binary installed and needs no network.
func agentFirst(a *Agent) []unitEntry {
	if a == nil {
		return nil
	}
	return []unitEntry{{"Requires", agentUnitName}, {"After", agentUnitName}}
}

// Counters of the packets the gateway forwards into and out of the tunnel, in the MSS table: what the idle check
// reads to tell a quiet tunnel from a busy one (WireGuard's own keepalives and handshakes are never forwarded).
const (
	forwardedIn  = "forwarded_in"
	forwardedOut = "forwarded_out"
	// forwardRefused is the comment of the rules that count and drop what the forward filter (GatewayInput.Forward)
	// refuses: a rule's own counter, not a named one, so the idle check's sum of the named counters stays the
	// forwarded packets.
	forwardRefused = "refused"
)

// gatewayPackages come from Fedora's repositories, the release repository alone first (the gateway boots the
// release's GA image, like the nodes: see systemRepos), all of them after a failed attempt. cloud-init's own package
// step is not used: it runs once, and a mirror hiccup at that moment would leave a gateway without wg-quick@.service
// that never brings the tunnel up and is not retried on reboot (cloud-init's modules run once per instance).
var gatewayPackages = []string{"nftables", "wireguard-tools"}

// gatewayPackagesUnit runs the agent's gateway-packages at every boot: a first boot installs (with retries), later
// boots only check; it then enables and starts the tunnel. A failure is retried by systemd every 30 s, without end
// (a failed bootstrap with it: a start pulls in the units it Requires=).
func gatewayPackagesUnit(a *Agent) unitFile {
	return unitFile{
		{Name: "Unit", Entries: slices.Concat([]unitEntry{
			{"Description", "dynk8s: install the WireGuard gateway's packages, then start " + wgUnit},
			{"Wants", "network-online.target"},
			{"After", "network-online.target"},
		}, agentFirst(a), []unitEntry{
			// Restart=on-failure must not run into systemd's start rate limit (5 starts in 10 s by default).
			{"StartLimitIntervalSec", "0"},
		})},
		{Name: "Service", Entries: []unitEntry{
			{"Type", "oneshot"},
			{"ExecStart", gatewayAgent("gateway-packages")},
			{"StandardOutput", "journal+console"},
			{"StandardError", "journal+console"},
			{"SyslogIdentifier", "dynk8s-gateway-packages"},
			// The agent's own deadline and a margin.
			{"TimeoutStartSec", unitSeconds(nodeconfig.DefaultGatewayDeadlines.PackagesUnitTimeout())},
			{"Restart", "on-failure"},
			{"RestartSec", "30s"},
		}},
		{Name: "Install", Entries: []unitEntry{
			{"WantedBy", "multi-user.target"},
		}},
	}
}

// peerMemory are wg-quick@wg0's entries that keep the on-prem peer's address across the gateway's stops when
// on-prem dials in (node/internal/gateway/peer.go says why: after a stop, the peer's own handshake can come minutes
// later). The address is saved before wg-quick deletes wg0, so the empty ExecStop= drops the packaged unit's
// `wg-quick down %i` to list it again after the save (systemd.service(5): an empty assignment resets the list), and
// dialled once wg-quick has brought wg0 up with its key. They are unit commands, not wg-quick hooks: wg-quick and its
// hooks run confined on Fedora (selinux-policy's wireguard_t may read /etc, not write /var/lib), the agent as a
// unit's command does not. "-": neither fails the unit, the tunnel comes up without them.
var peerMemory = []unitEntry{
	{"ExecStartPost", "-" + agentBinary + " gateway-dial-peer --interface %i"},
	{"ExecStop", ""},
	{"ExecStop", "-" + agentBinary + " gateway-save-peer --interface %i"},
	{"ExecStop", "/usr/bin/wg-quick down %i"},
}

// mssRuleset clamps the MSS of TCP connections forwarded through the tunnel. Leaving through wg0, SYNs are clamped to
// the route's (path) MTU; coming in from wg0, the on-prem side advertises an MSS for its own 1500-byte link, so
// SYNs are lowered to what fits the tunnel (MTU less 40 bytes of IPv4+TCP header, 60 for IPv6). Only larger values
// are lowered. Two named counters count the packets forwarded each way (for the idle check). The leading
// "table"/"delete table" pair makes a reload replace the rules instead of adding copies.
var mssRuleset = template.Must(template.New("mss").Parse(`table inet {{.Table}}
delete table inet {{.Table}}
table inet {{.Table}} {
  counter {{.In}} {
  }
  counter {{.Out}} {
  }
  chain forward {
    type filter hook forward priority mangle; policy accept;
    iifname "{{.Interface}}" counter name "{{.In}}"
    oifname "{{.Interface}}" counter name "{{.Out}}"
    oifname "{{.Interface}}" tcp flags syn / syn,rst tcp option maxseg size set rt mtu
    iifname "{{.Interface}}" meta nfproto ipv4 tcp flags syn / syn,rst tcp option maxseg size > {{.MSS4}} tcp option maxseg size set {{.MSS4}}
    iifname "{{.Interface}}" meta nfproto ipv6 tcp flags syn / syn,rst tcp option maxseg size > {{.MSS6}} tcp option maxseg size set {{.MSS6}}
  }
{{.Filter}}}
`))

// Gateway validates in and renders the WireGuard gateway's cloud-config: the bootstrap that installs the agent,
// wireguard-tools and nftables from Fedora, installed by a unit that retries, forwarding on, wg0.conf without a
// private key, and wg-quick@wg0 enabled with a drop-in that fetches the key from SSM before each start.
func Gateway(in GatewayInput) ([]byte, error) {
	if err := in.validate(); err != nil {
		return nil, err
	}
	wg := wireguard.Config{
		Interface: wireguard.Interface{
			Address:    []netip.Prefix{in.TunnelAddress},
			ListenPort: in.ListenPort,
			MTU:        in.MTU,
			PostUp: []string{
				"wg set %i private-key " + wgKeyPath,
				"nft -f " + wgMSSPath,
			},
			// "|| true": wg-quick stops at a failing hook, and the interface must go down even without the table.
			PreDown: []string{"nft delete table inet " + wgMSSTable + " || true"},
		},
		Peers: []wireguard.Peer{{
			PublicKey:  in.PeerPublicKey,
			AllowedIPs: in.PeerAllowedIPs,
			Endpoint:   in.PeerEndpoint,
		}},
	}
	if in.PeerEndpoint != nil {
		// The gateway dials on-prem: its keepalive is set with the key, after the interface is up, so that the
		// first handshake leaves at once. WireGuard sends a keepalive, and with it a handshake initiation, when an
		// up interface's peer gets a keepalive interval it did not have (wg(8), persistent-keepalive; kernel
		// drivers/net/wireguard/netlink.c set_peer, wireguard-go device/uapi.go). In [Peer] instead, the keepalive
		// is sent when wg-quick brings the interface up, before PostUp has set the key: that initiation fails, and
		// the next waits for the keepalive timer or for traffic into the tunnel, at least REKEY_TIMEOUT (5 s) later.
		wg.Interface.PostUp[0] += fmt.Sprintf(" peer %s persistent-keepalive %d", in.PeerPublicKey,
			wireguard.PersistentKeepalive)
	}
	wgConf, err := wg.Marshal()
	if err != nil {
		return nil, fmt.Errorf("gateway user data: wg0.conf: %w", err)
	}

	var nft strings.Builder
	if err := mssRuleset.Execute(&nft, struct {
		Table, Interface, In, Out, Filter string
		MSS4, MSS6                        int
	}{wgMSSTable, wgInterface, forwardedIn, forwardedOut, forwardChains(in.Forward, wgInterface, forwardRefused),
		int(in.MTU) - 40, int(in.MTU) - 60}); err != nil {
		return nil, fmt.Errorf("gateway user data: MSS ruleset: %w", err)
	}
	cfg, err := gatewayConfig(in).Encode()
	if err != nil {
		return nil, fmt.Errorf("gateway user data: %w", err)
	}
	var dropIn []unitSection
	if in.Agent != nil {
		dropIn = append(dropIn, unitSection{Name: "Unit", Entries: agentFirst(in.Agent)})
	}
	service := []unitEntry{
		{"ExecStartPre", gatewayAgent("gateway-key")},
		{"StandardOutput", "journal+console"},
		{"StandardError", "journal+console"},
		// The agent's first-boot deadline and a margin; oneshot units otherwise have no start timeout.
		{"TimeoutStartSec", unitSeconds(nodeconfig.DefaultGatewayDeadlines.KeyUnitTimeout())},
		// A first boot during an SSM outage, or a tunnel that fails to come up, is retried rather than left down.
		{"Restart", "on-failure"},
		{"RestartSec", "30s"},
	}
	if in.PeerEndpoint == nil {
		service = append(service, peerMemory...)
	}
	dropInFile, err := unitFile(append(dropIn, unitSection{Name: "Service", Entries: service})).marshal()
	if err != nil {
		return nil, fmt.Errorf("gateway user data: wg-quick drop-in: %w", err)
	}

	pkgUnit, err := gatewayPackagesUnit(in.Agent).marshal()
	if err != nil {
		return nil, fmt.Errorf("gateway user data: packages unit: %w", err)
	}

	cc := cloudConfig{
		WriteFiles: []writeFile{
			// Not deferred behind a package: it holds no key (the agent writes wg0.key 0600), so the mode of
			// /etc/wireguard, which cloud-init creates here and wireguard-tools later owns, does not matter.
			{Path: wgConfPath, Content: string(wgConf), Permissions: "0600"},
			{Path: nodeconfig.GatewayPath, Content: string(cfg), Permissions: "0644"},
			{Path: wgMSSPath, Content: nft.String(), Permissions: "0644"},
			{Path: "/etc/sysctl.d/90-dynk8s-gateway.conf", Content: sysctlFile(map[string]string{"net.ipv4.ip_forward": "1"}),
				Permissions: "0644"},
			{Path: "/etc/systemd/system/wg-quick@wg0.service.d/10-dynk8s.conf", Content: dropInFile, Permissions: "0644"},
			{Path: "/etc/systemd/system/" + gatewayPackagesUnitName, Content: pkgUnit, Permissions: "0644"},
		},
		// The packages unit, enabled, installs what is missing (retrying) and then enables and starts the tunnel,
		// which so comes back by itself after a reboot or an EC2 auto-recovery. `enable --now` blocks and is runcmd's
		// last command (idleCheck inserts before it), so cloud-init's final status shows a first install that failed:
		// runcmd is one shell script with no `set -e`, whose status is its last command's (runcmdFailsOnFailedUnits).
		// The unit keeps retrying after that.
		RunCmd: [][]string{
			{"sysctl", "-q", "--system"},
			{"systemctl", "daemon-reload"},
			{"systemctl", "enable", "--now", gatewayPackagesUnitName},
		},
	}
	if in.Agent != nil {
		if err := addAgent(&cc, *in.Agent, nodeconfig.GatewayAgentFetch); err != nil {
			return nil, fmt.Errorf("gateway user data: %w", err)
		}
		// Enabled for the boots to come; this boot's start of the packages unit pulls it in (Requires=).
		cc.RunCmd = slices.Insert(cc.RunCmd, 2, []string{"systemctl", "enable", agentUnitName})
	}
	if in.IdleStop > 0 {
		if err := idleCheck(in, &cc); err != nil {
			return nil, fmt.Errorf("gateway user data: %w", err)
		}
	}
	out, err := cc.marshal()
	if err != nil {
		return nil, fmt.Errorf("gateway user data: %w", err)
	}
	return out, nil
}

// idleCheck adds the idle check to the gateway's cloud-config: a timer that runs the agent's gateway-idle once a
// minute from a minute after boot (its config is gateway.json's idle). The timer is enabled, so it runs after every
// start of the instance.
func idleCheck(in GatewayInput, cc *cloudConfig) error {
	service, err := unitFile{
		{Name: "Unit", Entries: slices.Concat([]unitEntry{
			{"Description", "dynk8s: stop this WireGuard gateway when the node pools and the tunnel are idle"},
			{"Wants", "network-online.target"},
			{"After", "network-online.target " + wgUnit},
		}, agentFirst(in.Agent))},
		{Name: "Service", Entries: []unitEntry{
			{"Type", "oneshot"},
			{"ExecStart", gatewayAgent("gateway-idle")},
			{"SyslogIdentifier", "dynk8s-gateway-idle"},
			// The agent's own deadline and a margin, short of the timer's next run a minute away.
			{"TimeoutStartSec", unitSeconds(nodeconfig.DefaultGatewayDeadlines.IdleUnitTimeout())},
		}},
	}.marshal()
	if err != nil {
		return fmt.Errorf("idle check unit: %w", err)
	}
	timer, err := unitFile{
		{Name: "Unit", Entries: []unitEntry{
			{"Description", "dynk8s: check once a minute whether this WireGuard gateway is idle"},
		}},
		{Name: "Timer", Entries: []unitEntry{
			{"OnBootSec", "1min"},
			{"OnUnitActiveSec", "1min"},
			{"AccuracySec", "10s"},
		}},
		{Name: "Install", Entries: []unitEntry{
			{"WantedBy", "timers.target"},
		}},
	}.marshal()
	if err != nil {
		return fmt.Errorf("idle check timer: %w", err)
	}
	cc.WriteFiles = append(cc.WriteFiles,
		writeFile{Path: "/etc/systemd/system/" + idleUnitName, Content: service, Permissions: "0644"},
		writeFile{Path: "/etc/systemd/system/" + idleTimerName, Content: timer, Permissions: "0644"},
	)
	last := len(cc.RunCmd) - 1
	cc.RunCmd = slices.Concat(cc.RunCmd[:last], [][]string{{"systemctl", "enable", "--now", idleTimerName}},
		cc.RunCmd[last:])
	return nil
}

func (in GatewayInput) validate() error {
	var e errs
	// The port and the MTU must be set: without a port the kernel picks one the security group does not open, and
	// without an MTU wg-quick derives 8921 on EC2. Their ranges are the config's (wireguard.MinMTU..MaxMTU).
	if in.ListenPort == 0 {
		e.add("ListenPort", errors.New("is required"))
	}
	if in.MTU == 0 {
		e.add("MTU", errors.New("is required (wg-quick's automatic MTU is 8921 on EC2)"))
	}
	if p := in.TunnelAddress; !p.IsValid() {
		e.add("TunnelAddress", errors.New("is required"))
	} else if p.Addr() == p.Masked().Addr() && p.Bits() < p.Addr().BitLen()-1 {
		e.add("TunnelAddress", fmt.Errorf("%s is the network address; the gateway needs a host address in it", p))
	}
	if len(in.PeerAllowedIPs) == 0 {
		e.add("PeerAllowedIPs", errors.New("at least one CIDR is required"))
	}
	// The key, the ranges and the endpoint are checked by wireguard.Config.Marshal.
	e.add("PrivateKeyParameter", validateSSMName(in.PrivateKeyParameter))
	switch {
	case in.IdleStop < 0:
		e.add("IdleStop", fmt.Errorf("%s is negative", in.IdleStop))
	case in.IdleStop > 0 && in.IdleStop%time.Second != 0:
		e.add("IdleStop", fmt.Errorf("%s is not a whole number of seconds", in.IdleStop))
	case in.IdleStop > 0:
		e.add("ClusterName", validateDNSLabel(in.ClusterName))
	}
	if in.Forward != nil {
		e.add("Forward", in.Forward.validate())
	}
	if in.Agent != nil {
		in.Agent.validate(&e)
	}
	return e.join("gateway user data")
}

// gatewayConfig is the agent's configuration of the gateway (gateway.json).
func gatewayConfig(in GatewayInput) nodeconfig.Gateway {
	g := nodeconfig.Gateway{
		KeyParameter: in.PrivateKeyParameter,
		KeyFile:      wgKeyPath,
		Packages:     gatewayPackages,
		SystemRepos:  systemRepos,
		TunnelUnit:   wgUnit,
		Deadlines:    nodeconfig.DefaultGatewayDeadlines,
	}
	if in.IdleStop > 0 {
		g.Idle = &nodeconfig.GatewayIdle{ClusterName: in.ClusterName, Stop: nodeconfig.Duration(in.IdleStop),
			NFTTable: wgMSSTable}
	}
	return g
}
