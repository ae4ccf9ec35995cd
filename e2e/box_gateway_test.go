//go:build e2e

package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBoxGatewayTunnel boots the dev stack's gateway in a box and brings the tunnel up to the on-prem peer: cloud-init
// and systemd finish clean, the bootstrap finds the pinned agent, the agent reads the key from SSM and installs
// with the box root's real dnf and rpm what rpm does not find (wireguard-tools, from the signed local fedora
// repository), wg0 runs on wireguard-go with the rendered table, and pings cross the tunnel both ways.
func TestBoxGatewayTunnel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g := newBoxGateway(ctx, t, renderTunnel(t, false), "box-gw", true, gatewayInstance{})
	start := time.Now()
	g.boot(t)
	g.waitTunnel(ctx, t, 2*time.Minute)
	t.Logf("gateway box: wg-quick@wg0 active %.1f s after the box started", time.Since(start).Seconds())
	n := &boxNode{box: g.box}
	n.checkSettled(ctx, t)
	n.checkCloudInit(t)
	for unit, want := range map[string]string{
		"wg-quick@wg0.service": "dynk8s-wg-key: wrote the key from SSM to /etc/wireguard/wg0.key",
		// Real dnf and rpm: the image provides nftables; wireguard-tools comes from the fedora repository.
		"dynk8s-gateway-packages.service": "dynk8s-gateway-packages: installed wireguard-tools",
		"dynk8s-agent.service":            "is installed",
	} {
		if journal, _ := g.exec(ctx, "journalctl", "--no-pager", "-o", "cat", "-u", unit); !strings.Contains(journal, want) {
			t.Errorf("%s's journal lacks %q:\n%s", unit, want, journal)
		}
	}
	// Installed through the real rpm database, signed: rpm knows it, and where it came from.
	if out, err := g.exec(ctx, "rpm", "-q", "--qf", "%{NAME}-%{VERSION}-%{RELEASE} %{RSAHEADER:pgpsig}\\n",
		"wireguard-tools"); err != nil || !strings.HasPrefix(out, "wireguard-tools-1.0.20210914-9.fc43 RSA/SHA") {
		t.Errorf("rpm -q wireguard-tools in the box: %q (%v)", out, err)
	}
	if out, err := g.exec(ctx, "nft", "list", "table", "inet", "dynk8s_wg0_mss"); err != nil {
		t.Errorf("the gateway's nftables table is not loaded: %v: %s", err, out)
	}
	if out, err := g.exec(ctx, "sysctl", "-n", "net.ipv4.ip_forward"); err != nil || strings.TrimSpace(out) != "1" {
		t.Errorf("net.ipv4.ip_forward in the box: %q (%v), want 1", out, err)
	}

	g.tn.upOnPrem(ctx, t, false)
	g.tn.waitHandshake(ctx, t)
	g.tn.checkKeys(ctx, t, []byte(userDataFile(t, g.tn.plan.gatewayUserData, "/etc/wireguard/wg0.conf")))
	t.Logf("gateway box: first handshake %.1f s after the box started", time.Since(start).Seconds())

	gwIP, lanIP := g.tn.plan.gatewayIP.String(), g.tn.lanIP.String()
	t.Run("ping from on-prem to the gateway", func(t *testing.T) {
		if out, err := g.tn.onprem.run(ctx, "ping", "-c", "3", "-i", "0.2", "-W", "2", "-I", lanIP, gwIP); err != nil {
			t.Fatalf("on-prem %s -> gateway %s: %v\n%s", lanIP, gwIP, err, out)
		}
	})
	t.Run("ping from the gateway to on-prem", func(t *testing.T) {
		before := g.tn.onprem.counters(ctx, t, "dynk8s_probe")["echo-lan"]
		if out, err := g.exec(ctx, "ping", "-c", "3", "-i", "0.2", "-W", "2", "-I", gwIP, lanIP); err != nil {
			t.Fatalf("gateway %s -> on-prem %s: %v\n%s", gwIP, lanIP, err, out)
		}
		if got := g.tn.onprem.counters(ctx, t, "dynk8s_probe")["echo-lan"] - before; got < 3 {
			t.Errorf("%d echo requests arrived on-prem through %s, want 3", got, onPremIface)
		}
	})
	if rx, tx := g.tn.transfer(ctx, t); rx == 0 || tx == 0 {
		t.Errorf("the gateway's wg0 transferred rx %d tx %d bytes", rx, tx)
	}
	t.Run("the gateway dials the on-prem peer after a restart", func(t *testing.T) { g.checkRedial(ctx, t) })
	t.Logf("gateway box: done %.1f s after the box started", time.Since(start).Seconds())
}

// checkRedial restarts the tunnel's unit, as a stop and start of the instance would (the stop saves the address the
// on-prem peer was heard from, the start dials it), and checks that the gateway brings the tunnel back itself. The
// on-prem peer keeps the session it started moments ago: its keepalives go on in it, unanswered by the restarted
// gateway, and it would start a handshake of its own only once that session is REKEY_AFTER_TIME (120 s) old. So a
// handshake before then is the gateway's, and the wait's bound is that moment, not a machine speed.
func (g *boxGateway) checkRedial(ctx context.Context, t *testing.T) {
	first := g.tn.latestHandshake(ctx)
	if first == 0 {
		t.Fatal("the on-prem peer reports no handshake before the restart")
	}
	restart := time.Now()
	if out, err := g.exec(ctx, "systemctl", "restart", "wg-quick@wg0.service"); err != nil {
		t.Fatalf("systemctl restart wg-quick@wg0 in the box: %v\n%s", err, out)
	}
	saved, err := g.exec(ctx, "cat", "/var/lib/dynk8s/onprem-peer")
	if want := onPremInternetIP + ":"; err != nil || !strings.HasPrefix(saved, want) {
		t.Errorf("the saved on-prem peer's address: %q (%v), want %s<port>", saved, err, want)
	}
	journal, _ := g.exec(ctx, "journalctl", "--no-pager", "-o", "cat", "-u", "wg-quick@wg0.service", "--since",
		"@"+strconv.FormatInt(restart.Unix(), 10))
	for _, want := range []string{"saved the on-prem peer's address " + strings.TrimSpace(saved),
		"dialled the on-prem peer at " + strings.TrimSpace(saved)} {
		if !strings.Contains(journal, want) {
			t.Errorf("wg-quick@wg0's journal since the restart lacks %q:\n%s", want, journal)
		}
	}
	if out, _ := g.exec(ctx, "wg", "show", "wg0", "persistent-keepalive"); !strings.HasSuffix(strings.TrimSpace(out), "\t25") {
		t.Errorf("the gateway's keepalive after the dial: %q, want 25", out)
	}
	rekey := time.Unix(first, 0).Add(120 * time.Second)
	for g.tn.latestHandshake(ctx) <= first || g.tn.latestHandshake(ctx) < restart.Unix() {
		if time.Now().After(rekey) {
			t.Fatalf("no handshake after the restart before the on-prem peer's own rekey (%s): the gateway did not dial",
				rekey.Format(time.TimeOnly))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("gateway box: the tunnel's restart, handshake again %.1f s after it", time.Since(restart).Seconds())
}
