//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The control plane rig: the throwaway control plane hack/start-kube.sh started (cluster), the real tools a test
// needs or skips without (requireTool), kubectl as its admin, the shapes of the objects the tests read, and the
// processes a test starts and stops with itself (stopOnCleanup).

// cluster is the control plane hack/start-kube.sh started for this run.
type cluster struct {
	// Kubeconfig is the admin kubeconfig's path.
	Kubeconfig string
	// Server is the API server's https URL on loopback.
	Server string
	// CAFile is the cluster CA certificate (PEM).
	CAFile string
}

// requireCluster returns the control plane, skipping the test without one unless DYNK8S_REQUIRE_TOOLS is set.
// An ambient KUBECONFIG is deliberately not enough: these tests create and delete cluster-wide objects.
func requireCluster(t *testing.T) cluster {
	t.Helper()
	c := cluster{
		Kubeconfig: os.Getenv("DYNK8S_E2E_KUBECONFIG"),
		Server:     os.Getenv("DYNK8S_E2E_SERVER"),
		CAFile:     os.Getenv("DYNK8S_E2E_CA"),
	}
	if c.Kubeconfig == "" || c.Server == "" || c.CAFile == "" {
		missing(t, "a control plane from hack/start-kube.sh (DYNK8S_E2E_KUBECONFIG, DYNK8S_E2E_SERVER, DYNK8S_E2E_CA)")
	}
	requireTool(t, "kubectl")
	return c
}

// requireTool skips when a real tool is missing, unless DYNK8S_REQUIRE_TOOLS is set (as CI does).
func requireTool(t *testing.T, name string) string {
	t.Helper()
	return realtools.Require(t, name)
}

// missing skips the test for lack of what, or fails it under DYNK8S_REQUIRE_TOOLS.
func missing(t *testing.T, what string) {
	t.Helper()
	realtools.Missing(t, what)
}

// kubectl runs kubectl as the cluster admin and returns its stdout; the error carries stderr.
func (c cluster) kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err,
			strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// getJSON reads one object as JSON into v.
func (c cluster) getJSON(ctx context.Context, v any, args ...string) error {
	out, err := c.kubectl(ctx, append(append([]string{"get"}, args...), "-o", "json")...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("decode kubectl get %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// isNotFound tells a kubectl NotFound apart from every other failure (which must not count as "gone").
func isNotFound(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "NotFound") || strings.Contains(err.Error(), "not found"))
}

// templateSpec is the part of a pod template's spec the tests read, as kubectl -o json and the plan's inputs spell it.
type templateSpec struct {
	ServiceAccountName string `json:"serviceAccountName"`
	Containers         []struct {
		Image   string   `json:"image"`
		Command []string `json:"command"`
		Args    []string `json:"args"`
		Env     []struct {
			Name      string `json:"name"`
			Value     string `json:"value"`
			ValueFrom *struct {
				SecretKeyRef *struct{ Name, Key string } `json:"secretKeyRef"`
			} `json:"valueFrom"`
		} `json:"env"`
	} `json:"containers"`
}

// applyJSON creates an object from its JSON form.
func applyJSON(ctx context.Context, t *testing.T, c cluster, obj any) {
	t.Helper()
	kubectlJSON(ctx, t, c, "create", obj)
}

// kubectlJSON runs kubectl verb (create, replace) with obj as its input.
func kubectlJSON(ctx context.Context, t *testing.T, c cluster, verb string, obj any) {
	t.Helper()
	doc, err := json.Marshal(obj)
	assert.NilError(t, err)
	cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", c.Kubeconfig, verb, "-f", "-")
	cmd.Stdin = bytes.NewReader(doc)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s\n%s", verb, err, out, doc)
	}
}

// waitEvent waits for an event with reason on the object, last seen at or after since (events outlive the objects
// of an earlier run against the same cluster), and returns its message.
func waitEvent(ctx context.Context, t *testing.T, c cluster, ns, object, reason string, since time.Time,
	timeout time.Duration) string {
	t.Helper()
	since = since.Truncate(time.Second) // event timestamps have second resolution
	deadline := time.Now().Add(timeout)
	for {
		var list struct {
			Items []struct {
				Message       string    `json:"message"`
				LastTimestamp time.Time `json:"lastTimestamp"`
			} `json:"items"`
		}
		err := c.getJSON(ctx, &list, "events", "-n", ns,
			"--field-selector", "involvedObject.name="+object+",reason="+reason)
		for i := len(list.Items) - 1; err == nil && i >= 0; i-- {
			if !list.Items[i].LastTimestamp.Before(since) {
				return list.Items[i].Message
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("no %s event on %s/%s after %s (last error: %v)", reason, ns, object, timeout, err)
		}
		time.Sleep(time.Second)
	}
}

// stopOnCleanup starts cmd and stops it (SIGTERM, then SIGKILL after 5 s) when the test ends, logging its output if
// the test failed. The returned channel is closed when the process has exited.
func stopOnCleanup(t *testing.T, name string, cmd *exec.Cmd, logs *nodetest.SyncBuffer) chan struct{} {
	t.Helper()
	assert.NilError(t, cmd.Start(), "start %s", name)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output (last lines):\n%s", name, tail(logs.String(), 80))
		}
		// The whole log beside the control plane's (hack/start-kube.sh keeps them with DYNK8S_KEEP_KUBE_DIR).
		if dir := os.Getenv("DYNK8S_E2E_DIR"); dir != "" {
			file := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + name + ".log"
			_ = os.WriteFile(filepath.Join(dir, "logs", file), []byte(logs.String()), 0o600)
		}
	})
	return done
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// kubeNode is the part of a v1 Node this test reads.
type kubeNode struct {
	Metadata struct {
		Name              string            `json:"name"`
		UID               string            `json:"uid"`
		CreationTimestamp time.Time         `json:"creationTimestamp"`
		Labels            map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		ProviderID string       `json:"providerID"`
		Taints     []kube.Taint `json:"taints"`
	} `json:"spec"`
	Status struct {
		Allocatable map[string]string `json:"allocatable"`
		Addresses   []struct {
			Type    string `json:"type"`
			Address string `json:"address"`
		} `json:"addresses"`
		Conditions []struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

// hasTaint: the Node carries a taint with key.
func (n kubeNode) hasTaint(key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t kube.Taint) bool { return t.Key == key })
}

func (n kubeNode) ready() bool {
	for _, c := range n.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}
