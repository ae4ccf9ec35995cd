package addons

import (
	_ "embed" // the approver script
	"fmt"
	"slices"
	"strings"

	appsv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apps/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	rbacv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/rbac/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
)

// approveCSRScript approves the kubelet client CSRs of live pool instances and denies the rest of the join tokens'
// group; see the file for the rules.
//
//go:embed scripts/approve-csr.sh
var approveCSRScript string

const (
	// NodeBootstrapGroup is the group a join token authenticates with besides system:bootstrappers (its Secret's
	// auth-extra-groups, which rotate-token.sh writes). It is dynk8s's own, not kubeadm's
	// system:bootstrappers:kubeadm:default-node-token: kubeadm binds that one to the controller manager's
	// auto-approval of node client certificates, which checks nothing but the common name's prefix. This group gets
	// what a kubeadm join reads (nodeBootstrapBindings) and its CSRs are judged by the approver.
	NodeBootstrapGroup = "system:bootstrappers:dynk8s:pool-nodes"
	// ApproverName names the approver's ServiceAccount, ClusterRole, ConfigMap and Deployment.
	ApproverName      = "dynk8s-node-csr-approver"
	approverScriptKey = "approve-csr.sh"
	approverScriptDir = "/scripts"
	// KubeletClientSigner is the signer of the certificates a kubelet authenticates with.
	KubeletClientSigner = "kubernetes.io/kube-apiserver-client-kubelet"
)

// nodeBootstrapBinding grants NodeBootstrapGroup one role that kubeadm grants its own node group: kubeadm 1.34's
// `init` (phases bootstrap-token and upload-config) binds system:bootstrappers:kubeadm:default-node-token to these,
// and to the auto-approval ClusterRole system:certificates.k8s.io:certificatesigningrequests:nodeclient, which is
// left out on purpose. e2e/approver_test.go compares this list with what the real kubeadm binds.
type nodeBootstrapBinding struct {
	// kind is ClusterRole (for a ClusterRoleBinding) or Role (for a RoleBinding in kube-system).
	kind, role string
}

// nodeBootstrapBindings: create CSRs and read them back (system:node-bootstrapper, built in), read a Node by name
// (kubeadm join checks that no Node of its name is Ready), and read the kubeadm-config and kubelet-config
// ConfigMaps. kubeadm's proxy addon also lets the group read the kube-proxy ConfigMap; no join reads it.
var nodeBootstrapBindings = []nodeBootstrapBinding{
	{"ClusterRole", "system:node-bootstrapper"},
	{"ClusterRole", "kubeadm:get-nodes"},
	{"Role", "kubeadm:nodes-kubeadm-config"},
	{"Role", "kubeadm:kubelet-config"},
}

// approverRules allow what the script does: read and watch CSRs, set their Approved or Denied condition for the
// kubelet client signer only (the approve verb on signers covers denial too:
// https://kubernetes.io/docs/reference/access-authn-authz/certificate-signing-requests/#authorization), and read a
// Node by name.
func approverRules() rbacv1.PolicyRuleArray {
	return rbacv1.PolicyRuleArray{
		rule([]string{"certificates.k8s.io"}, []string{"certificatesigningrequests"}, nil, "get", "list", "watch"),
		rule([]string{"certificates.k8s.io"}, []string{"certificatesigningrequests/approval"}, nil, "update"),
		rule([]string{"certificates.k8s.io"}, []string{"signers"}, []string{KubeletClientSigner}, "approve"),
		rule([]string{""}, []string{"nodes"}, nil, "get"),
	}
}

// nodeBootstrap binds NodeBootstrapGroup to nodeBootstrapBindings.
func (b *builder) nodeBootstrap() error {
	subjects := rbacv1.SubjectArray{&rbacv1.SubjectArgs{
		Kind: pulumi.String("Group"), ApiGroup: pulumi.String("rbac.authorization.k8s.io"),
		Name: pulumi.String(NodeBootstrapGroup),
	}}
	for _, nb := range nodeBootstrapBindings {
		name := "dynk8s-node-bootstrap-" + strings.TrimPrefix(strings.TrimPrefix(nb.role, "system:"), "kubeadm:")
		ref := &rbacv1.RoleRefArgs{
			ApiGroup: pulumi.String("rbac.authorization.k8s.io"), Kind: pulumi.String(nb.kind),
			Name: pulumi.String(nb.role),
		}
		var err error
		if nb.kind == "ClusterRole" {
			_, err = rbacv1.NewClusterRoleBinding(b.ctx, b.childName(name), &rbacv1.ClusterRoleBindingArgs{
				Metadata: b.objectMeta(name, "", ApproverName), RoleRef: ref, Subjects: subjects,
			}, b.parent)
		} else {
			_, err = rbacv1.NewRoleBinding(b.ctx, b.childName(name), &rbacv1.RoleBindingArgs{
				Metadata: b.objectMeta(name, namespace, ApproverName), RoleRef: ref, Subjects: subjects,
			}, b.parent)
		}
		if err != nil {
			return fmt.Errorf("binding %s: %w", name, err)
		}
	}
	return nil
}

// approver declares the CSR approver: a Deployment of one replica that runs approve-csr.sh with its RBAC and the
// stale-node cleanup's AWS key (that IAM user may call ec2:DescribeInstances and nothing else, which is all the
// approver asks AWS).
//
// The form is the rotator's and the cleanup's, a script in the stock scriptImage, because dynk8s publishes no image
// of its own: a Go approver would need one. It watches, so a kubelet's CSR is judged within a second or so of its
// creation. One replica with the Recreate strategy: two approvers could approve two CSRs for the same name at once.
func (b *builder) approver(creds *awsCredentials) error {
	a := b.args
	if err := b.nodeBootstrap(); err != nil {
		return err
	}
	sa, err := b.serviceAccount("approver-sa", ApproverName, ApproverName)
	if err != nil {
		return err
	}
	crb, _, err := b.bindRoles("approver", ApproverName, ApproverName, approverRules(), nil)
	if err != nil {
		return err
	}
	script, err := corev1.NewConfigMap(b.ctx, b.childName("approver-script"), &corev1.ConfigMapArgs{
		Metadata: b.objectMeta(ApproverName, namespace, ApproverName),
		Data:     pulumi.StringMap{approverScriptKey: pulumi.String(approveCSRScript)},
	}, b.parent)
	if err != nil {
		return fmt.Errorf("approver script config map: %w", err)
	}
	pools := poolNames(a.Pools)
	spec := scriptPod{
		name: ApproverName, container: "approve", shell: "/bin/bash", image: a.scriptImage(), dir: approverScriptDir,
		key: approverScriptKey,
		env: corev1.EnvVarArray{
			&corev1.EnvVarArgs{Name: pulumi.String("BOOTSTRAP_GROUP"), Value: pulumi.String(NodeBootstrapGroup)},
			&corev1.EnvVarArgs{Name: pulumi.String("CLUSTER_NAME"), Value: pulumi.String(a.ClusterName)},
			&corev1.EnvVarArgs{Name: pulumi.String("POOLS"), Value: pulumi.String(strings.Join(pools, " "))},
			creds.env("AWS_ACCESS_KEY_ID", awsKeyIDKey),
			creds.env("AWS_SECRET_ACCESS_KEY", awsSecretKeyKey),
			&corev1.EnvVarArgs{Name: pulumi.String("AWS_DEFAULT_REGION"), Value: pulumi.String(a.Region)},
			scriptHome,
		},
	}.spec()
	spec.RestartPolicy = pulumi.String("Always")
	_, err = appsv1.NewDeployment(b.ctx, b.childName("approver"), &appsv1.DeploymentArgs{
		Metadata: b.workloadMeta(ApproverName, ApproverName),
		Spec: &appsv1.DeploymentSpecArgs{
			Replicas: pulumi.Int(1),
			Strategy: &appsv1.DeploymentStrategyArgs{Type: pulumi.String("Recreate")},
			Selector: selector(ApproverName),
			Template: &corev1.PodTemplateSpecArgs{
				Metadata: &metav1.ObjectMetaArgs{
					Labels:      commonLabels(ApproverName),
					Annotations: pulumi.StringMap{awsKeyChecksumAnnotation: creds.checksum},
				},
				Spec: spec,
			},
		},
	}, b.parent, pulumi.DependsOn([]pulumi.Resource{sa, crb, script, creds.secret}))
	if err != nil {
		return fmt.Errorf("approver deployment: %w", err)
	}
	return nil
}

// poolNames are the pools' names, sorted, so that the pools' order in the config changes no object.
func poolNames(pools []config.NodePool) []string {
	names := make([]string, len(pools))
	for i, p := range pools {
		names[i] = p.Name
	}
	slices.Sort(names)
	return names
}
