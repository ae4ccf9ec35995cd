package explain

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra/config"
)

// devStack is the dev stack's config, changed by change (its config map).
func devStack(t *testing.T, change func(map[string]any)) (*config.Config, []Template) {
	t.Helper()
	values, err := config.ReadStackFile("../../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	change(values)
	sc, err := mockcloud.ConfigFromMap(values)
	assert.NilError(t, err)
	cfg, err := config.ParseValues(sc.Values)
	assert.NilError(t, err)
	templates, err := Templates(cfg, CatalogShape)
	assert.NilError(t, err)
	return cfg, templates
}

// agent is a build agent of the dev stack's spot pool (builders-arm): its arch, its taint tolerated, a fuse
// device and ephemeral storage.
func agent() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "ci"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/arch": "arm64"},
			Tolerations: []corev1.Toleration{{Key: "example.com/spot", Operator: corev1.TolerationOpEqual,
				Value: "true", Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{Name: "build", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"),
					corev1.ResourceEphemeralStorage: resource.MustParse("20Gi"),
				},
				Limits: corev1.ResourceList{"github.com/fuse": resource.MustParse("1")},
			}}},
		},
	}
}

func verdict(t *testing.T, r Report, pool string) Verdict {
	t.Helper()
	for _, v := range r.Verdicts {
		if v.Pool == pool {
			return v
		}
	}
	t.Fatalf("no verdict for pool %s in %v", pool, r)
	return Verdict{}
}

// TestTemplateFromGroupTags: the template node is what the group's tags say, so a change to what GroupTags
// renders (a larger volume) changes the template.
func TestTemplateFromGroupTags(t *testing.T) {
	cfg, templates := devStack(t, func(map[string]any) {})
	arm := templates[1]
	assert.Equal(t, arm.Pool.Name, "builders-arm")
	shape, _ := CatalogShape(arm.Pool.InstanceTypes[0])
	for _, tag := range cfg.GroupTags(arm.Pool, shape) {
		if name, ok := strings.CutPrefix(tag.Key, resourceTagPrefix); ok {
			q := arm.Node.Status.Allocatable[corev1.ResourceName(name)]
			assert.Equal(t, q.Cmp(resource.MustParse(tag.Value)), 0, "%s: %s against the tag's %s", name, q.String(), tag.Value)
		}
	}
	assert.Equal(t, arm.Node.Labels["kubernetes.io/arch"], "arm64")
	assert.DeepEqual(t, arm.Node.Spec.Taints, []corev1.Taint{{Key: "example.com/spot", Value: "true", Effect: "NoSchedule"}})

	_, bigger := devStack(t, func(v map[string]any) { mockcloud.Pool(v, 1)["volumeSizeGiB"] = 200 })
	before, after := arm.Node.Status.Allocatable[corev1.ResourceEphemeralStorage], bigger[1].Node.Status.Allocatable[corev1.ResourceEphemeralStorage]
	assert.Check(t, after.Cmp(before) > 0, "ephemeral storage %s with 200 GiB, %s with 80", after.String(), before.String())
}

func TestExplainBuildAgent(t *testing.T) {
	cfg, templates := devStack(t, func(map[string]any) {})
	r := Explain(cfg, templates, agent())
	assert.Check(t, verdict(t, r, "builders-arm").Fits, "%v", r)
	x86 := verdict(t, r, "builders-x86")
	assert.Check(t, !x86.Fits)
	assert.DeepEqual(t, x86.Reasons, []string{
		"arch: node selector kubernetes.io/arch=arm64: the pool's nodes have kubernetes.io/arch=amd64"})
	assert.DeepEqual(t, r.Raise, []string{"builders-arm"})
	assert.Check(t, is.Contains(r.String(), "scale-up: builders-arm"))
}

// TestExplainEveryReason: each way a pod can miss a pool is named, all of them at once.
func TestExplainEveryReason(t *testing.T) {
	cfg, templates := devStack(t, func(map[string]any) {})
	pod := agent()
	pod.Spec.Tolerations = nil
	pod.Spec.NodeSelector["example.com/builder"] = "riscv"
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "kubernetes.io/arch", Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}},
			}},
		}}}}
	c := &pod.Spec.Containers[0]
	c.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("9")
	c.Resources.Requests[corev1.ResourceMemory] = resource.MustParse("15872Mi")
	c.Resources.Requests[corev1.ResourceEphemeralStorage] = resource.MustParse("100Gi")
	c.Resources.Limits["github.com/fuse"] = resource.MustParse("5001")
	r := Explain(cfg, templates, pod)
	arm := verdict(t, r, "builders-arm")
	assert.DeepEqual(t, arm.Reasons, []string{
		"untolerated taint example.com/spot=true:NoSchedule",
		"node selector example.com/builder=riscv: the pool's nodes have example.com/builder=aarch64",
		"arch: required node affinity (term 1) kubernetes.io/arch=In [amd64]: the pool's nodes have kubernetes.io/arch=arm64",
		"cpu: requests 9, the pool's template node has 8 allocatable",
		"ephemeral-storage: requests 100Gi, the pool's template node has 63Gi allocatable",
		"github.com/fuse: requests 5001, the pool's template node has 5000 allocatable",
		"memory: requests 15872Mi, the pool's template node has 15137Mi allocatable",
	})
	assert.DeepEqual(t, r.Raise, []string(nil))
	assert.Check(t, is.Contains(r.String(), "scale-up: none (no pool fits)"))

	// Without fuse the groups advertise no github.com/fuse at all.
	cfg, templates = devStack(t, func(v map[string]any) { mockcloud.Object(v, "fuse")["enabled"] = false })
	assert.Check(t, is.Contains(verdict(t, Explain(cfg, templates, agent()), "builders-arm").Reasons,
		"github.com/fuse: requests 1, the pool's template node has none"))
}

// TestPickFollowsTheExpander: of two fitting pools, priority takes the higher rank; least-waste alone leaves the tie
// of two 8-vCPU, 16 GiB types.
func TestPickFollowsTheExpander(t *testing.T) {
	pod := agent()
	pod.Spec.NodeSelector = nil
	_, templates := devStack(t, func(map[string]any) {})
	assert.DeepEqual(t, Pick("least-waste", pod, templates), []string{"builders-x86", "builders-arm"})
	for first, ranks := range map[string][2]int{"builders-x86": {20, 10}, "builders-arm": {10, 20}} {
		cfg, ranked := devStack(t, func(v map[string]any) {
			mockcloud.Object(v, "autoscaler")["expander"] = "priority,least-waste"
			mockcloud.Pool(v, 0)["autoscaling"] = map[string]any{"priority": ranks[0]}
			mockcloud.Pool(v, 1)["autoscaling"] = map[string]any{"priority": ranks[1]}
		})
		assert.DeepEqual(t, Explain(cfg, ranked, pod).Raise, []string{first})
	}
	// least-waste: a smaller pool wastes less.
	_, templates = devStack(t, func(v map[string]any) {
		mockcloud.Pool(v, 0)["instanceTypes"] = []any{"c7i.4xlarge"}
	})
	assert.DeepEqual(t, Pick("least-waste", pod, templates), []string{"builders-arm"})
}

// TestDaemonSetsTakeTheirShare: the requests of the DaemonSets whose pods would run on a pool's node count against
// its allocatable, as on the autoscaler's template node; one that would not run there (another arch, an untolerated
// taint) does not.
func TestDaemonSetsTakeTheirShare(t *testing.T) {
	cfg, templates := devStack(t, func(map[string]any) {})
	daemon := func(name string, selector map[string]string, tolerations []corev1.Toleration) appsv1.DaemonSet {
		return appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
			Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				NodeSelector: selector, Tolerations: tolerations,
				Containers: []corev1.Container{{Name: "d", Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}},
			}}}}
	}
	everywhere := []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	sets := []appsv1.DaemonSet{
		daemon("cni", nil, everywhere),
		daemon("plugin-arm64", map[string]string{"kubernetes.io/arch": "arm64"}, everywhere),
		daemon("plugin-amd64", map[string]string{"kubernetes.io/arch": "amd64"}, everywhere),
		daemon("untolerating", nil, nil),
	}
	withDS := WithDaemonSets(templates, sets)
	assert.DeepEqual(t, withDS[1].DaemonSetPods, []string{"kube-system/cni", "kube-system/plugin-arm64"})
	assert.DeepEqual(t, withDS[0].DaemonSetPods, []string{"kube-system/cni", "kube-system/plugin-amd64",
		"kube-system/untolerating"})

	pod := agent()
	pod.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("6500m")
	assert.Check(t, verdict(t, Explain(cfg, templates, pod), "builders-arm").Fits)
	arm := verdict(t, Explain(cfg, withDS, pod), "builders-arm")
	assert.DeepEqual(t, arm.Reasons, []string{"cpu: requests 6500m, the pool's template node has 8 allocatable, 2 " +
		"of it for the pods of kube-system/cni, kube-system/plugin-arm64"})
}

// A tie the autoscaler breaks at random names the nodeSelector that chooses.
func TestReportNamesTheSelectorThatBreaksATie(t *testing.T) {
	r := Report{Pod: "ci/agent", Verdicts: []Verdict{{Pool: "a", Fits: true}, {Pool: "b", Fits: true}},
		Raise: []string{"a", "b"}}
	assert.Equal(t, r.String(), `pod ci/agent
  a: fits
  b: fits
  scale-up: one of a, b (the expander leaves a tie, the autoscaler picks at random); to choose, add to the pod's spec: nodeSelector: {dynk8s.io/pool: <one of them>}
`)
	assert.Check(t, r.Fits())
	assert.Check(t, !Report{Pod: "ci/agent"}.Fits())
}
