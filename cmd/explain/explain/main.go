package explain

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"

	"github.com/dynk8s/dynk8s/cmd/internal/kubeclient"
	"github.com/dynk8s/dynk8s/infra/config"
)

const usage = `usage: explain [-stack NAME | -config FILE] POD.yaml...
       explain [-stack NAME | -config FILE] -pending [-kubeconfig FILE] [-context NAME] [-namespace NS] [-aws=false]

For each pod, says for every node pool of the stack whether a new node of that pool would run it, every reason
why not (an untolerated taint, a node selector or required node affinity the pool's nodes do not match, the
architecture, each resource beyond the pool's template node: cpu, memory, ephemeral-storage, github.com/fuse),
and which pool the stack's autoscaler.expander would raise. The template nodes are built from the node-template
tags the stack renders for the pools' Auto Scaling groups, as the Cluster Autoscaler builds them for a group at
zero. POD.yaml holds manifests (several YAML documents, or "-" for stdin).

With -pending it reads the cluster's pending, unschedulable pods instead, and shows the autoscaler's own word on
each: the pod's latest TriggeredScaleUp and NotTriggerScaleUp events. Then, with the ambient AWS credentials in
the stack's aws:region (autoscaling:DescribeAutoScalingGroups and DescribeScalingActivities), each pool's Auto
Scaling group, its desired capacity and instances, and its latest scaling activity with AWS's message: a launch
that failed (no spot capacity, a quota) shows there, not in the events. -aws=false leaves AWS out.

Each pool that only the pod's missing tolerations keep it off gets the tolerations to add; a tie between pools the
nodeSelector that chooses. Deployment, StatefulSet, ReplicaSet, Job and CronJob manifests are read for their pod
templates.

Exit status: 0 when every pod fits a pool, 3 when some pod fits none, 1 on an error, 2 on bad usage.

Flags:
`

// Main is cmd/explain; it returns the exit status.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	stack := fs.String("stack", "dev", "stack name: reads Pulumi.<stack>.yaml")
	configFile := fs.String("config", "", "stack config file to read instead of Pulumi.<stack>.yaml")
	pending := fs.Bool("pending", false, "explain the cluster's pending, unschedulable pods")
	kubeconfig := fs.String("kubeconfig", "", "with -pending: kubeconfig of the cluster (default: $KUBECONFIG, "+
		"else ~/.kube/config)")
	kubeContext := fs.String("context", "", "with -pending: kubeconfig context (default: the current one)")
	namespace := fs.String("namespace", "", "with -pending: only this namespace (default: every namespace)")
	withAWS := fs.Bool("aws", true, "with -pending: also show the pools' Auto Scaling groups and their latest "+
		"scaling activity (ambient AWS credentials)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *pending == (fs.NArg() > 0) {
		fmt.Fprintln(stderr, "explain: give pod manifests or -pending (explain -h)")
		return 2
	}
	file := *configFile
	if file == "" {
		file = "Pulumi." + *stack + ".yaml"
	}
	cfg, templates, err := Load(file)
	if err != nil {
		fmt.Fprintf(stderr, "explain: %v\n", err)
		return 1
	}
	if !*pending {
		pods, err := readPods(fs.Args())
		if err != nil {
			fmt.Fprintf(stderr, "explain: %v\n", err)
			return 1
		}
		// Without a cluster, the stack's own DaemonSets are what the autoscaler is sure to count on a pool's
		// template node (the cluster's own, such as kube-proxy or the CNI's, -pending reads).
		templates = WithDaemonSets(templates, StackDaemonSets(cfg))
		code := 0
		for _, pod := range pods {
			r := Explain(cfg, templates, pod)
			fmt.Fprint(stdout, r.String())
			if !r.Fits() {
				code = exitNoPoolFits
			}
		}
		return code
	}
	client, err := kubeclient.New(*kubeconfig, *kubeContext)
	if err != nil {
		fmt.Fprintf(stderr, "explain: %v\n", err)
		return 1
	}
	code := 0
	unfit, err := explainPending(ctx, client, cfg, templates, *namespace, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "explain: %v\n", err)
		return 1
	}
	if unfit > 0 {
		code = exitNoPoolFits
	}
	if !*withAWS {
		return code
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(cfg.Region))
	if err == nil {
		err = GroupsView(ctx, autoscaling.NewFromConfig(awsCfg), cfg, stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "explain: AWS (-aws=false leaves it out): %v\n", err)
		return 1
	}
	return code
}

// exitNoPoolFits is the exit status when some pod fits no pool: a scale-up would not happen for it.
const exitNoPoolFits = 3

// Load reads and validates a stack file and builds its pools' template nodes.
func Load(file string) (*config.Config, []Template, error) {
	sc, err := config.LoadStackFile(file)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := config.ParseValues(sc.Values)
	if err != nil {
		return nil, nil, err
	}
	templates, err := Templates(cfg, CatalogShape)
	if err != nil {
		return nil, nil, err
	}
	return cfg, templates, nil
}

// readPods reads every Pod of the files ("-": stdin), each a stream of YAML or JSON documents.
func readPods(files []string) ([]*corev1.Pod, error) {
	var pods []*corev1.Pod
	for _, name := range files {
		var r io.Reader = os.Stdin
		if name != "-" {
			f, err := os.Open(name)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			r = f
		}
		ps, err := DecodePods(r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		for i, p := range ps {
			if p.Name == "" {
				// A pod template, which the plugin names: named after its file for the report.
				p.Name = fmt.Sprintf("%s[%d]", filepath.Base(name), i)
			}
		}
		pods = append(pods, ps...)
	}
	return pods, nil
}

// DecodePods decodes a stream of manifests (YAML or JSON documents): Pods, and the pod templates of the workloads
// whose pods the autoscaler would weigh (Deployment, StatefulSet, ReplicaSet, Job, CronJob), each named
// "<kind>/<name>" after its workload; any other kind is an error.
func DecodePods(r io.Reader) ([]*corev1.Pod, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var pods []*corev1.Pod
	for i := 1; ; i++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		pod, err := decodePod(raw)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if pod == nil {
			continue // an empty document
		}
		if pod.Namespace == "" {
			pod.Namespace = metav1.NamespaceDefault
		}
		pods = append(pods, pod)
	}
	if len(pods) == 0 {
		return nil, errors.New("no Pod or workload in it")
	}
	return pods, nil
}

// workloadKinds are the kinds DecodePods takes a pod template from, as the message for any other kind lists them.
var workloadKinds = []string{"Pod", "Deployment", "StatefulSet", "ReplicaSet", "Job", "CronJob"}

// decodePod is one document's pod: a Pod, or a workload's pod template (with the workload's namespace); nil for an
// empty document.
func decodePod(raw json.RawMessage) (*corev1.Pod, error) {
	var meta metav1.TypeMeta
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		return nil, err
	}
	switch meta.Kind {
	case "":
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil || len(m) > 0 {
			return nil, fmt.Errorf("no kind (want one of %s)", strings.Join(workloadKinds, ", "))
		}
		return nil, nil
	case "Pod":
		var pod corev1.Pod
		if err := json.Unmarshal(raw, &pod); err != nil {
			return nil, err
		}
		return &pod, nil
	case "Deployment":
		return templatePod(raw, func(d *appsv1.Deployment) *corev1.PodTemplateSpec { return &d.Spec.Template })
	case "StatefulSet":
		return templatePod(raw, func(s *appsv1.StatefulSet) *corev1.PodTemplateSpec { return &s.Spec.Template })
	case "ReplicaSet":
		return templatePod(raw, func(rs *appsv1.ReplicaSet) *corev1.PodTemplateSpec { return &rs.Spec.Template })
	case "Job":
		return templatePod(raw, func(j *batchv1.Job) *corev1.PodTemplateSpec { return &j.Spec.Template })
	case "CronJob":
		return templatePod(raw, func(c *batchv1.CronJob) *corev1.PodTemplateSpec { return &c.Spec.JobTemplate.Spec.Template })
	}
	return nil, fmt.Errorf("kind %q, want one of %s", meta.Kind, strings.Join(workloadKinds, ", "))
}

// templatePod decodes a workload of type W and returns its pod template (template) as a Pod named
// "<kind>/<name>", in the workload's namespace.
func templatePod[W any, PW interface {
	*W
	metav1.Object
	GetObjectKind() schema.ObjectKind
}](raw json.RawMessage, template func(PW) *corev1.PodTemplateSpec) (*corev1.Pod, error) {
	w := PW(new(W))
	if err := json.Unmarshal(raw, w); err != nil {
		return nil, err
	}
	t := template(w)
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: t.ObjectMeta, Spec: t.Spec}
	pod.Name = w.GetObjectKind().GroupVersionKind().Kind + "/" + w.GetName()
	pod.Namespace = w.GetNamespace()
	return pod, nil
}

// autoscalerReasons are the events the Cluster Autoscaler writes on a pending pod it has weighed.
var autoscalerReasons = []string{"TriggeredScaleUp", "NotTriggerScaleUp"}

// explainPending explains every pending pod the scheduler found no node for (what the autoscaler acts on), with the
// autoscaler's latest events on it, and says how many of them fit no pool.
func explainPending(ctx context.Context, client kubernetes.Interface, cfg *config.Config, templates []Template,
	namespace string, out io.Writer) (unfit int, err error) {
	list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"status.phase": string(corev1.PodPending), "spec.nodeName": ""}.String()})
	if err != nil {
		return 0, fmt.Errorf("pending pods: %w", err)
	}
	sets, err := client.AppsV1().DaemonSets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("daemon sets: %w", err)
	}
	templates = WithDaemonSets(templates, sets.Items)
	found := 0
	for i := range list.Items {
		pod := &list.Items[i]
		if !unschedulable(pod) {
			continue
		}
		found++
		r := Explain(cfg, templates, pod)
		fmt.Fprint(out, r.String())
		if !r.Fits() {
			unfit++
		}
		events, err := client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.uid": string(pod.UID)}.String()})
		if err != nil {
			return unfit, fmt.Errorf("events of %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		mine := slices.DeleteFunc(events.Items, func(e corev1.Event) bool { return e.InvolvedObject.UID != pod.UID })
		for _, line := range autoscalerView(mine, cfg.Autoscaler.ScanInterval) {
			fmt.Fprintf(out, "  autoscaler: %s\n", line)
		}
	}
	if found == 0 {
		fmt.Fprintln(out, "no pending pod that the scheduler found no node for")
	}
	return unfit, nil
}

// unschedulable: the scheduler wrote PodScheduled=False, Unschedulable, the condition the autoscaler looks for.
func unschedulable(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse &&
			c.Reason == corev1.PodReasonUnschedulable
	})
}

// autoscalerView is the latest autoscaler event of each reason, oldest first, or a line saying there is none (with
// the autoscaler's loop interval, scan).
func autoscalerView(events []corev1.Event, scan time.Duration) []string {
	latest := map[string]corev1.Event{}
	for _, e := range events {
		if !slices.Contains(autoscalerReasons, e.Reason) {
			continue
		}
		if prev, ok := latest[e.Reason]; !ok || eventTime(e).After(eventTime(prev).Time) {
			latest[e.Reason] = e
		}
	}
	if len(latest) == 0 {
		return []string{"no " + strings.Join(autoscalerReasons, " or ") + " event yet (its loop runs every " +
			scan.String() + ")"}
	}
	var picked []corev1.Event
	for _, e := range latest {
		picked = append(picked, e)
	}
	slices.SortFunc(picked, func(a, b corev1.Event) int { return eventTime(a).Compare(eventTime(b).Time) })
	var lines []string
	for _, e := range picked {
		lines = append(lines, fmt.Sprintf("%s (%dx, last %s): %s", e.Reason, max(e.Count, 1),
			eventTime(e).UTC().Format("2006-01-02T15:04:05Z"), e.Message))
	}
	return lines
}

// eventTime is when an event was last seen: lastTimestamp, or eventTime for events written through events.k8s.io.
func eventTime(e corev1.Event) metav1.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp
	}
	return metav1.Time{Time: e.EventTime.Time}
}
