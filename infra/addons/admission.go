package addons

import (
	"fmt"
	"strings"

	admissionv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/admissionregistration/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// admissionPolicy is a ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA in Kubernetes 1.30:
// https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/) over core resources,
// applied to the requests whoExpression matches, and bound with Deny: what RBAC cannot narrow, admission does.
type admissionPolicy struct {
	resource, name, component string
	// resources are the rule's resources; a subresource is matched only when named ("nodes/status"): a rule for
	// "nodes" does not match a request to nodes/status (apiserver pkg/admission/plugin/webhook/predicates/rules).
	resources          []string
	operations         []string
	who, whoExpression string
	// variables are named CEL expressions the validations read as variables.<name>, in order.
	variables   []variable
	validations []validation
}

// variable is one entry of a policy's spec.variables.
type variable struct{ name, expression string }

// admissionPolicy declares the policy and its binding; the binding is what the workloads it guards depend on.
func (b *builder) admissionPolicy(p admissionPolicy) (pulumi.Resource, error) {
	var validations admissionv1.ValidationArray
	for _, v := range p.validations {
		validations = append(validations, &admissionv1.ValidationArgs{
			Expression: pulumi.String(v.expression),
			Message:    pulumi.String(v.message),
		})
	}
	var variables admissionv1.VariableArray
	for _, v := range p.variables {
		variables = append(variables, &admissionv1.VariableArgs{
			Name:       pulumi.String(v.name),
			Expression: pulumi.String(v.expression),
		})
	}
	policy, err := admissionv1.NewValidatingAdmissionPolicy(b.ctx, b.childName(p.resource),
		&admissionv1.ValidatingAdmissionPolicyArgs{
			Metadata: b.objectMeta(p.name, "", p.component),
			Spec: &admissionv1.ValidatingAdmissionPolicySpecArgs{
				FailurePolicy: pulumi.String("Fail"),
				MatchConstraints: &admissionv1.MatchResourcesArgs{
					ResourceRules: admissionv1.NamedRuleWithOperationsArray{&admissionv1.NamedRuleWithOperationsArgs{
						ApiGroups:   pulumi.StringArray{pulumi.String("")},
						ApiVersions: pulumi.StringArray{pulumi.String("v1")},
						Operations:  pulumi.ToStringArray(p.operations),
						Resources:   pulumi.ToStringArray(p.resources),
					}},
				},
				MatchConditions: admissionv1.MatchConditionArray{&admissionv1.MatchConditionArgs{
					Name:       pulumi.String(p.who),
					Expression: pulumi.String(p.whoExpression),
				}},
				Variables:   variables,
				Validations: validations,
			},
		}, b.parent)
	if err != nil {
		return nil, fmt.Errorf("admission policy: %w", err)
	}
	binding, err := admissionv1.NewValidatingAdmissionPolicyBinding(b.ctx, b.childName(p.resource+"-binding"),
		&admissionv1.ValidatingAdmissionPolicyBindingArgs{
			Metadata: b.objectMeta(p.name, "", p.component),
			Spec: &admissionv1.ValidatingAdmissionPolicyBindingSpecArgs{
				PolicyName:        pulumi.String(p.name),
				ValidationActions: pulumi.StringArray{pulumi.String("Deny")},
			},
		}, b.parent, pulumi.DependsOn([]pulumi.Resource{policy}))
	if err != nil {
		return nil, fmt.Errorf("admission policy binding: %w", err)
	}
	return binding, nil
}

// instanceIDPattern is an EC2 instance id, of the old (8 hex digits) or the current (17) form.
const instanceIDPattern = "^i-[0-9a-f]{8}([0-9a-f]{9})?$"

// NodeAdmissionName names the policy that holds kubelets to the pool label.
const NodeAdmissionName = "dynk8s-node-registration"

// celList is a CEL list literal of strings (names and label values: no quote can occur in them).
func celList(values []string) string {
	quoted := make([]string, len(values))
	for i, v := range values {
		quoted[i] = "'" + v + "'"
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// nodeValidations are what a kubelet (a user in system:nodes) may do with the dynk8s.io/pool label, the label the
// on-prem-only workloads (the autoscaler, the rotator, the cleanup, with their AWS keys) keep away from. The
// NodeRestriction admission plugin lets a kubelet set and remove that label on its own Node ("capturing dedicated
// workloads", https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction), so a
// pool node could shed it and draw them. Here a kubelet may not add, change or remove it once its Node exists; a
// Node it registers with the label names one of this stack's pools; and when onPremNodes is set, a Node it registers
// without the label is one of those names (a token holder's new unlabelled Node is refused). The operator, not
// being in system:nodes, may still relabel.
func nodeValidations(pools, onPremNodes []string) []validation {
	hasPool := func(obj string) string {
		return fmt.Sprintf("(has(%[1]s.metadata.labels) && '%[2]s' in %[1]s.metadata.labels)", obj, kube.LabelPool)
	}
	pool := func(obj string) string { return fmt.Sprintf("%s.metadata.labels['%s']", obj, kube.LabelPool) }
	vs := []validation{
		{fmt.Sprintf("request.operation != 'UPDATE' || (%s ? (%s && %s == %s) : !%s)",
			hasPool("object"), hasPool("oldObject"), pool("object"), pool("oldObject"), hasPool("oldObject")),
			"a kubelet may not add, change or remove its Node's " + kube.LabelPool + " label"},
		{fmt.Sprintf("request.operation != 'CREATE' || !%s || %s in %s", hasPool("object"), pool("object"),
			celList(pools)),
			fmt.Sprintf("a Node a kubelet registers with %s names one of this stack's pools: %s", kube.LabelPool,
				strings.Join(pools, ", "))},
		// A pool node is named after its instance (the JoinConfiguration's nodeRegistration.name), the name the
		// CSR approver checks against EC2.
		{fmt.Sprintf("request.operation != 'CREATE' || !%s || object.metadata.name.matches('%s')", hasPool("object"),
			instanceIDPattern),
			"a Node a kubelet registers with " + kube.LabelPool + " is named after its EC2 instance id"},
		// The converse: the only certificates a join token can get are for instance ids (the CSR approver), so an
		// unlabelled Node of such a name is a token holder's, come to draw the on-prem-only pods (the autoscaler,
		// the rotator, the cleanup, the approver, with their AWS keys), which keep off the pool label.
		{fmt.Sprintf("request.operation != 'CREATE' || %s || !object.metadata.name.matches('%s')", hasPool("object"),
			instanceIDPattern),
			"a Node a kubelet registers under an EC2 instance id carries " + kube.LabelPool},
	}
	if len(onPremNodes) > 0 {
		vs = append(vs, validation{
			fmt.Sprintf("request.operation != 'CREATE' || %s || object.metadata.name in %s", hasPool("object"),
				celList(onPremNodes)),
			"a Node a kubelet registers without " + kube.LabelPool + " is an on-prem node of " +
				"kubernetes.onPremNodes: add its name there first"})
	}
	return vs
}

// kubeletNodeResources are what a kubelet may write a Node's metadata through: the Node authorizer grants kubelets
// create, update and patch on nodes and update and patch on nodes/status, and on no other subresource of nodes
// (kubernetes plugin/pkg/auth/authorizer/rbac/bootstrappolicy, NodeRules, the same in 1.31 to 1.34). NodeRestriction
// admits a kubelet's label changes through both, and the status strategy keeps metadata changes
// (pkg/registry/core/node/strategy.go resets only the spec), so a policy on nodes alone would let a kubelet shed its
// pool label with kubectl patch --subresource=status. A status request carries object and oldObject as whole Nodes,
// so the same validations hold; the kubelet's own status updates keep its labels and pass.
var kubeletNodeResources = []string{"nodes", "nodes/status"}

// nodeAdmission holds kubelets to nodeValidations, on every resource a kubelet can write a Node through.
func (b *builder) nodeAdmission() error {
	pools := poolNames(b.args.Pools)
	_, err := b.admissionPolicy(admissionPolicy{
		resource: "node-policy", name: NodeAdmissionName, component: NodeAdmissionName,
		resources: kubeletNodeResources, operations: []string{"CREATE", "UPDATE"},
		who: "kubelets", whoExpression: "'system:nodes' in request.userInfo.groups",
		validations: nodeValidations(pools, b.args.OnPremNodes),
	})
	return err
}

// nodeNameClaim is where the API server puts the node of the pod a bound ServiceAccount token was issued for
// (KEP-4193, on by default since Kubernetes 1.32): request.userInfo.extra of the token's requests.
const nodeNameClaim = "authentication.kubernetes.io/node-name"

// ownNodeValidation holds a DaemonSet's ServiceAccount to the Node its pod runs on: RBAC can only grant Nodes
// cluster-wide, so a token taken from one pool node could otherwise cordon, taint or relabel every Node of the
// cluster. A token without the claim (not bound to a pod on a node) may change no Node at all. The pattern is the
// per-node ValidatingAdmissionPolicy of the upstream documentation ("Validating Admission Policy", the
// node-name claim example).
func ownNodeValidation() validation {
	return validation{
		fmt.Sprintf("'%[1]s' in request.userInfo.extra && object.metadata.name == request.userInfo.extra['%[1]s'][0]",
			nodeNameClaim),
		"this ServiceAccount may change only the Node its pod runs on",
	}
}

// ownNodePolicy declares a policy that holds the ServiceAccount sa to ownNodeValidation, and to more validations.
func (b *builder) ownNodePolicy(resource, name, sa string, more ...validation) error {
	_, err := b.admissionPolicy(admissionPolicy{
		resource: resource, name: name, component: sa,
		resources: []string{"nodes"}, operations: []string{"UPDATE", "DELETE"},
		who:           "its-service-account",
		whoExpression: fmt.Sprintf("request.userInfo.username == 'system:serviceaccount:%s:%s'", namespace, sa),
		validations:   append([]validation{ownNodeValidation()}, more...),
	})
	return err
}

// untaintValidation: the controller's change to a Node is the removal of the fuse startup taint and nothing else
// (labels, annotations, other taints and the spec stay).
func untaintValidation() validation {
	taints := func(obj string) string {
		return fmt.Sprintf("(has(%[1]s.spec.taints) ? %[1]s.spec.taints : [])", obj)
	}
	meta := func(obj, field string) string {
		return fmt.Sprintf("(has(%[1]s.metadata.%[2]s) ? %[1]s.metadata.%[2]s : {})", obj, field)
	}
	return validation{
		fmt.Sprintf("request.operation == 'UPDATE' && %s == %s.filter(t, t.key != '%s') && %s == %s && %s == %s && "+
			"(has(object.spec.unschedulable) && object.spec.unschedulable) == "+
			"(has(oldObject.spec.unschedulable) && oldObject.spec.unschedulable)",
			taints("object"), taints("oldObject"), kube.FuseStartupTaint.Key,
			meta("object", "labels"), meta("oldObject", "labels"),
			meta("object", "annotations"), meta("oldObject", "annotations")),
		"the controller may only remove the " + kube.FuseStartupTaint.Key + " taint from a Node",
	}
}
