//go:build e2e

package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The gateway in a box: the dev stack's gateway instance, booted from the user data its declared instance carries
// (userDataBase64, decoded as EC2 does), under real systemd and cloud-init. cloud-init writes the files and runs
// runcmd; dynk8s-agent.service (the bootstrap) finds the agent its agent.env pins installed,
// dynk8s-gateway-packages.service (the agent's gateway-packages) finds the packages and starts wg-quick@wg0, whose
// ExecStartPre, the agent's gateway-key, reads the key from moto's SSM through the fake IMDS's region; wg-quick
// brings wg0 up with wireguard-go, and its PostUp loads the rendered nftables table. The on-prem side is a network namespace of the test's with the
// rendered on-prem config, on a fake internet link to the box (dial-in: on-prem dials the Elastic IP its config
// names).
//
// What only the box has (none of it is in the user data): the agent this machine built, bound where the bootstrap
// installs it (the plan pinned its hash: renderTunnel; the bootstrap's download is TestBoxNodeInstallsTheAgent's);
// an rpm stand-in that answers for Debian's nftables and
// wireguard-tools (testdata/box/rpm-gateway); wireguard-go (bound read-only at /usr/local/bin, on the unit's PATH)
// and /dev/net/tun (this kernel has no WireGuard module); and drop-ins that give wg-quick@wg0 its userspace
// implementation (WG_QUICK_USERSPACE_IMPLEMENTATION, wg-quick(8)) and the agent's SSM and EC2 endpoints, the idle
// check its EC2 endpoint (on EC2 both resolve the service names; here they are moto's loopback port).

// The gateway box's instance ID.
const boxGatewayInstanceID = "i-0fedcba9876543210"

// boxGateway is the gateway instance in its box, with the on-prem side around it.
type boxGateway struct {
	*box
	tn   *tunnel
	moto *motoSSM
}

// gatewayInstance is what a gateway box may be told of the EC2 around it; the zero value is a gateway of its own
// (a made-up instance id and role key, the box's own moto for EC2, a VPC router where nothing leaves).
type gatewayInstance struct {
	// id is the instance's id; "" for boxGatewayInstanceID.
	id string
	// ec2 is the EC2 endpoint the gateway calls (its idle check); "" for the box's own moto.
	ec2 string
	// role is what the fake IMDS hands out as the instance role's credentials; nil for made-up ones.
	role *awsKey
	// router is the VPC's router (see boxSpec.router).
	router *vpcRouter
}

// newBoxGateway makes the gateway's box (named name) from the rendered plan p and the on-prem namespace, and puts the
// gateway's key into moto's SSM unless withKey is false.
func newBoxGateway(ctx context.Context, t *testing.T, p tunnelPlan, name string, withKey bool, inst gatewayInstance) *boxGateway {
	t.Helper()
	if inst.id == "" {
		inst.id = boxGatewayInstanceID
	}
	for _, tool := range []string{"ip", "nft", "wg", "wg-quick", "ping", "unshare", "nsenter"} {
		requireTool(t, tool)
	}
	wgGo := requireTool(t, "wireguard-go")
	userData := gatewayInstanceUserData(t, p)

	moto := startMoto(ctx, t, requireTool(t, "moto_server"))
	if withKey {
		moto.putSecureString(t, p.region, p.keyParameter, p.keyValue)
	}
	role := awsKey{Key: "ASIAE2EFAKEGATEWAY01", Secret: "e2e/fake/gateway/secret/key/000000000",
		Token: "e2e-fake-gateway-session"}
	if inst.role != nil {
		role = *inst.role
	}
	imds := fakeaws.NewIMDS(t, fakeaws.IMDSInstance{
		ID: inst.id, Zone: p.region + "a", Region: p.region, PrivateIP: p.gatewayIP.String(),
		Type: "t4g.micro", Role: "dynk8s-homelab-gateway", AccessKeyID: role.Key,
		SecretAccessKey: role.Secret, SessionToken: role.Token,
	})
	forwards := []string{strings.TrimPrefix(moto.url, "http://")}
	if inst.ec2 == "" {
		inst.ec2 = moto.url
	} else {
		forwards = append(forwards, strings.TrimPrefix(inst.ec2, "http://"))
	}
	b := newBox(t, boxSpec{
		name: name, instanceID: inst.id,
		hostname: "ip-" + strings.ReplaceAll(p.gatewayIP.String(), ".", "-"), nodeIP: p.gatewayIP.String(),
		userData: userData, imds: strings.TrimPrefix(imds.URL, "http://"), forwards: forwards, router: inst.router,
	})
	endpoints := "[Service]\nEnvironment=DYNK8S_SSM_ENDPOINT=" + moto.url + "\nEnvironment=DYNK8S_EC2_ENDPOINT=" +
		inst.ec2 + "\n"
	rpm, err := os.ReadFile(filepath.Join("testdata", "box", "rpm-gateway"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		path, content string
		mode          os.FileMode
	}{
		{"/usr/local/bin/rpm", string(rpm), 0o755},
		{"/etc/systemd/system/wg-quick@wg0.service.d/90-box.conf",
			endpoints + "Environment=WG_QUICK_USERSPACE_IMPLEMENTATION=wireguard-go\n", 0o644},
		{"/etc/systemd/system/dynk8s-gateway-idle.service.d/90-box.conf", endpoints, 0o644},
	} {
		path := filepath.Join(b.root, f.path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(f.content), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	b.binds = append(b.binds, "--bind-ro="+wgGo+":/usr/local/bin/wireguard-go", "--bind=/dev/net/tun",
		"--bind-ro="+nodetest.BuiltAgent(t)+":"+nodetest.AgentPath)

	tn := &tunnel{plan: p, gw: netns(name), gwIface: "wg0", wireguardGo: wgGo}
	tn.lanIP = nthAddr(p.onPremCIDRs[0].Masked().Addr(), 10)
	tn.outsideIP = outsideAddr(t, p.onPremCIDRs, p.vpcCIDR)
	gwPublic, _, err := splitHostPort(wgValue(p.onPremConf, "Peer", "Endpoint"))
	if err != nil {
		t.Fatalf("on-prem config's peer Endpoint: %v", err)
	}
	tn.onprem = netns("dynk8s-onprem-" + name + "-" + strconv.Itoa(os.Getpid()))
	run(t, "ip", "netns", "add", string(tn.onprem))
	t.Cleanup(func() { removeNamespace(t, tn.onprem) })
	tn.wireOnPrem(ctx, t, gwPublic)
	return &boxGateway{box: b, tn: tn, moto: moto}
}

// gatewayInstanceUserData is the gateway instance's user data as EC2 hands it over (its userDataBase64 decoded),
// checked to be the rendered cloud-config (userdata/gateway.yaml) byte for byte once decompressed.
func gatewayInstanceUserData(t *testing.T, p tunnelPlan) []byte {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(p.gatewayUserDataBase64)
	if err != nil || len(raw) == 0 {
		t.Fatalf("the gateway instance's userDataBase64 (%d characters): %v", len(p.gatewayUserDataBase64), err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the gateway instance's user data is not gzip: %v", err)
	}
	plain, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(plain, p.gatewayUserData) {
		t.Fatal("the gateway instance's user data is not the rendered userdata/gateway.yaml")
	}
	return raw
}

// wireOnPrem links the on-prem namespace to the box: the fake internet (the on-prem peer's public address and the
// gateway's Elastic IP, point to point, as in the tunnel tests) and the on-prem LAN, with the probe that counts what
// arrives from the tunnel.
func (tn *tunnel) wireOnPrem(ctx context.Context, t *testing.T, gwPublic string) {
	t.Helper()
	run(t, "ip", "link", "add", "inet0", "netns", string(tn.onprem), "type", "veth", "peer", "name", "inet0", "netns",
		string(tn.gw))
	bits := strconv.Itoa(tn.plan.onPremCIDRs[0].Bits())
	for _, c := range []struct {
		n    netns
		args []string
	}{
		{tn.onprem, []string{"ip", "link", "set", "lo", "up"}},
		{tn.onprem, []string{"ip", "addr", "add", onPremInternetIP + "/32", "peer", gwPublic + "/32", "dev", "inet0"}},
		{tn.gw, []string{"ip", "addr", "add", gwPublic + "/32", "peer", onPremInternetIP + "/32", "dev", "inet0"}},
		{tn.onprem, []string{"ip", "link", "set", "inet0", "up"}},
		{tn.gw, []string{"ip", "link", "set", "inet0", "up"}},
		{tn.onprem, []string{"ip", "link", "add", "lan0", "type", "veth", "peer", "name", "lan1"}},
		{tn.onprem, []string{"ip", "addr", "add", tn.lanIP.String() + "/" + bits, "dev", "lan0"}},
		{tn.onprem, []string{"ip", "link", "set", "lan1", "up"}},
		{tn.onprem, []string{"ip", "link", "set", "lan0", "up"}},
	} {
		c.n.must(ctx, t, c.args...)
	}
	tn.onprem.nft(ctx, t, `table inet dynk8s_probe {
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "`+onPremIface+`" ip daddr `+tn.lanIP.String()+` icmp type echo-request counter comment "echo-lan"
	}
}
`)
}

// waitTunnel waits for wg-quick@wg0 to be active in the box (the key read, wg0 up with wireguard-go, the table
// loaded); on a timeout the test fails with the unit's journal (and, at cleanup, the box's).
func (g *boxGateway) waitTunnel(ctx context.Context, t *testing.T, timeout time.Duration) {
	t.Helper()
	err := g.wait(ctx, timeout, "wg-quick@wg0 active", func(ctx context.Context) bool {
		out, _ := g.exec(ctx, "systemctl", "is-active", "wg-quick@wg0.service")
		return strings.TrimSpace(out) == "active"
	})
	if err != nil {
		out, _ := g.exec(ctx, "journalctl", "--no-pager", "-u", "wg-quick@wg0.service", "-u", "dynk8s-gateway-packages.service",
			"-u", "dynk8s-agent.service")
		t.Fatalf("%v; journal of wg-quick@wg0, the packages unit and the bootstrap:\n%s", err, out)
	}
}

// TestBoxGatewayTunnel boots the dev stack's gateway in a box and brings the tunnel up to the on-prem peer: cloud-init
// and systemd finish clean, the bootstrap finds the pinned agent, the agent reads the key from SSM and installs
// nothing that is there, wg0 runs on wireguard-go with the rendered table, and pings cross the tunnel both ways.
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
		"wg-quick@wg0.service":            "dynk8s-wg-key: wrote the key from SSM to /etc/wireguard/wg0.key",
		"dynk8s-gateway-packages.service": "dynk8s-gateway-packages: nftables wireguard-tools already installed",
		"dynk8s-agent.service":            "is installed",
	} {
		if journal, _ := g.exec(ctx, "journalctl", "--no-pager", "-o", "cat", "-u", unit); !strings.Contains(journal, want) {
			t.Errorf("%s's journal lacks %q:\n%s", unit, want, journal)
		}
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
	t.Logf("gateway box: done %.1f s after the box started", time.Since(start).Seconds())
}

// journal is the box's journal (all its boots) read from its disk, with journalctl's arguments args.
func (g *boxGateway) journal(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, "journalctl", append([]string{"-D", filepath.Join(g.root, "var/log/journal"),
		"--no-pager", "-o", "short-monotonic"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("journalctl -D: %v: %s", err, out)
	}
	return string(out)
}
