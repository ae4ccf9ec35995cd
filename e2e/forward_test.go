//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"net/netip"
	"os"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// TestTunnelForwardFilter: the gateway rendered with wireguard.onPremForward.mode cluster and
// one allow entry, brought up as in TestTunnelDialIn, forwards a new TCP connection from a VPC node to the on-prem
// API server's port and to the allowed port, drops one to any other on-prem port (counted as refused), and still
// passes connections on-prem opens toward the node. Negative control: with the filter's chain deleted from the
// live gateway, the refused port connects, so the refusal was the filter's.
func TestTunnelForwardFilter(t *testing.T) {
	if os.Geteuid() != 0 {
		missing(t, "root (network namespaces, mounts)")
	}
	for _, tool := range []string{"ip", "nft", "wg", "wg-quick", "unshare", "nsenter", "python3"} {
		requireTool(t, tool)
	}
	wgGo := requireTool(t, "wireguard-go")
	moto := requireTool(t, "moto_server")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	testBin, err := os.Executable()
	assert.NilError(t, err)

	const allowedPort, refusedPort = 8080, 7000
	p := renderTunnelEdited(t, false, func(t *testing.T, values map[string]any) {
		wg, ok := values["dynk8s:wireguard"].(map[string]any)
		if !ok {
			t.Fatal("Pulumi.dev.yaml has no dynk8s:wireguard object")
		}
		cidrs, _ := wg["onPremCidrs"].([]any)
		if len(cidrs) == 0 {
			t.Fatal("Pulumi.dev.yaml has no wireguard.onPremCidrs")
		}
		first := netip.MustParsePrefix(cidrs[0].(string))
		wg["onPremForward"] = map[string]any{"mode": "cluster", "allow": []any{map[string]any{
			"cidr": netip.PrefixFrom(nthAddr(first.Masked().Addr(), 10), 32).String(), "ports": strconv.Itoa(allowedPort),
		}}}
	})
	tn := &tunnel{plan: p, wireguardGo: wgGo, testBin: testBin}
	confs := userDataPaths(t, p.gatewayUserData, "/etc/wireguard/*.conf")
	if len(confs) != 1 {
		t.Fatalf("the gateway user data writes %d wg-quick files, want 1: %v", len(confs), confs)
	}
	tn.gwIface = strings.TrimSuffix(path.Base(confs[0]), ".conf")
	tn.lanIP = nthAddr(p.onPremCIDRs[0].Masked().Addr(), 10)
	tn.outsideIP = outsideAddr(t, p.onPremCIDRs, p.vpcCIDR)
	tn.nodeIP = nthAddr(p.nodeSubnet.Masked().Addr(), 23)
	gwPublic, _, err := splitHostPort(wgValue(p.onPremConf, "Peer", "Endpoint"))
	assert.NilError(t, err, "on-prem config's peer Endpoint")
	tn.makeNamespaces(ctx, t)
	tn.wire(ctx, t, gwPublic)
	tn.bootGateway(ctx, t, moto)
	tn.upOnPrem(ctx, t, false)
	tn.waitHandshake(ctx, t)

	apiPort := 6443
	listen(ctx, t, tn.onprem, tn.lanIP, apiPort, allowedPort, refusedPort)
	listen(ctx, t, tn.node, tn.nodeIP, refusedPort)
	refused := func() int { return tn.gw.counters(ctx, t, "dynk8s_wg0_mss")["refused"] }
	// The filter's drops are counted by rules, not named counters: the idle check sums the named ones, and
	// forwarded fails the test unless there are still exactly its two.
	tn.forwarded(ctx, t)

	before := refused()
	for _, c := range []struct {
		name    string
		from    netns
		to      netip.Addr
		port    int
		want    string
		counted bool
	}{
		{"VPC node -> on-prem API server port", tn.node, tn.lanIP, apiPort, "open", false},
		{"VPC node -> on-prem allowed port", tn.node, tn.lanIP, allowedPort, "open", false},
		{"VPC node -> on-prem other port", tn.node, tn.lanIP, refusedPort, "timeout", true},
		{"on-prem -> VPC node, any port", tn.onprem, tn.nodeIP, refusedPort, "open", false},
	} {
		before := refused()
		if got := probe(ctx, t, c.from, c.to, c.port); got != c.want {
			t.Errorf("%s (%s:%d): %s, want %s", c.name, c.to, c.port, got, c.want)
		}
		if grew := refused() > before; grew != c.counted {
			t.Errorf("%s: the gateway's refused counter grew: %v, want %v", c.name, grew, c.counted)
		}
	}
	if refused() == before {
		t.Error("the gateway counted nothing refused")
	}

	tn.gw.must(ctx, t, "nft", "delete", "chain", "inet", "dynk8s_wg0_mss", "filter_forward")
	if got := probe(ctx, t, tn.node, tn.lanIP, refusedPort); got != "open" {
		t.Errorf("without the filter chain the refused port is %s, want open: the refusal was not the filter's", got)
	}
}

// listenScript accepts TCP connections on each port given, at the address given, and closes them at once.
const listenScript = `
import socket, sys, threading
addr = sys.argv[1]
socks = []
for port in sys.argv[2:]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, int(port)))
    s.listen(16)
    socks.append(s)
def serve(s):
    while True:
        c, _ = s.accept()
        c.close()
for s in socks:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
`

// listen starts listenScript in n and waits until it listens; the namespace's teardown stops it.
func listen(ctx context.Context, t *testing.T, n netns, addr netip.Addr, ports ...int) {
	t.Helper()
	args := []string{"python3", "-c", listenScript, addr.String()}
	for _, p := range ports {
		args = append(args, strconv.Itoa(p))
	}
	cmd := n.cmd(ctx, args...)
	stdout, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	assert.NilError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line := bufio.NewScanner(stdout); !line.Scan() || line.Text() != "listening" {
		t.Fatalf("listener in %s on %s %v did not start", n, addr, ports)
	}
}

// probeScript connects once with a 3 s timeout and prints open, refused (a reset: nothing listens) or timeout (the
// SYN went unanswered: dropped on the way).
const probeScript = `
import socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("open")
except socket.timeout:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
`

func probe(ctx context.Context, t *testing.T, n netns, addr netip.Addr, port int) string {
	t.Helper()
	return strings.TrimSpace(n.must(ctx, t, "python3", "-c", probeScript, addr.String(), strconv.Itoa(port)))
}
