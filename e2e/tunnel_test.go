//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/cmd/check/check"
)

// lanHostMSS is what a host on an ordinary 1500-byte on-prem LAN advertises.
const lanHostMSS = 1460

func TestTunnelDialIn(t *testing.T) {
	testTunnel(t, false)
}

func TestTunnelDialOut(t *testing.T) {
	testTunnel(t, true)
}

func testTunnel(t *testing.T, dialOut bool) {
	if os.Geteuid() != 0 {
		missing(t, "root (network namespaces, mounts)")
	}
	for _, tool := range []string{"ip", "nft", "wg", "wg-quick", "ping", "unshare", "nsenter", "curl", "python3"} {
		requireTool(t, tool)
	}
	wgGo := requireTool(t, "wireguard-go")
	moto := requireTool(t, "moto_server")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	testBin, err := os.Executable()
	assert.NilError(t, err)

	p := renderTunnel(t, dialOut)
	tn := &tunnel{plan: p, wireguardGo: wgGo, testBin: testBin}
	confs := userDataPaths(t, p.gatewayUserData, "/etc/wireguard/*.conf")
	if len(confs) != 1 {
		t.Fatalf("the gateway user data writes %d wg-quick files, want 1: %v", len(confs), confs)
	}
	tn.gwIface = strings.TrimSuffix(path.Base(confs[0]), ".conf")
	gwConf := []byte(userDataFile(t, p.gatewayUserData, confs[0]))
	if dialOut != (wgValue(gwConf, "Peer", "Endpoint") != "") {
		t.Fatalf("dial-out=%v but the gateway's peer has Endpoint %q", dialOut, wgValue(gwConf, "Peer", "Endpoint"))
	}

	tn.lanIP = nthAddr(p.onPremCIDRs[0].Masked().Addr(), 10)
	tn.outsideIP = outsideAddr(t, p.onPremCIDRs, p.vpcCIDR)
	tn.nodeIP = nthAddr(p.nodeSubnet.Masked().Addr(), 23)
	// Dialling in, on-prem dials the Elastic IP its config names. Dialling out, the config names no address: the
	// gateway's is whatever EC2 assigned at its last start, and WireGuard's roaming takes on-prem to it.
	var gwPublic string
	if dialOut {
		if ep := wgValue(p.onPremConf, "Peer", "Endpoint"); ep != "" {
			t.Fatalf("dialling out, the on-prem config names the gateway's address %s, which changes with every start", ep)
		}
		gwPublic = p.gatewayStartIP
	} else {
		gwPublic, _, err = splitHostPort(wgValue(p.onPremConf, "Peer", "Endpoint"))
		assert.NilError(t, err, "on-prem config's peer Endpoint")
	}

	tn.makeNamespaces(ctx, t)
	tn.wire(ctx, t, gwPublic)

	// Before the tunnel exists nothing on-prem is reachable from the node: what passes below passes through it.
	t.Run("no path without the tunnel", func(t *testing.T) {
		if out, err := tn.node.run(ctx, "ping", "-c", "1", "-W", "1", tn.lanIP.String()); err == nil {
			t.Fatalf("the node reached %s with no tunnel up:\n%s", tn.lanIP, out)
		}
	})

	// On-prem is up first, as it is when a sleeping gateway starts: the time from the gateway's wg-quick up to the
	// first handshake is what the tunnel adds to a wake-up. Dialling out, the gateway initiates at once (its
	// keepalive is set with its key: cloudinit's Gateway); dialling in, it waits for on-prem's next initiation,
	// at most WireGuard's REKEY_TIMEOUT (5 s) after the last.
	tn.upOnPrem(ctx, t, dialOut)
	tn.bootGateway(ctx, t, moto)
	up := time.Now()
	tn.waitHandshake(ctx, t)
	t.Logf("first handshake %.2f s after the gateway's wg-quick up (dial-out %v)", time.Since(up).Seconds(), dialOut)
	tn.checkKeys(ctx, t, gwConf)

	t.Run("ping both ways", func(t *testing.T) { tn.testPing(ctx, t) })
	t.Run("TCP transfer both ways", func(t *testing.T) { tn.testTransfer(ctx, t) })
	t.Run("SYNs are MSS-clamped both ways", func(t *testing.T) { tn.testMSS(ctx, t) })
	t.Run("DF above the tunnel MTU gets fragmentation needed", func(t *testing.T) { tn.testDF(ctx, t) })
	t.Run("traffic outside onPremCidrs is not tunnelled", func(t *testing.T) { tn.testNotRouted(ctx, t) })
	t.Run("the gateway counts forwarded packets, not keepalives", func(t *testing.T) { tn.testForwardCounters(ctx, t) })
	t.Run("cmd/check finds a wrong MTU and a missing route on the peer", func(t *testing.T) { tn.testCheck(ctx, t) })
}

// testCheck runs cmd/check as the operator would on the on-prem peer (its network and mount namespaces, where the
// tunnel's interface and control socket are; no cluster): the peer as set up passes the host's checks; with the
// interface's MTU above the tunnel's and the VPC's route deleted, those two checks fail, saying what to change; put
// back, they pass again.
func (tn *tunnel) testCheck(ctx context.Context, t *testing.T) {
	bin := filepath.Join(t.TempDir(), "check")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/check").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/check: %v\n%s", err, out)
	}
	stackFile := devStackFile(t)
	run := func(when string) map[string]check.Result {
		t.Helper()
		pid, err := wireguardGoPID(ctx, tn.onprem)
		assert.NilError(t, err)
		cmd := exec.CommandContext(ctx, "nsenter", "-t", pid, "-m", "-n", "--", bin, "-config", stackFile,
			"-kubeconfig", "/nonexistent/kubeconfig", "-o", "json")
		cmd.Env = append(os.Environ(), "KUBECONFIG=")
		out, _ := cmd.Output()
		var r check.Report
		assert.NilError(t, json.Unmarshal(out, &r), "cmd/check %s: %s", when, out)
		var text strings.Builder
		assert.NilError(t, r.WriteText(&text))
		t.Logf("cmd/check %s (exit %d):\n%s", when, cmd.ProcessState.ExitCode(), text.String())
		byCheck := map[string]check.Result{}
		for _, res := range r.Results {
			byCheck[res.Check] = res
		}
		return byCheck
	}
	expect := func(r map[string]check.Result, name string, status check.Status, detail string) {
		t.Helper()
		got := r[name]
		if got.Status != status || !strings.Contains(got.Detail, detail) {
			t.Errorf("check %q: %s %q, want %s with %q", name, got.Status, got.Detail, status, detail)
		}
	}
	vpc := tn.plan.vpcCIDR.Masked().String()
	mtu := strconv.Itoa(tn.plan.mtu)

	r := run("on the peer as set up")
	expect(r, "tunnel interface", check.OK, onPremIface+" has the gateway's peer")
	expect(r, "VPC route", check.OK, "is routed into "+onPremIface)
	expect(r, "tunnel MTU", check.OK, onPremIface+" has MTU "+mtu)
	expect(r, "handshake", check.OK, "last handshake was")
	expect(r, "cluster", check.Skip, "kubeconfig")

	tn.onprem.must(ctx, t, "ip", "link", "set", onPremIface, "mtu", "1500")
	tn.onprem.must(ctx, t, "ip", "route", "del", vpc, "dev", onPremIface)
	r = run("with MTU 1500 and no route to the VPC")
	expect(r, "tunnel MTU", check.Fail, onPremIface+" has MTU 1500, the stack's tunnel "+mtu)
	expect(r, "VPC route", check.Fail, tn.plan.vpcCIDR.Masked().Addr().Next().String())
	if fix := r["VPC route"].Fix; !strings.Contains(fix, "ip route") || !strings.Contains(fix, vpc) {
		t.Errorf("the VPC route's failure says to change %q, want the route to add", fix)
	}

	tn.onprem.must(ctx, t, "ip", "link", "set", onPremIface, "mtu", mtu)
	tn.onprem.must(ctx, t, "ip", "route", "add", vpc, "dev", onPremIface)
	r = run("put back")
	expect(r, "VPC route", check.OK, "is routed into "+onPremIface)
	expect(r, "tunnel MTU", check.OK, onPremIface+" has MTU "+mtu)
}

func (tn *tunnel) testPing(ctx context.Context, t *testing.T) {
	rx0, tx0 := tn.transfer(ctx, t)
	before := tn.onprem.counters(ctx, t, "dynk8s_probe")["echo-lan"]
	if out, err := tn.node.run(ctx, "ping", "-c", "3", "-i", "0.2", "-W", "2", tn.lanIP.String()); err != nil {
		t.Errorf("VPC node -> on-prem %s: %v\n%s", tn.lanIP, err, out)
	}
	if out, err := tn.onprem.run(ctx, "ping", "-c", "3", "-i", "0.2", "-W", "2", "-I", tn.lanIP.String(),
		tn.nodeIP.String()); err != nil {
		t.Errorf("on-prem %s -> VPC node %s: %v\n%s", tn.lanIP, tn.nodeIP, err, out)
	}
	if got := tn.onprem.counters(ctx, t, "dynk8s_probe")["echo-lan"] - before; got < 3 {
		t.Errorf("%d echo requests for %s arrived on-prem through %s, want 3", got, tn.lanIP, onPremIface)
	}
	rx1, tx1 := tn.transfer(ctx, t)
	if rx1-rx0 < 3*84 || tx1-tx0 < 3*84 {
		t.Errorf("the gateway's tunnel counters moved by rx %d, tx %d bytes: the pings did not cross it",
			rx1-rx0, tx1-tx0)
	}
}

func (tn *tunnel) testTransfer(ctx context.Context, t *testing.T) {
	const size = 4 << 20
	for _, c := range []struct {
		name     string
		from, to netns
		server   netip.Addr
	}{
		{"VPC node -> on-prem", tn.node, tn.onprem, tn.lanIP},
		{"on-prem -> VPC node", tn.onprem, tn.node, tn.nodeIP},
	} {
		addr := netip.AddrPortFrom(c.server, 7000).String()
		result := tn.serve(ctx, t, c.to, addr)
		sent, answer := tn.send(ctx, t, c.from, addr, size)
		received := result()
		want := " " + strconv.Itoa(size)
		if sent == "" || !strings.HasSuffix(sent, want) || sent != answer || received != sent {
			t.Errorf("%s: sent %q, server read %q (answered %q): want %d bytes arriving intact", c.name, sent,
				received, answer, size)
		}
	}
}

// testMSS: a SYN that crosses the gateway carries at most the tunnel's MSS (MTU - 40 for IPv4), whichever side
// sent it. Towards on-prem the node's own MSS is the VPC's 8961; towards the VPC the on-prem side is made to
// advertise what a host on a 1500-byte LAN behind the peer would (1460), since the peer's own SYNs already fit its
// tunnel MTU.
// Negative control: with the gateway's clamp table deleted the same SYNs arrive unclamped.
func (tn *tunnel) testMSS(ctx context.Context, t *testing.T) {
	clamped := tn.plan.mtu - 40
	// nftables can only lower an MSS, so the LAN host's larger one comes from a route metric on the on-prem side.
	lanHostRoute := []string{tn.nodeIP.String() + "/32", "dev", onPremIface}
	tn.onprem.must(ctx, t, append(append([]string{"ip", "route", "add"}, lanHostRoute...), "advmss",
		strconv.Itoa(lanHostMSS))...)
	defer tn.onprem.must(ctx, t, append([]string{"ip", "route", "del"}, lanHostRoute...)...)
	cases := []struct {
		name      string
		from, to  netns
		server    netip.Addr
		port      int
		unclamped int
	}{
		{"VPC node -> on-prem", tn.node, tn.onprem, tn.lanIP, 7001, vpcMTU - 40},
		{"on-prem -> VPC node", tn.onprem, tn.node, tn.nodeIP, 7002, lanHostMSS},
	}
	probe := func(withClamp bool) {
		t.Helper()
		for _, c := range cases {
			c.to.must(ctx, t, "sh", "-c", "nft delete table inet dynk8s_mss 2>/dev/null; true")
			c.to.nft(ctx, t, fmt.Sprintf(`table inet dynk8s_mss {
	chain input {
		type filter hook input priority filter; policy accept;
		tcp dport %d tcp flags syn / syn,ack,rst counter comment "syn"
		tcp dport %d tcp flags syn / syn,ack,rst tcp option maxseg size %d counter comment "clamped"
		tcp dport %d tcp flags syn / syn,ack,rst tcp option maxseg size %d counter comment "unclamped"
	}
}
`, c.port, c.port, clamped, c.port, c.unclamped))
			// A route cache entry from an earlier too-big packet would lower the sender's own MSS by itself.
			c.from.must(ctx, t, "ip", "route", "flush", "cache")
			addr := netip.AddrPortFrom(c.server, uint16(c.port)).String()
			result := tn.serve(ctx, t, c.to, addr)
			tn.send(ctx, t, c.from, addr, 0)
			result()
			got := c.to.counters(ctx, t, "dynk8s_mss")
			if withClamp && (got["syn"] != 1 || got["clamped"] != 1) {
				t.Errorf("%s: %d SYN arrived, %d with MSS %d: want the one SYN clamped to %d (counters %v)",
					c.name, got["syn"], got["clamped"], clamped, clamped, got)
			}
			if !withClamp && (got["syn"] != 1 || got["unclamped"] != 1) {
				t.Errorf("negative control, %s: with the gateway's clamp removed %d SYN arrived, %d with the "+
					"sender's own MSS %d (counters %v): the probe cannot tell a clamp from none", c.name, got["syn"],
					got["unclamped"], c.unclamped, got)
			}
		}
	}
	probe(true)

	// The clamp is the rendered table (wg0-mss.nft); the file's first lines make reloading it idempotent.
	table := tn.clampTable(t)
	tn.gw.must(ctx, t, "nft", "delete", "table", "inet", table)
	probe(false)
	tn.gw.must(ctx, t, "nft", "-f", filepath.Join(tn.gwRoot, "etc/dynk8s/wg0-mss.nft"))
}

// clampTable is the name of the table the rendered ruleset declares.
func (tn *tunnel) clampTable(t *testing.T) string {
	t.Helper()
	rules, err := os.ReadFile(filepath.Join(tn.gwRoot, "etc/dynk8s/wg0-mss.nft"))
	assert.NilError(t, err)
	for _, line := range strings.Split(string(rules), "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "table" && f[1] == "inet" && f[3] == "{" {
			return f[2]
		}
	}
	t.Fatalf("no table in the rendered ruleset:\n%s", rules)
	return ""
}

// testDF: a don't-fragment packet of exactly the tunnel MTU passes (the control that the limit is the MTU and not
// something smaller); one byte more gets ICMP fragmentation-needed from the gateway, naming the MTU.
func (tn *tunnel) testDF(ctx context.Context, t *testing.T) {
	tn.node.must(ctx, t, "ip", "route", "flush", "cache")
	fits := strconv.Itoa(tn.plan.mtu - 28) // 20 bytes IPv4 + 8 bytes ICMP header
	if out, err := tn.node.run(ctx, "ping", "-c", "1", "-M", "do", "-s", fits, "-W", "2", tn.lanIP.String()); err != nil {
		t.Errorf("a DF packet of exactly the tunnel MTU (%d) did not pass: %v\n%s", tn.plan.mtu, err, out)
	}
	tooBig := strconv.Itoa(tn.plan.mtu - 27)
	out, err := tn.node.run(ctx, "ping", "-c", "1", "-M", "do", "-s", tooBig, "-W", "2", tn.lanIP.String())
	if err == nil {
		t.Fatalf("a DF packet one byte above the tunnel MTU passed:\n%s", out)
	}
	for _, want := range []string{"From " + tn.plan.gatewayIP.String(), "Frag needed",
		fmt.Sprintf("mtu = %d", tn.plan.mtu)} {
		if !strings.Contains(out, want) {
			t.Errorf("the node's ping of a DF packet above the MTU lacks %q (fragmentation needed from the "+
				"gateway):\n%s", want, out)
		}
	}
}

// testNotRouted: an address just outside onPremCidrs, present on the on-prem LAN, is not reachable through the
// gateway: the VPC declares no route for it, and even a packet handed to the gateway for it is not tunnelled.
// The positive control is the ping test: the same probe counts echo requests for the LAN address.
func (tn *tunnel) testNotRouted(ctx context.Context, t *testing.T) {
	outside := tn.outsideIP.String()
	if out, err := tn.node.run(ctx, "ip", "route", "get", outside); err == nil {
		t.Errorf("the VPC node has a route to %s, outside onPremCidrs %v:\n%s", outside, tn.plan.onPremCIDRs, out)
	}
	if out := tn.gw.must(ctx, t, "ip", "route", "get", tn.lanIP.String()); !strings.Contains(out, "dev "+tn.gwIface) {
		t.Errorf("control: the gateway does not route the on-prem address %s into %s:\n%s", tn.lanIP, tn.gwIface, out)
	}
	if out, err := tn.gw.run(ctx, "ip", "route", "get", outside); err == nil && strings.Contains(out, "dev "+tn.gwIface) {
		t.Errorf("the gateway routes %s, outside onPremCidrs, into %s:\n%s", outside, tn.gwIface, out)
	}
	// Hand the gateway a packet for the outside address anyway, as a misdeclared route would.
	tn.node.must(ctx, t, "ip", "route", "add", outside+"/32", "via", tn.plan.gatewayIP.String())
	if out, err := tn.node.run(ctx, "ping", "-c", "2", "-i", "0.2", "-W", "1", outside); err == nil {
		t.Errorf("the VPC node reached %s, outside onPremCidrs, through the gateway:\n%s", outside, out)
	}
	if got := tn.onprem.counters(ctx, t, "dynk8s_probe")["to-outside"]; got != 0 {
		t.Errorf("%d packets for %s (outside onPremCidrs) arrived on-prem", got, outside)
	}
	// And the on-prem peer routes only the VPC and the gateway's tunnel address into the tunnel.
	beyond := outsideAddr(t, []netip.Prefix{tn.plan.vpcCIDR}, tn.plan.vpcCIDR).String()
	if out, _ := tn.onprem.run(ctx, "ip", "route", "get", beyond); strings.Contains(out, "dev "+onPremIface) {
		t.Errorf("the on-prem peer routes %s, outside the VPC, into the tunnel:\n%s", beyond, out)
	}
}

// testForwardCounters: the gateway's forward counters count the traffic between the VPC and on-prem (which just
// flowed), and stand still on an idle tunnel, where WireGuard's own transfer counters keep moving with the 25 s
// keepalives. This is why the idle check reads the former.
func (tn *tunnel) testForwardCounters(ctx context.Context, t *testing.T) {
	before := tn.forwarded(ctx, t)
	if before == 0 {
		t.Fatal("after pings and TCP both ways the gateway counted no forwarded packet")
	}
	rx0, tx0 := tn.transfer(ctx, t)
	time.Sleep(27 * time.Second)
	rx1, tx1 := tn.transfer(ctx, t)
	if after := tn.forwarded(ctx, t); after != before {
		t.Errorf("nothing crossed the idle tunnel, yet the forward counters went from %d to %d", before, after)
	}
	if rx1 == rx0 && tx1 == tx0 {
		t.Errorf("no keepalive moved WireGuard's transfer counters in 27 s (rx %d, tx %d): the comparison shows nothing", rx1, tx1)
	}
	t.Logf("idle 27 s: forward counters stayed at %d packets; WireGuard transfer rx %d -> %d, tx %d -> %d",
		before, rx0, rx1, tx0, tx1)
}
