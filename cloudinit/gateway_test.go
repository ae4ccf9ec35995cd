package cloudinit

import (
	"encoding/base64"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/wireguard"
)

const (
	testPeerPublicKey   = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
	testGatewayPrivate  = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
	testKeyParameter    = "/dynk8s/homelab/gateway-private-key"
	testGatewayEndpoint = "203.0.113.10:51820"
	testClusterName     = "homelab"
)

// mustKey is a WireGuard key from its base64 form.
func mustKey(s string) wgtypes.Key {
	k, err := wgtypes.ParseKey(s)
	if err != nil {
		panic(err)
	}
	return k
}

func testGateway() GatewayInput {
	return GatewayInput{
		ListenPort:          51820,
		MTU:                 1420,
		TunnelAddress:       netip.MustParsePrefix("10.99.0.1/30"),
		PeerPublicKey:       mustKey(testPeerPublicKey),
		PeerAllowedIPs:      []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("10.99.0.2/32")},
		PrivateKeyParameter: testKeyParameter,
		Agent: &Agent{Bucket: testAgentBucket, Key: "dynk8s-node/linux-arm64", VersionID: testAgentVersion,
			SHA256: testAgentSHA256},
	}
}

func renderedGatewayUserData(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	withEndpoint := testGateway()
	peer, err := endpoint.Parse(testGatewayEndpoint)
	assert.NilError(t, err)
	withEndpoint.PeerEndpoint = &peer
	idle := withEndpoint
	idle.IdleStop, idle.ClusterName = 15*time.Minute, testClusterName
	for name, in := range map[string]GatewayInput{"gateway": testGateway(), "gateway-endpoint": withEndpoint, "gateway-idle": idle} {
		ud, err := Gateway(in)
		assert.NilError(t, err)
		out[name] = ud
	}
	return out
}

func TestGatewayGolden(t *testing.T) {
	t.Parallel()
	for name, ud := range renderedGatewayUserData(t) {
		t.Run(name, func(t *testing.T) {
			golden.Assert(t, stubScripts(t, ud), name+".golden")
		})
	}
}

func TestGatewayIsDeterministic(t *testing.T) {
	t.Parallel()
	a, err := Gateway(testGateway())
	assert.NilError(t, err)
	b, err := Gateway(testGateway())
	assert.NilError(t, err)
	assert.DeepEqual(t, a, b)
}

func TestGatewayRoundTrip(t *testing.T) {
	t.Parallel()
	ud := renderedGatewayUserData(t)["gateway-endpoint"]
	cc := parseCloudConfig(t, ud)
	assert.Check(t, is.Len(cc.Packages, 0), "packages are installed by a unit that retries, not once by cloud-init")
	assert.DeepEqual(t, cc.RunCmd[len(cc.RunCmd)-1], []string{"systemctl", "enable", "--now", "dynk8s-gateway-packages.service"})

	conf := fileByPath(t, cc, wgConfPath)
	assert.Check(t, is.Equal(conf.Permissions, "0600"))
	for _, want := range []string{"Address = 10.99.0.1/30\n", "ListenPort = 51820\n", "MTU = 1420\n",
		"PostUp = wg set %i private-key /etc/wireguard/wg0.key peer " + testPeerPublicKey + " persistent-keepalive 25\n",
		"PostUp = nft -f /etc/dynk8s/wg0-mss.nft\n",
		"PreDown = nft delete table inet dynk8s_wg0_mss || true\n", "PublicKey = " + testPeerPublicKey + "\n",
		"AllowedIPs = 192.168.0.0/16, 10.99.0.2/32\n", "Endpoint = " + testGatewayEndpoint + "\n"} {
		assert.Check(t, is.Contains(conf.Content, want))
	}
	assert.Check(t, !strings.Contains(conf.Content, "PrivateKey"), "wg0.conf must not carry a private key")
	// The keepalive comes with the key, once the interface is up: in [Peer], wg-quick's bring-up would send the
	// first handshake before the key is there, and the next would wait.
	assert.Check(t, !strings.Contains(conf.Content, "PersistentKeepalive"), "the keepalive is set in PostUp, not [Peer]")

	nft := fileByPath(t, cc, wgMSSPath).Content
	assert.Check(t, is.Contains(nft, `oifname "wg0" tcp flags syn / syn,rst tcp option maxseg size set rt mtu`))
	assert.Check(t, is.Contains(nft, "maxseg size > 1380 tcp option maxseg size set 1380"), "IPv4: MTU 1420 - 40")
	assert.Check(t, is.Contains(nft, "maxseg size > 1360 tcp option maxseg size set 1360"), "IPv6: MTU 1420 - 60")
	assert.Check(t, is.Equal(fileByPath(t, cc, "/etc/sysctl.d/90-dynk8s-gateway.conf").Content, "net.ipv4.ip_forward = 1\n"))
	assert.Check(t, is.Contains(fileByPath(t, cc, "/etc/systemd/system/wg-quick@wg0.service.d/10-dynk8s.conf").Content,
		"ExecStartPre=/usr/local/bin/dynk8s-node gateway-key --config /etc/dynk8s/gateway.json\n"))
	g := gatewayJSON(t, cc)
	assert.Check(t, is.Equal(g.KeyParameter, testKeyParameter))
	assert.Check(t, is.Equal(g.KeyFile, wgKeyPath))
	assert.Check(t, g.Idle == nil, "an always-on gateway has no idle check")

	// Without an endpoint the gateway only answers, so there is nothing to keep alive.
	plain := fileByPath(t, parseCloudConfig(t, renderedGatewayUserData(t)["gateway"]), wgConfPath).Content
	assert.Check(t, !strings.Contains(plain, "Endpoint") && !strings.Contains(plain, "PersistentKeepalive") &&
		!strings.Contains(plain, "persistent-keepalive"))
}

// Where on-prem dials in, wg-quick@wg0 saves the peer's address before `wg-quick down` deletes wg0 and dials it after
// `wg-quick up`, as unit commands that cannot fail the unit; where the gateway dials out it has the address already.
func TestGatewayKeepsTheDialInPeersAddress(t *testing.T) {
	t.Parallel()
	dropIn := "/etc/systemd/system/wg-quick@wg0.service.d/10-dynk8s.conf"
	rendered := renderedGatewayUserData(t)
	in := fileByPath(t, parseCloudConfig(t, rendered["gateway"]), dropIn).Content
	assert.Check(t, is.Contains(in, "ExecStartPost=-/usr/local/bin/dynk8s-node gateway-dial-peer --interface %i\n"))
	assert.Check(t, is.Contains(in, "ExecStop=\n"+
		"ExecStop=-/usr/local/bin/dynk8s-node gateway-save-peer --interface %i\n"+
		"ExecStop=/usr/bin/wg-quick down %i\n"), "the save comes before wg-quick down, which deletes wg0")
	out := fileByPath(t, parseCloudConfig(t, rendered["gateway-endpoint"]), dropIn).Content
	assert.Check(t, !strings.Contains(out, "peer") && !strings.Contains(out, "ExecStop"), out)
	// The keepalive the dial sets is the one the dial-out gateway's PostUp sets.
	assert.Check(t, is.Equal(nodeconfig.GatewayPeerKeepalive, wireguard.PersistentKeepalive*time.Second))
}

// With IdleStop the gateway runs the idle check once a minute, from boot on (the timer is enabled), told the cluster
// to look for, the window and the counters' table; without it, none of that is rendered.
func TestGatewayIdleCheckRendered(t *testing.T) {
	t.Parallel()
	cc := parseCloudConfig(t, renderedGatewayUserData(t)["gateway-idle"])
	assert.DeepEqual(t, gatewayJSON(t, cc).Idle, &nodeconfig.GatewayIdle{ClusterName: testClusterName,
		Stop: nodeconfig.Duration(15 * time.Minute), NFTTable: wgMSSTable})
	timer := fileByPath(t, cc, "/etc/systemd/system/"+idleTimerName).Content
	for _, want := range []string{"OnBootSec=1min\n", "OnUnitActiveSec=1min\n", "WantedBy=timers.target\n"} {
		assert.Check(t, is.Contains(timer, want))
	}
	service := fileByPath(t, cc, "/etc/systemd/system/"+idleUnitName).Content
	assert.Check(t, is.Contains(service, "ExecStart=/usr/local/bin/dynk8s-node gateway-idle --config /etc/dynk8s/gateway.json\n"))
	assert.Check(t, is.Contains(service, "Type=oneshot\n"))
	assert.Check(t, is.DeepEqual(cc.RunCmd[len(cc.RunCmd)-2], []string{"systemctl", "enable", "--now", idleTimerName}))
	nft := fileByPath(t, cc, wgMSSPath).Content
	assert.Check(t, is.Contains(nft, `iifname "wg0" counter name "forwarded_in"`))
	assert.Check(t, is.Contains(nft, `oifname "wg0" counter name "forwarded_out"`))

	plain := parseCloudConfig(t, renderedGatewayUserData(t)["gateway-endpoint"])
	for _, f := range plain.WriteFiles {
		assert.Check(t, !strings.Contains(f.Path, "idle"), "an always-on gateway got %s", f.Path)
	}
	for _, c := range plain.RunCmd {
		assert.Check(t, !strings.Contains(strings.Join(c, " "), "idle"), "an always-on gateway runs %v", c)
	}
}

// The real wg(8) parser reads the rendered wg0.conf: with no WireGuard in this kernel, a valid file gets as far as
// "Protocol not supported", a bad one stops at "Configuration parsing error".
func TestGatewayWgConfParsesWithWg(t *testing.T) {
	t.Parallel()
	wg := realtools.Require(t, "wg")
	wgQuick := realtools.Require(t, "wg-quick")
	check := func(content string) string {
		f := filepath.Join(t.TempDir(), "wg0.conf")
		assert.NilError(t, os.WriteFile(f, []byte(content), 0o600))
		stripped, err := exec.Command(wgQuick, "strip", f).Output()
		assert.NilError(t, err)
		cmd := exec.Command(wg, "setconf", "dynk8snone", "/dev/stdin")
		cmd.Stdin = strings.NewReader(string(stripped))
		out, _ := cmd.CombinedOutput()
		return string(out)
	}
	for name, ud := range renderedGatewayUserData(t) {
		out := check(fileByPath(t, parseCloudConfig(t, ud), wgConfPath).Content)
		assert.Check(t, is.Contains(out, "Protocol not supported"), "%s: %s", name, out)
		assert.Check(t, !strings.Contains(out, "parsing error"), "%s: %s", name, out)
	}
	out := check("[Interface]\nListenPort = 51820\n\n[Peer]\nPublicKey = not-a-key\n")
	assert.Check(t, is.Contains(out, "Configuration parsing error"), "the check must be able to fail: %s", out)
}

func TestGatewayValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		modify func(*GatewayInput)
		want   string
	}{
		{"port 0", func(in *GatewayInput) { in.ListenPort = 0 }, "ListenPort: is required"},
		{"MTU unset", func(in *GatewayInput) { in.MTU = 0 }, "MTU: is required"},
		{"tunnel address unset", func(in *GatewayInput) { in.TunnelAddress = netip.Prefix{} }, "TunnelAddress: is required"},
		{"tunnel network address", func(in *GatewayInput) { in.TunnelAddress = netip.MustParsePrefix("10.99.0.0/30") }, "is the network address"},
		{"no peer key", func(in *GatewayInput) { in.PeerPublicKey = wgtypes.Key{} }, "Peers[0].PublicKey: required"},
		{"no allowed IPs", func(in *GatewayInput) { in.PeerAllowedIPs = nil }, "PeerAllowedIPs: at least one"},
		{"allowed IP with host bits", func(in *GatewayInput) { in.PeerAllowedIPs = []netip.Prefix{netip.MustParsePrefix("192.168.1.1/16")} }, "Peers[0].AllowedIPs[0]: 192.168.1.1/16 has host bits set, want 192.168.0.0/16"},
		{"parameter missing", func(in *GatewayInput) { in.PrivateKeyParameter = "" }, "PrivateKeyParameter"},
		{"private key instead of parameter", func(in *GatewayInput) { in.PrivateKeyParameter = testGatewayPrivate }, "looks like a WireGuard key"},
		{"idle stop negative", func(in *GatewayInput) { in.IdleStop = -time.Minute }, "IdleStop: -1m0s is negative"},
		{"idle stop fractional", func(in *GatewayInput) { in.IdleStop = 1500 * time.Millisecond }, "not a whole number of seconds"},
		{"idle stop without cluster", func(in *GatewayInput) { in.IdleStop = time.Hour }, "ClusterName"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testGateway()
			tc.modify(&in)
			_, err := Gateway(in)
			assert.ErrorContains(t, err, tc.want)
			assert.Check(t, !strings.Contains(err.Error(), testGatewayPrivate), "the error repeats a key")
		})
	}
}

// Only the peer's public key may appear in the gateway's user data; the private key is fetched from SSM at boot.
func TestGatewayRendersNoSecret(t *testing.T) {
	t.Parallel()
	for name, ud := range renderedGatewayUserData(t) {
		for _, k := range keyLikeRE.FindAllString(string(ud), -1) {
			assert.Check(t, is.Equal(k, testPeerPublicKey), "%s: unexpected key-shaped text", name)
		}
		assert.Check(t, !strings.Contains(string(ud), testGatewayPrivate), name)
		assert.Check(t, !tokenLikeRE.Match(ud), name)
	}
}

// The EC2 limit is 16 KiB gzipped. The gateway carries the bootstrap, gateway.json and its units (about 3.0-3.2 KB
// gzipped since the bootstrap also serves the controller's init container); the size is logged for the record, and
// held under a budget that a script moved back in would exceed.
func TestGatewayUserDataSize(t *testing.T) {
	t.Parallel()
	for name, ud := range renderedGatewayUserData(t) {
		enc, err := Encode(ud)
		assert.NilError(t, err)
		gz, err := base64.StdEncoding.DecodeString(enc)
		assert.NilError(t, err)
		t.Logf("%s: %d bytes raw, %d bytes gzipped", name, len(ud), len(gz))
		assert.Check(t, len(gz) <= 3584, "%s: %d bytes gzipped; keep the gateway's user data small", name, len(gz))
	}
}

// nft(8) in check mode accepts the MSS ruleset, including a reload over itself.
func TestGatewayMSSRulesetParsesWithNft(t *testing.T) {
	t.Parallel()
	nft := realtools.Require(t, "nft")
	ruleset := fileByPath(t, parseCloudConfig(t, renderedGatewayUserData(t)["gateway"]), wgMSSPath).Content
	f := filepath.Join(t.TempDir(), "mss.nft")
	assert.NilError(t, os.WriteFile(f, []byte(ruleset+ruleset), 0o600))
	out, err := exec.Command(nft, "-c", "-f", f).CombinedOutput()
	assert.NilError(t, err, "nft -c: %s", out)

	bad := strings.Replace(ruleset, "set rt mtu", "set rt mtux", 1)
	assert.NilError(t, os.WriteFile(f, []byte(bad), 0o600))
	out, err = exec.Command(nft, "-c", "-f", f).CombinedOutput()
	assert.Assert(t, err != nil, "nft -c accepted a broken rule: %s", out)
}

// The gateway's packages come from a unit that runs at every boot and is restarted on failure, not from cloud-init's
// one-time package step: a first boot during a mirror hiccup must still end with a tunnel.
func TestGatewayPackagesUnitRetries(t *testing.T) {
	t.Parallel()
	cc := parseCloudConfig(t, renderedGatewayUserData(t)["gateway"])
	unit := fileByPath(t, cc, "/etc/systemd/system/dynk8s-gateway-packages.service").Content
	for _, want := range []string{"ExecStart=/usr/local/bin/dynk8s-node gateway-packages --config /etc/dynk8s/gateway.json\n",
		"Restart=on-failure\n", "StartLimitIntervalSec=0\n", "WantedBy=multi-user.target\n", "After=network-online.target\n"} {
		assert.Check(t, is.Contains(unit, want))
	}
	g := gatewayJSON(t, cc)
	assert.Check(t, is.DeepEqual(g.Packages, []string{"nftables", "wireguard-tools"}))
	assert.Check(t, is.DeepEqual(g.SystemRepos, []string{"fedora"}))
	assert.Check(t, is.Equal(g.TunnelUnit, wgUnit))
}

// Every unit that runs the agent requires the bootstrap and starts after it, so nothing runs an agent whose hash
// was not checked; each unit's hard timeout is its command's deadline in gateway.json and a margin, so the agent's
// one reason, not systemd's kill, is what the journal shows. The bootstrap is enabled for later boots, where it
// finds the pinned binary installed and needs no network (a second boot with SSM unreachable keeps the key on disk).
func TestGatewayUnitsRunTheAgentAfterTheBootstrap(t *testing.T) {
	t.Parallel()
	cc := parseCloudConfig(t, renderedGatewayUserData(t)["gateway-idle"])
	d := gatewayJSON(t, cc).Deadlines
	for path, timeout := range map[string]time.Duration{
		"/etc/systemd/system/wg-quick@wg0.service.d/10-dynk8s.conf": d.KeyUnitTimeout(),
		"/etc/systemd/system/" + gatewayPackagesUnitName:            d.PackagesUnitTimeout(),
		"/etc/systemd/system/" + idleUnitName:                       d.IdleUnitTimeout(),
	} {
		unit := fileByPath(t, cc, path).Content
		assert.Check(t, is.Contains(unit, agentBinary+" gateway-"), path)
		assert.Check(t, is.Contains(unit, "Requires="+agentUnitName+"\n"), path)
		assert.Check(t, is.Contains(unit, "After="+agentUnitName+"\n"), path)
		assert.Check(t, is.Contains(unit, "TimeoutStartSec="+strconv.Itoa(int(timeout/time.Second))+"s\n"), path)
	}
	assert.Check(t, is.Equal(d, nodeconfig.DefaultGatewayDeadlines))
	env := parseEnv(t, fileByPath(t, cc, agentEnvPath).Content)
	assert.Check(t, is.Equal(env["DYNK8S_AGENT_SHA256"], testAgentSHA256))
	assert.Check(t, is.Equal(env["DYNK8S_AGENT_KEY"], "dynk8s-node/linux-arm64"))
	assert.Check(t, slices.ContainsFunc(cc.RunCmd, func(c []string) bool {
		return slices.Equal(c, []string{"systemctl", "enable", agentUnitName})
	}), "the bootstrap is not enabled: %v", cc.RunCmd)
	for _, f := range cc.WriteFiles {
		assert.Check(t, f.Path == agentScript || !strings.HasPrefix(f.Path, libexecDir+"/"), "a boot script: %s", f.Path)
	}

	// Without a bootstrap (tests that bind the agent in place) nothing requires it.
	in := testGateway()
	in.Agent = nil
	ud, err := Gateway(in)
	assert.NilError(t, err)
	assert.Check(t, !strings.Contains(string(ud), agentUnitName))
}

// gatewayJSON is the gateway's agent config in cc, decoded as the agent decodes it.
func gatewayJSON(t *testing.T, cc cloudConfig) nodeconfig.Gateway {
	t.Helper()
	g, err := nodeconfig.DecodeGateway(strings.NewReader(fileByPath(t, cc, nodeconfig.GatewayPath).Content))
	assert.NilError(t, err)
	return g
}

// runcmd's status is its last command's (one shell script, no `set -e`): that is the blocking start of the packages
// unit, so a first install that fails is cloud-init's error, with the idle check's timer enabled before it.
func TestGatewayRuncmdEndsWithThePackagesUnit(t *testing.T) {
	t.Parallel()
	for name, ud := range renderedGatewayUserData(t) {
		rc := parseCloudConfig(t, ud).RunCmd
		assert.Check(t, is.DeepEqual(rc[len(rc)-1], []string{"systemctl", "enable", "--now", gatewayPackagesUnitName}), name)
	}
}
