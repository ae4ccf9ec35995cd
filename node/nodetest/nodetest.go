// Package nodetest is the kit of the tests that run the node agent as built (node/cmd/dynk8s-node): its own
// acceptance tests here, which run it with the configuration cloudinit renders against the wire fakes of
// internal/fakeaws, and the e2e's boxes and joins. It builds the agent once per test binary and reads what the
// agent leaves: its log's failure lines, the JoinConfiguration it hands kubeadm, the timeline.
package nodetest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// AgentPath is where the bootstrap installs the agent on an instance.
const AgentPath = "/usr/local/bin/dynk8s-node"

var build struct {
	once      sync.Once
	dir, path string
	err       error
}

// BuiltAgent is node/cmd/dynk8s-node built for this machine, static, once per test binary (the Go build cache makes
// it quick after the first); a TestMain removes it with RemoveBuiltAgent.
func BuiltAgent(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		if build.dir, build.err = os.MkdirTemp("", "dynk8s-agent-"); build.err != nil {
			return
		}
		build.path = filepath.Join(build.dir, "dynk8s-node")
		cmd := exec.Command("go", "build", "-trimpath", "-o", build.path, "github.com/dynk8s/dynk8s/node/cmd/dynk8s-node")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = &buildError{err: err, out: string(out)}
		}
	})
	assert.NilError(t, build.err)
	return build.path
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string {
	return "go build ./node/cmd/dynk8s-node: " + e.err.Error() + "\n" + e.out
}

// RemoveBuiltAgent removes what BuiltAgent built, for a TestMain to call after the tests.
func RemoveBuiltAgent() {
	if build.dir != "" {
		_ = os.RemoveAll(build.dir)
	}
}

// FailedLines are the lines of an agent's (or the bootstrap's) log that report a failure: one, with the reason,
// when a command fails; none else.
func FailedLines(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "FAILED") {
			out = append(out, l)
		}
	}
	return out
}

// KernelLog are the lines the agent wrote to the kernel log of the node under root (its dev/kmsg, which the test
// makes a file).
func KernelLog(t testing.TB, root string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "dev/kmsg"))
	assert.NilError(t, err)
	if len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// ParseJoinConfig reads a JoinConfiguration as the agent hands it to kubeadm, refusing unknown fields.
func ParseJoinConfig(t testing.TB, doc string) nodeconfig.JoinConfiguration {
	t.Helper()
	var jc nodeconfig.JoinConfiguration
	assert.NilError(t, yaml.UnmarshalStrict([]byte(doc), &jc))
	return jc
}

// Timeline is /run/dynk8s/timeline.json as the runbook and cmd/timeline read it.
type Timeline struct {
	InstanceID              string   `json:"instanceId"`
	LifecycleState          string   `json:"lifecycleState"`
	Mode                    string   `json:"mode"`
	Result                  string   `json:"result"`
	Reason                  string   `json:"reason"`
	TotalSeconds            float64  `json:"totalSeconds"`
	StartedSecondsAfterBoot *float64 `json:"startedSecondsAfterBoot"`
	Phases                  []struct {
		Name    string  `json:"name"`
		Seconds float64 `json:"seconds"`
	} `json:"phases"`
}

// PhaseNames are the timeline's phases' names, in order.
func (tl Timeline) PhaseNames() []string {
	var out []string
	for _, p := range tl.Phases {
		out = append(out, p.Name)
	}
	return out
}

// ReadTimeline reads the timeline under root strictly and checks it against a run of the agent that took elapsed
// on a node booted uptime ago (its /proc/uptime): the phases fit in the total (pre-pull runs beside the others), the
// total in the run, and the start after the boot.
func ReadTimeline(t testing.TB, root string, elapsed, uptime time.Duration) Timeline {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "run/dynk8s/timeline.json"))
	assert.NilError(t, err)
	var tl Timeline
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	assert.NilError(t, dec.Decode(&tl), string(b))
	sum := 0.0
	for _, p := range tl.Phases {
		assert.Check(t, p.Seconds >= 0 && p.Seconds <= tl.TotalSeconds+0.01, "phase %+v of %.3f s", p, tl.TotalSeconds)
		if p.Name != "pre-pull" {
			sum += p.Seconds
		}
	}
	assert.Check(t, sum <= tl.TotalSeconds+0.01, "phases sum to %.3f s, more than the %.3f s total", sum, tl.TotalSeconds)
	assert.Check(t, tl.TotalSeconds <= elapsed.Seconds(), "total %.3f s, but the agent ran %s", tl.TotalSeconds, elapsed)
	if assert.Check(t, tl.StartedSecondsAfterBoot != nil) {
		assert.Check(t, *tl.StartedSecondsAfterBoot > 0 && *tl.StartedSecondsAfterBoot <= uptime.Seconds())
	}
	return tl
}

// SyncBuffer collects the output of a process or a goroutine that others read while it writes.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Calls records the command lines a fake host is given, from any goroutine. Embed it: Record in the fake's Run and
// Output, Recorded in the test.
type Calls struct {
	mu    sync.Mutex
	lines []string
}

// Record records name and args as one line, and returns it.
func (c *Calls) Record(name string, args []string) string {
	line := strings.TrimSpace(name + " " + strings.Join(args, " "))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, line)
	return line
}

// Recorded is the lines so far, in order.
func (c *Calls) Recorded() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.lines)
}
