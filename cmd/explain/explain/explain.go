// Package explain answers "would a new node of this pool run this pod, and which pool would the autoscaler raise?"
// the way the Cluster Autoscaler's AWS provider does when a group is at zero: it builds each pool's template node
// from the group's node-template tags (config.Config.GroupTags, the code that renders them for the stack), checks
// the pod against it with the upstream scheduling helpers (k8s.io/component-helpers: tolerations, node selector and
// required node affinity, pod requests), and applies the configured expander chain to the pools that fit.
//
// What it leaves out, as a scale-up from zero sees it (cluster-autoscaler/cloudprovider/aws/aws_manager.go
// buildNodeFromTemplate at cluster-autoscaler-1.34.5): the zone label (the autoscaler takes it from the group's
// zones), the DaemonSet pods unless the caller hands them over (WithDaemonSets), pod affinity and topology spread,
// volumes, host ports, and groups at their maxSize or backed off.
package explain

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/ec2catalog"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// The node-template tag prefixes the AWS provider reads (cloudprovider/aws/aws_manager.go at
// cluster-autoscaler-1.34.5: extractLabelsFromAsg, extractTaintsFromAsg, extractAllocatableResourcesFromAsg).
const (
	labelTagPrefix    = "k8s.io/cluster-autoscaler/node-template/label/"
	taintTagPrefix    = "k8s.io/cluster-autoscaler/node-template/taint/"
	resourceTagPrefix = "k8s.io/cluster-autoscaler/node-template/resources/"
	// templatePods is the pod capacity the provider gives every template node.
	templatePods = 110
)

// Shapes says what EC2 says of an instance type (vCPUs, memory); ok false for a type it does not know.
type Shapes func(instanceType string) (config.InstanceType, bool)

// CatalogShape sizes an instance type from the offline catalog the plan's stand-in for EC2 answers with
// (internal/ec2catalog): the shape the offline plan renders the groups' tags with. A real group's tags carry EC2's
// figures (the same for the dev stack's types).
func CatalogShape(instanceType string) (config.InstanceType, bool) {
	t, ok := ec2catalog.Lookup(instanceType)
	return config.InstanceType{Name: instanceType, VCPU: t.VCPU, MemoryMiB: t.MemoryMiB}, ok
}

// Template is one pool's template node.
type Template struct {
	Pool config.NodePool
	Node *corev1.Node
	// DaemonSets are the requests of the DaemonSet pods that would run on the node, which the autoscaler counts on
	// a template node too (WithDaemonSets; none without it), and DaemonSetPods their DaemonSets' names.
	DaemonSets    corev1.ResourceList
	DaemonSetPods []string
}

// WithDaemonSets returns the templates with the requests of those of sets whose pods would run on each template
// node (its taints tolerated, its labels matched), as the autoscaler adds DaemonSet pods to a template node
// (simulator/node_info_utils.go at cluster-autoscaler-1.34.5).
func WithDaemonSets(templates []Template, sets []appsv1.DaemonSet) []Template {
	out := slices.Clone(templates)
	for i := range out {
		t := &out[i]
		t.DaemonSets, t.DaemonSetPods = corev1.ResourceList{}, nil
		for _, ds := range sets {
			pod := &corev1.Pod{ObjectMeta: ds.Spec.Template.ObjectMeta, Spec: ds.Spec.Template.Spec}
			pod = withDefaultRequests(pod)
			if len(untoleratedTaints(pod, t.Node)) > 0 || len(affinityReasons(pod, t.Node)) > 0 {
				continue
			}
			for name, q := range resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{}) {
				sum := t.DaemonSets[name]
				sum.Add(q)
				t.DaemonSets[name] = sum
			}
			t.DaemonSetPods = append(t.DaemonSetPods, ds.Namespace+"/"+ds.Name)
		}
		slices.Sort(t.DaemonSetPods)
	}
	return out
}

// StackDaemonSets are the stack's own DaemonSets on pool nodes (config.PoolDaemonSets, which infra/addons declares),
// as the API would hold them: what explain counts on a template node without a cluster.
func StackDaemonSets(cfg *config.Config) []appsv1.DaemonSet {
	var out []appsv1.DaemonSet
	for _, d := range cfg.PoolDaemonSets() {
		var tolerations []corev1.Toleration
		for _, t := range d.Tolerates {
			tol := corev1.Toleration{Key: t.Key, Effect: corev1.TaintEffect(t.Effect), Operator: corev1.TolerationOpExists}
			if t.Value != "" {
				tol.Operator, tol.Value = corev1.TolerationOpEqual, t.Value
			}
			tolerations = append(tolerations, tol)
		}
		out = append(out, appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: d.Name},
			Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				NodeSelector: d.NodeSelector,
				Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
						MatchExpressions: []corev1.NodeSelectorRequirement{{Key: kube.LabelPool, Operator: corev1.NodeSelectorOpExists}},
					}}},
				}},
				Tolerations: tolerations,
				Containers: []corev1.Container{{Name: d.Name, Resources: corev1.ResourceRequirements{
					Requests: resourceList(d.Requests), Limits: resourceList(d.Limits),
				}}},
			}}},
		})
	}
	return out
}

// Templates builds the template node of every pool of cfg, in config order. shapes sizes each pool's first
// instance type, which the autoscaler sizes a group by.
func Templates(cfg *config.Config, shapes Shapes) ([]Template, error) {
	var out []Template
	for _, p := range cfg.NodePools {
		shape, ok := shapes(p.InstanceTypes[0])
		if !ok {
			return nil, fmt.Errorf("pool %s: no shape known for instance type %s", p.Name, p.InstanceTypes[0])
		}
		node, err := templateNode(p, shape, cfg.GroupTags(p, shape))
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		out = append(out, Template{Pool: p, Node: node})
	}
	return out, nil
}

// templateNode is the node the AWS provider builds from a group's tags: capacity from the instance type (pods 110,
// cpu, memory), overridden by the resources tags; allocatable equal to it; the label tags; the taint tags.
func templateNode(p config.NodePool, shape config.InstanceType, tags []config.Tag) (*corev1.Node, error) {
	name := "template-" + p.Name
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.LabelHostname: name}},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
			corev1.ResourcePods:   *resource.NewQuantity(templatePods, resource.DecimalSI),
			corev1.ResourceCPU:    *resource.NewQuantity(int64(shape.VCPU), resource.DecimalSI),
			corev1.ResourceMemory: *resource.NewQuantity(int64(shape.MemoryMiB)*1024*1024, resource.BinarySI),
		}},
	}
	for _, tag := range tags {
		switch {
		case strings.HasPrefix(tag.Key, labelTagPrefix):
			node.Labels[strings.TrimPrefix(tag.Key, labelTagPrefix)] = tag.Value
		case strings.HasPrefix(tag.Key, taintTagPrefix):
			value, effect, ok := strings.Cut(tag.Value, ":")
			if !ok {
				return nil, fmt.Errorf("taint tag %s=%q is not value:effect", tag.Key, tag.Value)
			}
			node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{
				Key: strings.TrimPrefix(tag.Key, taintTagPrefix), Value: value, Effect: corev1.TaintEffect(effect)})
		case strings.HasPrefix(tag.Key, resourceTagPrefix):
			q, err := resource.ParseQuantity(tag.Value)
			if err != nil {
				return nil, fmt.Errorf("resource tag %s=%q: %w", tag.Key, tag.Value, err)
			}
			node.Status.Capacity[corev1.ResourceName(strings.TrimPrefix(tag.Key, resourceTagPrefix))] = q
		}
	}
	node.Status.Allocatable = node.Status.Capacity.DeepCopy()
	return node, nil
}

// Verdict is whether a new node of a pool would run the pod, and every reason why not.
type Verdict struct {
	Pool    string
	Fits    bool
	Reasons []string
	// Tolerate are the pool's taints the pod would have to tolerate to fit, when they are all that keeps it off
	// (adding tolerations to the pod is then the whole fix); nil otherwise.
	Tolerate []corev1.Taint
}

// Check is the pod against one pool's template node.
func Check(pod *corev1.Pod, t Template) Verdict {
	pod = withDefaultRequests(pod)
	v := Verdict{Pool: t.Pool.Name}
	untolerated := untoleratedTaints(pod, t.Node)
	for _, taint := range untolerated {
		v.Reasons = append(v.Reasons, "untolerated taint "+taint.ToString())
	}
	rest := append(affinityReasons(pod, t.Node), resourceReasons(pod, t)...)
	v.Reasons = append(v.Reasons, rest...)
	v.Fits = len(v.Reasons) == 0
	if len(rest) == 0 && len(untolerated) > 0 {
		v.Tolerate = untolerated
	}
	return v
}

// resourceList is r's set quantities as a container's requests or limits.
func resourceList(r config.Resources) corev1.ResourceList {
	l := corev1.ResourceList{}
	for name, q := range r.Quantities() {
		l[corev1.ResourceName(name)] = resource.MustParse(q)
	}
	return l
}

// withDefaultRequests is the pod as the API server stores it: a container's request of a resource it only sets a
// limit for is that limit (kubernetes pkg/apis/core/v1/defaults.go, SetDefaults_Pod), so a manifest that asks for
// github.com/fuse as a limit alone is weighed as the live pod is.
func withDefaultRequests(pod *corev1.Pod) *corev1.Pod {
	pod = pod.DeepCopy()
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			r := &cs[i].Resources
			for name, limit := range r.Limits {
				if _, set := r.Requests[name]; !set {
					if r.Requests == nil {
						r.Requests = corev1.ResourceList{}
					}
					r.Requests[name] = limit.DeepCopy()
				}
			}
		}
	}
	return pod
}

// untoleratedTaints: each taint of the node that keeps the pod off it (NoSchedule and NoExecute; PreferNoSchedule
// only weighs).
func untoleratedTaints(pod *corev1.Pod, node *corev1.Node) []corev1.Taint {
	var out []corev1.Taint
	for _, taint := range node.Spec.Taints {
		if taint.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		if !corev1helpers.TolerationsTolerateTaint(pod.Spec.Tolerations, &taint) {
			out = append(out, taint)
		}
	}
	return out
}

// affinityReasons: the node selector's and the required node affinity's mismatches, the architecture named as
// such. The verdict is the upstream helper's (nodeaffinity.GetRequiredNodeAffinity); the reasons break it down.
func affinityReasons(pod *corev1.Pod, node *corev1.Node) []string {
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node); err == nil && ok {
		return nil
	} else if err != nil {
		return []string{fmt.Sprintf("invalid required node affinity: %v", err)}
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(pod.Spec.NodeSelector)) {
		want := pod.Spec.NodeSelector[k]
		if got, ok := node.Labels[k]; !ok || got != want {
			out = append(out, labelMismatch("node selector", k, want, got, ok))
		}
	}
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return out
	}
	required := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if ns, err := nodeaffinity.NewNodeSelector(required); err == nil && ns.Match(node) {
		return out
	}
	for i, term := range required.NodeSelectorTerms {
		for _, req := range term.MatchExpressions {
			one := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
				{MatchExpressions: []corev1.NodeSelectorRequirement{req}}}}
			if ns, err := nodeaffinity.NewNodeSelector(one); err == nil && !ns.Match(node) {
				got, ok := node.Labels[req.Key]
				out = append(out, labelMismatch(fmt.Sprintf("required node affinity (term %d)", i+1), req.Key,
					fmt.Sprintf("%s %v", req.Operator, req.Values), got, ok))
			}
		}
		for _, req := range term.MatchFields {
			out = append(out, fmt.Sprintf("required node affinity (term %d): field %s %s %v: the template "+
				"node's name is not the real node's", i+1, req.Key, req.Operator, req.Values))
		}
	}
	return out
}

// labelMismatch says what the pod asks of label key and what the template node has.
func labelMismatch(what, key, want, got string, has bool) string {
	subject := what
	if key == kube.LabelArch {
		subject = "arch: " + what
	}
	if !has {
		return fmt.Sprintf("%s %s=%s: the pool's nodes have no label %s", subject, key, want, key)
	}
	return fmt.Sprintf("%s %s=%s: the pool's nodes have %s=%s", subject, key, want, key, got)
}

// resourceReasons: each resource the pod requests beyond the template node's allocatable less its DaemonSet pods'
// requests (init containers and overhead counted as the scheduler counts them, resourcehelper.PodRequests).
func resourceReasons(pod *corev1.Pod, t Template) []string {
	requests := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	var out []string
	for _, name := range slices.Sorted(maps.Keys(requests)) {
		want := requests[name]
		if want.IsZero() {
			continue
		}
		have, ok := t.Node.Status.Allocatable[name]
		taken := t.DaemonSets[name]
		total := want.DeepCopy()
		total.Add(taken)
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: requests %s, the pool's template node has none", name, quantity(want)))
		case total.Cmp(have) > 0 && taken.IsZero():
			out = append(out, fmt.Sprintf("%s: requests %s, the pool's template node has %s allocatable", name,
				quantity(want), quantity(have)))
		case total.Cmp(have) > 0:
			out = append(out, fmt.Sprintf("%s: requests %s, the pool's template node has %s allocatable, %s of "+
				"it for the pods of %s", name, quantity(want), quantity(have), quantity(taken),
				strings.Join(t.DaemonSetPods, ", ")))
		}
	}
	return out
}

// quantity prints a whole decimal quantity as a number (5000 devices, not 5k) and any other in its canonical form.
func quantity(q resource.Quantity) string {
	if q.Format == resource.DecimalSI && q.MilliValue()%1000 == 0 {
		return strconv.FormatInt(q.Value(), 10)
	}
	return q.String()
}

// Pick is what the expander chain does with the pools that fit the pod: the pools it could raise, more than one
// when it would pick at random among them (the autoscaler ends every chain with random).
func Pick(expander string, pod *corev1.Pod, fitting []Template) []string {
	pod = withDefaultRequests(pod)
	options := slices.Clone(fitting)
	for _, e := range strings.Split(expander, ",") {
		switch e {
		case config.PriorityExpander:
			options = highestRank(options)
		case "least-waste":
			options = leastWaste(pod, options)
		}
		// least-nodes and most-pods: one node of any fitting pool runs the one pod; random: any.
	}
	var names []string
	for _, o := range options {
		names = append(names, o.Pool.Name)
	}
	return names
}

// highestRank keeps the options of the highest autoscaling.priority (expander/priority/priority.go at
// cluster-autoscaler-1.34.5); unranked ones only when none is ranked.
func highestRank(options []Template) []Template {
	best, out := -1, []Template(nil)
	for _, o := range options {
		r := o.Pool.Autoscaling.Priority
		switch {
		case r == nil || *r < best:
		case *r > best:
			best, out = *r, []Template{o}
		default:
			out = append(out, o)
		}
	}
	if len(out) == 0 {
		return options
	}
	return out
}

// leastWaste keeps the options that leave the least of the node's cpu and memory unused, summed as shares of its
// capacity (expander/waste/waste.go at cluster-autoscaler-1.34.5).
func leastWaste(pod *corev1.Pod, options []Template) []Template {
	requests := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	waste := func(name corev1.ResourceName, capacity corev1.ResourceList) float64 {
		have, want := capacity[name], requests[name]
		if name == corev1.ResourceCPU {
			return float64(have.MilliValue()-want.MilliValue()) / float64(have.MilliValue())
		}
		return float64(have.Value()-want.Value()) / float64(have.Value())
	}
	best, out := math.Inf(1), []Template(nil)
	for _, o := range options {
		score := waste(corev1.ResourceCPU, o.Node.Status.Capacity) + waste(corev1.ResourceMemory, o.Node.Status.Capacity)
		switch {
		case score < best:
			best, out = score, []Template{o}
		case score == best:
			out = append(out, o)
		}
	}
	return out
}

// Report is the whole answer for one pod.
type Report struct {
	Pod      string
	Verdicts []Verdict
	// Raise are the pools the autoscaler would raise (one of them, at random, when several); none when no pool fits.
	Raise []string
}

// Explain checks the pod against every template and applies the expander to those that fit.
func Explain(cfg *config.Config, templates []Template, pod *corev1.Pod) Report {
	r := Report{Pod: pod.Namespace + "/" + pod.Name}
	var fitting []Template
	for _, t := range templates {
		v := Check(pod, t)
		r.Verdicts = append(r.Verdicts, v)
		if v.Fits {
			fitting = append(fitting, t)
		}
	}
	r.Raise = Pick(cfg.Autoscaler.Expander, pod, fitting)
	return r
}

// String is the report as cmd/explain prints it.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s\n", r.Pod)
	for _, v := range r.Verdicts {
		if v.Fits {
			fmt.Fprintf(&b, "  %s: fits\n", v.Pool)
			continue
		}
		fmt.Fprintf(&b, "  %s: does not fit\n", v.Pool)
		for _, reason := range v.Reasons {
			fmt.Fprintf(&b, "    - %s\n", reason)
		}
		if len(v.Tolerate) > 0 {
			fmt.Fprintf(&b, "    fits with these in the pod's spec: %s\n", tolerationsYAML(v.Tolerate))
		}
	}
	switch len(r.Raise) {
	case 0:
		b.WriteString("  scale-up: none (no pool fits)\n")
	case 1:
		fmt.Fprintf(&b, "  scale-up: %s\n", r.Raise[0])
	default:
		fmt.Fprintf(&b, "  scale-up: one of %s (the expander leaves a tie, the autoscaler picks at random); "+
			"to choose, add to the pod's spec: nodeSelector: {%s: <one of them>}\n", strings.Join(r.Raise, ", "),
			kube.LabelPool)
	}
	return b.String()
}

// Fits says whether some pool fits the pod: the autoscaler would raise one.
func (r Report) Fits() bool { return len(r.Raise) > 0 }

// tolerationsYAML is the tolerations of taints (operator Equal, or Exists for a taint without a value) as a YAML
// flow sequence to paste into a pod spec.
func tolerationsYAML(taints []corev1.Taint) string {
	var items []string
	for _, t := range taints {
		if t.Value == "" {
			items = append(items, fmt.Sprintf("{key: %s, operator: Exists, effect: %s}", t.Key, t.Effect))
			continue
		}
		items = append(items, fmt.Sprintf("{key: %s, operator: Equal, value: %q, effect: %s}", t.Key, t.Value,
			t.Effect))
	}
	return "tolerations: [" + strings.Join(items, ", ") + "]"
}
