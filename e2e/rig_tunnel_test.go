//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The tunnel tests bring up what the dev stack renders for the WireGuard gateway and the on-prem peer in three
// network namespaces of their own, with the real wg-quick, wireguard-go (this kernel has no WireGuard) and nftables:
//
//	onprem  --(fake internet, point-to-point)--  gw  --(fake VPC link, MTU 9001)--  vpcnode
//
// onprem is the on-prem peer and also owns the on-prem LAN address (the first onPremCidr's .10) on a veth pair, as
// a router's LAN port would; gw boots like the gateway instance: the user data's files written under a temp root
// that is overlaid on /etc in a private mount namespace, the key fetched from moto's SSM by the node agent's
// gateway-key (ExecStartPre of wg-quick@wg0), the rendered sysctl applied, then `wg-quick up wg0`, whose PostUp loads the
// rendered nftables MSS clamp. vpcnode has an address in a declared subnet and exactly the VPC routes the stack
// declares towards the gateway's network interface. Every address exists only inside these namespaces.
//
// Simplifications, each an AWS behaviour the namespaces do not have: the Elastic IP is assigned to gw's internet
// link (AWS translates it 1:1 to the interface's private address), the internet and VPC links are two interfaces
// (the instance has one), and the VPC's local route is an on-link /16. IPv6 is not exercised.

// onPremInternetIP is the on-prem peer's address on the fake internet; in dial-out mode the stack's
// wireguard.onPremEndpoint points at it. A documentation address (RFC 5737), assigned inside the test's namespace.
const onPremInternetIP = "203.0.113.10"

// The interface the on-prem side's wg-quick file is installed as (a name of the operator's choosing).
const onPremIface = "dynk8s-onprem"

// privateWireGuardRun gives the commands after it a private, empty /run/wireguard: wireguard-go's control sockets
// (/var/run/wireguard/<iface>.sock) live in the file system, not in the network namespace, so without it two
// tunnels named alike (the gateway's wg0 and another test run's, or this machine's own) would be one to `wg`.
// The directory itself is created if missing, as wg-quick would.
const privateWireGuardRun = `mkdir -p /run/wireguard && mount -t tmpfs -o mode=0700 dynk8s-e2e-wg /run/wireguard`

// vpcMTU is what EC2 gives current instance types inside a VPC (jumbo frames), so a node's own MSS is 8961.
const vpcMTU = 9001

// tunnelPlan is what the stack renders and declares for the tunnel, read from a mock-engine run of the program.
type tunnelPlan struct {
	gatewayUserData []byte
	// gatewayUserDataBase64 is the gateway instance's userDataBase64 as declared: what EC2 hands the instance.
	gatewayUserDataBase64 string
	onPremConf            []byte
	// keyParameter and keyValue are the gateway key's SSM parameter as declared (the value is the mock engine's
	// random key, the private half of the public key in the on-prem config).
	keyParameter, keyValue string
	region                 string
	mtu                    int
	onPremCIDRs            []netip.Prefix
	vpcCIDR                netip.Prefix
	// gatewayIP is the gateway interface's private address; vpcRoutes the route table's destinations that point
	// at that interface.
	gatewayIP netip.Addr
	vpcRoutes []netip.Prefix
	// nodeSubnet is a declared subnet for the VPC node (another zone's than the gateway's when there is one).
	nodeSubnet netip.Prefix
	// gatewayStartIP is the public address the stand-in EC2 gave the gateway at launch: in dial-out mode the only
	// one it has (no Elastic IP), and one the on-prem config does not know.
	gatewayStartIP string
}

// declaredNetwork is the gateway's fixed private address, the routes the VPC sends to the gateway's own interface,
// the subnet a node shares with it, and the public address EC2 gave the instance at its (stand-in) start, as the
// plan declares them.
func declaredNetwork(t *testing.T, res *plan.Result) (gatewayIP netip.Addr, routes []netip.Prefix, subnet netip.Prefix, public string) {
	t.Helper()
	var err error
	gw := res.Cloud.Find("aws:ec2/instance:Instance", "gateway")
	if gw == nil {
		t.Fatal("the plan declares no gateway instance")
	}
	ip, _ := mockcloud.Plain(gw.Inputs["privateIp"], false).(string)
	if gatewayIP, err = netip.ParseAddr(ip); err != nil {
		t.Fatalf("the gateway instance's private address %q: %v", ip, err)
	}
	eniID, _ := mockcloud.Plain(gw.Outputs["primaryNetworkInterfaceId"], false).(string)
	public, _ = mockcloud.Plain(gw.Outputs["publicIp"], false).(string)
	for _, r := range res.Cloud.ByType("aws:ec2/route:Route") {
		if nic, _ := mockcloud.Plain(r.Inputs["networkInterfaceId"], false).(string); nic != eniID || nic == "" {
			continue
		}
		dest, _ := mockcloud.Plain(r.Inputs["destinationCidrBlock"], false).(string)
		pfx, err := netip.ParsePrefix(dest)
		assert.NilError(t, err, "route %s", r.Name)
		routes = append(routes, pfx)
	}
	for _, s := range res.Cloud.ByType("aws:ec2/subnet:Subnet") {
		cidr, _ := mockcloud.Plain(s.Inputs["cidrBlock"], false).(string)
		pfx, err := netip.ParsePrefix(cidr)
		assert.NilError(t, err, "subnet %s", s.Name)
		if !subnet.IsValid() || subnet.Contains(gatewayIP) {
			subnet = pfx
		}
	}
	if !subnet.IsValid() {
		t.Fatal("the plan declares no subnet")
	}
	return gatewayIP, routes, subnet, public
}

// renderTunnel runs the program on the dev stack (dial-out: with wireguard.onPremEndpoint at the on-prem peer's
// fake internet address) under the mock engine.
func renderTunnel(t *testing.T, dialOut bool) tunnelPlan {
	t.Helper()
	return renderTunnelEdited(t, dialOut, nil)
}

// renderTunnelEdited is renderTunnel with the dev stack's config values changed by edit first (nil: none).
func renderTunnelEdited(t *testing.T, dialOut bool, edit func(t *testing.T, values map[string]any)) tunnelPlan {
	t.Helper()
	values := devStackValues(t)
	if edit != nil {
		edit(t, values)
	}
	if dialOut {
		wg, ok := values["dynk8s:wireguard"].(map[string]any)
		if !ok {
			t.Fatalf("Pulumi.dev.yaml has no dynk8s:wireguard object")
		}
		wg["onPremEndpoint"] = onPremInternetIP + ":51820"
	}
	sc, err := mockcloud.ConfigFromMap(values)
	assert.NilError(t, err)
	// The gateway's user data pins the agent the gateway's box binds in place (agentDir), so its bootstrap finds it
	// installed; the bootstrap's own download is TestBoxNodeInstallsTheAgent's.
	sc.AgentDir = agentDir(t)
	cfg, err := config.ParseValues(sc.Values)
	assert.NilError(t, err, "stack config")
	res, err := plan.RunConfig("dev", sc)
	assert.NilError(t, err, "run the program under the mock engine")
	files, err := res.Artifacts()
	assert.NilError(t, err)
	p := tunnelPlan{
		gatewayUserData: files["userdata/gateway.yaml"],
		onPremConf:      files[plan.OnPremConfigFile],
		region:          cfg.Region,
		mtu:             cfg.WireGuard.MTU,
		onPremCIDRs:     cfg.WireGuard.OnPremCIDRs,
		vpcCIDR:         cfg.Network.VPCCIDR,
	}
	if len(p.gatewayUserData) == 0 || len(p.onPremConf) == 0 {
		t.Fatalf("the plan rendered no gateway user data or no on-prem WireGuard config (artifacts: %d)", len(files))
	}

	p.gatewayIP, p.vpcRoutes, p.nodeSubnet, p.gatewayStartIP = declaredNetwork(t, res)
	if gw := res.Cloud.Find("aws:ec2/instance:Instance", "gateway"); gw != nil {
		p.gatewayUserDataBase64, _ = mockcloud.Plain(gw.Inputs["userDataBase64"], true).(string)
	}

	// The gateway key's parameter is the one its user data names.
	gw, err := nodeconfig.DecodeGateway(strings.NewReader(userDataFile(t, p.gatewayUserData, nodeconfig.GatewayPath)))
	assert.NilError(t, err, "the gateway's %s", nodeconfig.GatewayPath)
	p.keyParameter = gw.KeyParameter
	for _, r := range res.Cloud.ByType("aws:ssm/parameter:Parameter") {
		if name, _ := mockcloud.Plain(r.Inputs["name"], false).(string); name == p.keyParameter {
			p.keyValue, _ = mockcloud.Plain(r.Inputs["value"], true).(string)
		}
	}
	if p.keyParameter == "" || p.keyValue == "" {
		t.Fatalf("no SSM parameter declared for the gateway key %q", p.keyParameter)
	}
	return p
}

// userDataFile is the content of one write_files entry of a cloud-config.
func userDataFile(t *testing.T, userData []byte, name string) string {
	t.Helper()
	var doc struct {
		WriteFiles []struct {
			Path    string `json:"path"`
			Content string `json:"content"`
		} `json:"write_files"`
	}
	assert.NilError(t, yaml.Unmarshal(userData, &doc), "parse user data")
	for _, f := range doc.WriteFiles {
		if f.Path == name {
			return f.Content
		}
	}
	t.Fatalf("the gateway user data writes no %s", name)
	return ""
}

// userDataPaths lists the write_files paths that match a glob.
func userDataPaths(t *testing.T, userData []byte, glob string) []string {
	t.Helper()
	var doc struct {
		WriteFiles []struct {
			Path string `json:"path"`
		} `json:"write_files"`
	}
	assert.NilError(t, yaml.Unmarshal(userData, &doc), "parse user data")
	var out []string
	for _, f := range doc.WriteFiles {
		if ok, _ := path.Match(glob, f.Path); ok {
			out = append(out, f.Path)
		}
	}
	return out
}

// wgValue is the first "Key = value" of a section of a wg-quick file.
func wgValue(conf []byte, section, key string) string {
	in := false
	for _, line := range strings.Split(string(conf), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			in = line == "["+section+"]"
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if in && ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// netns is a network namespace the test made.
type netns string

func (n netns) cmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", string(n)}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run runs a command in the namespace and returns its combined output.
func (n netns) run(ctx context.Context, args ...string) (string, error) {
	out, err := n.cmd(ctx, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in %s: %s: %w: %s", n, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (n netns) must(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	out, err := n.run(ctx, args...)
	assert.NilError(t, err)
	return out
}

// nft loads a ruleset into the namespace.
func (n netns) nft(ctx context.Context, t *testing.T, ruleset string) {
	t.Helper()
	cmd := n.cmd(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("in %s: nft -f: %v: %s\n%s", n, err, out, ruleset)
	}
}

// counters reads the named counters (rule comments) of an nftables table in the namespace.
func (n netns) counters(ctx context.Context, t *testing.T, table string) map[string]int {
	t.Helper()
	out := n.must(ctx, t, "nft", "-j", "list", "table", "inet", table)
	var doc struct {
		Nftables []struct {
			Rule *struct {
				Comment string           `json:"comment"`
				Expr    []map[string]any `json:"expr"`
			} `json:"rule"`
		} `json:"nftables"`
	}
	assert.NilError(t, json.Unmarshal([]byte(out), &doc), "nft -j list table inet %s", table)
	got := map[string]int{}
	for _, item := range doc.Nftables {
		if item.Rule == nil || item.Rule.Comment == "" {
			continue
		}
		for _, e := range item.Rule.Expr {
			if c, ok := e["counter"].(map[string]any); ok {
				packets, _ := c["packets"].(float64)
				got[item.Rule.Comment] = int(packets)
			}
		}
	}
	return got
}

// tunnel is the brought-up topology of one test.
type tunnel struct {
	plan                 tunnelPlan
	onprem, gw, node     netns
	gwIface              string
	lanIP, outsideIP     netip.Addr
	nodeIP               netip.Addr
	gwRoot, opConf       string
	wireguardGo, testBin string
}

// makeNamespaces creates the three namespaces and registers their teardown: every process left in them (the
// wireguard-go daemons wg-quick started, helpers) is stopped by pid, then the namespaces go; the private mount
// namespaces (and the control sockets in them) go with their last process.
func (tn *tunnel) makeNamespaces(ctx context.Context, t *testing.T) {
	t.Helper()
	suffix := strconv.Itoa(os.Getpid())
	tn.onprem, tn.gw, tn.node = netns("dynk8s-onprem-"+suffix), netns("dynk8s-gw-"+suffix), netns("dynk8s-node-"+suffix)
	for _, n := range []netns{tn.onprem, tn.gw, tn.node} {
		if out, err := exec.CommandContext(ctx, "ip", "netns", "add", string(n)).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", n, err, out)
		}
		t.Cleanup(func() { removeNamespace(t, n) })
	}
}

// removeNamespace stops the processes in a namespace (TERM, then KILL after 5 s) and deletes it.
func removeNamespace(t *testing.T, n netns) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pids := func() []int {
		out, _ := exec.CommandContext(ctx, "ip", "netns", "pids", string(n)).Output()
		var ps []int
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil {
				ps = append(ps, pid)
			}
		}
		return ps
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		ps := pids()
		if len(ps) == 0 {
			break
		}
		for _, pid := range ps {
			_ = syscall.Kill(pid, sig)
		}
		for i := 0; i < 50 && len(pids()) > 0; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if ps := pids(); len(ps) > 0 {
		t.Errorf("processes %v still run in namespace %s", ps, n)
	}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "del", string(n)).CombinedOutput(); err != nil {
		t.Errorf("ip netns del %s: %v: %s", n, err, out)
	}
}

// wire makes the links, addresses and the declared VPC routes.
func (tn *tunnel) wire(ctx context.Context, t *testing.T, gwPublic string) {
	t.Helper()
	p := tn.plan
	host := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	host("link", "add", "inet0", "netns", string(tn.onprem), "type", "veth", "peer", "name", "inet0", "netns", string(tn.gw))
	host("link", "add", "vpc0", "netns", string(tn.gw), "type", "veth", "peer", "name", "vpc0", "netns", string(tn.node))
	vpcBits := strconv.Itoa(p.vpcCIDR.Bits())
	for _, c := range []struct {
		n    netns
		args []string
	}{
		{tn.onprem, []string{"ip", "link", "set", "lo", "up"}},
		{tn.gw, []string{"ip", "link", "set", "lo", "up"}},
		{tn.node, []string{"ip", "link", "set", "lo", "up"}},
		// The fake internet: the on-prem peer's public address and the gateway's Elastic IP, point to point.
		{tn.onprem, []string{"ip", "addr", "add", onPremInternetIP + "/32", "peer", gwPublic + "/32", "dev", "inet0"}},
		{tn.gw, []string{"ip", "addr", "add", gwPublic + "/32", "peer", onPremInternetIP + "/32", "dev", "inet0"}},
		{tn.onprem, []string{"ip", "link", "set", "inet0", "up"}},
		{tn.gw, []string{"ip", "link", "set", "inet0", "up"}},
		// The VPC: the gateway's interface address and the node's, both on the VPC's local route.
		{tn.gw, []string{"ip", "link", "set", "vpc0", "mtu", strconv.Itoa(vpcMTU), "up"}},
		{tn.node, []string{"ip", "link", "set", "vpc0", "mtu", strconv.Itoa(vpcMTU), "up"}},
		{tn.gw, []string{"ip", "addr", "add", p.gatewayIP.String() + "/" + vpcBits, "dev", "vpc0"}},
		{tn.node, []string{"ip", "addr", "add", tn.nodeIP.String() + "/" + vpcBits, "dev", "vpc0"}},
		// The on-prem LAN (no dummy driver here: a veth pair stands in for the LAN port), with one address inside
		// onPremCidrs and one outside, for the negative control.
		{tn.onprem, []string{"ip", "link", "add", "lan0", "type", "veth", "peer", "name", "lan1"}},
		{tn.onprem, []string{"ip", "addr", "add", tn.lanIP.String() + "/" + strconv.Itoa(p.onPremCIDRs[0].Bits()), "dev", "lan0"}},
		{tn.onprem, []string{"ip", "addr", "add", tn.outsideIP.String() + "/24", "dev", "lan0"}},
		{tn.onprem, []string{"ip", "link", "set", "lan1", "up"}},
		{tn.onprem, []string{"ip", "link", "set", "lan0", "up"}},
	} {
		c.n.must(ctx, t, c.args...)
	}
	if len(p.vpcRoutes) == 0 {
		t.Fatal("the stack declares no VPC route to the gateway")
	}
	for _, r := range p.vpcRoutes {
		tn.node.must(ctx, t, "ip", "route", "add", r.String(), "via", p.gatewayIP.String())
	}
	// Counts what arrives on-prem from the tunnel, by destination: the proof that a packet crossed, or did not.
	tn.onprem.nft(ctx, t, fmt.Sprintf(`table inet dynk8s_probe {
	chain input {
		type filter hook input priority filter; policy accept;
		iifname %q ip daddr %s icmp type echo-request counter comment "echo-lan"
		ip daddr %s counter comment "to-outside"
	}
}
`, onPremIface, tn.lanIP, tn.outsideIP))
}

// bootGateway does what the gateway's first boot does with its user data.
func (tn *tunnel) bootGateway(ctx context.Context, t *testing.T, moto string) {
	t.Helper()
	p := tn.plan
	dir := t.TempDir()
	tn.gwRoot = filepath.Join(dir, "root")
	writeUserDataFiles(t, p.gatewayUserData, tn.gwRoot)

	ssm := startMoto(ctx, t, moto)
	ssm.putSecureString(t, p.region, p.keyParameter, p.keyValue)
	imds := fakeaws.NewIMDS(t, fakeaws.IMDSInstance{
		ID: "i-0fedcba9876543210", Zone: p.region + "a", Region: p.region, PrivateIP: p.gatewayIP.String(),
		Type: "t4g.micro", Role: "dynk8s-homelab-gateway", AccessKeyID: "ASIAE2EFAKEGATEWAY01",
		SecretAccessKey: "e2e/fake/gateway/secret/key/000000000", SessionToken: "e2e-fake-gateway-session",
	})

	// The private mount namespace sees the written files at their real paths (/etc overlaid with the temp root's
	// etc), as the instance does; nothing outside the namespace changes. The agent runs in this machine's network
	// namespace, where moto and the fake IMDS listen; wg-quick in the gateway's.
	const boot = `set -euo pipefail
work=$1 root=$2 ns=$3 iface=$4 agent=$5
shift 5
mount -t overlay dynk8s-e2e-etc -o "lowerdir=/etc,upperdir=$root/etc,workdir=$work" /etc
` + privateWireGuardRun + `
"$agent" gateway-key
exec ip netns exec "$ns" bash -euo pipefail -c 'iface=$1; shift; for f in "$@"; do sysctl -p "$f"; done; wg-quick up "$iface"' boot "$iface" "$@"
`
	work := filepath.Join(dir, "overlay-work")
	assert.NilError(t, os.Mkdir(work, 0o700))
	args := []string{"--mount", "--propagation", "private", "--", "bash", "-c", boot, "gateway-boot",
		work, tn.gwRoot, string(tn.gw), tn.gwIface, nodetest.BuiltAgent(t)}
	args = append(args, userDataPaths(t, p.gatewayUserData, "/etc/sysctl.d/*.conf")...)
	cmd := exec.CommandContext(ctx, "unshare", args...)
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(),
		"DYNK8S_IMDS_ENDPOINT="+imds.URL,
		"DYNK8S_SSM_ENDPOINT="+ssm.url,
		// The unit runs under systemd, whose journal takes stderr; without it the agent would also call logger and
		// write to this machine's log.
		"JOURNAL_STREAM=0:0",
		"WG_QUICK_USERSPACE_IMPLEMENTATION="+tn.wireguardGo,
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gateway boot (gateway-key, sysctl, wg-quick up %s): %v\n%s", tn.gwIface, err, out)
	}
	for _, want := range []string{"wrote the key from SSM to /etc/wireguard/" + tn.gwIface + ".key",
		"net.ipv4.ip_forward = 1"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("gateway boot output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("gateway boot:\n%s", out)
}

// upOnPrem installs the rendered on-prem config as the operator would and brings it up with wg-quick.
func (tn *tunnel) upOnPrem(ctx context.Context, t *testing.T, dialOut bool) {
	t.Helper()
	tn.opConf = filepath.Join(t.TempDir(), onPremIface+".conf")
	assert.NilError(t, os.WriteFile(tn.opConf, tn.plan.onPremConf, 0o600))
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "--", "bash", "-euo",
		"pipefail", "-c", privateWireGuardRun+` && exec ip netns exec "$1" wg-quick up "$2"`, "onprem-up",
		string(tn.onprem), tn.opConf)
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), "WG_QUICK_USERSPACE_IMPLEMENTATION="+tn.onPremWireGuardGo(t))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("on-prem wg-quick up: %v\n%s", err, out)
	}
	if dialOut != (wgValue(tn.plan.onPremConf, "Interface", "ListenPort") != "") {
		t.Errorf("dial-out=%v but the on-prem config's ListenPort is %q", dialOut,
			wgValue(tn.plan.onPremConf, "Interface", "ListenPort"))
	}
}

// onPremWireGuardGo is the wireguard-go that wg-quick starts on the on-prem side. With DYNK8S_E2E_SHOW set it is a
// wrapper that runs it with LOG_LEVEL=verbose (every handshake initiation, retry and keepalive, timestamped) into a
// file the test logs at its cleanup: the daemon it forks keeps the wrapper's stdout, which must not be wg-quick's
// pipe.
func (tn *tunnel) onPremWireGuardGo(t *testing.T) string {
	t.Helper()
	if os.Getenv("DYNK8S_E2E_SHOW") == "" {
		return tn.wireguardGo
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "wireguard-go.log")
	wrapper := filepath.Join(dir, "wireguard-go")
	script := "#!/bin/sh\nLOG_LEVEL=verbose exec " + tn.wireguardGo + " \"$@\" >>" + log + " 2>&1\n"
	assert.NilError(t, os.WriteFile(wrapper, []byte(script), 0o755))
	t.Cleanup(func() {
		b, err := os.ReadFile(log)
		t.Logf("the on-prem wireguard-go's log (%v):\n%s", err, b)
	})
	return wrapper
}

// waitHandshake waits for the first handshake. An initiation that reaches a side not yet configured is dropped and
// retried after WireGuard's REKEY_TIMEOUT (5 s), so allow for a few of those.
func (tn *tunnel) waitHandshake(ctx context.Context, t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := tn.wg(ctx, tn.onprem, "show", onPremIface, "latest-handshakes")
		if f := strings.Fields(out); err == nil && len(f) == 2 && f[1] != "0" {
			return
		}
		if time.Now().After(deadline) {
			gw, _ := tn.wg(ctx, tn.gw, "show", tn.gwIface)
			op, _ := tn.wg(ctx, tn.onprem, "show", onPremIface)
			t.Fatalf("no WireGuard handshake after 20 s (%v)\ngateway:\n%s\non-prem:\n%s", err, gw, op)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// latestHandshake is the on-prem peer's latest handshake with the gateway (wg's seconds since the epoch; 0: none, or
// wg could not tell).
func (tn *tunnel) latestHandshake(ctx context.Context) int64 {
	out, err := tn.wg(ctx, tn.onprem, "show", onPremIface, "latest-handshakes")
	f := strings.Fields(out)
	if err != nil || len(f) != 2 {
		return 0
	}
	n, _ := strconv.ParseInt(f[1], 10, 64)
	return n
}

// wg runs wg as the tunnel's own side sees it: in the network and mount namespaces of the wireguard-go daemon that
// runs in n, where its control socket is.
func (tn *tunnel) wg(ctx context.Context, n netns, args ...string) (string, error) {
	pid, err := wireguardGoPID(ctx, n)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"-t", pid, "-m", "-n", "wg"}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	b, err := cmd.CombinedOutput()
	if err != nil {
		return string(b), fmt.Errorf("wg %s in %s: %w: %s", strings.Join(args, " "), n, err, b)
	}
	return string(b), nil
}

// wireguardGoPID is the pid of the wireguard-go daemon that runs in n: its mount namespace holds the tunnel's
// control socket (privateWireGuardRun).
func wireguardGoPID(ctx context.Context, n netns) (string, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "pids", string(n)).Output()
	if err != nil {
		return "", fmt.Errorf("ip netns pids %s: %w", n, err)
	}
	for _, pid := range strings.Fields(string(out)) {
		comm, err := os.ReadFile("/proc/" + pid + "/comm")
		if err == nil && strings.TrimSpace(string(comm)) == "wireguard-go" {
			return pid, nil
		}
	}
	return "", fmt.Errorf("no wireguard-go runs in %s", n)
}

func (tn *tunnel) mustWG(ctx context.Context, t *testing.T, n netns, args ...string) string {
	t.Helper()
	out, err := tn.wg(ctx, n, args...)
	assert.NilError(t, err)
	return out
}

// checkKeys: each side runs with the private half of the public key the other side's config names.
func (tn *tunnel) checkKeys(ctx context.Context, t *testing.T, gwConf []byte) {
	t.Helper()
	gwPub := strings.TrimSpace(tn.mustWG(ctx, t, tn.gw, "show", tn.gwIface, "public-key"))
	opPub := strings.TrimSpace(tn.mustWG(ctx, t, tn.onprem, "show", onPremIface, "public-key"))
	if want := wgValue(tn.plan.onPremConf, "Peer", "PublicKey"); gwPub != want {
		t.Errorf("the gateway runs with public key %s (from SSM), the on-prem config expects %s", gwPub, want)
	}
	if want := wgValue(gwConf, "Peer", "PublicKey"); opPub != want {
		t.Errorf("the on-prem peer runs with public key %s, the gateway config expects %s", opPub, want)
	}
}

// forwarded is the packet total of the named counters in the gateway's rendered nftables table: what its idle check
// reads (the node agent's gateway-idle).
func (tn *tunnel) forwarded(ctx context.Context, t *testing.T) int {
	t.Helper()
	out := tn.gw.must(ctx, t, "nft", "-j", "list", "counters", "table", "inet", "dynk8s_wg0_mss")
	var doc struct {
		Nftables []struct {
			Counter *struct {
				Name    string `json:"name"`
				Packets int    `json:"packets"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	assert.NilError(t, json.Unmarshal([]byte(out), &doc), "nft -j list counters")
	total, names := 0, 0
	for _, item := range doc.Nftables {
		if item.Counter != nil {
			total += item.Counter.Packets
			names++
		}
	}
	if names != 2 {
		t.Fatalf("the gateway's table has %d named counters, want 2 (in and out): %s", names, out)
	}
	return total
}

// transfer is the gateway's WireGuard byte counters (received, sent) for its one peer.
func (tn *tunnel) transfer(ctx context.Context, t *testing.T) (rx, tx int64) {
	t.Helper()
	f := strings.Fields(tn.mustWG(ctx, t, tn.gw, "show", tn.gwIface, "transfer"))
	if len(f) != 3 {
		t.Fatalf("wg show transfer: %q", f)
	}
	rx, _ = strconv.ParseInt(f[1], 10, 64)
	tx, _ = strconv.ParseInt(f[2], 10, 64)
	return rx, tx
}

// serve starts the TCP helper as a server in n and waits until it listens.
func (tn *tunnel) serve(ctx context.Context, t *testing.T, n netns, addr string) (result func() string) {
	t.Helper()
	cmd := n.cmd(ctx, tn.testBin, "serve", addr)
	cmd.Env = append(os.Environ(), netHelperEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	assert.NilError(t, cmd.Start())
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "listening" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper server in %s did not start: %s", n, stderr.String())
	}
	done := false
	t.Cleanup(func() {
		if !done {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return func() string {
		t.Helper()
		var answer string
		if lines.Scan() {
			answer = lines.Text()
		}
		err := cmd.Wait()
		done = true
		if err != nil {
			t.Errorf("helper server in %s: %v: %s", n, err, stderr.String())
		}
		return answer
	}
}

// send runs the TCP helper as a client in n: it sends size random bytes and returns "<sha256> <bytes>" of what it
// sent and the server's answer.
func (tn *tunnel) send(ctx context.Context, t *testing.T, n netns, addr string, size int) (sent, answer string) {
	t.Helper()
	cmd := n.cmd(ctx, tn.testBin, "send", addr, strconv.Itoa(size))
	cmd.Env = append(os.Environ(), netHelperEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Errorf("helper client in %s -> %s: %v: %s", n, addr, err, stderr.String())
		return "", ""
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Errorf("helper client in %s: output %q", n, out)
		return "", ""
	}
	return lines[0], lines[1]
}

// nthAddr is a + n.
func nthAddr(a netip.Addr, n int) netip.Addr {
	for range n {
		a = a.Next()
	}
	return a
}

// outsideAddr is the .10 of the /24 right after the first prefix, checked to be in none of them.
func outsideAddr(t *testing.T, prefixes []netip.Prefix, also netip.Prefix) netip.Addr {
	t.Helper()
	p := prefixes[0].Masked()
	last := p.Addr()
	for last.Next().IsValid() && p.Contains(last.Next()) {
		last = last.Next()
	}
	a := nthAddr(last, 11)
	for _, q := range append(prefixes, also) {
		if q.Contains(a) {
			t.Fatalf("no address outside %v found next to them (%s)", prefixes, a)
		}
	}
	return a
}

func splitHostPort(s string) (string, int, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return "", 0, errors.New("want ip:port, got " + strconv.Quote(s))
	}
	return ap.Addr().String(), int(ap.Port()), nil
}

// forwardIntoNetns listens on addr (a loopback host:port of a server of this test) inside the network namespace of
// pid, and forwards each connection to the same addr in the test's own namespace. Closed with the test.
func forwardIntoNetns(t *testing.T, pid int, addr string) {
	t.Helper()
	forwardIntoNetnsFile(t, fmt.Sprintf("/proc/%d/ns/net", pid), addr, addr)
}

// forwardIntoNetnsFile listens on listen inside the network namespace nsFile names (/proc/PID/ns/net, or
// /run/netns/NAME), and forwards each connection to target (a loopback host:port of a server of this test) in the
// test's own namespace. Closed with the test.
func forwardIntoNetnsFile(t *testing.T, nsFile, listen, target string) {
	t.Helper()
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Only this goroutine's thread enters the node's namespace, and it returns to the test's namespace before
		// the thread is unlocked. Should the return fail, the thread stays locked and ends with the goroutine.
		runtime.LockOSThread()
		own, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer own.Close()
		f, err := os.Open(nsFile)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("setns: %w", err)}
			return
		}
		l, err := net.Listen("tcp", listen)
		if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{l, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listen on %s in the network namespace %s: %v", listen, nsFile, r.err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := r.l.Accept()
			if err != nil {
				return
			}
			out, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				_ = in.Close()
				continue
			}
			track(in)
			track(out)
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(out, in); _ = out.(*net.TCPConn).CloseWrite() }()
			go func() { defer wg.Done(); _, _ = io.Copy(in, out); _ = in.(*net.TCPConn).CloseWrite() }()
		}
	}()
	t.Cleanup(func() {
		_ = r.l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}
