//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes"
	"github.com/pulumi/pulumi/sdk/v3/go/auto"
	"github.com/pulumi/pulumi/sdk/v3/go/auto/optdestroy"
	"github.com/pulumi/pulumi/sdk/v3/go/auto/optup"
	"github.com/pulumi/pulumi/sdk/v3/go/common/apitype"
	"github.com/pulumi/pulumi/sdk/v3/go/common/tokens"
	"github.com/pulumi/pulumi/sdk/v3/go/common/workspace"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The engine rig: a stack of the real Pulumi engine (file backend, passphrase secrets, an inline program run in this
// process), the Kubernetes objects its state records, and the in-cluster component's program it runs.

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
		assert.NilError(t, os.MkdirAll(dirs[d], 0o700))
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
	assert.NilError(t, err, "create stack")
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

var errNoObjects = errors.New("the stack manages no Kubernetes objects")

// addonsProgram declares the real component as the stack does, against the test's API server. pools is read on
// every run, so a test can change it between updates.
func addonsProgram(c cluster, cfg *config.Config, pools *[]config.NodePool) pulumi.RunFunc {
	return func(ctx *pulumi.Context) error {
		kubeconfig, err := os.ReadFile(c.Kubeconfig)
		if err != nil {
			return err
		}
		p, err := kubernetes.NewProvider(ctx, "e2e-cluster", &kubernetes.ProviderArgs{
			Kubeconfig: pulumi.String(string(kubeconfig)),
		})
		if err != nil {
			return err
		}
		withPools := *cfg
		withPools.NodePools = *pools
		args := infra.AddonsArgs(&withPools, infra.Credentials{
			AutoscalerKeyID: pulumi.String(e2eAWSKeyID), AutoscalerSecret: pulumi.String(e2eAWSSecretKey),
			CleanupKeyID: pulumi.String(e2eCleanupKeyID), CleanupSecret: pulumi.String(e2eCleanupSecretKey),
			RotatorKeyID: pulumi.String(e2eRotatorKeyID), RotatorSecret: pulumi.String(e2eRotatorSecretKey),
		})
		// No kubelet runs here, so no workload ever becomes ready; the provider must not wait for it.
		args.SkipAwait = true
		// No pod fetches the controller here (the tests run the binary they built); its delivery is named as the
		// stack names it, with the stand-in hash of the offline plan.
		args.Controller = addons.ControllerDelivery{Bucket: pulumi.String("dynk8s-e2e-agent")}
		for _, arch := range infra.ControllerArches {
			args.Controller.Objects = append(args.Controller.Objects, addons.ControllerObject{Arch: arch,
				Key: addons.ControllerName + "/linux-" + arch.Label(), VersionID: pulumi.String("e2e"),
				SHA256: infra.StandInSHA256})
		}
		// A sleeping gateway gets the controller's wake-up, as the stack declares it (its RBAC on the autoscaler's
		// status included); the burst gives the controller moto's gateway and groups in place of these stand-ins.
		if withPools.Gateway.IdleStop > 0 && args.GroupNames == nil {
			groups := pulumi.StringMap{}
			for _, pool := range withPools.NodePools {
				groups[pool.Name] = pulumi.String("e2e-" + pool.Name)
			}
			args.GatewayInstanceID, args.GroupNames = pulumi.String("i-0e2e0000000000000"), groups
		}
		_, err = addons.NewClusterAddons(ctx, "addons", args, pulumi.Providers(p))
		return err
	}
}

// applyAddons brings the stack's addons up through the real engine, and takes them down when the test ends.
func applyAddons(ctx context.Context, t *testing.T, c cluster, cfg *config.Config) *pulumiStack {
	t.Helper()
	pools := slices.Clone(cfg.NodePools)
	st := newStack(ctx, t, c, addonsProgram(c, cfg, &pools))
	var objs []k8sObject
	t.Cleanup(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if _, err := st.Destroy(dctx, optdestroy.ProgressStreams(st.log)); err != nil {
			t.Errorf("destroy the addons: %v", err)
		}
		// The engine does not wait (SkipAwait) for what the API server deletes in the background (a DaemonSet
		// waits for its pods); the next test's addons must not meet it.
		for _, o := range objs {
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
				_, err := c.kubectl(dctx, append([]string{"get"}, o.args()...)...)
				if isNotFound(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("%s still there a minute after the destroy (%v)", o, err)
					break
				}
			}
		}
	})
	if _, err := st.Up(ctx, optup.ProgressStreams(st.log), optup.ErrorProgressStreams(st.log)); err != nil {
		t.Fatalf("up: %v", err)
	}
	var err error
	if objs, err = st.objects(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}
