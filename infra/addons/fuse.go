package addons

import (
	_ "embed" // the untaint script
	"fmt"
	"maps"
	"slices"
	"strconv"

	appsv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apps/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// fuseComponent is the app.kubernetes.io/name of the plugin's DaemonSets, and the name of its ServiceAccount and
// RBAC objects.
const fuseComponent = config.FusePluginName

// fuseDevicePluginDir is the kubelet's device-plugin directory: the plugin serves its socket there and watches
// kubelet.sock to re-register after a kubelet restart.
const fuseDevicePluginDir = "/var/lib/kubelet/device-plugins"

// The default fuse device plugin images are (github.com/kuberenetes-learning-group/fuse-device-plugin,
// the plugin that advertises github.com/fuse) per pool arch, used for every arch that fuse.images does not name.
//
// The plugin's only published tag in wide use, soolaugust/fuse-device-plugin:v1.0, is amd64-only (the project's
// issue #4 says so), hence one image and one DaemonSet per arch instead of a single multi-arch image. For arm64 the
// default is v1.1, the multi-arch manifest (amd64 + arm64) that the project's Makefile publishes since PR #5
// (2022-05); its existence could not be checked from here, and the project is unmaintained, so operators of arm64
// pools should mirror it (or build the plugin) and set fuse.images.arm64. Both tags run the binary at
// /usr/bin/fuse-device-plugin with the --mounts_allowed flag.
//
// defaultFuseImage returns them; a function rather than a map, so nothing can change the defaults at run time.
func defaultFuseImage(arch kube.Arch) string {
	switch arch {
	case kube.ArchX86_64:
		return "docker.io/soolaugust/fuse-device-plugin:v1.0"
	case kube.ArchArm64:
		return "docker.io/soolaugust/fuse-device-plugin:v1.1"
	}
	return ""
}

// FuseImage is the plugin image for a pool arch: the configured one, else the default. The node boot pre-pulls it.
func FuseImage(cfg config.Fuse, arch kube.Arch) (string, error) {
	if img := cfg.Images[arch]; img != "" {
		return img, nil
	}
	if img := defaultFuseImage(arch); img != "" {
		return img, nil
	}
	return "", fmt.Errorf("no fuse device plugin image for pool arch %q: set fuse.images.%s", arch, arch)
}

// fuse declares one device plugin DaemonSet per arch that some pool uses, when fuse is enabled.
func (b *builder) fuse() error {
	a := b.args
	if !a.Fuse.Enabled {
		return nil
	}
	byArch := map[kube.Arch][]config.NodePool{}
	for _, p := range a.Pools {
		byArch[p.Arch] = append(byArch[p.Arch], p)
	}
	for _, arch := range slices.Sorted(maps.Keys(byArch)) {
		kubeArch := arch.Label()
		image, err := FuseImage(a.Fuse, arch)
		if err != nil {
			return err
		}
		name := fuseComponent + "-" + kubeArch
		_, err = appsv1.NewDaemonSet(b.ctx, b.childName(name), &appsv1.DaemonSetArgs{
			Metadata: b.workloadMeta(name, fuseComponent),
			Spec: &appsv1.DaemonSetSpecArgs{
				// The arch is part of the selector so that the per-arch DaemonSets never claim each other's pods.
				Selector: &metav1.LabelSelectorArgs{MatchLabels: fusePodSelector(kubeArch)},
				Template: &corev1.PodTemplateSpecArgs{
					Metadata: &metav1.ObjectMetaArgs{Labels: fusePodLabels(kubeArch)},
					Spec:     fusePodSpec(image, kubeArch, a.Fuse.Capacity, byArch[arch]),
				},
			},
		}, b.parent)
		if err != nil {
			return fmt.Errorf("daemonset %s: %w", name, err)
		}
	}
	return nil
}

func fusePodSelector(kubeArch string) pulumi.StringMap {
	return pulumi.StringMap{
		"app.kubernetes.io/name":     pulumi.String(fuseComponent),
		"app.kubernetes.io/instance": pulumi.String(fuseComponent + "-" + kubeArch),
	}
}

func fusePodLabels(kubeArch string) pulumi.StringMap {
	labels := commonLabels(fuseComponent)
	labels["app.kubernetes.io/instance"] = pulumi.String(fuseComponent + "-" + kubeArch)
	return labels
}

// fusePodSpec runs the plugin (image) on the dynk8s pool nodes of one arch. It has no API access: the controller
// lifts the node's fuse startup taint once the node advertises the resource (cluster/internal/untaint), so a pool
// node carries no token that may change a Node.
func fusePodSpec(image, kubeArch string, capacity int, pools []config.NodePool) *corev1.PodSpecArgs {
	return &corev1.PodSpecArgs{
		// The resource appears only once the plugin runs, after the node is Ready; until then the autoscaler may
		// think the node lacks it and add more. Highest node priority, tolerating the pool taints, keeps that window
		// short.
		PriorityClassName: pulumi.String("system-node-critical"),
		NodeSelector: pulumi.StringMap{
			kube.LabelArch: pulumi.String(kubeArch),
			kube.LabelOS:   pulumi.String("linux"),
		},
		// Only pool nodes: the ASGs advertise github.com/fuse to the autoscaler, the on-prem nodes are not ours.
		Affinity: poolAffinity(),
		// Its own node's startup taint included: it is there until this pod has done its work.
		Tolerations: tolerations(pools),
		// The plugin talks to the kubelet over unix sockets only: no host network (upstream's manifest has it,
		// without need), and no ServiceAccount token.
		AutomountServiceAccountToken: pulumi.Bool(false),
		Containers: corev1.ContainerArray{
			&corev1.ContainerArgs{
				Name:    pulumi.String(fuseComponent),
				Image:   pulumi.String(image),
				Command: pulumi.StringArray{pulumi.String("/usr/bin/fuse-device-plugin")},
				// The image's own default is 5000; passing the configured capacity keeps what the node advertises
				// equal to the ASG's node-template tag, whatever the image.
				Args: pulumi.StringArray{
					pulumi.String("--mounts_allowed"),
					pulumi.String(strconv.Itoa(capacity)),
				},
				Resources: resources(config.FusePluginRequests, config.FusePluginLimits),
				// Root (uid 0) is needed to create the socket in the root-owned kubelet directory; every
				// capability is still dropped, as upstream does: the plugin only hands out /dev/fuse by path.
				SecurityContext: restrictedContainer(0),
				VolumeMounts: corev1.VolumeMountArray{
					&corev1.VolumeMountArgs{
						Name:      pulumi.String("device-plugins"),
						MountPath: pulumi.String(fuseDevicePluginDir),
					},
				},
			},
		},
		Volumes: corev1.VolumeArray{
			&corev1.VolumeArgs{
				Name: pulumi.String("device-plugins"),
				HostPath: &corev1.HostPathVolumeSourceArgs{
					Path: pulumi.String(fuseDevicePluginDir),
					Type: pulumi.String("Directory"),
				},
			},
		},
	}
}
