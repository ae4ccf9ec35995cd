//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/auto"
	"github.com/pulumi/pulumi/sdk/v3/go/common/apitype"
	"github.com/pulumi/pulumi/sdk/v3/go/common/tokens"
	"github.com/pulumi/pulumi/sdk/v3/go/common/workspace"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

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

// pulumiStack is a stack on a file backend in a temp dir, with the passphrase secrets provider, whose inline
// program runs in this test process (so no Go language host is needed).
type pulumiStack struct {
	auto.Stack
	log *nodetest.SyncBuffer
}

const (
	projectName = "dynk8s-e2e"
	stackName   = "e2e"
	// The passphrase guards only this run's throwaway state.
	passphrase = "dynk8s-e2e-passphrase"
)

func newStack(ctx context.Context, t *testing.T, c cluster, program pulumi.RunFunc) *pulumiStack {
	t.Helper()
	requireTool(t, "pulumi")
	requireTool(t, "pulumi-resource-kubernetes")
	root := t.TempDir()
	backend := "file://" + filepath.Join(root, "state")
	dirs := map[string]string{}
	for _, d := range []string{"state", "home", "work"} {
		dirs[d] = filepath.Join(root, d)
		if err := os.MkdirAll(dirs[d], 0o700); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{
		"PULUMI_CONFIG_PASSPHRASE": passphrase,
		"PULUMI_BACKEND_URL":       backend,
		"PULUMI_SKIP_UPDATE_CHECK": "true",
		// The provider plugin comes from PATH; anything else would be a download, which cannot work here, so fail
		// at once rather than after five retries.
		"PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
		"KUBECONFIG": c.Kubeconfig,
	}
	proj := workspace.Project{
		Name:    tokens.PackageName(projectName),
		Runtime: workspace.NewProjectRuntimeInfo("go", nil),
		Backend: &workspace.ProjectBackend{URL: backend},
	}
	s, err := auto.UpsertStackInlineSource(ctx, stackName, projectName, program,
		auto.Project(proj), auto.PulumiHome(dirs["home"]), auto.WorkDir(dirs["work"]),
		auto.SecretsProvider("passphrase"), auto.EnvVars(env))
	if err != nil {
		t.Fatalf("create stack: %v", err)
	}
	ps := &pulumiStack{Stack: s, log: &nodetest.SyncBuffer{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("engine output:\n%s", ps.log.String())
		}
	})
	return ps
}

// k8sObject is one Kubernetes object the stack manages, as recorded in its state.
type k8sObject struct {
	URN        string
	APIVersion string
	Kind       string
	Namespace  string
	Name       string
	UID        string
}

// ref is the kubectl resource argument, fully qualified (kind.version.group) so that no short name or
// preferred-version guess can pick another resource.
func (o k8sObject) ref() string {
	group, version := "", o.APIVersion
	if i := strings.IndexByte(o.APIVersion, '/'); i >= 0 {
		group, version = o.APIVersion[:i], o.APIVersion[i+1:]
	}
	return o.Kind + "." + version + "." + group
}

func (o k8sObject) args() []string {
	a := []string{o.ref(), o.Name}
	if o.Namespace != "" {
		a = append(a, "-n", o.Namespace)
	}
	return a
}

func (o k8sObject) String() string {
	if o.Namespace == "" {
		return o.Kind + " " + o.Name
	}
	return o.Kind + " " + o.Namespace + "/" + o.Name
}

// objects lists the Kubernetes objects in the stack's state, sorted, read from an exported deployment so that
// the check covers whatever the component declares, not a list kept by hand.
func (s *pulumiStack) objects(ctx context.Context) ([]k8sObject, error) {
	dep, err := s.Export(ctx)
	if err != nil {
		return nil, fmt.Errorf("export stack: %w", err)
	}
	var d apitype.DeploymentV3
	if err := json.Unmarshal(dep.Deployment, &d); err != nil {
		return nil, fmt.Errorf("decode deployment (version %d): %w", dep.Version, err)
	}
	var objs []k8sObject
	for _, r := range d.Resources {
		if !r.Custom || !strings.HasPrefix(string(r.Type), "kubernetes:") ||
			strings.HasPrefix(string(r.Type), "pulumi:providers:") {
			continue
		}
		meta, _ := r.Outputs["metadata"].(map[string]any)
		o := k8sObject{URN: string(r.URN)}
		o.APIVersion, _ = r.Outputs["apiVersion"].(string)
		o.Kind, _ = r.Outputs["kind"].(string)
		o.Name, _ = meta["name"].(string)
		o.Namespace, _ = meta["namespace"].(string)
		o.UID, _ = meta["uid"].(string)
		if o.APIVersion == "" || o.Kind == "" || o.Name == "" {
			return nil, fmt.Errorf("resource %s: no apiVersion/kind/metadata.name in its outputs", r.URN)
		}
		objs = append(objs, o)
	}
	sort.Slice(objs, func(i, j int) bool { return objs[i].String() < objs[j].String() })
	return objs, nil
}

// changes returns an operation summary without the "same" entries, e.g. map[update:1].
func changes(summary map[string]int) map[string]int {
	out := map[string]int{}
	for op, n := range summary {
		if op != "same" && n != 0 {
			out[op] = n
		}
	}
	return out
}

// isNotFound tells a kubectl NotFound apart from every other failure (which must not count as "gone").
func isNotFound(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "NotFound") || strings.Contains(err.Error(), "not found"))
}

var errNoObjects = errors.New("the stack manages no Kubernetes objects")

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

// cronJob is a CronJob as the tests read it.
type cronJob struct {
	Spec struct {
		JobTemplate struct {
			Spec struct {
				Template struct {
					Spec templateSpec `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		} `json:"jobTemplate"`
	} `json:"spec"`
}
