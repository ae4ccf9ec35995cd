package infra_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/common/constant"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra"
)

// engineRun is what the engine does with the program, under the mock engine: it starts the program with the whole
// stack config in PULUMI_CONFIG, which the Go SDK reads (the mock engine takes only the place of the gRPC endpoints).
// It returns the exit status of infra.Main, its stderr, the diagnostics the program logged (through infra.Run,
// as Main runs it) and what it declared.
func engineRun(t *testing.T, values map[string]any, mutate func(*mockcloud.Cloud)) (int, string, []string,
	*mockcloud.Cloud) {
	t.Helper()
	sc, err := mockcloud.ConfigFromMap(values)
	assert.NilError(t, err)
	newCloud := func() *mockcloud.Cloud {
		c := mockcloud.NewFor(sc)
		if mutate != nil {
			mutate(c)
		}
		return c
	}
	cloud := newCloud()
	t.Setenv(pulumi.EnvConfig, mustJSON(t, sc.Values))
	t.Setenv(infra.AgentDirEnv, standInAgentDir(t))
	// The ambient kubeconfig (the dev stack configures none) names an API server with one Ready on-prem Node, which
	// the engine's run lists (infra.ClusterOnPremNodes).
	kubeconfig, _ := onPremAPIServer(t, onPremNode("onprem-1", corev1.ConditionTrue))
	file := filepath.Join(t.TempDir(), "kubeconfig")
	assert.NilError(t, os.WriteFile(file, []byte(kubeconfig), 0o600))
	t.Setenv("KUBECONFIG", file)
	var stderr bytes.Buffer
	status := infra.Main(&stderr, pulumi.WithMocks(mockcloud.Project, "dev", cloud))

	// The mock engine drops what the program logs; a second run records it.
	logged := &errorLog{}
	_ = pulumi.RunErr(func(ctx *pulumi.Context) error {
		logged.Log = ctx.Log
		ctx.Log = logged
		return infra.Run(ctx)
	}, pulumi.WithMocks(mockcloud.Project, "dev", newCloud()))
	return status, stderr.String(), logged.errors(), cloud
}

// standInAgentDir is a directory laid out as `make build` leaves the node agent and the controller of both
// architectures, holding stand-in bytes, not a build.
func standInAgentDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, program := range []string{"dynk8s-node", "dynk8s-controller"} {
		for _, arch := range []string{"amd64", "arm64"} {
			assert.NilError(t, os.WriteFile(filepath.Join(dir, program+"-linux-"+arch), []byte(program+" "+arch), 0o755))
		}
	}
	return dir
}

// TestEngineNeedsTheBuiltAgent: under the engine, a node agent `make build` has not built stops the run with the
// command to run, before anything is declared: a stack never uploads a stand-in.
func TestEngineNeedsTheBuiltAgent(t *testing.T) {
	c := devConfig(t)
	sc, err := mockcloud.ConfigFromMap(c)
	assert.NilError(t, err)
	t.Setenv(pulumi.EnvConfig, mustJSON(t, sc.Values))
	dir := standInAgentDir(t)
	assert.NilError(t, os.Remove(filepath.Join(dir, "dynk8s-node-linux-arm64")))
	t.Setenv(infra.AgentDirEnv, dir)
	cloud := mockcloud.New(sc.Values["aws:region"])
	var stderr bytes.Buffer
	status := infra.Main(&stderr, pulumi.WithMocks(mockcloud.Project, "dev", cloud))
	assert.Equal(t, status, constant.ExitStatusLoggedError, stderr.String())
	assert.Equal(t, len(cloud.Resources()), 0, "nothing declared")

	logged := &errorLog{}
	_ = pulumi.RunErr(func(ctx *pulumi.Context) error {
		logged.Log = ctx.Log
		ctx.Log = logged
		return infra.Run(ctx)
	}, pulumi.WithMocks(mockcloud.Project, "dev", mockcloud.New(sc.Values["aws:region"])))
	assert.DeepEqual(t, logged.errors(), []string{"node agent for arm64: " + filepath.Join(dir, "dynk8s-node-linux-arm64") +
		" is not built: run `make build` first"})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	assert.NilError(t, err)
	return string(b)
}

// errorLog records the error diagnostics a program logs.
type errorLog struct {
	pulumi.Log
	mu   sync.Mutex
	msgs []string
}

func (l *errorLog) Error(msg string, args *pulumi.LogArgs) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, msg)
	l.mu.Unlock()
	return l.Log.Error(msg, args)
}

func (l *errorLog) errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// TestEngineRefusesUnknownTopLevelKey: under the engine, the program reads the stack's key names from the config
// the engine passes, so a misspelt top-level key fails the preview with its path, and nothing is declared.
func TestEngineRefusesUnknownTopLevelKey(t *testing.T) {
	c := devConfig(t)
	c["dynk8s:autoscalr"] = map[string]any{"expander": "random"}
	status, stderr, logged, cloud := engineRun(t, c, nil)
	assert.Equal(t, status, constant.ExitStatusLoggedError, "the program reported its error: %s", stderr)
	assert.Equal(t, stderr, "", "the diagnostic is the program's only word")
	assert.Equal(t, len(logged), 1, "%q", logged)
	assert.Check(t, is.Contains(logged[0], "dynk8s:autoscalr: unknown key: did you mean autoscaler? (known keys here: agent, autoscaler, "))
	assert.Equal(t, len(cloud.Resources()), 0, "nothing declared")

	status, stderr, logged, cloud = engineRun(t, devConfig(t), nil)
	assert.Equal(t, status, 0, "the dev stack runs: %s %q", stderr, logged)
	assert.Check(t, len(cloud.Resources()) > 40)
}

// TestPreviewChecksAreOurWords: a check of what the preview reads (the on-prem cluster's cluster-info and
// kubeadm-config, EC2's instance types and zones) fails as the program's own diagnostic: the sentence with its key
// path, without the engine's "waiting for RPCs: marshaling properties: awaiting input property" wrapping, with
// nothing on stderr (the language host adds no message of its own for ExitStatusLoggedError) and nothing declared in
// AWS: the cluster is read and checked before the first AWS resource.
func TestPreviewChecksAreOurWords(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate      func(map[string]any)
		cloud       func(*mockcloud.Cloud)
		path, words string
	}{
		"cluster-info names the server by name": {nil, func(c *mockcloud.Cloud) {
			c.ClusterServer = "https://k8s.lab.example:6443"
		}, "dynk8s:kubernetes.serverNameResolvesInVpc", "cluster-info names the API server https://k8s.lab.example:6443 by name"},
		"cluster-info names another server": {nil, func(c *mockcloud.Cloud) {
			c.ClusterServer = "https://192.168.10.11:6443"
		}, "dynk8s:kubernetes.apiServerEndpoint", "but dynk8s:kubernetes.apiServerEndpoint is 192.168.10.10:6443"},
		"kubeadm-config: control plane older": {nil, func(c *mockcloud.Cloud) {
			c.ClusterVersion = "v1.33.6"
		}, "dynk8s:kubernetes.version", "newer than the control plane's v1.33.6"},
		"instance type EC2 does not have": {func(c map[string]any) {
			pool(c, 0)["instanceTypes"] = []any{"c5.16xlarge"}
		}, nil, "dynk8s:nodePools[0].instanceTypes[0]", `EC2 has no instance type "c5.16xlarge" in eu-central-1`},
		"more zones than the region has": {func(c map[string]any) {
			obj(c, "network")["availabilityZones"] = 4
		}, nil, "dynk8s:network.availabilityZones", "eu-central-1 has 3 available zones, 4 asked for"},
	} {
		t.Run(name, func(t *testing.T) {
			c := devConfig(t)
			if tc.mutate != nil {
				tc.mutate(c)
			}
			status, stderr, logged, cloud := engineRun(t, c, tc.cloud)
			assert.Equal(t, status, constant.ExitStatusLoggedError, "stderr: %s", stderr)
			assert.Equal(t, stderr, "", "the diagnostic is the program's only word")
			assert.Equal(t, len(logged), 1, "%q", logged)
			msg := logged[0]
			assert.Check(t, is.Contains(msg, tc.path+": "), "the diagnostic names the key path")
			assert.Check(t, is.Contains(msg, tc.words))
			for _, engine := range []string{"waiting for RPCs", "marshaling properties", "awaiting input property",
				"error occurred", "program failed"} {
				assert.Check(t, !strings.Contains(msg, engine), "the diagnostic carries %q:\n%s", engine, msg)
			}
			for _, r := range cloud.Resources() {
				assert.Check(t, !strings.HasPrefix(r.Type, "aws:"), "declared %s %s before the check failed",
					r.Type, r.Name)
			}
		})
	}
}

func TestReportMarksTheError(t *testing.T) {
	err := pulumi.RunErr(func(ctx *pulumi.Context) error {
		return infra.Report(ctx, errors.New("dynk8s:clusterName: is required"))
	}, pulumi.WithMocks(mockcloud.Project, "dev", mockcloud.New("")))
	assert.Check(t, errors.Is(err, infra.ErrReported), "%v", err)
	assert.Check(t, is.ErrorContains(err, "dynk8s:clusterName: is required"))
}
