package addons

import (
	"fmt"
	"slices"
	"strings"

	rbacv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/rbac/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
)

const (
	// NodeBootstrapGroup is the group a join token authenticates with besides system:bootstrappers (its Secret's
	// auth-extra-groups, which the controller's rotation loop writes). It is dynk8s's own, not kubeadm's
	// system:bootstrappers:kubeadm:default-node-token: kubeadm binds that one to the controller manager's
	// auto-approval of node client certificates, which checks nothing but the common name's prefix. This group gets
	// what a kubeadm join reads (nodeBootstrapBindings) and its CSRs are judged by the controller's approval loop.
	NodeBootstrapGroup = "system:bootstrappers:dynk8s:pool-nodes"
	// ApproverName is the component the node bootstrap bindings belong to: the CSR approval they lead to.
	ApproverName = "dynk8s-node-csr-approver"
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

// poolNames are the pools' names, sorted, so that the pools' order in the config changes no object.
func poolNames(pools []config.NodePool) []string {
	names := make([]string, len(pools))
	for i, p := range pools {
		names[i] = p.Name
	}
	slices.Sort(names)
	return names
}
