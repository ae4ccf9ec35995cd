package infra_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// TestBootWorstCaseFits: a pool node's boot at its worst, read from what the node runs (its user data's dynk8s
// units, the order systemd gives them and their hard timeouts) and the launch estimate, is what
// nodeconfig.BootWorstCase says; the launch hook's heartbeat outlasts it, its default result lets an instance whose
// boot never completed go on rather than replacing it, and the autoscaler's --max-node-provision-time, at config's default,
// outlasts it too.
func TestBootWorstCaseFits(t *testing.T) {
	c := devConfig(t)
	p := pool(c, 1)
	p["spot"], p["instanceTypes"], p["warmPool"] = false, []any{"c7g.2xlarge"}, map[string]any{"state": "Stopped"}
	cfg, err := mockcloud.ConfigFromMap(c)
	assert.NilError(t, err)
	res, err := plan.RunConfig("dev", cfg)
	assert.NilError(t, err)

	templates := res.Cloud.ByType("aws:ec2/launchTemplate:LaunchTemplate")
	assert.Check(t, len(templates) > 1)
	for _, lt := range templates {
		raw, err := cloudinit.Decode(in(&lt, "userData").(string))
		assert.NilError(t, err)
		files, err := cloudinit.Files(raw)
		assert.NilError(t, err)
		units := map[string]bootUnit{}
		for _, f := range files {
			name, ok := strings.CutPrefix(f.Path, "/etc/systemd/system/")
			if ok && strings.HasPrefix(name, "dynk8s-") && strings.HasSuffix(name, ".service") {
				units[name] = parseBootUnit(t, f.Content)
			}
		}
		chain, total := longestChain(t, units, "dynk8s-join.service")
		t.Logf("%s: %s after a launch of %s: %v", lt.Name, total, nodeconfig.LaunchEstimate, chain)
		assert.Check(t, len(chain) >= 3, "%s: the join waits for no fetch and no routes: %v", lt.Name, chain)
		assert.Equal(t, nodeconfig.LaunchEstimate+total, nodeconfig.BootWorstCase(),
			"%s: BootWorstCase is not the launch and the units' chain %v", lt.Name, chain)
	}
	worst := nodeconfig.BootWorstCase()

	hooks := res.Cloud.ByType("aws:autoscaling/lifecycleHook:LifecycleHook")
	launches := 0
	for _, h := range hooks {
		if in(&h, "lifecycleTransition") != "autoscaling:EC2_INSTANCE_LAUNCHING" {
			continue
		}
		launches++
		heartbeat := time.Duration(in(&h, "heartbeatTimeout").(float64)) * time.Second
		assert.Check(t, heartbeat > worst && heartbeat <= 7200*time.Second,
			"%s: a heartbeat of %s does not outlast the boot's %s within AWS's 7200 s", h.Name, heartbeat, worst)
		assert.Check(t, in(&h, "defaultResult") == "CONTINUE",
			"%s: an instance whose boot never completes the action is replaced, every heartbeat", h.Name)
	}
	assert.Check(t, launches == 1, "launch hooks: %d, want the warm pool's", launches)

	files, err := res.Artifacts()
	assert.NilError(t, err)
	deployment := string(files["manifests/deployment-kube-system-cluster-autoscaler.yaml"])
	m := regexp.MustCompile(`--max-node-provision-time=(\S+)`).FindStringSubmatch(deployment)
	assert.Assert(t, m != nil, "the autoscaler has no --max-node-provision-time:\n%s", deployment)
	flag, err := time.ParseDuration(strings.Trim(m[1], `"'`))
	assert.NilError(t, err)
	// The dev stack leaves the flag at config's default.
	assert.Check(t, flag > worst, "--max-node-provision-time=%s is within the boot's worst case %s", flag, worst)
}

// bootUnit is what the worst case needs of a unit: what it starts after (After=, and the Before= of others) and its
// hard start timeout.
type bootUnit struct {
	after, before []string
	timeout       time.Duration
}

func parseBootUnit(t *testing.T, content string) bootUnit {
	t.Helper()
	var u bootUnit
	for line := range strings.Lines(content) {
		key, value, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		switch key {
		case "After":
			u.after = append(u.after, strings.Fields(value)...)
		case "Before":
			u.before = append(u.before, strings.Fields(value)...)
		case "TimeoutStartSec":
			d, err := time.ParseDuration(value)
			assert.NilError(t, err, "TimeoutStartSec=%s", value)
			u.timeout = d
		}
	}
	return u
}

// longestChain is the chain of the user data's dynk8s units that ends in last and takes longest on their hard
// timeouts, with its total. A unit in it without a timeout fails the test: a oneshot's start is unbounded by
// default (systemd.service(5), TimeoutStartSec=).
func longestChain(t *testing.T, units map[string]bootUnit, last string) ([]string, time.Duration) {
	t.Helper()
	preds := map[string][]string{}
	for name, u := range units {
		for _, a := range u.after {
			if _, ok := units[a]; ok {
				preds[name] = append(preds[name], a)
			}
		}
		for _, b := range u.before {
			if _, ok := units[b]; ok {
				preds[b] = append(preds[b], name)
			}
		}
	}
	var walk func(name string, depth int) ([]string, time.Duration)
	walk = func(name string, depth int) ([]string, time.Duration) {
		assert.Assert(t, depth <= len(units), "the units' order has a cycle through %s", name)
		u := units[name]
		assert.Check(t, u.timeout > 0, "%s has no TimeoutStartSec: the boot has no worst case", name)
		var best []string
		var longest time.Duration
		for _, p := range preds[name] {
			if chain, d := walk(p, depth+1); d > longest || best == nil {
				best, longest = chain, d
			}
		}
		return append(best, name), longest + u.timeout
	}
	_, ok := units[last]
	assert.Assert(t, ok, "the user data has no %s", last)
	return walk(last, 0)
}
