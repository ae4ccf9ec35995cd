package addons

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	appsv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apps/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	rbacv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/rbac/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
)

// The names are upstream's: the autoscaler's leader-election lease and its status ConfigMap carry the same name,
// and the RBAC rules below grant access to exactly those names.
const (
	autoscalerName            = "cluster-autoscaler"
	autoscalerCredentialsName = "cluster-autoscaler-aws-credentials"
	// autoscalerUID is the nobody user of the distroless/static:nonroot base image, as upstream runs it.
	autoscalerUID = 65534
	// autoscalerMetricsPort serves /metrics and /health-check.
	autoscalerMetricsPort = 8085
	// awsKeyChecksumAnnotation changes with the access key id, so that a rotated key rolls the pod: the
	// environment from a secretKeyRef is read only when the container starts, and the old key is deleted soon
	// after the new one exists.
	awsKeyChecksumAnnotation = "dynk8s.io/aws-access-key-id-sha256"
)

// autoscalerArgs are the autoscaler's command-line flags.
func autoscalerArgs(clusterName string, cfg config.Autoscaler) []string {
	return []string{
		"--cloud-provider=aws",
		// Both tag keys must be on an ASG; the second keeps clusters that share an account apart.
		"--node-group-auto-discovery=asg:tag=" + config.AutoscalerEnabledTag + "," + config.AutoscalerClusterTag(clusterName),
		"--expander=" + cfg.Expander,
		// Pools of one shape in several zones are balanced instead of filling one zone.
		"--balance-similar-node-groups=true",
		// Build agents use emptyDir; with the default (true) such a node would never be scaled down.
		"--skip-nodes-with-local-storage=false",
		"--scale-down-unneeded-time=" + cfg.ScaleDownUnneededTime,
		"--scale-down-delay-after-add=" + cfg.ScaleDownDelayAfterAdd.String(),
		// A node cut off by a tunnel outage is NotReady but runs its builds on; it is removed only after this long.
		"--scale-down-unready-time=" + cfg.ScaleDownUnreadyTime.String(),
		// Above the nodes' join timeout, so a slow boot is waited for and a failed one reclaimed.
		"--max-node-provision-time=" + cfg.MaxNodeProvisionTime.String(),
		// A launch AWS cannot fulfil (spot without capacity) fails the group's scaling activity; the AWS provider
		// sees it when it next reads the groups (every minute) and reports the missing instances as out of
		// resources (cloudprovider/aws/auto_scaling_groups.go, createPlaceholdersForDesiredNonStartedInstances), so
		// the autoscaler backs the group off and raises the next fitting group in the same minute, long before
		// --max-node-provision-time. The backoff decides how soon the failed group is tried again: each retry
		// while spot is still short costs the pods it catches about a minute, so it starts at 5 minutes and
		// doubles up to 30, and forgets after 3 quiet hours. Upstream's values, pinned: the fallback the docs
		// describe does not change with a release's defaults.
		"--initial-node-group-backoff-duration=5m0s",
		"--max-node-group-backoff-duration=30m0s",
		"--node-group-backoff-reset-timeout=3h0m0s",
		"--max-nodes-total=" + strconv.Itoa(cfg.MaxNodesTotal),
		"--new-pod-scale-up-delay=" + cfg.NewPodScaleUpDelay.String(),
		"--scan-interval=" + cfg.ScanInterval.String(),
		"--skip-nodes-with-system-pods=" + strconv.FormatBool(cfg.SkipNodesWithSystemPods),
		"--stderrthreshold=info",
		"--v=4",
	}
}

// priorityExpanderName and priorityExpanderKey are the ConfigMap in kube-system the priority expander reads on every
// scale-up, and its key (expander/priority/priority.go at cluster-autoscaler-1.34.5).
const (
	priorityExpanderName = "cluster-autoscaler-priority-expander"
	priorityExpanderKey  = "priorities"
)

// usesPriorityExpander reports whether the expander chain has the priority expander.
func usesPriorityExpander(cfg config.Autoscaler) bool {
	return slices.Contains(strings.Split(cfg.Expander, ","), config.PriorityExpander)
}

// priorityExpanderConfig is the priority expander's document: each rank with the regular expressions of the node
// groups it holds, highest rank first (expander/priority/readme.md at cluster-autoscaler-1.34.5). An AWS node
// group's id is its Auto Scaling group's name, which Pulumi makes from the prefix <cluster>-<pool>- and a unique
// suffix; each pool's group is matched by its whole name, anchored and quoted, because a pattern on the prefix
// would also match the group of a pool whose name extends this one's (builders and builders-x86). groups are the
// group names by pool name.
func priorityExpanderConfig(pools []config.NodePool, groups map[string]string) (string, error) {
	ranks := map[int][]string{}
	for _, p := range pools {
		if p.Autoscaling.Priority == nil {
			return "", fmt.Errorf("pool %s has no autoscaling.priority", p.Name)
		}
		group, ok := groups[p.Name]
		if !ok || group == "" {
			return "", fmt.Errorf("pool %s: no Auto Scaling group name", p.Name)
		}
		// JSON quoting is YAML's double-quoted form, so the backslashes of an escaped name survive.
		quoted, err := json.Marshal("^" + regexp.QuoteMeta(group) + "$")
		if err != nil {
			return "", err
		}
		ranks[*p.Autoscaling.Priority] = append(ranks[*p.Autoscaling.Priority], string(quoted))
	}
	var b strings.Builder
	for _, rank := range slices.Backward(slices.Sorted(maps.Keys(ranks))) {
		fmt.Fprintf(&b, "%d:\n", rank)
		for _, re := range slices.Sorted(slices.Values(ranks[rank])) {
			fmt.Fprintf(&b, "  - %s\n", re)
		}
	}
	return b.String(), nil
}

// priorityExpander declares the priority expander's ConfigMap, when the expander chain has it.
func (b *builder) priorityExpander() (pulumi.Resource, error) {
	a := b.args
	if !usesPriorityExpander(a.Autoscaler) {
		return nil, nil
	}
	doc := a.GroupNames.ToStringMapOutput().ApplyT(func(groups map[string]string) (string, error) {
		return priorityExpanderConfig(a.Pools, groups)
	}).(pulumi.StringOutput)
	cm, err := corev1.NewConfigMap(b.ctx, b.childName("autoscaler-priorities"), &corev1.ConfigMapArgs{
		Metadata: b.objectMeta(priorityExpanderName, namespace, autoscalerName),
		Data:     pulumi.StringMap{priorityExpanderKey: doc},
	}, b.parent)
	if err != nil {
		return nil, fmt.Errorf("priority expander config map: %w", err)
	}
	return cm, nil
}

// autoscalerClusterRules are the ClusterRole rules of the upstream AWS example
// (cluster-autoscaler/cloudprovider/aws/examples/cluster-autoscaler-autodiscover.yaml, master as of 2026-04).
// They are a superset of what older releases need; a rule on a resource the API server does not serve (the
// resource.k8s.io DRA kinds on an old cluster) grants nothing, so one set serves every supported minor.
func autoscalerClusterRules() rbacv1.PolicyRuleArray {
	return rbacv1.PolicyRuleArray{
		rule([]string{""}, []string{"events", "endpoints"}, nil, "create", "patch"),
		rule([]string{""}, []string{"pods/eviction"}, nil, "create"),
		rule([]string{""}, []string{"pods/status"}, nil, "update"),
		rule([]string{""}, []string{"endpoints"}, []string{autoscalerName}, "get", "update"),
		rule([]string{""}, []string{"nodes"}, nil, "watch", "list", "get", "update"),
		rule([]string{""}, []string{"namespaces", "pods", "services", "replicationcontrollers",
			"persistentvolumeclaims", "persistentvolumes"}, nil, "watch", "list", "get"),
		rule([]string{"extensions"}, []string{"replicasets", "daemonsets"}, nil, "watch", "list", "get"),
		rule([]string{"policy"}, []string{"poddisruptionbudgets"}, nil, "watch", "list"),
		rule([]string{"apps"}, []string{"statefulsets", "replicasets", "daemonsets"}, nil,
			"watch", "list", "get"),
		rule([]string{"resource.k8s.io"}, []string{"deviceclasses", "resourceslices", "resourceclaims"}, nil,
			"watch", "list", "get"),
		rule([]string{"storage.k8s.io"}, []string{"storageclasses", "csinodes", "csidrivers",
			"csistoragecapacities", "volumeattachments"}, nil, "watch", "list", "get"),
		rule([]string{"batch", "extensions"}, []string{"jobs"}, nil, "get", "list", "watch", "patch"),
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, nil, "create"),
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, []string{autoscalerName}, "get", "update"),
	}
}

// autoscalerNamespaceRules are the Role rules in kube-system of the same example: its status and priority-expander
// ConfigMaps.
func autoscalerNamespaceRules() rbacv1.PolicyRuleArray {
	return rbacv1.PolicyRuleArray{
		rule([]string{""}, []string{"configmaps"}, nil, "create", "list", "watch"),
		rule([]string{""}, []string{"configmaps"},
			[]string{"cluster-autoscaler-status", "cluster-autoscaler-priority-expander"},
			"delete", "get", "update", "watch"),
	}
}

// rule is one RBAC policy rule.
func rule(groups, resources, names []string, verbs ...string) *rbacv1.PolicyRuleArgs {
	r := &rbacv1.PolicyRuleArgs{
		ApiGroups: pulumi.ToStringArray(groups),
		Resources: pulumi.ToStringArray(resources),
		Verbs:     pulumi.ToStringArray(verbs),
	}
	if len(names) > 0 {
		r.ResourceNames = pulumi.ToStringArray(names)
	}
	return r
}

// autoscaler declares the Cluster Autoscaler and returns its image.
func (b *builder) autoscaler() (string, error) {
	a := b.args
	image := a.autoscalerImage()

	sa, err := b.serviceAccount("autoscaler-sa", autoscalerName, autoscalerName)
	if err != nil {
		return "", err
	}
	crb, rb, err := b.bindRoles("autoscaler", autoscalerName, autoscalerName, autoscalerClusterRules(),
		autoscalerNamespaceRules())
	if err != nil {
		return "", err
	}

	priorities, err := b.priorityExpander()
	if err != nil {
		return "", err
	}

	creds, err := b.awsCredentials("autoscaler-credentials", autoscalerCredentialsName, autoscalerName,
		a.AWSAccessKeyID, a.AWSSecretAccessKey)
	if err != nil {
		return "", err
	}

	_, err = appsv1.NewDeployment(b.ctx, b.childName("autoscaler"), &appsv1.DeploymentArgs{
		Metadata: b.workloadMeta(autoscalerName, autoscalerName),
		Spec: &appsv1.DeploymentSpecArgs{
			// One replica: the autoscaler elects a leader, a second one would only wait.
			Replicas: pulumi.Int(1),
			Selector: selector(autoscalerName),
			Template: &corev1.PodTemplateSpecArgs{
				Metadata: &metav1.ObjectMetaArgs{
					Labels: commonLabels(autoscalerName),
					Annotations: pulumi.StringMap{
						"prometheus.io/scrape":   pulumi.String("true"),
						"prometheus.io/port":     pulumi.String(fmt.Sprint(autoscalerMetricsPort)),
						awsKeyChecksumAnnotation: creds.checksum,
					},
				},
				Spec: &corev1.PodSpecArgs{
					PriorityClassName:  pulumi.String("system-cluster-critical"),
					ServiceAccountName: pulumi.String(autoscalerName),
					SecurityContext:    nonRootPod(autoscalerUID),
					// Never on a dynk8s pool node: the autoscaler would scale away the node it runs on, and
					// with all pools at zero it would have nowhere to run.
					Affinity: onPremAffinity(),
					Containers: corev1.ContainerArray{
						&corev1.ContainerArgs{
							Name:  pulumi.String(autoscalerName),
							Image: pulumi.String(image),
							// The image is distroless/static:nonroot: no shell, the binary at /cluster-autoscaler,
							// and its own CA certificates. Upstream's example mounts the host's CA bundle over
							// them, but the path differs per host OS (a missing file becomes an empty directory
							// and breaks TLS), so nothing is mounted.
							Command: pulumi.StringArray{pulumi.String("/cluster-autoscaler")},
							Args:    pulumi.ToStringArray(autoscalerArgs(a.ClusterName, a.Autoscaler)),
							Env: corev1.EnvVarArray{
								&corev1.EnvVarArgs{Name: pulumi.String("AWS_REGION"), Value: pulumi.String(a.Region)},
								creds.env("AWS_ACCESS_KEY_ID", awsKeyIDKey),
								creds.env("AWS_SECRET_ACCESS_KEY", awsSecretKeyKey),
							},
							Ports: corev1.ContainerPortArray{
								&corev1.ContainerPortArgs{
									Name:          pulumi.String("http-metrics"),
									ContainerPort: pulumi.Int(autoscalerMetricsPort),
									Protocol:      pulumi.String("TCP"),
								},
							},
							// /health-check fails when the main loop has not run for a while (e.g. AWS refuses
							// the key); a restart makes that visible instead of a silently idle autoscaler.
							LivenessProbe: &corev1.ProbeArgs{
								HttpGet: &corev1.HTTPGetActionArgs{
									Path: pulumi.String("/health-check"),
									Port: pulumi.String("http-metrics"),
								},
								InitialDelaySeconds: pulumi.Int(60),
								PeriodSeconds:       pulumi.Int(30),
							},
							// Upstream's figures, requests equal to limits.
							Resources:       resources(config.Resources{CPU: "100m", Memory: "600Mi"}, config.Resources{CPU: "100m", Memory: "600Mi"}),
							SecurityContext: restrictedContainer(autoscalerUID),
						},
					},
				},
			},
		},
	}, b.parent, pulumi.DependsOn(dependsOn(sa, crb, rb, creds.secret, priorities)))
	if err != nil {
		return "", fmt.Errorf("deployment: %w", err)
	}
	return image, nil
}

// bindRoles declares a ClusterRole with clusterRules bound to the kube-system service account saName and, when
// namespaceRules is not empty, a Role in kube-system with those rules bound to the same account. All objects are
// named objectName.
func (b *builder) bindRoles(prefix, objectName, saName string, clusterRules,
	namespaceRules rbacv1.PolicyRuleArray) (crb, rb pulumi.Resource, err error) {
	component := objectName
	subjects := rbacv1.SubjectArray{
		&rbacv1.SubjectArgs{
			Kind:      pulumi.String("ServiceAccount"),
			Name:      pulumi.String(saName),
			Namespace: pulumi.String(namespace),
		},
	}
	cr, err := rbacv1.NewClusterRole(b.ctx, b.childName(prefix+"-clusterrole"), &rbacv1.ClusterRoleArgs{
		Metadata: b.objectMeta(objectName, "", component),
		Rules:    clusterRules,
	}, b.parent)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster role %s: %w", objectName, err)
	}
	crb, err = rbacv1.NewClusterRoleBinding(b.ctx, b.childName(prefix+"-clusterrolebinding"),
		&rbacv1.ClusterRoleBindingArgs{
			Metadata: b.objectMeta(objectName, "", component),
			RoleRef: &rbacv1.RoleRefArgs{
				ApiGroup: pulumi.String("rbac.authorization.k8s.io"),
				Kind:     pulumi.String("ClusterRole"),
				Name:     pulumi.String(objectName),
			},
			Subjects: subjects,
		}, b.parent, pulumi.DependsOn([]pulumi.Resource{cr}))
	if err != nil {
		return nil, nil, fmt.Errorf("cluster role binding %s: %w", objectName, err)
	}
	if len(namespaceRules) == 0 {
		return crb, nil, nil
	}

	r, err := rbacv1.NewRole(b.ctx, b.childName(prefix+"-role"), &rbacv1.RoleArgs{
		Metadata: b.objectMeta(objectName, namespace, component),
		Rules:    namespaceRules,
	}, b.parent)
	if err != nil {
		return nil, nil, fmt.Errorf("role %s: %w", objectName, err)
	}
	rb, err = rbacv1.NewRoleBinding(b.ctx, b.childName(prefix+"-rolebinding"), &rbacv1.RoleBindingArgs{
		Metadata: b.objectMeta(objectName, namespace, component),
		RoleRef: &rbacv1.RoleRefArgs{
			ApiGroup: pulumi.String("rbac.authorization.k8s.io"),
			Kind:     pulumi.String("Role"),
			Name:     pulumi.String(objectName),
		},
		Subjects: subjects,
	}, b.parent, pulumi.DependsOn([]pulumi.Resource{r}))
	if err != nil {
		return nil, nil, fmt.Errorf("role binding %s: %w", objectName, err)
	}
	return crb, rb, nil
}

// dependsOn drops the nil entries of a dependency list (a binding that was not needed).
func dependsOn(rs ...pulumi.Resource) []pulumi.Resource {
	out := make([]pulumi.Resource, 0, len(rs))
	for _, r := range rs {
		if r != nil {
			out = append(out, r)
		}
	}
	return out
}
