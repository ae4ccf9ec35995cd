package addons

import (
	"fmt"
	"slices"
	"strings"

	appsv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apps/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	policyv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/policy/v1"
	rbacv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/rbac/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

const (
	// ControllerName names the controller's ServiceAccount, roles, Deployment, Lease and the rest.
	ControllerName = "dynk8s-controller"
	// ApprovalRecordName is the ConfigMap in kube-system where the controller remembers every instance it approved
	// a certificate for, longer than the controller manager keeps approved CSRs (an hour).
	ApprovalRecordName = "dynk8s-approved-nodes"
	// ControllerMetricsPort serves the controller's probes and Prometheus metrics.
	ControllerMetricsPort = 8080
	// controllerUID is an unprivileged user (the distroless "nonroot" uid); the image's default is root.
	controllerUID = 65532
	// controllerBinDir is the emptyDir the init container installs the controller in, controllerBootstrapDir where
	// the bootstrap script is mounted.
	controllerBinDir       = "/opt/dynk8s/bin"
	controllerBootstrapDir = "/opt/dynk8s/bootstrap"
	controllerBootstrapKey = "fetch-agent.sh"
	// controllerFetchDeadline bounds the init container's download: S3 answers in seconds, and a pod that cannot
	// fetch fails visibly (Init:Error) instead of waiting.
	controllerFetchDeadlineSeconds = 120
	// tokenRotationAnnotation carries kubernetes.bootstrapTokenRotation on the pod template: a new value rolls the
	// Deployment, and the leader of the new pods issues a token when it starts (every leader does).
	tokenRotationAnnotation = "dynk8s.io/bootstrap-token-rotation"
)

// ControllerDelivery is where the controller's init container fetches the controller: the stack's agent bucket and
// one pinned object per architecture (infra.ControllerDelivery).
type ControllerDelivery struct {
	Bucket  pulumi.StringInput
	Objects []ControllerObject
}

// ControllerObject is the controller built for one architecture, pinned by S3 version and sha256.
type ControllerObject struct {
	Arch      kube.Arch
	Key       string
	VersionID pulumi.StringInput
	SHA256    string
}

// controllerClusterRules are what the loops do cluster-wide: judge and approve or deny kubelet client CSRs (the
// approve verb on the signer covers denial too:
// https://kubernetes.io/docs/reference/access-authn-authz/certificate-signing-requests/#authorization), watch the
// Nodes, remove the fuse startup taint from them and delete those of gone instances (both narrowed further by the
// controller's node policy), and record events.
func controllerClusterRules() rbacv1.PolicyRuleArray {
	return rbacv1.PolicyRuleArray{
		rule([]string{"certificates.k8s.io"}, []string{"certificatesigningrequests"}, nil, "get", "list", "watch"),
		rule([]string{"certificates.k8s.io"}, []string{"certificatesigningrequests/approval"}, nil, "update"),
		rule([]string{"certificates.k8s.io"}, []string{"signers"}, []string{KubeletClientSigner}, "approve"),
		rule([]string{""}, []string{"nodes"}, nil, "get", "list", "watch", "update", "delete"),
		rule([]string{""}, []string{"events"}, nil, "create", "patch"),
	}
}

// controllerNamespaceRules are what the loops do in kube-system: create join token Secrets (and nothing else with
// Secrets: no get, list or watch, which RBAC could not narrow to the controller's own and which would read every
// Secret of kube-system; the token policy holds what it creates), keep the approval record, hold the Lease, and with
// the wake-up read the autoscaler's status.
// create cannot be narrowed to a name (the authorizer does not know the name of an object being created), the
// other verbs are.
func controllerNamespaceRules(wakes bool) rbacv1.PolicyRuleArray {
	rules := rbacv1.PolicyRuleArray{
		rule([]string{""}, []string{"secrets"}, nil, "create"),
		rule([]string{""}, []string{"configmaps"}, nil, "create"),
		rule([]string{""}, []string{"configmaps"}, []string{ApprovalRecordName}, "get", "update"),
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, nil, "create"),
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, []string{ControllerName}, "get", "update"),
	}
	if wakes {
		// The wake-up's informer lists and watches the autoscaler's status alone, with a metadata.name field
		// selector, which the API server authorizes as a request for that name
		// (k8s.io/apiserver pkg/endpoints/request/requestinfo.go).
		rules = append(rules, rule([]string{""}, []string{"configmaps"}, []string{autoscalerStatusName}, "get",
			"list", "watch"))
	}
	return rules
}

// autoscalerStatusName is the Cluster Autoscaler's status ConfigMap in kube-system (its --status-config-map-name,
// which the stack leaves at its default).
const autoscalerStatusName = "cluster-autoscaler-status"

// controllerNodePolicyName names the policy that holds the controller's changes to Nodes to its two jobs.
const controllerNodePolicyName = "dynk8s-controller-nodes"

// controllerNodeValidations: the controller's only change to a Node is the removal of the fuse startup taint
// (untaintValidation), and it deletes only a pool node that is not Ready (the cleanup's rules; it asks EC2 first,
// which admission cannot see). A stolen controller token can so neither relabel, cordon nor taint a Node, nor
// delete an on-prem or a Ready node.
func controllerNodeValidations() []validation {
	notReady := "!(has(oldObject.status.conditions) && " +
		"oldObject.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True'))"
	untaint := untaintValidation()
	return []validation{
		{"request.operation != 'UPDATE' || (" + untaint.expression + ")", untaint.message},
		{fmt.Sprintf("request.operation != 'DELETE' || (has(oldObject.metadata.labels) && '%s' in "+
			"oldObject.metadata.labels && %s)", kube.LabelPool, notReady),
			"the controller may delete only a pool node that is not Ready"},
	}
}

// controller declares dynk8s-controller: its ServiceAccount and roles, the admission policies that narrow them, the
// bootstrap that fetches it, two replicas behind a PodDisruptionBudget, and the Service its metrics are scraped
// through. It runs the CSR approval, the join token rotation, the stale Node cleanup and, with fuse, the startup
// taint's removal (cluster/cmd/dynk8s-controller).
//
// It is a binary from the stack's agent bucket rather than an image of dynk8s's own: the nodes already trust that
// bucket (a version and a sha256 pinned by the stack), the build that makes the agent makes it, and there is no
// registry to publish to, keep and sign. The pinned stock image (images.scripts) supplies bash and curl to the init
// container and a root file system to run the static binary from.
func (b *builder) controller(cleanupCreds, rotatorCreds *awsCredentials, after []pulumi.Resource) error {
	a := b.args
	if err := b.nodeBootstrap(); err != nil {
		return err
	}
	sa, err := b.serviceAccount("controller-sa", ControllerName, ControllerName)
	if err != nil {
		return err
	}
	crb, rb, err := b.bindRoles("controller", ControllerName, ControllerName, controllerClusterRules(),
		controllerNamespaceRules(a.wakes()))
	if err != nil {
		return err
	}
	nodePolicy, err := b.admissionPolicy(admissionPolicy{
		resource: "controller-node-policy", name: controllerNodePolicyName, component: ControllerName,
		resources: []string{"nodes"}, operations: []string{"UPDATE", "DELETE"},
		who:           "the-controller",
		whoExpression: serviceAccountIs(ControllerName),
		validations:   controllerNodeValidations(),
	})
	if err != nil {
		return err
	}
	bootstrap, err := corev1.NewConfigMap(b.ctx, b.childName("controller-bootstrap"), &corev1.ConfigMapArgs{
		Metadata: b.objectMeta(ControllerName+"-bootstrap", namespace, ControllerName),
		Data:     pulumi.StringMap{controllerBootstrapKey: pulumi.String(cloudinit.AgentBootstrap())},
	}, b.parent)
	if err != nil {
		return fmt.Errorf("bootstrap config map: %w", err)
	}
	if _, err := policyv1.NewPodDisruptionBudget(b.ctx, b.childName("controller-pdb"), &policyv1.PodDisruptionBudgetArgs{
		Metadata: b.objectMeta(ControllerName, namespace, ControllerName),
		Spec: &policyv1.PodDisruptionBudgetSpecArgs{
			// A drain of an on-prem node takes one replica at a time; the other keeps (or takes) the Lease.
			MinAvailable: pulumi.Int(1),
			Selector:     selector(ControllerName),
		},
	}, b.parent); err != nil {
		return fmt.Errorf("pod disruption budget: %w", err)
	}
	if _, err := corev1.NewService(b.ctx, b.childName("controller-metrics"), &corev1.ServiceArgs{
		Metadata: b.objectMeta(ControllerName+"-metrics", namespace, ControllerName),
		Spec: &corev1.ServiceSpecArgs{
			Selector: pulumi.StringMap{"app.kubernetes.io/name": pulumi.String(ControllerName)},
			Ports: corev1.ServicePortArray{&corev1.ServicePortArgs{
				Name: pulumi.String("http-metrics"), Port: pulumi.Int(ControllerMetricsPort),
				TargetPort: pulumi.String("http-metrics"),
			}},
		},
	}, b.parent); err != nil {
		return fmt.Errorf("metrics service: %w", err)
	}

	deps := append([]pulumi.Resource{sa, crb, rb, nodePolicy, bootstrap, cleanupCreds.secret, rotatorCreds.secret},
		after...)
	_, err = appsv1.NewDeployment(b.ctx, b.childName("controller"), &appsv1.DeploymentArgs{
		Metadata: b.workloadMeta(ControllerName, ControllerName),
		Spec: &appsv1.DeploymentSpecArgs{
			// Two replicas, one leader (a Lease): a follower takes over within the lease's 15 s when the leader's
			// node goes away.
			Replicas: pulumi.Int(2),
			Strategy: &appsv1.DeploymentStrategyArgs{
				Type: pulumi.String("RollingUpdate"),
				RollingUpdate: &appsv1.RollingUpdateDeploymentArgs{
					MaxSurge: pulumi.Int(1), MaxUnavailable: pulumi.Int(0),
				},
			},
			Selector: selector(ControllerName),
			Template: &corev1.PodTemplateSpecArgs{
				Metadata: &metav1.ObjectMetaArgs{
					Labels: commonLabels(ControllerName),
					Annotations: pulumi.StringMap{
						awsKeyChecksumAnnotation:                  cleanupCreds.checksum,
						awsKeyChecksumAnnotation + "-token-write": rotatorCreds.checksum,
						tokenRotationAnnotation:                   pulumi.String(a.BootstrapTokenRotation),
					},
				},
				Spec: b.controllerPodSpec(cleanupCreds, rotatorCreds),
			},
		},
	}, b.parent, pulumi.DependsOn(deps))
	if err != nil {
		return fmt.Errorf("deployment: %w", err)
	}
	return nil
}

// serviceAccountIs is a match condition for requests of one ServiceAccount of kube-system.
func serviceAccountIs(sa string) string {
	return fmt.Sprintf("request.userInfo.username == 'system:serviceaccount:%s:%s'", namespace, sa)
}

// controllerLoops are the loops the controller runs: the untaint loop only when the pools carry the fuse startup
// taint, the wake-up only when the gateway sleeps, the warm pools' loop only when a pool has a warm pool, the cache
// volumes' loop always.
func (a *ClusterAddonsArgs) controllerLoops() string {
	loops := []string{"approve", "rotate", "cleanup"}
	if a.Fuse.Enabled {
		loops = append(loops, "untaint")
	}
	if a.wakes() {
		loops = append(loops, "wake")
	}
	if len(a.warmPools()) > 0 {
		loops = append(loops, "warm")
	}
	// In every stack: the volumes of a pool whose cache is turned off, or that is gone, are deleted too.
	loops = append(loops, "cache")
	return strings.Join(loops, ",")
}

// cachePools is --cache-pools: POOL:MAX:IDLE_DAYS of each pool with a cache ("": none).
func (a *ClusterAddonsArgs) cachePools() string {
	var pools []string
	for _, p := range a.Pools {
		if p.Cache != nil {
			pools = append(pools, fmt.Sprintf("%s:%d:%d", p.Name, p.CacheVolumes(), p.Cache.MaxIdleDays))
		}
	}
	slices.Sort(pools)
	return strings.Join(pools, ",")
}

// warmPools are the names of the pools with a warm pool, whose stale warm instances the controller replaces; none
// without the groups' names.
func (a *ClusterAddonsArgs) warmPools() []string {
	var pools []string
	for _, p := range a.Pools {
		if p.WarmPool != nil && a.GroupNames != nil {
			pools = append(pools, p.Name)
		}
	}
	return pools
}

// wakes says whether the controller wakes the gateway: it sleeps, and the groups are known.
func (a *ClusterAddonsArgs) wakes() bool { return a.GatewayInstanceID != nil && a.GroupNames != nil }

// groupList is the groups' names of pools (every pool's for nil), sorted and comma-separated (the wake-up's
// --wake-groups, the warm loop's --warm-groups).
func (a *ClusterAddonsArgs) groupList(pools []string) pulumi.StringOutput {
	return a.GroupNames.ToStringMapOutput().ApplyT(func(groups map[string]string) string {
		var names []string
		for pool, group := range groups {
			if pools == nil || slices.Contains(pools, pool) {
				names = append(names, group)
			}
		}
		slices.Sort(names)
		return strings.Join(names, ",")
	}).(pulumi.StringOutput)
}

// controllerArgs are the controller's flags (cluster/cmd/dynk8s-controller).
func (a *ClusterAddonsArgs) controllerArgs() pulumi.StringArray {
	args := pulumi.StringArray{
		pulumi.String("--region=" + a.Region),
		pulumi.String("--cluster=" + a.ClusterName),
		pulumi.String("--pools=" + strings.Join(poolNames(a.Pools), ",")),
		pulumi.String("--bootstrap-group=" + NodeBootstrapGroup),
		pulumi.String("--approval-record=" + namespace + "/" + ApprovalRecordName),
		pulumi.String("--token-parameter=" + a.JoinTokenParameter),
		pulumi.Sprintf("--token-kms-key=%s", tokenKeyID(a.JoinTokenParameterResource)),
		pulumi.String("--token-ttl=" + a.BootstrapTokenTTL.String()),
		pulumi.String("--not-ready-after=" + a.Cleanup.NotReadyAfter.String()),
		pulumi.String("--loops=" + a.controllerLoops()),
		pulumi.Sprintf("--addr=:%d", ControllerMetricsPort),
	}
	if a.wakes() {
		args = append(args, pulumi.Sprintf("--wake-gateway=%s", a.GatewayInstanceID),
			pulumi.Sprintf("--wake-groups=%s", a.groupList(nil)))
	}
	if warm := a.warmPools(); len(warm) > 0 {
		args = append(args, pulumi.Sprintf("--warm-groups=%s", a.groupList(warm)))
	}
	if pools := a.cachePools(); pools != "" {
		args = append(args, pulumi.String("--cache-pools="+pools))
	}
	return args
}

// controllerPodSpec: the init container installs the pinned controller into an emptyDir with the nodes' bootstrap,
// with the cleanup user's key (which may read exactly the controller's objects), and the controller runs from there,
// as an unprivileged user with a read-only root, on an on-prem node only (it holds two AWS keys and approves node
// certificates), at system-cluster-critical priority so that a full cluster still judges its joins.
func (b *builder) controllerPodSpec(cleanupCreds, rotatorCreds *awsCredentials) *corev1.PodSpecArgs {
	a := b.args
	image := pulumi.String(a.scriptImage())
	env := func(name string, value pulumi.StringInput) *corev1.EnvVarArgs {
		return &corev1.EnvVarArgs{Name: pulumi.String(name), Value: value}
	}
	fetchEnv := corev1.EnvVarArray{
		env("DYNK8S_AGENT_BUCKET", a.Controller.Bucket),
		env("DYNK8S_AGENT_DEADLINE_SECONDS", pulumi.Sprintf("%d", controllerFetchDeadlineSeconds)),
		env("DYNK8S_AGENT_DEST", pulumi.String(controllerBinDir+"/"+ControllerName)),
		env("DYNK8S_AWS_REGION", pulumi.String(a.Region)),
		env("DYNK8S_S3_ENDPOINT", pulumi.String(awsEndpoint("s3", a.Region))),
		cleanupCreds.env("AWS_ACCESS_KEY_ID", awsKeyIDKey),
		cleanupCreds.env("AWS_SECRET_ACCESS_KEY", awsSecretKeyKey),
	}
	for _, o := range a.Controller.Objects {
		suffix := "_" + strings.ToUpper(o.Arch.Label())
		fetchEnv = append(fetchEnv,
			env("DYNK8S_AGENT_KEY"+suffix, pulumi.String(o.Key)),
			env("DYNK8S_AGENT_VERSION_ID"+suffix, o.VersionID),
			env("DYNK8S_AGENT_SHA256"+suffix, pulumi.String(o.SHA256)))
	}
	probe := func(path string, period int) *corev1.ProbeArgs {
		return &corev1.ProbeArgs{
			HttpGet:       &corev1.HTTPGetActionArgs{Path: pulumi.String(path), Port: pulumi.String("http-metrics")},
			PeriodSeconds: pulumi.Int(period), TimeoutSeconds: pulumi.Int(5), FailureThreshold: pulumi.Int(3),
		}
	}
	return &corev1.PodSpecArgs{
		ServiceAccountName: pulumi.String(ControllerName),
		PriorityClassName:  pulumi.String("system-cluster-critical"),
		Affinity:           controllerAffinity(),
		SecurityContext:    nonRootPod(controllerUID),
		// The leader releases its Lease when it stops (a rollout, a drain), so a follower takes over at once.
		TerminationGracePeriodSeconds: pulumi.Int(30),
		InitContainers: corev1.ContainerArray{&corev1.ContainerArgs{
			Name:  pulumi.String("fetch"),
			Image: image,
			Command: pulumi.StringArray{pulumi.String("/bin/bash"),
				pulumi.String(controllerBootstrapDir + "/" + controllerBootstrapKey)},
			Env:             fetchEnv,
			Resources:       resources(config.Resources{CPU: "10m", Memory: "32Mi"}, config.Resources{CPU: "500m", Memory: "128Mi"}),
			SecurityContext: restrictedContainer(controllerUID),
			VolumeMounts: corev1.VolumeMountArray{
				&corev1.VolumeMountArgs{Name: pulumi.String("bootstrap"), MountPath: pulumi.String(controllerBootstrapDir),
					ReadOnly: pulumi.Bool(true)},
				&corev1.VolumeMountArgs{Name: pulumi.String("bin"), MountPath: pulumi.String(controllerBinDir)},
			},
		}},
		Containers: corev1.ContainerArray{&corev1.ContainerArgs{
			Name:    pulumi.String("controller"),
			Image:   image,
			Command: pulumi.StringArray{pulumi.String(controllerBinDir + "/" + ControllerName)},
			Args:    a.controllerArgs(),
			Env: corev1.EnvVarArray{
				&corev1.EnvVarArgs{Name: pulumi.String("POD_NAME"), ValueFrom: &corev1.EnvVarSourceArgs{
					FieldRef: &corev1.ObjectFieldSelectorArgs{FieldPath: pulumi.String("metadata.name")}}},
				cleanupCreds.env("AWS_ACCESS_KEY_ID", awsKeyIDKey),
				cleanupCreds.env("AWS_SECRET_ACCESS_KEY", awsSecretKeyKey),
				rotatorCreds.env("DYNK8S_SSM_ACCESS_KEY_ID", awsKeyIDKey),
				rotatorCreds.env("DYNK8S_SSM_SECRET_ACCESS_KEY", awsSecretKeyKey),
			},
			Ports: corev1.ContainerPortArray{&corev1.ContainerPortArgs{
				Name: pulumi.String("http-metrics"), ContainerPort: pulumi.Int(ControllerMetricsPort),
			}},
			LivenessProbe:   probe("/healthz", 10),
			ReadinessProbe:  probe("/readyz", 5),
			Resources:       resources(config.Resources{CPU: "20m", Memory: "64Mi"}, config.Resources{CPU: "500m", Memory: "256Mi"}),
			SecurityContext: restrictedContainer(controllerUID),
			VolumeMounts: corev1.VolumeMountArray{
				&corev1.VolumeMountArgs{Name: pulumi.String("bin"), MountPath: pulumi.String(controllerBinDir),
					ReadOnly: pulumi.Bool(true)},
			},
		}},
		Volumes: corev1.VolumeArray{
			&corev1.VolumeArgs{
				Name: pulumi.String("bootstrap"),
				ConfigMap: &corev1.ConfigMapVolumeSourceArgs{
					Name: pulumi.String(ControllerName + "-bootstrap"), DefaultMode: pulumi.Int(0o555),
				},
			},
			&corev1.VolumeArgs{
				Name:     pulumi.String("bin"),
				EmptyDir: &corev1.EmptyDirVolumeSourceArgs{SizeLimit: pulumi.String("128Mi")},
			},
		},
	}
}

// controllerAffinity keeps the controller on the on-prem nodes and, where there are two, its replicas apart.
func controllerAffinity() *corev1.AffinityArgs {
	aff := onPremAffinity()
	aff.PodAntiAffinity = &corev1.PodAntiAffinityArgs{
		PreferredDuringSchedulingIgnoredDuringExecution: corev1.WeightedPodAffinityTermArray{
			&corev1.WeightedPodAffinityTermArgs{
				Weight: pulumi.Int(100),
				PodAffinityTerm: &corev1.PodAffinityTermArgs{
					TopologyKey:   pulumi.String(kube.LabelHostname),
					LabelSelector: selector(ControllerName),
				},
			},
		},
	}
	return aff
}

// awsEndpoint is a service's regional endpoint in region's partition: the China regions' domain is
// amazonaws.com.cn, every other region config accepts (commercial and GovCloud; it refuses the isolated partitions)
// is under amazonaws.com (AWS General Reference, "Service endpoints"; the partitions' dnsSuffix in the AWS SDKs'
// endpoints.json).
func awsEndpoint(service, region string) string {
	domain := "amazonaws.com"
	if strings.HasPrefix(region, "cn-") {
		domain = "amazonaws.com.cn"
	}
	return "https://" + service + "." + region + "." + domain
}
