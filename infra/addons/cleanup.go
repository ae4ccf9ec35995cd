package addons

import (
	_ "embed" // the cleanup script
	"fmt"
	"strconv"

	batchv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/batch/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	rbacv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/rbac/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// cleanupScript deletes the Node objects of terminated pool instances; see the file for the rules.
//
//go:embed scripts/cleanup.sh
var cleanupScript string

const (
	cleanupName      = "dynk8s-stale-node-cleanup"
	cleanupCredsName = "dynk8s-stale-node-cleanup-aws-credentials"
	cleanupScriptKey = "cleanup.sh"
	cleanupScriptDir = "/scripts"
	// cleanupSchedule runs the job every two minutes, so a stale node goes at most about two minutes after it
	// qualifies: until then the autoscaler counts it as unready (config: cleanup.notReadyAfter).
	cleanupSchedule = "*/2 * * * *"
	// defaultScriptImage runs the component's scripts (the cleanup, the token rotator, the fuse untaint sidecar), which
	// need kubectl, the AWS CLI, curl, jq, sh and bash. registry.k8s.io/kubectl is distroless (no shell), and the
	// Bitnami images left the free catalog in 2025; alpine/k8s (github.com/alpine-docker/k8s, its Dockerfile) is
	// built for linux/amd64 and linux/arm64 with kubectl, the AWS CLI v1, bash, curl, jq and coreutils (this tag
	// replaced the distroless kubectl image for the same reason in devantler-tech/platform PR #2380, 2026-07). The
	// scripts use core/v1 Nodes and Secrets only, which every kubectl of the last years handles against any
	// supported API server.
	defaultScriptImage = "docker.io/alpine/k8s:1.36.2"
	// scriptUID is an unprivileged user; the image's default is root.
	scriptUID = 65534
)

// cleanupRules allow exactly what the script does: list the nodes, and get and delete them (kubectl delete reads
// the object first). No secrets, no pods.
func cleanupRules() rbacv1.PolicyRuleArray {
	return rbacv1.PolicyRuleArray{
		rule([]string{""}, []string{"nodes"}, nil, "get", "list", "delete"),
	}
}

// cleanup declares the stale-node cleanup CronJob with its script and RBAC; it returns its AWS key's Secret, which
// the CSR approver shares.
func (b *builder) cleanup() (*awsCredentials, error) {
	a := b.args
	sa, err := b.serviceAccount("cleanup-sa", cleanupName, cleanupName)
	if err != nil {
		return nil, err
	}
	crb, _, err := b.bindRoles("cleanup", cleanupName, cleanupName, cleanupRules(), nil)
	if err != nil {
		return nil, err
	}
	creds, err := b.awsCredentials("cleanup-credentials", cleanupCredsName, cleanupName, a.CleanupAWSAccessKeyID,
		a.CleanupAWSSecretAccessKey)
	if err != nil {
		return nil, err
	}
	script, err := corev1.NewConfigMap(b.ctx, b.childName("cleanup-script"), &corev1.ConfigMapArgs{
		Metadata: b.objectMeta(cleanupName, namespace, cleanupName),
		Data:     pulumi.StringMap{cleanupScriptKey: pulumi.String(cleanupScript)},
	}, b.parent)
	if err != nil {
		return nil, fmt.Errorf("script config map: %w", err)
	}

	threshold := int(a.Cleanup.NotReadyAfter.Seconds())
	_, err = batchv1.NewCronJob(b.ctx, b.childName("cleanup"), &batchv1.CronJobArgs{
		Metadata: b.objectMeta(cleanupName, namespace, cleanupName),
		Spec: &batchv1.CronJobSpecArgs{
			Schedule: pulumi.String(cleanupSchedule),
			// Runs must not overlap: two runs would race to delete the same nodes.
			ConcurrencyPolicy: pulumi.String("Forbid"),
			// A run missed by more than a minute is skipped; the next one comes soon.
			StartingDeadlineSeconds:    pulumi.Int(60),
			SuccessfulJobsHistoryLimit: pulumi.Int(1),
			FailedJobsHistoryLimit:     pulumi.Int(3),
			JobTemplate: &batchv1.JobTemplateSpecArgs{
				Metadata: &metav1.ObjectMetaArgs{Labels: commonLabels(cleanupName)},
				Spec: &batchv1.JobSpecArgs{
					// No retries and a deadline below the schedule's period: a failed run is simply the next one.
					BackoffLimit:          pulumi.Int(0),
					ActiveDeadlineSeconds: pulumi.Int(110),
					Template: &corev1.PodTemplateSpecArgs{
						Metadata: &metav1.ObjectMetaArgs{Labels: commonLabels(cleanupName)},
						Spec:     cleanupPodSpec(threshold, a.Region, a.scriptImage(), creds),
					},
				},
			},
		},
	}, b.parent, pulumi.DependsOn([]pulumi.Resource{sa, crb, script, creds.secret}))
	if err != nil {
		return nil, fmt.Errorf("cron job: %w", err)
	}
	return creds, nil
}

// cleanupPodSpec runs the script on an on-prem node with the cleanup service account and its own AWS key. Stale
// nodes count towards the autoscaler's unready limits, so the cleanup must run even in a full cluster; and the nodes
// it judges are the ones that come and go.
func cleanupPodSpec(thresholdSeconds int, region, image string, creds *awsCredentials) *corev1.PodSpecArgs {
	return scriptPod{
		name: cleanupName, container: "cleanup", shell: "/bin/sh", image: image, dir: cleanupScriptDir,
		key: cleanupScriptKey,
		env: corev1.EnvVarArray{
			&corev1.EnvVarArgs{Name: pulumi.String("POOL_LABEL"), Value: pulumi.String(kube.LabelPool)},
			&corev1.EnvVarArgs{
				Name:  pulumi.String("NOT_READY_AFTER_SECONDS"),
				Value: pulumi.String(strconv.Itoa(thresholdSeconds)),
			},
			creds.env("AWS_ACCESS_KEY_ID", awsKeyIDKey),
			creds.env("AWS_SECRET_ACCESS_KEY", awsSecretKeyKey),
			&corev1.EnvVarArgs{Name: pulumi.String("AWS_DEFAULT_REGION"), Value: pulumi.String(region)},
			scriptHome,
		},
	}.spec()
}

// scriptPod is a pod that runs one of the component's shell scripts (the cleanup, the token rotator) from the
// ConfigMap of its name, as the ServiceAccount of its name: in image (images.scripts) as an unprivileged user with a read-only
// root, at system-cluster-critical priority, so that it runs even in a full cluster, and never on a pool node.
type scriptPod struct {
	name, container, shell, image string
	// dir is where the ConfigMap is mounted and key the script's file in it.
	dir, key string
	env      corev1.EnvVarArray
}

// scriptHome is where kubectl keeps its discovery cache: $HOME, on the tmp volume, as the root filesystem is
// read-only.
var scriptHome = &corev1.EnvVarArgs{Name: pulumi.String("HOME"), Value: pulumi.String("/tmp")}

func (s scriptPod) spec() *corev1.PodSpecArgs {
	return &corev1.PodSpecArgs{
		RestartPolicy:      pulumi.String("Never"),
		ServiceAccountName: pulumi.String(s.name),
		PriorityClassName:  pulumi.String("system-cluster-critical"),
		Affinity:           onPremAffinity(),
		SecurityContext:    nonRootPod(scriptUID),
		Containers: corev1.ContainerArray{
			&corev1.ContainerArgs{
				Name:            pulumi.String(s.container),
				Image:           pulumi.String(s.image),
				Command:         pulumi.StringArray{pulumi.String(s.shell), pulumi.String(s.dir + "/" + s.key)},
				Env:             s.env,
				Resources:       resources("10m", "32Mi", "200m", "128Mi"),
				SecurityContext: restrictedContainer(scriptUID),
				VolumeMounts: corev1.VolumeMountArray{
					&corev1.VolumeMountArgs{
						Name:      pulumi.String("script"),
						MountPath: pulumi.String(s.dir),
						ReadOnly:  pulumi.Bool(true),
					},
					&corev1.VolumeMountArgs{Name: pulumi.String("tmp"), MountPath: pulumi.String("/tmp")},
				},
			},
		},
		Volumes: corev1.VolumeArray{
			&corev1.VolumeArgs{
				Name: pulumi.String("script"),
				ConfigMap: &corev1.ConfigMapVolumeSourceArgs{
					Name:        pulumi.String(s.name),
					DefaultMode: pulumi.Int(0o555),
				},
			},
			&corev1.VolumeArgs{
				Name:     pulumi.String("tmp"),
				EmptyDir: &corev1.EmptyDirVolumeSourceArgs{SizeLimit: pulumi.String("16Mi")},
			},
		},
	}
}
