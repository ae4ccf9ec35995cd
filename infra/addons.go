package infra

import (
	"errors"
	"fmt"
	"sort"

	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// ClusterAddonsType is the type token of the in-cluster component.
const ClusterAddonsType = "dynk8s:infra:ClusterAddons"

// addonsNamespace holds every namespaced object of the component: the Cluster Autoscaler, the bootstrap token and
// the system-*-critical priority classes all belong there.
const addonsNamespace = "kube-system"

// addonsSkipAwaitAnnotation tells the Kubernetes provider not to wait for a workload to become ready.
const addonsSkipAwaitAnnotation = "pulumi.com/skipAwait"

// ClusterAddons is everything dynk8s declares inside the on-prem cluster: the Cluster Autoscaler (AWS), the fuse
// device plugin, the bootstrap token Secret the nodes join with, the stale-node cleanup and the spot interruption
// drain. It takes plain values and the outputs of other components only, so that it also runs on its own against
// any API server (the real-engine tests do that).
type ClusterAddons struct {
	pulumi.ResourceState

	// AutoscalerImage is the Cluster Autoscaler image the Deployment runs.
	AutoscalerImage pulumi.StringOutput `pulumi:"autoscalerImage"`
	// BootstrapTokenSecretName is the name of the bootstrap token Secret in kube-system (bootstrap-token-<id>).
	BootstrapTokenSecretName pulumi.StringOutput `pulumi:"bootstrapTokenSecretName"`
}

// ClusterAddonsArgs are the inputs of NewClusterAddons. The Kubernetes provider is not an argument: pass it with
// pulumi.Providers(p) on the component; the children inherit it.
type ClusterAddonsArgs struct {
	// ClusterName is the cluster's name in the autoscaler's ASG discovery tag (required).
	ClusterName string
	// Region is the AWS region of the node pools, given to the autoscaler as AWS_REGION (required).
	Region string
	// KubernetesVersion is the control plane's version, e.g. "1.34.4" (required): the autoscaler version must be of
	// its minor.
	KubernetesVersion string
	// Autoscaler is the resolved autoscaler config (required): Version set (e.g. "1.34.5", see
	// ResolveAutoscalerVersion), Expander and ScaleDownUnneededTime set.
	Autoscaler AutoscalerConfig
	// Fuse configures the fuse device plugin (optional; zero value: disabled). Enabled needs Capacity > 0. Images
	// overrides the plugin image per pool arch (x86_64, arm64); missing arches take the defaults of
	// DefaultFuseImages.
	Fuse FuseConfig
	// Cleanup configures the stale-node cleanup (required: NotReadyAfter > 0).
	Cleanup CleanupConfig
	// TerminationHandler configures the spot interruption drain (optional; zero value: disabled). It is deployed
	// only when enabled and some pool is a spot pool.
	TerminationHandler TerminationHandlerConfig
	// Pools are the node pools (optional): their names, arches, spot flags and taints decide where the DaemonSets
	// run and what they tolerate.
	Pools []NodePoolConfig
	// AWSAccessKeyID is the autoscaler IAM user's access key id (required).
	AWSAccessKeyID pulumi.StringInput
	// AWSSecretAccessKey is that key's secret (required); it is kept a Pulumi secret.
	AWSSecretAccessKey pulumi.StringInput
	// BootstrapTokenID is the join token's public id, [a-z0-9]{6} (required).
	BootstrapTokenID pulumi.StringInput
	// BootstrapTokenSecret is the join token's secret part, [a-z0-9]{16} (required); it is kept a Pulumi secret.
	BootstrapTokenSecret pulumi.StringInput
	// SkipAwait annotates the workloads pulumi.com/skipAwait "true" (optional, default false): only for tests
	// against an API server without kubelets, where nothing ever becomes ready.
	SkipAwait bool
}

// NewClusterAddons declares the in-cluster parts of dynk8s.
func NewClusterAddons(ctx *pulumi.Context, name string, args *ClusterAddonsArgs,
	opts ...pulumi.ResourceOption) (*ClusterAddons, error) {
	if args == nil {
		return nil, errors.New("cluster addons: args are required")
	}
	if err := args.validate(); err != nil {
		return nil, fmt.Errorf("cluster addons %q: %w", name, err)
	}

	comp := &ClusterAddons{}
	if err := ctx.RegisterComponentResource(ClusterAddonsType, name, comp, opts...); err != nil {
		return nil, fmt.Errorf("cluster addons %q: %w", name, err)
	}
	b := &addonsBuilder{ctx: ctx, name: name, args: args, parent: pulumi.Parent(comp)}

	image, err := b.autoscaler()
	if err != nil {
		return nil, fmt.Errorf("cluster addons %q: cluster autoscaler: %w", name, err)
	}
	if err := b.fuse(); err != nil {
		return nil, fmt.Errorf("cluster addons %q: fuse device plugin: %w", name, err)
	}
	tokenName, err := b.bootstrapToken()
	if err != nil {
		return nil, fmt.Errorf("cluster addons %q: bootstrap token: %w", name, err)
	}
	if err := b.cleanup(); err != nil {
		return nil, fmt.Errorf("cluster addons %q: stale-node cleanup: %w", name, err)
	}
	if err := b.terminationHandler(); err != nil {
		return nil, fmt.Errorf("cluster addons %q: termination handler: %w", name, err)
	}

	comp.AutoscalerImage = pulumi.String(image).ToStringOutput()
	comp.BootstrapTokenSecretName = tokenName
	if err := ctx.RegisterResourceOutputs(comp, pulumi.Map{
		"autoscalerImage":          comp.AutoscalerImage,
		"bootstrapTokenSecretName": comp.BootstrapTokenSecretName,
	}); err != nil {
		return nil, fmt.Errorf("cluster addons %q: register outputs: %w", name, err)
	}
	return comp, nil
}

// validate reports every missing or unusable argument at once. Config validation has already checked the values
// with their key paths; this guards the component when it is used on its own (tests, the real-engine harness).
func (a *ClusterAddonsArgs) validate() error {
	var errs []error
	if a.ClusterName == "" {
		errs = append(errs, errors.New("missing ClusterName"))
	}
	if a.Region == "" {
		errs = append(errs, errors.New("missing Region"))
	}
	if a.Autoscaler.Version == "" {
		errs = append(errs, errors.New("missing Autoscaler.Version (resolve it with ResolveAutoscalerVersion)"))
	} else if _, err := ResolveAutoscalerVersion(a.KubernetesVersion, a.Autoscaler.Version, a.Fuse.Enabled); err != nil {
		errs = append(errs, fmt.Errorf("invalid Autoscaler.Version: %w", err))
	}
	if a.Autoscaler.Expander == "" {
		errs = append(errs, errors.New("missing Autoscaler.Expander"))
	}
	if a.Autoscaler.ScaleDownUnneededTime == "" {
		errs = append(errs, errors.New("missing Autoscaler.ScaleDownUnneededTime"))
	}
	if a.Fuse.Enabled && a.Fuse.Capacity <= 0 {
		errs = append(errs, fmt.Errorf("invalid Fuse.Capacity %d: must be > 0 when fuse is enabled", a.Fuse.Capacity))
	}
	if a.Cleanup.NotReadyAfter <= 0 {
		errs = append(errs, fmt.Errorf("invalid Cleanup.NotReadyAfter %s: must be > 0", a.Cleanup.NotReadyAfter))
	}
	for field, in := range map[string]pulumi.StringInput{
		"AWSAccessKeyID":       a.AWSAccessKeyID,
		"AWSSecretAccessKey":   a.AWSSecretAccessKey,
		"BootstrapTokenID":     a.BootstrapTokenID,
		"BootstrapTokenSecret": a.BootstrapTokenSecret,
	} {
		if in == nil {
			errs = append(errs, fmt.Errorf("missing %s", field))
		}
	}
	if a.Fuse.Enabled {
		for _, arch := range addonsPoolArches(a.Pools) {
			if _, err := fuseImage(a.Fuse, arch); err != nil {
				errs = append(errs, err)
			}
		}
	}
	addonsSortErrors(errs)
	return errors.Join(errs...)
}

// addonsSortErrors orders errors by message so that the report does not depend on map iteration.
func addonsSortErrors(errs []error) {
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
}

// addonsBuilder carries what every part of the component needs.
type addonsBuilder struct {
	ctx    *pulumi.Context
	name   string
	args   *ClusterAddonsArgs
	parent pulumi.ResourceOption
}

// childName is the Pulumi name of a child: the component's name plus a kebab-case suffix.
func (b *addonsBuilder) childName(suffix string) string { return b.name + "-" + suffix }

// objectMeta is the metadata of a component object: an explicit name (no auto-naming suffix, so the object is
// stable and can be found by name), the namespace when namespaced, and the common labels.
func (b *addonsBuilder) objectMeta(name, namespace, component string) *metav1.ObjectMetaArgs {
	meta := &metav1.ObjectMetaArgs{
		Name:   pulumi.String(name),
		Labels: addonsLabels(component),
	}
	if namespace != "" {
		meta.Namespace = pulumi.String(namespace)
	}
	return meta
}

// workloadMeta is objectMeta plus the skipAwait annotation when the args ask for it.
func (b *addonsBuilder) workloadMeta(name, component string) *metav1.ObjectMetaArgs {
	meta := b.objectMeta(name, addonsNamespace, component)
	if b.args.SkipAwait {
		meta.Annotations = pulumi.StringMap{addonsSkipAwaitAnnotation: pulumi.String("true")}
	}
	return meta
}

// addonsLabels are the labels on every object of the component.
func addonsLabels(component string) pulumi.StringMap {
	return pulumi.StringMap{
		"app.kubernetes.io/name":       pulumi.String(component),
		"app.kubernetes.io/part-of":    pulumi.String("dynk8s"),
		"app.kubernetes.io/managed-by": pulumi.String("pulumi"),
	}
}

// addonsSelector is the immutable selector of a workload: only the name label, so relabelling never forces a
// replacement.
func addonsSelector(component string) *metav1.LabelSelectorArgs {
	return &metav1.LabelSelectorArgs{
		MatchLabels: pulumi.StringMap{"app.kubernetes.io/name": pulumi.String(component)},
	}
}

// addonsTolerations tolerates every taint of pools: a DaemonSet that must run on the pool nodes cannot rely on the
// nodes being untainted. The result is sorted and without duplicates, so the same pools give the same spec.
func addonsTolerations(pools []NodePoolConfig) corev1.TolerationArray {
	seen := map[Taint]bool{}
	var taints []Taint
	for _, p := range pools {
		for _, t := range p.Taints {
			if !seen[t] {
				seen[t] = true
				taints = append(taints, t)
			}
		}
	}
	sort.Slice(taints, func(i, j int) bool {
		a, b := taints[i], taints[j]
		if a.Key != b.Key {
			return a.Key < b.Key
		}
		if a.Value != b.Value {
			return a.Value < b.Value
		}
		return a.Effect < b.Effect
	})
	var out corev1.TolerationArray
	for _, t := range taints {
		tol := &corev1.TolerationArgs{Key: pulumi.String(t.Key), Effect: pulumi.String(t.Effect)}
		if t.Value == "" {
			tol.Operator = pulumi.String("Exists")
		} else {
			tol.Operator = pulumi.String("Equal")
			tol.Value = pulumi.String(t.Value)
		}
		out = append(out, tol)
	}
	return out
}

// addonsPoolArches returns the distinct arches of pools, sorted.
func addonsPoolArches(pools []NodePoolConfig) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range pools {
		if !seen[p.Arch] {
			seen[p.Arch] = true
			out = append(out, p.Arch)
		}
	}
	sort.Strings(out)
	return out
}

// addonsKubeArch maps a pool arch (the EC2 name) to the kubernetes.io/arch label value (the Go name).
func addonsKubeArch(arch string) (string, error) {
	switch arch {
	case "x86_64":
		return "amd64", nil
	case "arm64":
		return "arm64", nil
	}
	return "", fmt.Errorf("unknown pool arch %q (want x86_64 or arm64)", arch)
}

// addonsPoolAffinity requires (exists true) or forbids (exists false) the pool label every dynk8s pool node sets.
func addonsPoolAffinity(exists bool) *corev1.AffinityArgs {
	op := "DoesNotExist"
	if exists {
		op = "Exists"
	}
	return &corev1.AffinityArgs{
		NodeAffinity: &corev1.NodeAffinityArgs{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelectorArgs{
				NodeSelectorTerms: corev1.NodeSelectorTermArray{
					&corev1.NodeSelectorTermArgs{
						MatchExpressions: corev1.NodeSelectorRequirementArray{
							&corev1.NodeSelectorRequirementArgs{
								Key:      pulumi.String(LabelPool),
								Operator: pulumi.String(op),
							},
						},
					},
				},
			},
		},
	}
}

// addonsResources is a requirements block with the same shape everywhere: cpu and memory requests and limits.
func addonsResources(cpuRequest, memRequest, cpuLimit, memLimit string) *corev1.ResourceRequirementsArgs {
	return &corev1.ResourceRequirementsArgs{
		Requests: pulumi.StringMap{"cpu": pulumi.String(cpuRequest), "memory": pulumi.String(memRequest)},
		Limits:   pulumi.StringMap{"cpu": pulumi.String(cpuLimit), "memory": pulumi.String(memLimit)},
	}
}

// addonsRestrictedContainer is the container security context of the restricted Pod Security profile: no privilege
// escalation, no capabilities, read-only root; runAsUser > 0 also makes it non-root.
func addonsRestrictedContainer(runAsUser int) *corev1.SecurityContextArgs {
	sc := &corev1.SecurityContextArgs{
		AllowPrivilegeEscalation: pulumi.Bool(false),
		ReadOnlyRootFilesystem:   pulumi.Bool(true),
		Capabilities:             &corev1.CapabilitiesArgs{Drop: pulumi.StringArray{pulumi.String("ALL")}},
		SeccompProfile:           &corev1.SeccompProfileArgs{Type: pulumi.String("RuntimeDefault")},
	}
	if runAsUser > 0 {
		sc.RunAsNonRoot = pulumi.Bool(true)
		sc.RunAsUser = pulumi.Int(runAsUser)
		sc.RunAsGroup = pulumi.Int(runAsUser)
	}
	return sc
}

// addonsNonRootPod is the pod security context of a non-root workload.
func addonsNonRootPod(uid int) *corev1.PodSecurityContextArgs {
	return &corev1.PodSecurityContextArgs{
		RunAsNonRoot:   pulumi.Bool(true),
		RunAsUser:      pulumi.Int(uid),
		RunAsGroup:     pulumi.Int(uid),
		FsGroup:        pulumi.Int(uid),
		SeccompProfile: &corev1.SeccompProfileArgs{Type: pulumi.String("RuntimeDefault")},
	}
}

// serviceAccount declares a ServiceAccount in kube-system.
func (b *addonsBuilder) serviceAccount(suffix, name, component string) (*corev1.ServiceAccount, error) {
	sa, err := corev1.NewServiceAccount(b.ctx, b.childName(suffix), &corev1.ServiceAccountArgs{
		Metadata: b.objectMeta(name, addonsNamespace, component),
	}, b.parent)
	if err != nil {
		return nil, fmt.Errorf("service account %s: %w", name, err)
	}
	return sa, nil
}
