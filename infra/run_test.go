package infra_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/common/constant"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/internal/mockcloud"
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
		c := mockcloud.New(sc.Values["aws:region"])
		if mutate != nil {
			mutate(c)
		}
		return c
	}
	cloud := newCloud()
	t.Setenv(pulumi.EnvConfig, mustJSON(t, sc.Values))
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
	assert.Check(t, is.Contains(logged[0], "dynk8s:autoscalr: unknown key (known keys here: autoscaler, "))
	assert.Equal(t, len(cloud.Resources()), 0, "nothing declared")

	status, stderr, logged, cloud = engineRun(t, devConfig(t), nil)
	assert.Equal(t, status, 0, "the dev stack runs: %s %q", stderr, logged)
	assert.Check(t, len(cloud.Resources()) > 40)
}

func TestReportMarksTheError(t *testing.T) {
	err := pulumi.RunErr(func(ctx *pulumi.Context) error {
		return infra.Report(ctx, errors.New("dynk8s:clusterName: is required"))
	}, pulumi.WithMocks(mockcloud.Project, "dev", mockcloud.New("")))
	assert.Check(t, errors.Is(err, infra.ErrReported), "%v", err)
	assert.Check(t, is.ErrorContains(err, "dynk8s:clusterName: is required"))
}
