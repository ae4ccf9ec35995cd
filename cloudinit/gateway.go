package cloudinit

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/dynk8s/dynk8s/internal/endpoint"
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
}

const (
	wgInterface = "wg0"
	wgConfPath  = "/etc/wireguard/wg0.conf"
	// wgKeyPath is written at boot by wg-key.sh and loaded by PostUp; wg0.conf itself holds no key.
	wgKeyPath    = "/etc/wireguard/wg0.key"
	wgKeyEnvPath = "/etc/dynk8s/wg-key.env"
	wgMSSPath    = "/etc/dynk8s/wg0-mss.nft"
	wgMSSTable   = "dynk8s_wg0_mss"
	wgUnit       = "wg-quick@wg0.service"
	// The idle check: a script run once a minute by a timer, configured by an env file.
	idleEnvPath   = "/etc/dynk8s/gateway-idle.env"
	idleUnitName  = "dynk8s-gateway-idle.service"
	idleTimerName = "dynk8s-gateway-idle.timer"

	gatewayPackagesUnitName = "dynk8s-gateway-packages.service"
	gatewayPackagesEnvPath  = "/etc/dynk8s/gateway-packages.env"
)

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

// gatewayPackagesUnit runs gateway-packages.sh at every boot: a first boot installs (with retries), later boots only
// check; it then enables and starts the tunnel. A failure is retried by systemd every 30 s, without end.
func gatewayPackagesUnit() unitFile {
	return unitFile{
		{Name: "Unit", Entries: []unitEntry{
			{"Description", "dynk8s: install the WireGuard gateway's packages, then start " + wgUnit},
			{"Wants", "network-online.target"},
			{"After", "network-online.target"},
			// Restart=on-failure must not run into systemd's start rate limit (5 starts in 10 s by default).
			{"StartLimitIntervalSec", "0"},
		}},
		{Name: "Service", Entries: []unitEntry{
			{"Type", "oneshot"},
			{"ExecStart", libexecDir + "/gateway-packages.sh"},
			{"StandardOutput", "journal+console"},
			{"StandardError", "journal+console"},
			// Above the script's own 10 min deadline.
			{"TimeoutStartSec", "12min"},
			{"Restart", "on-failure"},
			{"RestartSec", "30s"},
		}},
		{Name: "Install", Entries: []unitEntry{
			{"WantedBy", "multi-user.target"},
		}},
	}
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

// Gateway validates in and renders the WireGuard gateway's cloud-config: wireguard-tools and nftables from Fedora,
// installed by a unit that retries, forwarding on, wg0.conf without a private key, and wg-quick@wg0 enabled with a
// drop-in that fetches the key from SSM before each start.
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
		wg.Peers[0].PersistentKeepalive = wireguard.PersistentKeepalive
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
	env, err := envFile("wg-key.sh", map[string]string{"DYNK8S_KEY_PARAMETER": in.PrivateKeyParameter})
	if err != nil {
		return nil, fmt.Errorf("gateway user data: %w", err)
	}
	dropIn, err := unitFile{{Name: "Service", Entries: []unitEntry{
		{"ExecStartPre", libexecDir + "/wg-key.sh"},
		{"StandardOutput", "journal+console"},
		{"StandardError", "journal+console"},
		// Above wg-key.sh's 10 min first-boot deadline; oneshot units otherwise have no start timeout.
		{"TimeoutStartSec", "12min"},
		// A first boot during an SSM outage, or a tunnel that fails to come up, is retried rather than left down.
		{"Restart", "on-failure"},
		{"RestartSec", "30s"},
	}}}.marshal()
	if err != nil {
		return nil, fmt.Errorf("gateway user data: wg-quick drop-in: %w", err)
	}

	pkgEnv, err := envFile("gateway-packages.sh", map[string]string{
		"DYNK8S_PACKAGES":     strings.Join(gatewayPackages, ","),
		"DYNK8S_SYSTEM_REPOS": strings.Join(systemRepos, ","),
		"DYNK8S_UNIT":         wgUnit,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway user data: %w", err)
	}
	pkgUnit, err := gatewayPackagesUnit().marshal()
	if err != nil {
		return nil, fmt.Errorf("gateway user data: packages unit: %w", err)
	}

	cc := cloudConfig{
		WriteFiles: []writeFile{
			// Not deferred behind a package: it holds no key (wg-key.sh writes wg0.key under umask 077), so the mode
			// of /etc/wireguard, which cloud-init creates here and wireguard-tools later owns, does not matter.
			{Path: wgConfPath, Content: string(wgConf), Permissions: "0600"},
			{Path: wgKeyEnvPath, Content: env, Permissions: "0644"},
			{Path: wgMSSPath, Content: nft.String(), Permissions: "0644"},
			{Path: "/etc/sysctl.d/90-dynk8s-gateway.conf", Content: sysctlFile(map[string]string{"net.ipv4.ip_forward": "1"}),
				Permissions: "0644"},
			{Path: "/etc/systemd/system/wg-quick@wg0.service.d/10-dynk8s.conf", Content: dropIn, Permissions: "0644"},
			{Path: gatewayPackagesEnvPath, Content: pkgEnv, Permissions: "0644"},
			{Path: "/etc/systemd/system/" + gatewayPackagesUnitName, Content: pkgUnit, Permissions: "0644"},
			{Path: libexecDir + "/gateway-packages.sh", Content: forUserData(gatewayPackagesSh), Permissions: "0755"},
			{Path: libexecDir + "/wg-key.sh", Content: forUserData(wgKeySh), Permissions: "0755"},
			{Path: libexecDir + "/lib.sh", Content: forUserData(libSh), Permissions: "0644"},
			{Path: libexecDir + "/aws.sh", Content: forUserData(awsSh), Permissions: "0644"},
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

// idleCheck adds the idle check to the gateway's cloud-config: gateway-idle.sh, its config, and a timer that runs it
// once a minute from a minute after boot. The timer is enabled, so it runs after every start of the instance.
func idleCheck(in GatewayInput, cc *cloudConfig) error {
	env, err := envFile("gateway-idle.sh", map[string]string{
		"DYNK8S_CLUSTER_NAME":      in.ClusterName,
		"DYNK8S_IDLE_STOP_SECONDS": strconv.Itoa(int(in.IdleStop / time.Second)),
		"DYNK8S_NFT_TABLE":         wgMSSTable,
	})
	if err != nil {
		return err
	}
	service, err := unitFile{
		{Name: "Unit", Entries: []unitEntry{
			{"Description", "dynk8s: stop this WireGuard gateway when the node pools and the tunnel are idle"},
			{"Wants", "network-online.target"},
			{"After", "network-online.target " + wgUnit},
		}},
		{Name: "Service", Entries: []unitEntry{
			{"Type", "oneshot"},
			{"ExecStart", libexecDir + "/gateway-idle.sh"},
			{"SyslogIdentifier", "dynk8s-gateway-idle"},
			// The script's own deadline is 45 s; the timer's next run is a minute away.
			{"TimeoutStartSec", "55s"},
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
		writeFile{Path: idleEnvPath, Content: env, Permissions: "0644"},
		writeFile{Path: "/etc/systemd/system/" + idleUnitName, Content: service, Permissions: "0644"},
		writeFile{Path: "/etc/systemd/system/" + idleTimerName, Content: timer, Permissions: "0644"},
		writeFile{Path: libexecDir + "/gateway-idle.sh", Content: forUserData(gatewayIdleSh), Permissions: "0755"},
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
	return e.join("gateway user data")
}
