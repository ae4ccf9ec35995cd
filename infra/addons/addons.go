// Package addons is the in-cluster half of dynk8s: the ClusterAddons component declares the Cluster Autoscaler
// (AWS provider), the fuse device plugin, dynk8s-controller (the CSR approval, the join token rotation, the
// stale-node cleanup and the fuse startup taint's removal), the admission policies and the spot interruption drain
// in the on-prem cluster, through the Kubernetes provider it is given. It knows nothing of the AWS components: they
// hand it plain values and outputs.
package addons

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// ClusterAddonsType is the type token of the in-cluster component. It is part of every child's URN, so it keeps the
// "infra" module of the package the component was first declared in: a new token would replace every object.
const ClusterAddonsType = "dynk8s:infra:ClusterAddons"

// namespace holds every namespaced object of the component: the Cluster Autoscaler, the bootstrap token and
// the system-*-critical priority classes all belong there.
const namespace = "kube-system"

// skipAwaitAnnotation tells the Kubernetes provider not to wait for a workload to become ready.
const skipAwaitAnnotation = "pulumi.com/skipAwait"

// ClusterAddons is everything dynk8s declares inside the on-prem cluster: the Cluster Autoscaler (AWS), the fuse
// device plugin, dynk8s-controller (which approves the kubelets' certificates, issues the join tokens, deletes stale
// Nodes and lifts the fuse startup taint), the admission policies and the spot interruption drain. It takes plain
// values and the outputs of other components only, so that it also runs on its own against any API server (the
// real-engine tests do that).
type ClusterAddons struct {
	pulumi.ResourceState

	// AutoscalerImage is the Cluster Autoscaler image the Deployment runs.
	AutoscalerImage pulumi.StringOutput `pulumi:"autoscalerImage"`
}

// ClusterAddonsArgs are the inputs of NewClusterAddons. The Kubernetes provider is not an argument: pass it with
// pulumi.Providers(p) on the component; the children inherit it.
type ClusterAddonsArgs struct {
	// ClusterName is the cluster's name in the autoscaler's ASG discovery tag (required).
	ClusterName string
	// Region is the AWS region of the node pools, given to the autoscaler as AWS_REGION (required).
	Region string
	// Autoscaler configures the Cluster Autoscaler (required: Expander and ScaleDownUnneededTime set; Version is
	// ignored in favour of AutoscalerVersion).
	Autoscaler config.Autoscaler
	// AutoscalerVersion is the Cluster Autoscaler release to run (required), as config resolves it.
	AutoscalerVersion kube.Version
	// Fuse configures the fuse device plugin (optional; zero value: disabled). Enabled needs Capacity > 0. Images
	// overrides the plugin image per pool arch; missing arches take the defaults.
	Fuse config.Fuse
	// Cleanup configures the stale-node cleanup (required: NotReadyAfter > 0).
	Cleanup config.Cleanup
	// TerminationHandler configures the spot interruption drain (optional; zero value: disabled). It is deployed
	// only when enabled and some pool is a spot pool.
	TerminationHandler config.TerminationHandler
	// Pools are the node pools (optional): their names, arches, spot flags and taints decide where the DaemonSets
	// run and what they tolerate.
	Pools []config.NodePool
	// GroupNames are the Auto Scaling group of each pool, by pool name (required with the priority expander, whose
	// ConfigMap ranks the groups by name).
	GroupNames pulumi.StringMapInput
	// GatewayInstanceID is the sleeping WireGuard gateway's instance (optional; nil: the gateway never sleeps).
	// With it and GroupNames, the controller starts the gateway when the autoscaler raises one of the groups.
	GatewayInstanceID pulumi.StringInput
	// Images overrides the images the component runs (optional; each empty field takes its default, a tag).
	Images config.Images
	// OnPremNodes are the on-prem Nodes a kubelet may register without the pool label (optional; empty: any).
	OnPremNodes []string
	// AWSAccessKeyID is the autoscaler IAM user's access key id (required).
	AWSAccessKeyID pulumi.StringInput
	// AWSSecretAccessKey is that key's secret (required); it is kept a Pulumi secret.
	AWSSecretAccessKey pulumi.StringInput
	// CleanupAWSAccessKeyID is the stale-node cleanup IAM user's access key id (required): the cleanup asks EC2
	// whether an instance is gone before it deletes its Node.
	CleanupAWSAccessKeyID pulumi.StringInput
	// CleanupAWSSecretAccessKey is that key's secret (required); it is kept a Pulumi secret.
	CleanupAWSSecretAccessKey pulumi.StringInput
	// JoinTokenParameter is the name of the SSM SecureString the nodes read their join token from (required); the
	// token rotator overwrites it.
	JoinTokenParameter string
	// JoinTokenParameterResource is the Pulumi resource that declares that parameter (optional): the controller
	// runs after it exists, so its first PutParameter never creates the parameter before Pulumi does
	// (ParameterAlreadyExists).
	JoinTokenParameterResource pulumi.Resource
	// BootstrapTokenTTL is the lifetime of each join token (required, at least config.MinBootstrapTokenTTL); the
	// controller issues a new one every config.BootstrapTokenRotationPeriod of it.
	BootstrapTokenTTL time.Duration
	// BootstrapTokenRotation is the operator's rotation value (required): a new value rolls the controller, whose
	// new leader issues a token at once.
	BootstrapTokenRotation string
	// Controller is where the controller's init container fetches the controller (required: the bucket and one
	// object per architecture).
	Controller ControllerDelivery
	// TokenRotatorAccessKeyID is the token rotator IAM user's access key id (required).
	TokenRotatorAccessKeyID pulumi.StringInput
	// TokenRotatorSecretAccessKey is that key's secret (required); it is kept a Pulumi secret.
	TokenRotatorSecretAccessKey pulumi.StringInput
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
	b := &builder{ctx: ctx, name: name, args: args, parent: pulumi.Parent(comp)}

	image, err := b.autoscaler()
	if err != nil {
		return nil, fmt.Errorf("cluster addons %q: cluster autoscaler: %w", name, err)
	}
	if err := b.fuse(); err != nil {
		return nil, fmt.Errorf("cluster addons %q: fuse device plugin: %w", name, err)
	}
	rotatorCreds, tokenPolicy, err := b.tokenRotator()
	if err != nil {
		return nil, fmt.Errorf("cluster addons %q: join token rotation: %w", name, err)
	}
	cleanupCreds, err := b.cleanupCredentials()
	if err != nil {
		return nil, fmt.Errorf("cluster addons %q: stale-node cleanup: %w", name, err)
	}
	after := []pulumi.Resource{tokenPolicy}
	if a := args.JoinTokenParameterResource; a != nil {
		after = append(after, a)
	}
	if err := b.controller(cleanupCreds, rotatorCreds, after); err != nil {
		return nil, fmt.Errorf("cluster addons %q: controller: %w", name, err)
	}
	if err := b.terminationHandler(); err != nil {
		return nil, fmt.Errorf("cluster addons %q: termination handler: %w", name, err)
	}
	if err := b.nodeAdmission(); err != nil {
		return nil, fmt.Errorf("cluster addons %q: node admission: %w", name, err)
	}

	comp.AutoscalerImage = pulumi.String(image).ToStringOutput()
	if err := ctx.RegisterResourceOutputs(comp, pulumi.Map{
		"autoscalerImage": comp.AutoscalerImage,
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
	if a.AutoscalerVersion.IsZero() {
		errs = append(errs, errors.New("missing AutoscalerVersion"))
	}
	if a.Autoscaler.Expander == "" {
		errs = append(errs, errors.New("missing Autoscaler.Expander"))
	}
	if usesPriorityExpander(a.Autoscaler) && a.GroupNames == nil {
		errs = append(errs, errors.New("missing GroupNames: the priority expander ranks the pools' groups by name"))
	}
	if a.Autoscaler.ScaleDownUnneededTime == "" {
		errs = append(errs, errors.New("missing Autoscaler.ScaleDownUnneededTime"))
	}
	if a.Autoscaler.MaxNodeProvisionTime <= 0 {
		errs = append(errs, fmt.Errorf("invalid Autoscaler.MaxNodeProvisionTime %s: must be > 0",
			a.Autoscaler.MaxNodeProvisionTime))
	}
	if a.Autoscaler.ScaleDownUnreadyTime <= 0 {
		errs = append(errs, fmt.Errorf("invalid Autoscaler.ScaleDownUnreadyTime %s: must be > 0",
			a.Autoscaler.ScaleDownUnreadyTime))
	}
	if a.Fuse.Enabled && a.Fuse.Capacity <= 0 {
		errs = append(errs, fmt.Errorf("invalid Fuse.Capacity %d: must be > 0 when fuse is enabled", a.Fuse.Capacity))
	}
	if a.Cleanup.NotReadyAfter <= 0 {
		errs = append(errs, fmt.Errorf("invalid Cleanup.NotReadyAfter %s: must be > 0", a.Cleanup.NotReadyAfter))
	}
	if a.JoinTokenParameter == "" {
		errs = append(errs, errors.New("missing JoinTokenParameter"))
	}
	if a.BootstrapTokenTTL < config.MinBootstrapTokenTTL || a.BootstrapTokenTTL > config.MaxBootstrapTokenTTL {
		errs = append(errs, fmt.Errorf("invalid BootstrapTokenTTL %s: must be %s..%s", a.BootstrapTokenTTL,
			config.MinBootstrapTokenTTL, config.MaxBootstrapTokenTTL))
	}
	if a.BootstrapTokenRotation == "" {
		errs = append(errs, errors.New("missing BootstrapTokenRotation"))
	}
	if a.Controller.Bucket == nil || len(a.Controller.Objects) == 0 {
		errs = append(errs, errors.New("missing Controller: the bucket and the objects the controller is fetched from"))
	}
	for field, in := range map[string]pulumi.StringInput{
		"AWSAccessKeyID":              a.AWSAccessKeyID,
		"AWSSecretAccessKey":          a.AWSSecretAccessKey,
		"CleanupAWSAccessKeyID":       a.CleanupAWSAccessKeyID,
		"CleanupAWSSecretAccessKey":   a.CleanupAWSSecretAccessKey,
		"TokenRotatorAccessKeyID":     a.TokenRotatorAccessKeyID,
		"TokenRotatorSecretAccessKey": a.TokenRotatorSecretAccessKey,
	} {
		if in == nil {
			errs = append(errs, fmt.Errorf("missing %s", field))
		}
	}
	if a.Fuse.Enabled {
		for _, p := range a.Pools {
			if _, err := FuseImage(a.Fuse, p.Arch); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(sortErrors(errs)...)
}

// sortErrors orders errors by message and drops repeats, so that the report does not depend on map iteration.
func sortErrors(errs []error) []error {
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return slices.CompactFunc(errs, func(a, b error) bool { return a.Error() == b.Error() })
}

// builder carries what every part of the component needs.
type builder struct {
	ctx    *pulumi.Context
	name   string
	args   *ClusterAddonsArgs
	parent pulumi.ResourceOption
}

// childName is the Pulumi name of a child: the component's name plus a kebab-case suffix.
func (b *builder) childName(suffix string) string { return b.name + "-" + suffix }

// objectMeta is the metadata of a component object: an explicit name (no auto-naming suffix, so the object is
// stable and can be found by name), the namespace when namespaced, and the common labels.
func (b *builder) objectMeta(name, namespace, component string) *metav1.ObjectMetaArgs {
	meta := &metav1.ObjectMetaArgs{
		Name:   pulumi.String(name),
		Labels: commonLabels(component),
	}
	if namespace != "" {
		meta.Namespace = pulumi.String(namespace)
	}
	return meta
}

// workloadMeta is objectMeta plus the skipAwait annotation when the args ask for it.
func (b *builder) workloadMeta(name, component string) *metav1.ObjectMetaArgs {
	meta := b.objectMeta(name, namespace, component)
	if b.args.SkipAwait {
		meta.Annotations = pulumi.StringMap{skipAwaitAnnotation: pulumi.String("true")}
	}
	return meta
}

// commonLabels are the labels on every object of the component.
func commonLabels(component string) pulumi.StringMap {
	return pulumi.StringMap{
		"app.kubernetes.io/name":       pulumi.String(component),
		"app.kubernetes.io/part-of":    pulumi.String("dynk8s"),
		"app.kubernetes.io/managed-by": pulumi.String("pulumi"),
	}
}

// selector is the immutable selector of a workload: only the name label, so relabelling never forces a
// replacement.
func selector(component string) *metav1.LabelSelectorArgs {
	return &metav1.LabelSelectorArgs{
		MatchLabels: pulumi.StringMap{"app.kubernetes.io/name": pulumi.String(component)},
	}
}

// tolerations tolerates every taint of pools, and the fuse startup taint: a DaemonSet that must run on the pool
// nodes cannot rely on the nodes being untainted. The result is sorted and without duplicates, so the same pools
// give the same spec.
func tolerations(pools []config.NodePool) corev1.TolerationArray {
	var out corev1.TolerationArray
	for _, t := range config.PoolTolerations(pools) {
		tol := &corev1.TolerationArgs{Key: pulumi.String(t.Key), Effect: pulumi.String(string(t.Effect))}
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

// poolAffinity requires the pool label every dynk8s pool node sets: the DaemonSets that serve the pool nodes.
func poolAffinity() *corev1.AffinityArgs {
	return requireLabels(map[string]string{kube.LabelPool: "Exists"})
}

// onPremAffinity holds a pod to the on-prem Nodes: those the operator labelled kube.LabelOnPrem, which no kubelet
// can set, and that carry no pool label (a pool node's kubelet can shed or change its pool label only where the
// node policy fails to stop it, and the positive label does not depend on that). The workloads that hold the
// stack's AWS keys or approve node certificates run only there.
func onPremAffinity() *corev1.AffinityArgs {
	return requireLabels(map[string]string{kube.LabelOnPrem: "Exists", kube.LabelPool: "DoesNotExist"})
}

// requireLabels is a required node affinity of one term: each label key with its operator (Exists, DoesNotExist),
// in key order.
func requireLabels(ops map[string]string) *corev1.AffinityArgs {
	var exprs corev1.NodeSelectorRequirementArray
	for _, key := range slices.Sorted(maps.Keys(ops)) {
		exprs = append(exprs, &corev1.NodeSelectorRequirementArgs{
			Key: pulumi.String(key), Operator: pulumi.String(ops[key]),
		})
	}
	return &corev1.AffinityArgs{
		NodeAffinity: &corev1.NodeAffinityArgs{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelectorArgs{
				NodeSelectorTerms: corev1.NodeSelectorTermArray{
					&corev1.NodeSelectorTermArgs{MatchExpressions: exprs},
				},
			},
		},
	}
}

// resources is a requirements block with the same shape everywhere: the cpu and memory requests and limits set.
func resources(requests, limits config.Resources) *corev1.ResourceRequirementsArgs {
	return &corev1.ResourceRequirementsArgs{
		Requests: pulumi.ToStringMap(requests.Quantities()),
		Limits:   pulumi.ToStringMap(limits.Quantities()),
	}
}

// restrictedContainer is the container security context of the restricted Pod Security profile: no privilege
// escalation, no capabilities, read-only root; runAsUser > 0 also makes it non-root.
func restrictedContainer(runAsUser int) *corev1.SecurityContextArgs {
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

// nonRootPod is the pod security context of a non-root workload.
func nonRootPod(uid int) *corev1.PodSecurityContextArgs {
	return &corev1.PodSecurityContextArgs{
		RunAsNonRoot:   pulumi.Bool(true),
		RunAsUser:      pulumi.Int(uid),
		RunAsGroup:     pulumi.Int(uid),
		FsGroup:        pulumi.Int(uid),
		SeccompProfile: &corev1.SeccompProfileArgs{Type: pulumi.String("RuntimeDefault")},
	}
}

// serviceAccount declares a ServiceAccount in kube-system.
func (b *builder) serviceAccount(suffix, name, component string) (*corev1.ServiceAccount, error) {
	sa, err := corev1.NewServiceAccount(b.ctx, b.childName(suffix), &corev1.ServiceAccountArgs{
		Metadata: b.objectMeta(name, namespace, component),
	}, b.parent)
	if err != nil {
		return nil, fmt.Errorf("service account %s: %w", name, err)
	}
	return sa, nil
}
