package gateway

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/node/internal/cloud"
	"github.com/dynk8s/dynk8s/node/internal/cloud/cloudfake"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The gateway's commands, scenario by scenario, with fake clients. The built agent's acceptance tests run it against
// the wire-level fakes.

const (
	testKeyParameter = "/dynk8s/homelab/gateway-private-key"
	testKey          = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
	testOtherKey     = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
	testIdleStop     = 15 * time.Minute
)

// idleFilters are the idle check's DescribeInstances filters: the stack's pool instances (the cluster tag and the
// pool tag key), pending or running.
var idleFilters = map[string][]string{"tag:dynk8s:cluster": {"homelab"}, "tag-key": {"dynk8s:pool"},
	"instance-state-name": {"pending", "running"}}

// fakeGatewayHost records every command line and plays rpm, dnf and nft.
type fakeGatewayHost struct {
	nodetest.Calls
	mu sync.Mutex
	// rpmMissing: packages rpm -q does not find; dnfFailures: installs that fail first (negative: all).
	rpmMissing  []string
	dnfFailures int
	// counters is nft's JSON ("": no such table, nft fails).
	counters string
	fail     map[string]bool
}

func (h *fakeGatewayHost) Has(string) bool { return true }

func (h *fakeGatewayHost) Run(_ context.Context, _ time.Duration, _ bool, name string, args ...string) error {
	line := h.Record(name, args)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.fail[line]:
		return &system.ExitError{Name: name, Code: 1}
	case name == "dnf" && h.dnfFailures != 0:
		h.dnfFailures--
		return &system.ExitError{Name: name, Code: 1}
	}
	return nil
}

func (h *fakeGatewayHost) Output(_ context.Context, _ time.Duration, name string, args ...string) (string, error) {
	h.Record(name, args)
	if name == "rpm" {
		if slices.Contains(h.rpmMissing, args[len(args)-1]) {
			return "", &system.ExitError{Name: name, Code: 1}
		}
		return args[len(args)-1] + "-1.0-1.fc43.x86_64\n", nil
	}
	if h.counters == "" {
		return "", fmt.Errorf("nft exited 1: Error: No such file or directory")
	}
	return h.counters, nil
}

// gatewayRig is the gateway instance: its root, its config and the fakes.
type gatewayRig struct {
	t      *testing.T
	root   string
	cfg    nodeconfig.Gateway
	imds   *cloudfake.IMDS
	ssm    *cloudfake.SSM
	ec2    *cloudfake.EC2
	host   *fakeGatewayHost
	now    time.Time
	dryRun bool
}

func newGatewayRig(t *testing.T) *gatewayRig {
	r := &gatewayRig{t: t, root: t.TempDir(), imds: cloudfake.NewIMDS("", ""), ssm: &cloudfake.SSM{Name: testKeyParameter, Value: testKey},
		host: &fakeGatewayHost{fail: map[string]bool{}}, now: time.Now()}
	r.ec2 = &cloudfake.EC2{Instances: []cloudfake.Instance{
		// The gateway itself (no pool tag) and another cluster's node never count.
		{ID: "i-0aaaaaaaaaaaaaaa1", State: "running", Tags: map[string]string{"dynk8s:cluster": "homelab"}},
		{ID: "i-0bbbbbbbbbbbbbbb2", State: "running", Tags: map[string]string{"dynk8s:cluster": "other", "dynk8s:pool": "x"}},
	}}
	r.cfg = nodeconfig.Gateway{KeyParameter: testKeyParameter, KeyFile: "/etc/wireguard/wg0.key",
		Packages: []string{"nftables", "wireguard-tools"}, SystemRepos: []string{"fedora"},
		TunnelUnit: "wg-quick@wg0.service",
		Idle:       &nodeconfig.GatewayIdle{ClusterName: "homelab", Stop: nodeconfig.Duration(testIdleStop), NFTTable: "dynk8s_wg0_mss"},
		Deadlines: nodeconfig.GatewayDeadlines{Key: nodeconfig.Duration(3 * time.Second),
			KeyOnDisk: nodeconfig.Duration(300 * time.Millisecond), Packages: nodeconfig.Duration(3 * time.Second),
			Idle: nodeconfig.Duration(3 * time.Second), BackoffInitial: nodeconfig.Duration(20 * time.Millisecond),
			BackoffMax: nodeconfig.Duration(100 * time.Millisecond)}}
	return r
}

// gatewayResult is what one command did.
type gatewayResult struct {
	err     error
	log     string
	calls   []string
	elapsed time.Duration
}

// run runs one of the gateway's commands as runGateway does, and logs FAILED as it does.
func (r *gatewayRig) run(cmd string) gatewayResult {
	r.t.Helper()
	out := &nodetest.SyncBuffer{}
	log := system.NewLogger("dynk8s-"+cmd, out, r.root)
	log.Journal = false
	c := &cloud.Cloud{IMDS: r.imds, Connect: func(c *cloud.Cloud, region, domain string) {
		if region != "eu-central-1" || domain != "amazonaws.com" {
			r.t.Errorf("connect(%q, %q)", region, domain)
		}
		c.SSM, c.EC2 = r.ssm, r.ec2
	}}
	g := &gatewayRun{cfg: r.cfg, cloud: c, host: r.host, files: system.Files{Root: r.root}, log: log,
		now: func() time.Time { return r.now }, dryRun: r.dryRun}
	before, described := len(r.host.Recorded()), len(r.ec2.Filters)
	start := time.Now()
	var err error
	switch cmd {
	case "gateway-key":
		err = g.Key(context.Background())
	case "gateway-packages":
		err = g.Packages(context.Background())
	default:
		err = g.Idle(context.Background())
	}
	if err != nil {
		log.Printf("FAILED: %v", err)
	}
	res := gatewayResult{err: err, log: out.String(), calls: r.host.Recorded()[before:], elapsed: time.Since(start)}
	// The gateway asks EC2 only for the stack's pool instances, and starts none.
	for _, f := range r.ec2.Filters[described:] {
		assert.Check(r.t, is.DeepEqual(f, idleFilters), "DescribeInstances filters")
	}
	assert.Check(r.t, is.Equal(r.ec2.Started(), 0), "the gateway started an instance")
	r.t.Logf("%s: %v after %s\n%s", cmd, err, res.elapsed.Round(time.Millisecond), res.log)
	return res
}

func (r *gatewayRig) keyFile() string { return filepath.Join(r.root, r.cfg.KeyFile) }

func (r *gatewayRig) putKey(key string) {
	r.t.Helper()
	assert.NilError(r.t, os.MkdirAll(filepath.Dir(r.keyFile()), 0o700))
	assert.NilError(r.t, os.WriteFile(r.keyFile(), []byte(key+"\n"), 0o600))
}

// gateway-key: the key from SSM into the key file, with the key on disk as the fallback of a boot without SSM.
func TestGatewayKey(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		onDisk  string // the key file's key before the run ("": none)
		setup   func(r *gatewayRig)
		logs    []string
		failure string
		want    string // the key file's key after the run ("": none)
	}{
		// A first boot: IMDS's token and SSM each fail once, then the key is written.
		"first boot": {setup: func(r *gatewayRig) { r.imds.TokenFailures, r.ssm.Failures = 1, 1 },
			logs: []string{"IMDSv2 token: HTTP 503", "HTTP 400 AccessDeniedException: fake SSM says no",
				"read the WireGuard key from SSM parameter " + testKeyParameter + ": succeeded on attempt 3",
				"wrote the key from SSM to "}, want: testKey},
		// The next start finds the same key and leaves the file alone.
		"current": {onDisk: testKey, logs: []string{"is current"}, want: testKey},
		// A rotated key: SSM's value wins.
		"rotated": {onDisk: testOtherKey, logs: []string{"wrote the key from SSM to "}, want: testKey},
		// A reboot while SSM is unreachable keeps the key on disk after a short try (deadlines.keyOnDisk).
		"SSM down, key on disk": {onDisk: testKey, setup: func(r *gatewayRig) { r.ssm.Failures = -1 },
			logs: []string{"SSM unreachable (SSM GetParameter " + testKeyParameter + ": HTTP 400 AccessDeniedException: " +
				"fake SSM says no); keeping the key already in "}, want: testKey},
		// A first boot with SSM down: one clear reason, so systemd retries the unit.
		"SSM down, no key": {setup: func(r *gatewayRig) { r.ssm.Failures = -1 },
			failure: "no WireGuard key: SSM parameter " + testKeyParameter + " could not be read (SSM GetParameter " +
				testKeyParameter + ": HTTP 400 AccessDeniedException: fake SSM says no) and "},
		// What SSM holds must be a WireGuard key; it is not repeated in the log, and nothing is written.
		"not a key": {setup: func(r *gatewayRig) { r.ssm.Value = "c2VjcmV0LWJ1dC1ub3QtYS1rZXk=" },
			failure: "SSM parameter " + testKeyParameter + " does not hold a WireGuard key (32 bytes, base64)"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newGatewayRig(t)
			if c.onDisk != "" {
				r.putKey(c.onDisk)
			}
			if c.setup != nil {
				c.setup(r)
			}
			res := r.run("gateway-key")
			for _, want := range c.logs {
				assert.Check(t, is.Contains(res.log, want))
			}
			if c.failure != "" {
				assert.Assert(t, is.Len(nodetest.FailedLines(res.log), 1), res.log)
				assert.Check(t, is.Contains(nodetest.FailedLines(res.log)[0], c.failure))
			} else {
				assert.Check(t, is.Len(nodetest.FailedLines(res.log), 0))
			}
			for _, secret := range []string{testKey, testOtherKey, "c2VjcmV0LWJ1dC1ub3QtYS1rZXk="} {
				assert.Check(t, !strings.Contains(res.log, secret), "a key is in the log")
			}
			b, err := os.ReadFile(r.keyFile())
			if c.want == "" {
				assert.Check(t, os.IsNotExist(err), "a key file was written")
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.Equal(string(b), c.want+"\n"))
			fi, err := os.Stat(r.keyFile())
			assert.NilError(t, err)
			assert.Check(t, is.Equal(fi.Mode().Perm(), os.FileMode(0o600)))
		})
	}
}

// With a key on disk SSM gets deadlines.keyOnDisk, not the first boot's deadlines.key: the tunnel is not held up.
func TestGatewayKeyOnDiskTriesBriefly(t *testing.T) {
	t.Parallel()
	r := newGatewayRig(t)
	r.cfg.Deadlines.Key = nodeconfig.Duration(time.Minute)
	r.putKey(testKey)
	r.ssm.Failures = -1
	res := r.run("gateway-key")
	assert.NilError(t, res.err)
	assert.Check(t, res.elapsed < 30*time.Second, "took %s with a key on disk", res.elapsed)
}

// gateway-packages: what rpm does not find is installed, the release repository alone first; then the tunnel.
func TestGatewayPackages(t *testing.T) {
	t.Parallel()
	const (
		release = "dnf install -y --setopt=install_weak_deps=False --repo=fedora"
		every   = "dnf install -y --setopt=install_weak_deps=False"
		start   = "systemctl enable --now --no-block wg-quick@wg0.service"
	)
	for name, c := range map[string]struct {
		missing     []string
		dnfFailures int
		calls       []string // the calls after rpm's
		logs        []string
		failure     string
	}{
		// Two failed installs, then one that works: the tunnel is started after it.
		"retry, then start the tunnel": {missing: []string{"nftables", "wireguard-tools"}, dnfFailures: 2,
			calls: []string{release + " nftables wireguard-tools", every + " nftables wireguard-tools",
				every + " nftables wireguard-tools", start},
			logs: []string{"install nftables wireguard-tools: attempt 1 failed: dnf install exited 1",
				"install nftables wireguard-tools: succeeded on attempt 3", "installed nftables wireguard-tools"}},
		// Later boots find the packages and only start the tunnel.
		"installed": {calls: []string{start},
			logs: []string{"nftables wireguard-tools already installed"}},
		// Only a missing package is fetched.
		"one missing": {missing: []string{"wireguard-tools"},
			calls: []string{release + " wireguard-tools", start}},
		// A mirror that stays down: one reason, and no tunnel start (systemd restarts the unit).
		"mirror down": {missing: []string{"wireguard-tools"}, dnfFailures: -1,
			failure: "install wireguard-tools: gave up after"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newGatewayRig(t)
			r.host.rpmMissing, r.host.dnfFailures = c.missing, c.dnfFailures
			res := r.run("gateway-packages")
			assert.Check(t, is.DeepEqual(res.calls[:2], []string{"rpm -q --whatprovides nftables",
				"rpm -q --whatprovides wireguard-tools"}))
			for _, want := range c.logs {
				assert.Check(t, is.Contains(res.log, want))
			}
			if c.failure != "" {
				assert.Assert(t, is.Len(nodetest.FailedLines(res.log), 1), res.log)
				assert.Check(t, is.Contains(nodetest.FailedLines(res.log)[0], c.failure))
				assert.Check(t, is.Contains(nodetest.FailedLines(res.log)[0], "dnf install exited 1"))
				assert.Check(t, !slices.ContainsFunc(res.calls, func(c string) bool { return strings.HasPrefix(c, "systemctl") }))
				return
			}
			assert.NilError(t, res.err)
			assert.Check(t, is.DeepEqual(res.calls[2:], c.calls))
		})
	}
}

// counters is `nft -j list counters table inet dynk8s_wg0_mss` with these packet counts (as nftables 1.0 prints it).
func counters(in, out int) string {
	return fmt.Sprintf(`{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, `+
		`{"counter": {"family": "inet", "name": "forwarded_in", "table": "dynk8s_wg0_mss", "handle": 2, "packets": %d, "bytes": %d}}, `+
		`{"counter": {"family": "inet", "name": "forwarded_out", "table": "dynk8s_wg0_mss", "handle": 3, "packets": %d, "bytes": %d}}]}`,
		in, in*100, out, out*100)
}

func (r *gatewayRig) stateFile() string { return filepath.Join(r.root, "run/dynk8s", idleStateFile) }

// state writes the state a run of this boot left: the last activity ago, and the packet total then.
func (r *gatewayRig) state(ago time.Duration, packets int) {
	r.t.Helper()
	r.rawState(fmt.Sprintf("%d %d\n", r.now.Add(-ago).Unix(), packets))
}

func (r *gatewayRig) rawState(line string) {
	r.t.Helper()
	assert.NilError(r.t, os.MkdirAll(filepath.Dir(r.stateFile()), 0o755))
	assert.NilError(r.t, os.WriteFile(r.stateFile(), []byte(line), 0o600))
}

// readState is the state the run left.
func (r *gatewayRig) readState() (lastActive time.Time, packets int) {
	r.t.Helper()
	b, err := os.ReadFile(r.stateFile())
	assert.NilError(r.t, err)
	var sec int64
	_, err = fmt.Sscanf(string(b), "%d %d\n", &sec, &packets)
	assert.NilError(r.t, err, "state %q", b)
	return time.Unix(sec, 0), packets
}

const poweroff = "systemctl poweroff"

// gateway-idle: its decision rules, each with what it logs and the state it leaves.
func TestGatewayIdle(t *testing.T) {
	t.Parallel()
	pool := func(id, state string) cloudfake.Instance {
		return cloudfake.Instance{ID: id, State: state, Tags: map[string]string{"dynk8s:cluster": "homelab", "dynk8s:pool": "builders-x86"}}
	}
	for name, c := range map[string]struct {
		setup    func(r *gatewayRig)
		state    string // the state file's line ("": none, a fresh boot)
		counters string // nft's answer ("": the table is not loaded)
		stops    bool
		logs     []string
		failure  string
		// activeNow: the run restarts the window; packets: the total it keeps (unchecked when both are zero).
		activeNow bool
		packets   int
		describes int // DescribeInstances calls (0: unchecked)
	}{
		// No pool instance pending or running (this cluster's stopping node, its gateway and another cluster's node
		// do not count) and the counters did not move, for longer than idle.stop.
		"idle": {setup: func(r *gatewayRig) {
			r.ec2.Instances = append(r.ec2.Instances, pool("i-0ccccccccccccccc3", "stopping"))
		},
			state: "16m 42", counters: counters(40, 2), stops: true, packets: 42, describes: 1,
			logs: []string{"stopping: idle for 960s (limit 900s): no pool instance pending or running and no packet " +
				"forwarded through wg0; a booting node starts the gateway again"}},
		// A pool instance pending or running keeps the gateway up however long ago the last packet was.
		"pool instance pending": {setup: func(r *gatewayRig) { r.ec2.Instances = append(r.ec2.Instances, pool("i-0ddddddddddddddd4", "pending")) },
			state: "1h 7", counters: counters(5, 2), activeNow: true, packets: 7,
			logs: []string{"staying up: pool instances i-0ddddddddddddddd4 (pending)"}},
		"pool instance running": {setup: func(r *gatewayRig) { r.ec2.Instances = append(r.ec2.Instances, pool("i-0ddddddddddddddd4", "running")) },
			state: "1h 7", counters: counters(5, 2), activeNow: true, packets: 7,
			logs: []string{"staying up: pool instances i-0ddddddddddddddd4 (running)"}},
		// Packets crossed the tunnel since the last run; a counter that went down (a reloaded table) counts too.
		"traffic": {state: "1h 100", counters: counters(90, 11), activeNow: true, packets: 101,
			logs: []string{"staying up: packets forwarded through wg0 (counter 100 -> 101)"}},
		"counter reset": {state: "1h 100", counters: counters(3, 0), activeNow: true, packets: 3,
			logs: []string{"staying up: packets forwarded through wg0 (counter 100 -> 3)"}},
		// Quiet, but not yet for idle.stop: the window is kept.
		"inside the window": {state: "10m 42", counters: counters(40, 2), packets: 42,
			logs: []string{"staying up: idle for 600s of 900s (no pool instance pending or running, no packet forwarded)"}},
		// The first run after a boot has no state: the boot starts the window; the first reading counts as traffic.
		"first run": {counters: counters(0, 0), activeNow: true, packets: 0,
			logs: []string{"staying up: packets forwarded through wg0 (counter -1 -> 0)"}},
		// With the table not loaded (wg-quick down), the first run only starts the window.
		"first run, tunnel down": {activeNow: true, packets: -1, logs: []string{"staying up: idle for 0s of 900s"}},
		// With the tunnel down and no pool instance for longer than idle.stop, the gateway stops.
		"tunnel down": {state: "20m -1", stops: true, packets: -1},
		// A state it cannot read starts the window now.
		"malformed state": {state: "yesterday", counters: counters(40, 2), activeNow: true, packets: 42,
			logs: []string{"ignoring malformed state in "}},
		// EC2 errors are retried inside the run: two 503s, then the answer, and the decision is taken.
		"EC2 retried": {setup: func(r *gatewayRig) { r.ec2.Failures, r.ec2.FailStatus, r.ec2.FailCode = 2, 503, "RequestLimitExceeded" },
			state: "1h 42", counters: counters(40, 2), stops: true, packets: 42, describes: 3,
			logs: []string{"list the pool instances of cluster homelab: succeeded on attempt 3"}},
		// When EC2 does not answer, nobody can tell whether a node needs the tunnel: the gateway stays up, and the
		// run fails with one reason inside its deadline. A refusal fails the same way.
		"EC2 unavailable": {setup: func(r *gatewayRig) { r.ec2.Failures, r.ec2.FailStatus, r.ec2.FailCode = -1, 503, "Unavailable" },
			state: "1h 42", counters: counters(40, 2),
			failure: "cannot tell whether a pool instance runs (EC2 DescribeInstances: HTTP 503 Unavailable: fake EC2 says no); the gateway stays up"},
		"EC2 refuses": {setup: func(r *gatewayRig) {
			r.ec2.Failures, r.ec2.FailStatus, r.ec2.FailCode = -1, 403, "UnauthorizedOperation"
		},
			state: "1h 42", counters: counters(40, 2),
			failure: "cannot tell whether a pool instance runs (EC2 DescribeInstances: HTTP 403 UnauthorizedOperation: fake EC2 says no); the gateway stays up"},
		// Security review L3: EC2 may answer a filtered DescribeInstances with empty pages and a NextToken; a running
		// pool instance behind them keeps the gateway up.
		"instance behind empty pages": {setup: func(r *gatewayRig) {
			r.ec2.Instances, r.ec2.EmptyPages = append(r.ec2.Instances, pool("i-0eeeeeeeeeeeeeee5", "running")), 2
		}, state: "1h 7", counters: counters(5, 2), activeNow: true, packets: 7, describes: 3,
			logs: []string{"staying up: pool instances i-0eeeeeeeeeeeeeee5 (running)"}},
		// Empty pages and no instance at the end: idle.
		"empty pages": {setup: func(r *gatewayRig) { r.ec2.EmptyPages = 2 }, state: "16m 7", counters: counters(5, 2),
			stops: true, packets: 7, describes: 3},
		// Pages without end: the question has no answer, and the gateway stays up.
		"pages without end": {setup: func(r *gatewayRig) { r.ec2.EmptyPages = 1 << 20 }, state: "16m 7", counters: counters(5, 2),
			failure: "still a NextToken after 20 pages); the gateway stays up"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newGatewayRig(t)
			if c.setup != nil {
				c.setup(r)
			}
			if ago, packets, ok := strings.Cut(c.state, " "); ok {
				d, err := time.ParseDuration(ago)
				assert.NilError(t, err)
				var n int
				_, err = fmt.Sscan(packets, &n)
				assert.NilError(t, err)
				r.state(d, n)
			} else if c.state != "" {
				r.rawState(c.state + "\n")
			}
			r.host.counters = c.counters
			res := r.run("gateway-idle")
			for _, want := range c.logs {
				assert.Check(t, is.Contains(res.log, want))
			}
			assert.Check(t, is.Equal(slices.Contains(res.calls, poweroff), c.stops), "%v", res.calls)
			if c.describes > 0 {
				assert.Check(t, is.Equal(r.ec2.Described(), c.describes))
			}
			if c.failure != "" {
				assert.Assert(t, is.Len(nodetest.FailedLines(res.log), 1), res.log)
				assert.Check(t, is.Contains(nodetest.FailedLines(res.log)[0], c.failure))
				assert.Check(t, res.elapsed < 15*time.Second, "took %s past a 3 s deadline", res.elapsed)
				return
			}
			assert.NilError(t, res.err)
			assert.Check(t, slices.Contains(res.calls, "nft -j list counters table inet dynk8s_wg0_mss"))
			last, packets := r.readState()
			assert.Check(t, is.Equal(packets, c.packets))
			if c.activeNow {
				assert.Check(t, is.Equal(last.Unix(), r.now.Unix()), "the window restarts")
			} else {
				assert.Check(t, last.Unix() < r.now.Unix(), "the window is kept")
			}
		})
	}
}

// Each page asks for the next with the NextToken the last one gave.
func TestGatewayIdleFollowsNextToken(t *testing.T) {
	t.Parallel()
	r := newGatewayRig(t)
	r.ec2.EmptyPages = 2
	r.state(time.Hour, 7)
	r.host.counters = counters(5, 2)
	assert.NilError(t, r.run("gateway-idle").err)
	assert.Check(t, is.DeepEqual(r.ec2.Tokens, []string{"", "page-1", "page-2"}))
}

// An always-on gateway (no idle config) checks nothing and never stops.
func TestGatewayIdleOff(t *testing.T) {
	t.Parallel()
	r := newGatewayRig(t)
	r.cfg.Idle = nil
	res := r.run("gateway-idle")
	assert.NilError(t, res.err)
	assert.Check(t, is.Len(res.calls, 0))
	assert.Check(t, is.Equal(r.ec2.Described(), 0))
}

// A dry run reads but changes nothing: no key file, no state, no poweroff.
func TestGatewayDryRun(t *testing.T) {
	t.Parallel()
	r := newGatewayRig(t)
	r.dryRun = true
	res := r.run("gateway-key")
	assert.NilError(t, res.err)
	assert.Check(t, is.Contains(res.log, "dry run: would write the key from SSM to "))
	_, err := os.Stat(r.keyFile())
	assert.Check(t, os.IsNotExist(err))

	r.state(time.Hour, 42)
	before, _ := os.ReadFile(r.stateFile())
	r.host.counters = counters(40, 2)
	res = r.run("gateway-idle")
	assert.NilError(t, res.err)
	after, _ := os.ReadFile(r.stateFile())
	assert.Check(t, is.Equal(string(after), string(before)))
}

// loadGatewayConfig's test hooks replace every deadline: DYNK8S_DEADLINE_SECONDS is one value for all.
func TestLoadGatewayConfigHooks(t *testing.T) {
	r := newGatewayRig(t)
	b, err := r.cfg.Encode()
	assert.NilError(t, err)
	path := filepath.Join(t.TempDir(), "gateway.json")
	assert.NilError(t, os.WriteFile(path, b, 0o644))
	t.Setenv("DYNK8S_DEADLINE_SECONDS", "7")
	t.Setenv("DYNK8S_BACKOFF_MAX_MS", "250")
	cfg, err := loadGatewayConfig(path)
	assert.NilError(t, err)
	d := cfg.Deadlines
	for _, v := range []nodeconfig.Duration{d.Key, d.KeyOnDisk, d.Packages, d.Idle} {
		assert.Check(t, is.Equal(v.D(), 7*time.Second))
	}
	assert.Check(t, is.Equal(d.BackoffMax.D(), 250*time.Millisecond))
	t.Setenv("DYNK8S_DEADLINE_SECONDS", "soon")
	_, err = loadGatewayConfig(path)
	assert.ErrorContains(t, err, "DYNK8S_DEADLINE_SECONDS=soon is not a whole number")
	_, err = loadGatewayConfig(filepath.Join(t.TempDir(), "none.json"))
	assert.ErrorContains(t, err, "is missing or unreadable")
}
