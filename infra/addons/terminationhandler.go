package addons

import (
	"fmt"
	"strconv"

	appsv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apps/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	rbacv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/rbac/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

const (
	nthName = config.TerminationHandlerName
	// TerminationHandlerNodePolicyName names the policy that holds the termination handler to its own Node.
	TerminationHandlerNodePolicyName = "dynk8s-termination-handler-own-node"
	// defaultNTHImage is the latest release as of 2026-01 (aws/aws-node-termination-handler PR #1237, "v1.25.4 release
	// prep"); the image is multi-arch (linux amd64 and arm64).
	defaultNTHImage = "public.ecr.aws/aws-ec2/aws-node-termination-handler:v1.25.4"
	// nthUID is the user the upstream chart runs the handler as.
	nthUID = TerminationHandlerUID
)

// TerminationHandlerUID is the user aws-node-termination-handler runs as, on the host network: the nodes let it
// (besides root) reach the instance metadata service after the join, which it polls in IMDS mode.
const TerminationHandlerUID = 1000

// nthRules are the ClusterRole rules of the upstream chart (config/helm/aws-node-termination-handler/templates/
// clusterrole.yaml) without the optional event rule: cordon (patch/update nodes), list the node's pods and evict
// them, and read DaemonSets to skip their pods.
func nthRules() rbacv1.PolicyRuleArray {
	return rbacv1.PolicyRuleArray{
		rule([]string{""}, []string{"nodes"}, nil, "get", "list", "patch", "update"),
		rule([]string{""}, []string{"pods"}, nil, "list", "get"),
		rule([]string{""}, []string{"pods/eviction"}, nil, "create"),
		rule([]string{"extensions"}, []string{"daemonsets"}, nil, "get"),
		rule([]string{"apps"}, []string{"daemonsets"}, nil, "get"),
	}
}

// nthEnv runs the handler in IMDS mode: it polls the instance metadata of its own node for the two-minute spot
// interruption notice, scheduled events and the group's target lifecycle state, then cordons and drains the node.
func nthEnv() corev1.EnvVarArray {
	field := func(name, path string) *corev1.EnvVarArgs {
		return &corev1.EnvVarArgs{
			Name:      pulumi.String(name),
			ValueFrom: &corev1.EnvVarSourceArgs{FieldRef: &corev1.ObjectFieldSelectorArgs{FieldPath: pulumi.String(path)}},
		}
	}
	value := func(name, v string) *corev1.EnvVarArgs {
		return &corev1.EnvVarArgs{Name: pulumi.String(name), Value: pulumi.String(v)}
	}
	return corev1.EnvVarArray{
		field("NODE_NAME", "spec.nodeName"),
		field("POD_NAME", "metadata.name"),
		field("NAMESPACE", "metadata.namespace"),
		value("ENABLE_SPOT_INTERRUPTION_DRAINING", "true"),
		value("ENABLE_SCHEDULED_EVENT_DRAINING", "true"),
		// Rebalance recommendations come early and often; acting on them would drain nodes that may run for hours.
		value("ENABLE_REBALANCE_MONITORING", "false"),
		value("ENABLE_SQS_TERMINATION_DRAINING", "false"),
		// autoscaling/target-lifecycle-state Terminated: a termination the group started (the groups' lifecycle
		// hook holds the instance for the drain).
		value("ENABLE_ASG_LIFECYCLE_DRAINING", "true"),
		// Build agents use emptyDir; without this the drain would stop at them.
		value("DELETE_LOCAL_DATA", "true"),
		value("IGNORE_DAEMON_SETS", "true"),
		// -1: each pod's own terminationGracePeriodSeconds.
		value("POD_TERMINATION_GRACE_PERIOD", "-1"),
		// The whole drain must fit in the two-minute spot notice.
		value("NODE_TERMINATION_GRACE_PERIOD", strconv.Itoa(config.DrainGraceSeconds)),
		value("JSON_LOGGING", "true"),
	}
}

// terminationHandler declares aws-node-termination-handler on every pool node, when enabled and there are pools.
func (b *builder) terminationHandler() error {
	a := b.args
	if !a.TerminationHandler.Enabled || len(a.Pools) == 0 {
		return nil
	}

	sa, err := b.serviceAccount("nth-sa", nthName, nthName)
	if err != nil {
		return err
	}
	crb, _, err := b.bindRoles("nth", nthName, nthName, nthRules(), nil)
	if err != nil {
		return err
	}
	if err := b.ownNodePolicy("nth-node-policy", TerminationHandlerNodePolicyName, nthName); err != nil {
		return err
	}
	_, err = appsv1.NewDaemonSet(b.ctx, b.childName("nth"), &appsv1.DaemonSetArgs{
		Metadata: b.workloadMeta(nthName, nthName),
		Spec: &appsv1.DaemonSetSpecArgs{
			Selector: selector(nthName),
			Template: &corev1.PodTemplateSpecArgs{
				Metadata: &metav1.ObjectMetaArgs{Labels: commonLabels(nthName)},
				Spec: &corev1.PodSpecArgs{
					ServiceAccountName: pulumi.String(nthName),
					PriorityClassName:  pulumi.String("system-node-critical"),
					// The host network reaches IMDS in one hop, so the launch templates keep the hop limit at 1
					// and ordinary pods cannot reach the node role's credentials.
					HostNetwork: pulumi.Bool(true),
					DnsPolicy:   pulumi.String("ClusterFirstWithHostNet"),
					// Every pool node (on-demand nodes get scheduled events and group terminations too); never an
					// on-prem node, which has no instance metadata of ours.
					NodeSelector:    pulumi.StringMap{kube.LabelOS: pulumi.String("linux")},
					Affinity:        poolAffinity(),
					Tolerations:     tolerations(a.Pools),
					SecurityContext: nonRootPod(nthUID),
					Containers: corev1.ContainerArray{
						&corev1.ContainerArgs{
							Name:            pulumi.String(nthName),
							Image:           pulumi.String(a.terminationHandlerImage()),
							Env:             nthEnv(),
							Resources:       resources(config.TerminationHandlerRequests, config.TerminationHandlerLimits),
							SecurityContext: restrictedContainer(nthUID),
						},
					},
				},
			},
		},
	}, b.parent, pulumi.DependsOn([]pulumi.Resource{sa, crb}))
	if err != nil {
		return fmt.Errorf("daemonset: %w", err)
	}
	return nil
}
