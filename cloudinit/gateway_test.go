package cloudinit

import (
	"encoding/base64"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/realtools"
)

const (
	testPeerPublicKey   = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
	testGatewayPrivate  = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
	testKeyParameter    = "/dynk8s/homelab/gateway-private-key"
	wgKeyScript         = libexecDir + "/wg-key.sh"
	testGatewayEndpoint = "203.0.113.10:51820"
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
		"PostUp = wg set %i private-key /etc/wireguard/wg0.key\n", "PostUp = nft -f /etc/dynk8s/wg0-mss.nft\n",
		"PreDown = nft delete table inet dynk8s_wg0_mss || true\n", "PublicKey = " + testPeerPublicKey + "\n",
		"AllowedIPs = 192.168.0.0/16, 10.99.0.2/32\n", "Endpoint = " + testGatewayEndpoint + "\n", "PersistentKeepalive = 25\n"} {
		assert.Check(t, is.Contains(conf.Content, want))
	}
	assert.Check(t, !strings.Contains(conf.Content, "PrivateKey"), "wg0.conf must not carry a private key")

	nft := fileByPath(t, cc, wgMSSPath).Content
	assert.Check(t, is.Contains(nft, `oifname "wg0" tcp flags syn / syn,rst tcp option maxseg size set rt mtu`))
	assert.Check(t, is.Contains(nft, "maxseg size > 1380 tcp option maxseg size set 1380"), "IPv4: MTU 1420 - 40")
	assert.Check(t, is.Contains(nft, "maxseg size > 1360 tcp option maxseg size set 1360"), "IPv6: MTU 1420 - 60")
	assert.Check(t, is.Equal(fileByPath(t, cc, "/etc/sysctl.d/90-dynk8s-gateway.conf").Content, "net.ipv4.ip_forward = 1\n"))
	assert.Check(t, is.Contains(fileByPath(t, cc, "/etc/systemd/system/wg-quick@wg0.service.d/10-dynk8s.conf").Content,
		"ExecStartPre=/usr/local/libexec/dynk8s/wg-key.sh\n"))
	assert.Check(t, is.Equal(parseEnv(t, fileByPath(t, cc, wgKeyEnvPath).Content)["DYNK8S_KEY_PARAMETER"], testKeyParameter))

	// Without an endpoint the gateway only answers, so there is nothing to keep alive.
	plain := fileByPath(t, parseCloudConfig(t, renderedGatewayUserData(t)["gateway"]), wgConfPath).Content
	assert.Check(t, !strings.Contains(plain, "Endpoint") && !strings.Contains(plain, "PersistentKeepalive"))
}

// With IdleStop the gateway runs the idle check once a minute, from boot on (the timer is enabled), told the cluster
// to look for, the window and the counters' table; without it, none of that is rendered.
func TestGatewayIdleCheckRendered(t *testing.T) {
	t.Parallel()
	cc := parseCloudConfig(t, renderedGatewayUserData(t)["gateway-idle"])
	assert.DeepEqual(t, parseEnv(t, fileByPath(t, cc, idleEnvPath).Content), map[string]string{
		"DYNK8S_CLUSTER_NAME": testClusterName, "DYNK8S_IDLE_STOP_SECONDS": "900", "DYNK8S_NFT_TABLE": wgMSSTable,
	})
	timer := fileByPath(t, cc, "/etc/systemd/system/"+idleTimerName).Content
	for _, want := range []string{"OnBootSec=1min\n", "OnUnitActiveSec=1min\n", "WantedBy=timers.target\n"} {
		assert.Check(t, is.Contains(timer, want))
	}
	service := fileByPath(t, cc, "/etc/systemd/system/"+idleUnitName).Content
	assert.Check(t, is.Contains(service, "ExecStart="+idleScript+"\n"))
	assert.Check(t, is.Contains(service, "Type=oneshot\n"))
	assert.Check(t, is.Equal(fileByPath(t, cc, idleScript).Permissions, "0755"))
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

func TestGatewayUserDataSize(t *testing.T) {
	t.Parallel()
	for name, ud := range renderedGatewayUserData(t) {
		enc, err := Encode(ud)
		assert.NilError(t, err)
		gz, err := base64.StdEncoding.DecodeString(enc)
		assert.NilError(t, err)
		t.Logf("%s: %d bytes raw, %d bytes gzipped", name, len(ud), len(gz))
	}
}

// wg-key.sh: first boot fetches the key from SSM into a 0600 file.
func TestWgKeyFetchesFromSSM(t *testing.T) {
	t.Parallel()
	aws := newFakeAWS(t, map[string]string{testKeyParameter: testGatewayPrivate})
	aws.imds.FailTokens(1)
	aws.ssmFailures = 1
	run := runScript(t, renderedGatewayUserData(t)["gateway"], wgKeyScript, aws, nil, nil)
	assert.Equal(t, run.exitCode, 0)
	keyFile := filepath.Join(run.root, wgKeyPath)
	b, err := os.ReadFile(keyFile)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(b), testGatewayPrivate+"\n"))
	fi, err := os.Stat(keyFile)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(fi.Mode().Perm(), os.FileMode(0o600)))
	assert.Check(t, !strings.Contains(run.stderr, testGatewayPrivate), "the key is in the log")
	assert.Check(t, !strings.Contains(run.file("calls"), testGatewayPrivate), "the key is in some argv")

	// The next start finds the same key and leaves the file alone.
	again := run.env.run(t, wgKeyScript)
	assert.Equal(t, again.exitCode, 0)
	assert.Check(t, is.Contains(again.stderr, "is current"))
}

// A reboot while SSM is unreachable keeps the key already on disk, after a short try.
func TestWgKeyKeepsKeyOnDiskWhenSSMIsDown(t *testing.T) {
	t.Parallel()
	aws := newFakeAWS(t, map[string]string{testKeyParameter: testGatewayPrivate})
	aws.ssmFailures = -1
	run := runScript(t, renderedGatewayUserData(t)["gateway"], wgKeyScript, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "2"},
		func(root string) {
			assert.NilError(t, os.MkdirAll(filepath.Join(root, "etc/wireguard"), 0o700))
			assert.NilError(t, os.WriteFile(filepath.Join(root, wgKeyPath), []byte(testGatewayPrivate+"\n"), 0o600))
		})
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "keeping the key already in"))
	assert.Check(t, is.Len(failedLines(run.stderr), 0))
}

// First boot with SSM down and no key: one clear reason and a non-zero exit, so systemd retries the unit.
func TestWgKeyFailsWithoutAnyKey(t *testing.T) {
	t.Parallel()
	aws := newFakeAWS(t, nil)
	aws.ssmFailures = -1
	run := runScript(t, renderedGatewayUserData(t)["gateway"], wgKeyScript, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "2"}, nil)
	assert.Check(t, run.exitCode != 0)
	failed := failedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "no WireGuard key: SSM parameter "+testKeyParameter+" could not be read"))
	assert.Check(t, is.Contains(failed[0], "AccessDeniedException"))
}

func TestWgKeyRefusesMalformedKey(t *testing.T) {
	t.Parallel()
	aws := newFakeAWS(t, map[string]string{testKeyParameter: "c2VjcmV0LWJ1dC1ub3QtYS1rZXk="})
	run := runScript(t, renderedGatewayUserData(t)["gateway"], wgKeyScript, aws, nil, nil)
	assert.Check(t, run.exitCode != 0)
	assert.Check(t, is.Contains(run.stderr, "does not hold a WireGuard key"))
	assert.Check(t, !strings.Contains(run.stderr, "c2VjcmV0LWJ1dC1ub3QtYS1rZXk="))
	_, err := os.Stat(filepath.Join(run.root, wgKeyPath))
	assert.Check(t, os.IsNotExist(err))
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

const gatewayPackagesScript = libexecDir + "/gateway-packages.sh"

// The gateway's packages come from a unit that runs at every boot and is restarted on failure, not from cloud-init's
// one-time package step: a first boot during a mirror hiccup must still end with a tunnel.
func TestGatewayPackagesUnitRetries(t *testing.T) {
	t.Parallel()
	cc := parseCloudConfig(t, renderedGatewayUserData(t)["gateway"])
	unit := fileByPath(t, cc, "/etc/systemd/system/dynk8s-gateway-packages.service").Content
	for _, want := range []string{"ExecStart=/usr/local/libexec/dynk8s/gateway-packages.sh\n", "Restart=on-failure\n",
		"StartLimitIntervalSec=0\n", "WantedBy=multi-user.target\n", "After=network-online.target\n"} {
		assert.Check(t, is.Contains(unit, want))
	}
	env := parseEnv(t, fileByPath(t, cc, "/etc/dynk8s/gateway-packages.env").Content)
	assert.Check(t, is.DeepEqual(env, map[string]string{"DYNK8S_PACKAGES": "nftables,wireguard-tools",
		"DYNK8S_SYSTEM_REPOS": "fedora", "DYNK8S_UNIT": wgUnit}))
}

// Two failed installs, then one that works: the tunnel is started after it. The first reads only Fedora's release
// repository (the GA image's), the next ones every repository.
func TestGatewayPackagesRetryThenStartTheTunnel(t *testing.T) {
	t.Parallel()
	aws := newFakeAWS(t, nil)
	run := runScript(t, renderedGatewayUserData(t)["gateway"], gatewayPackagesScript, aws,
		map[string]string{"STUB_RPM_MISSING": "nftables wireguard-tools", "STUB_DNF_FAILURES": "2"}, nil)
	assert.Equal(t, run.exitCode, 0)
	install := "dnf install -y --setopt=install_weak_deps=False nftables wireguard-tools\n"
	calls := run.file("calls")
	assert.Check(t, is.Contains(calls, "rpm -q --whatprovides wireguard-tools\ndnf install -y "+
		"--setopt=install_weak_deps=False --repo=fedora nftables wireguard-tools\n"+install), calls)
	assert.Check(t, is.Equal(strings.Count(calls, install), 2), calls)
	assert.Check(t, is.Contains(run.stderr, "install nftables wireguard-tools: attempt 1 failed: dnf install exited 1"))
	assert.Check(t, is.Contains(run.stderr, "succeeded on attempt 3"))
	assert.Check(t, strings.HasSuffix(calls, install+"systemctl daemon-reload\nsystemctl enable --now --no-block wg-quick@wg0.service\n"), calls)
	assert.Check(t, is.Len(failedLines(run.stderr), 0))
}

// Later boots find the packages and only start the tunnel; only a missing package is fetched.
func TestGatewayPackagesInstallsOnlyWhatIsMissing(t *testing.T) {
	t.Parallel()
	aws := newFakeAWS(t, nil)
	ud := renderedGatewayUserData(t)["gateway"]
	run := runScript(t, ud, gatewayPackagesScript, aws, nil, nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, !strings.Contains(run.file("calls"), "dnf"), run.file("calls"))
	assert.Check(t, is.Contains(run.stderr, "nftables wireguard-tools already installed"))
	assert.Check(t, is.Contains(run.file("calls"), "systemctl enable --now --no-block wg-quick@wg0.service\n"))

	partial := runScript(t, ud, gatewayPackagesScript, aws, map[string]string{"STUB_RPM_MISSING": "wireguard-tools"}, nil)
	assert.Equal(t, partial.exitCode, 0)
	assert.Check(t, is.Contains(partial.file("calls"), "dnf install -y --setopt=install_weak_deps=False --repo=fedora wireguard-tools\n"))
}

// A mirror that stays down: one reason, a non-zero exit (systemd restarts the unit), and no tunnel start.
func TestGatewayPackagesGiveUpWithOneReason(t *testing.T) {
	t.Parallel()
	aws := newFakeAWS(t, nil)
	run := runScript(t, renderedGatewayUserData(t)["gateway"], gatewayPackagesScript, aws,
		map[string]string{"STUB_RPM_MISSING": "wireguard-tools", "STUB_DNF_FAILURES": "-1", "DYNK8S_DEADLINE_SECONDS": "2"}, nil)
	assert.Check(t, run.exitCode != 0)
	failed := failedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "install wireguard-tools: gave up after"))
	assert.Check(t, is.Contains(failed[0], "dnf install exited 1"))
	assert.Check(t, !strings.Contains(run.file("calls"), "systemctl enable"))
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
