package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	astypes "github.com/aws/aws-sdk-go-v2/service/autoscaling/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"

	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/names"
)

// now is the report's time in every case.
var now = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) time.Time { return now.Add(-d) }

// fakeAWS answers the four read calls from its fields, as EC2 Auto Scaling, EC2 and SSM would.
type fakeAWS struct {
	groups     []astypes.AutoScalingGroup
	warm       map[string][]astypes.Instance
	activities map[string][]astypes.Activity
	instances  []ec2types.Instance
	parameters []ssmtypes.ParameterMetadata
	// fail names a call that fails with err.
	fail string
	err  error
}

func (f *fakeAWS) failed(call string) error {
	if f.fail == call {
		return f.err
	}
	return nil
}

func (f *fakeAWS) DescribeAutoScalingGroups(_ context.Context, in *autoscaling.DescribeAutoScalingGroupsInput, _ ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error) {
	if err := f.failed("DescribeAutoScalingGroups"); err != nil {
		return nil, err
	}
	out := &autoscaling.DescribeAutoScalingGroupsOutput{}
	for _, g := range f.groups {
		if hasTags(g.Tags, in.Filters) {
			out.AutoScalingGroups = append(out.AutoScalingGroups, g)
		}
	}
	return out, nil
}

// hasTags applies tag:<key> filters as EC2 Auto Scaling does.
func hasTags(tags []astypes.TagDescription, filters []astypes.Filter) bool {
	for _, f := range filters {
		key, ok := strings.CutPrefix(aws.ToString(f.Name), "tag:")
		if !ok {
			panic("filter " + aws.ToString(f.Name))
		}
		found := false
		for _, t := range tags {
			for _, v := range f.Values {
				found = found || (aws.ToString(t.Key) == key && aws.ToString(t.Value) == v)
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func (f *fakeAWS) DescribeWarmPool(_ context.Context, in *autoscaling.DescribeWarmPoolInput, _ ...func(*autoscaling.Options)) (*autoscaling.DescribeWarmPoolOutput, error) {
	if err := f.failed("DescribeWarmPool"); err != nil {
		return nil, err
	}
	return &autoscaling.DescribeWarmPoolOutput{Instances: f.warm[aws.ToString(in.AutoScalingGroupName)]}, nil
}

func (f *fakeAWS) DescribeScalingActivities(_ context.Context, in *autoscaling.DescribeScalingActivitiesInput, _ ...func(*autoscaling.Options)) (*autoscaling.DescribeScalingActivitiesOutput, error) {
	if err := f.failed("DescribeScalingActivities"); err != nil {
		return nil, err
	}
	return &autoscaling.DescribeScalingActivitiesOutput{Activities: f.activities[aws.ToString(in.AutoScalingGroupName)]}, nil
}

func (f *fakeAWS) DescribeInstances(_ context.Context, in *ec2.DescribeInstancesInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	if err := f.failed("DescribeInstances"); err != nil {
		return nil, err
	}
	out := &ec2.DescribeInstancesOutput{}
	for _, i := range f.instances {
		match := true
		for _, flt := range in.Filters {
			key, _ := strings.CutPrefix(aws.ToString(flt.Name), "tag:")
			ok := false
			for _, t := range i.Tags {
				ok = ok || (aws.ToString(t.Key) == key && aws.ToString(t.Value) == flt.Values[0])
			}
			match = match && ok
		}
		if match {
			out.Reservations = append(out.Reservations, ec2types.Reservation{Instances: []ec2types.Instance{i}})
		}
	}
	return out, nil
}

func (f *fakeAWS) DescribeParameters(_ context.Context, in *ssm.DescribeParametersInput, _ ...func(*ssm.Options)) (*ssm.DescribeParametersOutput, error) {
	if err := f.failed("DescribeParameters"); err != nil {
		return nil, err
	}
	out := &ssm.DescribeParametersOutput{}
	for _, p := range f.parameters {
		if aws.ToString(p.Name) == in.ParameterFilters[0].Values[0] {
			out.Parameters = append(out.Parameters, p)
		}
	}
	return out, nil
}

type fakeWireGuard struct {
	devices []*wgtypes.Device
	err     error
}

func (f fakeWireGuard) Devices() ([]*wgtypes.Device, error) { return f.devices, f.err }

// world is a stack's state as the sources give it: by default the dev stack asleep at zero, everything healthy.
type world struct {
	aws  *fakeAWS
	wg   *fakeWireGuard
	kube []runtime.Object
	meta []runtime.Object
	// noAWS and noKube leave those clients out, with these reasons.
	noAWS, noKube error
}

func devConfig(t *testing.T) *config.Config {
	t.Helper()
	sc, err := config.LoadStackFile("../../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	cfg, err := config.ParseValues(sc.Values)
	assert.NilError(t, err)
	return cfg
}

func devBill(t *testing.T) *plan.IdleBill {
	t.Helper()
	res, err := plan.Run("dev", "../../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	b := res.IdleBill()
	return &b
}

func tag(k, v string) astypes.TagDescription {
	return astypes.TagDescription{Key: aws.String(k), Value: aws.String(v)}
}

func ec2Tag(k, v string) ec2types.Tag { return ec2types.Tag{Key: aws.String(k), Value: aws.String(v)} }

func group(cfg *config.Config, pool, name string, desired int32, states ...astypes.LifecycleState) astypes.AutoScalingGroup {
	g := astypes.AutoScalingGroup{AutoScalingGroupName: aws.String(name), MinSize: aws.Int32(0), MaxSize: aws.Int32(4),
		DesiredCapacity: aws.Int32(desired),
		Tags:            []astypes.TagDescription{tag(names.TagCluster, cfg.ClusterName), tag(names.TagPool, pool)}}
	for i, s := range states {
		g.Instances = append(g.Instances, astypes.Instance{InstanceId: aws.String("i-0000000000000000" + string(rune('a'+i))),
			LifecycleState: s})
	}
	return g
}

func gatewayInstance(cfg *config.Config, state ec2types.InstanceStateName, since time.Time) ec2types.Instance {
	return ec2types.Instance{InstanceId: aws.String("i-0gateway00000000a"), State: &ec2types.InstanceState{Name: state},
		LaunchTime: aws.Time(since),
		Tags: []ec2types.Tag{ec2Tag("Name", cfg.ClusterName+"-wireguard-gateway"), ec2Tag(names.TagCluster, cfg.ClusterName),
			ec2Tag("dynk8s:idleStop", "15m0s")}}
}

func poolNode(name, pool string, ready bool, since time.Time) *corev1.Node {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.LabelPool: pool},
		CreationTimestamp: metav1.NewTime(since.Add(-20 * time.Second))},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status,
			LastTransitionTime: metav1.NewTime(since)}}}}
}

func tokenSecret(name string, created time.Time) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, CreationTimestamp: metav1.NewTime(created),
			Labels: map[string]string{"app.kubernetes.io/managed-by": names.JoinTokenManagedBy}}}
}

func lease(holder string, renewed time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "dynk8s-controller"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: aws.String(holder), LeaseDurationSeconds: aws.Int32(15),
			RenewTime: &metav1.MicroTime{Time: renewed}}}
}

var partLabels = map[string]string{"app.kubernetes.io/part-of": "dynk8s", "app.kubernetes.io/managed-by": "pulumi"}

func deployment(name string, want, ready int32) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, Labels: partLabels},
		Spec: appsv1.DeploymentSpec{Replicas: aws.Int32(want)}, Status: appsv1.DeploymentStatus{ReadyReplicas: ready}}
}

func daemonSet(name string, want, ready int32) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, Labels: partLabels},
		Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: want, NumberReady: ready}}
}

// onPremPeer is the on-prem peer's interface with its gateway peer, its last handshake ago.
func onPremPeer(handshake time.Duration) *wgtypes.Device {
	_, vpc, _ := net.ParseCIDR("10.200.0.0/16")
	_, tunnel, _ := net.ParseCIDR("10.201.0.1/32")
	p := wgtypes.Peer{Endpoint: &net.UDPAddr{IP: net.ParseIP("203.0.113.59"), Port: 51820},
		AllowedIPs: []net.IPNet{*tunnel, *vpc}, ReceiveBytes: 3 << 20, TransmitBytes: 512 << 10}
	if handshake >= 0 {
		p.LastHandshakeTime = ago(handshake)
	}
	return &wgtypes.Device{Name: "dynk8s-onprem", Peers: []wgtypes.Peer{p}}
}

func newWorld(cfg *config.Config) *world {
	return &world{
		aws: &fakeAWS{
			groups: []astypes.AutoScalingGroup{group(cfg, "builders-x86", "homelab-builders-x86-2026", 0),
				group(cfg, "builders-arm", "homelab-builders-arm-2026", 0)},
			instances: []ec2types.Instance{gatewayInstance(cfg, ec2types.InstanceStateNameStopped, ago(3*time.Hour))},
			parameters: []ssmtypes.ParameterMetadata{{Name: aws.String("/dynk8s/homelab/join-token"),
				LastModifiedDate: aws.Time(ago(10 * time.Minute))}},
		},
		wg: &fakeWireGuard{devices: []*wgtypes.Device{{Name: "wg-other"}, onPremPeer(2 * time.Hour)}},
		kube: []runtime.Object{lease("dynk8s-controller-7d9f-abcde", ago(3*time.Second)),
			deployment("cluster-autoscaler", 1, 1), deployment("dynk8s-controller", 2, 2),
			daemonSet("fuse-device-plugin", 0, 0), daemonSet("aws-node-termination-handler", 0, 0),
			// Not the stack's: never listed.
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns"},
				Spec: appsv1.DeploymentSpec{Replicas: aws.Int32(2)}}},
		meta: []runtime.Object{tokenSecret("bootstrap-token-old111", ago(50*time.Minute)),
			tokenSecret("bootstrap-token-new222", ago(10*time.Minute+time.Second))},
	}
}

func (w *world) collect(t *testing.T, cfg *config.Config, bill *plan.IdleBill) Report {
	t.Helper()
	src := Sources{AWSError: w.noAWS, KubeError: w.noKube}
	if w.noAWS == nil {
		src.AutoScaling, src.EC2, src.SSM = w.aws, w.aws, w.aws
	}
	if w.noKube == nil {
		src.Kube = fake.NewClientset(w.kube...)
		scheme := metadatafake.NewTestScheme()
		scheme.AddKnownTypeWithName(corev1.SchemeGroupVersion.WithKind("Secret"), &metav1.PartialObjectMetadata{})
		scheme.AddKnownTypeWithName(corev1.SchemeGroupVersion.WithKind("SecretList"), &metav1.PartialObjectMetadataList{})
		src.Metadata = metadatafake.NewSimpleMetadataClient(scheme, w.meta...)
	}
	if w.wg != nil {
		src.WireGuard = w.wg
	}
	return Collect(context.Background(), src, Input{Stack: "dev", Config: cfg, Bill: bill, Now: now})
}

// burst is the world in a burst: one builders-x86 instance in service, its Node Ready, the gateway awake with the
// tunnel up.
func burst(cfg *config.Config, w *world) {
	w.aws.groups[0] = group(cfg, "builders-x86", "homelab-builders-x86-2026", 1, astypes.LifecycleStateInService)
	w.aws.activities = map[string][]astypes.Activity{"homelab-builders-x86-2026": {
		{Description: aws.String("Terminating EC2 instance: i-0123456789abcdef0"), StatusCode: astypes.ScalingActivityStatusCodeSuccessful,
			StartTime: aws.Time(ago(2 * time.Hour)), EndTime: aws.Time(ago(2*time.Hour - time.Minute))},
		{Description: aws.String("Launching a new EC2 instance: i-0000000000000000a"), StatusCode: astypes.ScalingActivityStatusCodeSuccessful,
			StartTime: aws.Time(ago(5 * time.Minute)), EndTime: aws.Time(ago(5*time.Minute - 48*time.Second))},
		{Description: aws.String("Launching a new EC2 instance: i-0123456789abcdef0"), StatusCode: astypes.ScalingActivityStatusCodeSuccessful,
			StartTime: aws.Time(ago(3 * time.Hour)), EndTime: aws.Time(ago(3*time.Hour - time.Minute))},
	}}
	w.aws.instances[0] = gatewayInstance(cfg, ec2types.InstanceStateNameRunning, ago(5*time.Minute))
	w.kube = append(w.kube, poolNode("i-0000000000000000a", "builders-x86", true, ago(5*time.Minute-61*time.Second)))
	w.wg.devices[1] = onPremPeer(40 * time.Second)
	w.kube[2] = deployment("dynk8s-controller", 2, 2)
	w.kube = append(w.kube[:3], append([]runtime.Object{daemonSet("fuse-device-plugin", 1, 1)}, w.kube[4:]...)...)
}

// TestStatusScreens pins the text screen of the two usual states, asleep at zero and in a burst (golden files,
// reviewed when they change).
func TestStatusScreens(t *testing.T) {
	cfg, bill := devConfig(t), devBill(t)
	for name, change := range map[string]func(*world){
		"asleep": func(*world) {},
		"burst":  func(w *world) { burst(cfg, w) },
	} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(cfg)
			change(w)
			r := w.collect(t, cfg, bill)
			assert.DeepEqual(t, r.Problems, []string{})
			assert.DeepEqual(t, r.Unread, []string{})
			var out bytes.Buffer
			assert.NilError(t, r.WriteText(&out))
			golden.Assert(t, out.String(), name+".golden")
		})
	}
}

// TestStatusReadsTheBurst checks the figures of a burst as the report holds them (what -o json prints).
func TestStatusReadsTheBurst(t *testing.T) {
	cfg, bill := devConfig(t), devBill(t)
	w := newWorld(cfg)
	burst(cfg, w)
	w.aws.groups[1] = group(cfg, "builders-arm", "homelab-builders-arm-2026", 2, astypes.LifecycleStatePending,
		astypes.LifecycleStatePendingWait, astypes.LifecycleStateTerminating)
	w.aws.groups[1].WarmPoolConfiguration = &astypes.WarmPoolConfiguration{}
	// The group launches version 10 of its template: the warm instances of version 9 and 2 are stale, the one of
	// version 10 is not; one the answer gives no version of is not judged.
	w.aws.groups[1].LaunchTemplate = &astypes.LaunchTemplateSpecification{Version: aws.String("10")}
	lt := func(v string) *astypes.LaunchTemplateSpecification {
		return &astypes.LaunchTemplateSpecification{Version: aws.String(v)}
	}
	w.aws.warm = map[string][]astypes.Instance{"homelab-builders-arm-2026": {
		{InstanceId: aws.String("i-0warm000000000002"), LifecycleState: astypes.LifecycleStateWarmedStopped, LaunchTemplate: lt("9")},
		{InstanceId: aws.String("i-0warm000000000001"), LifecycleState: astypes.LifecycleStateWarmedStopped, LaunchTemplate: lt("2")},
		{InstanceId: aws.String("i-0warm000000000003"), LifecycleState: astypes.LifecycleStateWarmedStopped, LaunchTemplate: lt("10")},
		{InstanceId: aws.String("i-0warm000000000004"), LifecycleState: astypes.LifecycleStateWarmedPending}}}
	r := w.collect(t, cfg, bill)

	x86, arm := r.Pools[0], r.Pools[1]
	assert.Check(t, is.Equal(x86.Group, "homelab-builders-x86-2026"))
	assert.Check(t, is.Equal(x86.Desired, 1))
	assert.Check(t, is.Equal(x86.InService, 1))
	assert.Check(t, is.Len(x86.Nodes, 1))
	assert.Check(t, x86.Nodes[0].Ready)
	// The newest launch, not the list's first activity, and its Node's Ready time.
	assert.Assert(t, x86.LastScaleUp != nil)
	assert.Check(t, is.Equal(x86.LastScaleUp.Instance, "i-0000000000000000a"))
	assert.Check(t, is.Equal(x86.LastScaleUp.End.Sub(x86.LastScaleUp.Start), 48*time.Second))
	assert.Check(t, is.Equal(x86.LastScaleUp.Ready.Sub(x86.LastScaleUp.Start), 61*time.Second))
	assert.Check(t, is.Equal(arm.Booting, 2))
	assert.Check(t, is.Equal(arm.Leaving, 1))
	assert.Check(t, is.Equal(arm.InService, 0))
	assert.Check(t, is.DeepEqual(arm.Warm, &Warm{Size: 4, States: map[string]int{"Warmed:Stopped": 3, "Warmed:Pending": 1},
		Stale: []string{"i-0warm000000000001", "i-0warm000000000002"}}))
	assert.Check(t, is.Equal(warmCell(arm.Warm), "1 Pending, 3 Stopped, 2 stale"))
	assert.Check(t, arm.LastScaleUp == nil)

	assert.Check(t, is.Equal(r.Gateway.State, "running"))
	assert.Check(t, is.Equal(r.Gateway.IdleStop, "15m0s"))
	assert.Check(t, r.Tunnel.Up)
	assert.Check(t, is.Equal(r.Tunnel.Interface, "dynk8s-onprem"))
	assert.Check(t, is.Equal(r.Tunnel.Endpoint, "203.0.113.59:51820"))
	assert.Check(t, is.Equal(r.Token.Count, 2))
	assert.Check(t, is.Equal(*r.Token.Newest, ago(10*time.Minute+time.Second)))
	assert.Check(t, is.Equal(r.Token.Every, Duration(40*time.Minute)))
	assert.Check(t, r.Controller.Leads)

	// The hour now: the gateway's and one builders-x86 node's, priced; the arm pool's spot instances are not.
	hourly, terms, priced := NowHourly(r)
	assert.Check(t, !priced)
	assert.Check(t, is.DeepEqual(terms, []string{"gateway $0.0096/h", "1 × builders-x86 $0.4254/h",
		"2 × builders-arm (spot, not priced)"}))
	assert.Check(t, is.Equal(hourly, 0.0096+0.4254))
}

// TestStatusProblems checks that each state that needs the operator is listed, with where to look, and that the
// healthy states around it are not.
func TestStatusProblems(t *testing.T) {
	cfg := devConfig(t)
	for _, c := range []struct {
		name   string
		change func(*world)
		want   []string
	}{{
		name: "a Node NotReady past its grace",
		change: func(w *world) {
			w.kube = append(w.kube, poolNode("i-0000000000000000b", "builders-x86", false, ago(6*time.Minute)),
				poolNode("i-0000000000000000c", "builders-x86", false, ago(2*time.Minute)))
		},
		want: []string{"pool builders-x86: Node i-0000000000000000b is not Ready (since 2026-12-04T11:54:00Z): kubectl describe node i-0000000000000000b"},
	}, {
		name: "a Node of a pool the stack does not declare",
		change: func(w *world) {
			w.kube = append(w.kube, poolNode("i-0000000000000000d", "gpu", true, ago(time.Hour)))
		},
		want: []string{"Node i-0000000000000000d has dynk8s.io/pool=gpu, a pool the stack does not declare: a pool removed " +
			"with its nodes still there (kubectl drain i-0000000000000000d, then kubectl delete node i-0000000000000000d)"},
	}, {
		name: "instances in service while the gateway sleeps",
		change: func(w *world) {
			w.aws.groups[1] = group(cfg, "builders-arm", "homelab-builders-arm-2026", 1, astypes.LifecycleStateInService)
		},
		want: []string{"pool builders-arm: 1 instance(s) in service while the gateway is stopped: they cannot reach the " +
			"cluster; a node's boot and the controller's wake-up start it (journalctl -u dynk8s-join on the node, the " +
			"controller's log)"},
	}, {
		name: "a group missing",
		change: func(w *world) {
			w.aws.groups = w.aws.groups[:1]
		},
		want: []string{"pool builders-arm: no Auto Scaling group tagged dynk8s:cluster=homelab and dynk8s:pool=builders-arm (is the stack up?)"},
	}, {
		name: "another stack's group is not this one's",
		change: func(w *world) {
			other := *cfg
			other.ClusterName = "other"
			w.aws.groups[1] = group(&other, "builders-arm", "other-builders-arm-2026", 3, astypes.LifecycleStateInService)
		},
		want: []string{"pool builders-arm: no Auto Scaling group tagged dynk8s:cluster=homelab and dynk8s:pool=builders-arm (is the stack up?)"},
	}, {
		name: "the gateway awake past its grace with no handshake",
		change: func(w *world) {
			w.aws.instances[0] = gatewayInstance(cfg, ec2types.InstanceStateNameRunning, ago(10*time.Minute))
			w.wg.devices[1] = onPremPeer(4 * time.Minute)
		},
		want: []string{"tunnel: the gateway has run since 2026-12-04T11:50:00Z and the last handshake on dynk8s-onprem was " +
			"2026-12-04T11:56:00Z: on the gateway, journalctl -u wg-quick@wg0 (docs/troubleshooting.md, \"When the tunnel does not come up\")"},
	}, {
		name: "the gateway just started: no handshake yet is no problem",
		change: func(w *world) {
			w.aws.instances[0] = gatewayInstance(cfg, ec2types.InstanceStateNameRunning, ago(time.Minute))
			w.wg.devices[1] = onPremPeer(-1)
		},
	}, {
		name: "no gateway",
		change: func(w *world) {
			w.aws.instances = nil
		},
		want: []string{"gateway: no instance tagged Name=homelab-wireguard-gateway and dynk8s:cluster=homelab (is the stack up?)"},
	}, {
		name: "two gateways",
		change: func(w *world) {
			second := gatewayInstance(cfg, ec2types.InstanceStateNameStopped, ago(time.Hour))
			second.InstanceId = aws.String("i-0gateway00000000b")
			w.aws.instances = append(w.aws.instances, second)
		},
		want: []string{"gateway: 2 instances are tagged Name=homelab-wireguard-gateway: i-0gateway00000000a, i-0gateway00000000b; the stack declares one"},
	}, {
		name: "a terminated gateway is not the gateway",
		change: func(w *world) {
			w.aws.instances = append(w.aws.instances, gatewayInstance(cfg, ec2types.InstanceStateNameTerminated, ago(time.Hour)))
		},
	}, {
		name: "no rotation past its period",
		change: func(w *world) {
			w.meta = w.meta[:1]
		},
		want: []string{"join token: the newest was issued 50m0s ago, and the rotator issues one every 40m0s: is a controller " +
			"leading? (its log: kubectl -n kube-system logs <the Lease's holder>)"},
	}, {
		name: "no token at all",
		change: func(w *world) {
			w.meta = nil
		},
		want: []string{"join token: no token Secret in kube-system (app.kubernetes.io/managed-by=dynk8s-join-token-rotator): " +
			"no node can join; is a controller leading?"},
	}, {
		name: "the newest token not written to SSM",
		change: func(w *world) {
			w.aws.parameters[0].LastModifiedDate = aws.Time(ago(50 * time.Minute))
		},
		want: []string{"join token: the newest token (issued 2026-12-04T11:49:59Z) is not in SSM (written 2026-12-04T11:10:00Z): " +
			"the rotator cannot write /dynk8s/homelab/join-token; the controller's log says why"},
	}, {
		name: "no leader",
		change: func(w *world) {
			w.kube[0] = lease("dynk8s-controller-7d9f-abcde", ago(time.Minute))
		},
		want: []string{"controller: no replica leads (Lease kube-system/dynk8s-controller renewed 2026-12-04T11:59:00Z by " +
			"\"dynk8s-controller-7d9f-abcde\"): nothing approves a node's CSR; kubectl -n kube-system get pods -l " +
			"app.kubernetes.io/name=dynk8s-controller"},
	}, {
		name: "a workload not ready",
		change: func(w *world) {
			w.kube[1] = deployment("cluster-autoscaler", 1, 0)
			w.kube[3] = daemonSet("fuse-device-plugin", 2, 1)
		},
		want: []string{"DaemonSet kube-system/fuse-device-plugin: 1 of 2 ready: kubectl -n kube-system describe daemonset fuse-device-plugin",
			"Deployment kube-system/cluster-autoscaler: 0 of 1 ready: kubectl -n kube-system describe deployment cluster-autoscaler"},
	}} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(cfg)
			c.change(w)
			r := w.collect(t, cfg, nil)
			want := c.want
			if want == nil {
				want = []string{}
			}
			assert.DeepEqual(t, r.Problems, want)
			assert.DeepEqual(t, r.Unread, []string{})
		})
	}
}

// TestStatusReadsWhatItCan checks that a source that fails or is missing leaves the others' view, and says so once.
func TestStatusReadsWhatItCan(t *testing.T) {
	cfg := devConfig(t)
	denied := errors.New("api error AccessDenied: User: arn:aws:iam::123456789012:user/op is not authorized")
	for _, c := range []struct {
		name   string
		change func(*world)
		unread []string
		check  func(t *testing.T, r Report)
	}{{
		name:   "no AWS credentials",
		change: func(w *world) { w.noAWS = errors.New("no AWS credentials: no profile") },
		unread: []string{"AWS (the groups, the gateway, the join token parameter): no AWS credentials: no profile"},
		check: func(t *testing.T, r Report) {
			assert.Check(t, is.Equal(r.Pools[0].Error, notRead))
			assert.Check(t, is.Equal(r.Gateway.Error, notRead))
			assert.Check(t, r.Controller.Leads)
			assert.Check(t, is.Equal(r.Token.Count, 2))
			assert.Check(t, is.Len(r.Parts, 4))
		},
	}, {
		name:   "no cluster",
		change: func(w *world) { w.noKube = errors.New("kubeconfig: no configuration") },
		unread: []string{"the cluster (the Nodes, the join token Secrets, the controller's Lease, the workloads): kubeconfig: no configuration"},
		check: func(t *testing.T, r Report) {
			assert.Check(t, is.Equal(r.Gateway.State, "stopped"))
			assert.Check(t, is.Equal(r.Pools[1].Group, "homelab-builders-arm-2026"))
			assert.Check(t, is.Equal(r.Token.Error, "Secrets not read (below)"))
			assert.Check(t, r.Token.Written != nil)
		},
	}, {
		name: "Auto Scaling denied",
		change: func(w *world) {
			w.aws.fail, w.aws.err = "DescribeAutoScalingGroups", denied
		},
		unread: []string{"Auto Scaling groups: autoscaling:DescribeAutoScalingGroups: " + denied.Error()},
		check: func(t *testing.T, r Report) {
			assert.Check(t, is.Equal(r.Gateway.State, "stopped"))
		},
	}, {
		name:   "scaling activities denied",
		change: func(w *world) { w.aws.fail, w.aws.err = "DescribeScalingActivities", denied },
		unread: []string{"pool builders-x86: scaling activities: autoscaling:DescribeScalingActivities: " + denied.Error(),
			"pool builders-arm: scaling activities: autoscaling:DescribeScalingActivities: " + denied.Error()},
		check: func(t *testing.T, r Report) {
			assert.Check(t, is.Equal(r.Pools[0].Desired, 0))
		},
	}, {
		name:   "SSM denied",
		change: func(w *world) { w.aws.fail, w.aws.err = "DescribeParameters", denied },
		unread: []string{"join token parameter: ssm:DescribeParameters: " + denied.Error()},
	}, {
		name:   "WireGuard not readable (not root) is a note, not a failure",
		change: func(w *world) { w.wg.err = os.ErrPermission },
		check: func(t *testing.T, r Report) {
			assert.Check(t, is.Contains(r.Tunnel.Note, "not root"))
		},
	}, {
		name: "a handshake younger than a session is not a tunnel once the gateway has stopped",
		change: func(w *world) {
			w.wg.devices[1] = onPremPeer(90 * time.Second)
		},
		check: func(t *testing.T, r Report) {
			assert.Check(t, !r.Tunnel.Up)
			assert.Check(t, r.Tunnel.LastHandshake != nil)
		},
	}, {
		name:   "not the on-prem peer's host is a note",
		change: func(w *world) { w.wg.devices = w.wg.devices[:1] },
		check: func(t *testing.T, r Report) {
			assert.Check(t, is.Equal(r.Tunnel.Note, "no WireGuard interface on this host has a peer for the VPC "+
				"10.200.0.0/16: run status on the on-prem peer"))
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(cfg)
			c.change(w)
			r := w.collect(t, cfg, nil)
			want := c.unread
			if want == nil {
				want = []string{}
			}
			assert.DeepEqual(t, r.Unread, want)
			assert.DeepEqual(t, r.Problems, []string{})
			if c.check != nil {
				c.check(t, r)
			}
		})
	}
}

// TestStatusExitCodes runs Main on a stack file: a wrong one is refused before anything is read; a good one with no
// cluster and no AWS prints what it could not read and exits 1.
func TestStatusExitCodes(t *testing.T) {
	t.Setenv("KUBECONFIG", "/nonexistent/kubeconfig")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent/config")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	var out, errOut bytes.Buffer
	assert.Equal(t, Main(context.Background(), []string{"-o", "yaml"}, &out, &errOut), 2)
	assert.Equal(t, Main(context.Background(), []string{"-config", "testdata/no-such.yaml"}, &out, &errOut), 1)
	assert.Check(t, is.Contains(errOut.String(), "testdata/no-such.yaml"))

	out.Reset()
	code := Main(context.Background(), []string{"-config", "../../../Pulumi.dev.yaml", "-o", "json"}, &out, &errOut)
	assert.Equal(t, code, 1)
	assert.Check(t, is.Contains(out.String(), `"unread": [`))
	assert.Check(t, is.Contains(out.String(), "no AWS credentials"))
	assert.Check(t, is.Contains(out.String(), `"every": "40m0s"`))
	// What -o json prints reads back as the report (the e2e reads it so).
	var r Report
	assert.NilError(t, json.Unmarshal(out.Bytes(), &r))
	assert.Check(t, is.Equal(r.Token.Every, Duration(40*time.Minute)))
	assert.Check(t, is.Contains(out.String(), `"monthlyUsd": 13.746`))
}
