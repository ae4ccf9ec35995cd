package status

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	astypes "github.com/aws/aws-sdk-go-v2/service/autoscaling/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	nodeutil "k8s.io/component-helpers/node/util"

	"github.com/dynk8s/dynk8s/cmd/internal/wgpeer"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/names"
)

// AutoScaling is the EC2 Auto Scaling API status reads; the SDK's client satisfies it.
type AutoScaling interface {
	DescribeAutoScalingGroups(ctx context.Context, in *autoscaling.DescribeAutoScalingGroupsInput, opts ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error)
	DescribeWarmPool(ctx context.Context, in *autoscaling.DescribeWarmPoolInput, opts ...func(*autoscaling.Options)) (*autoscaling.DescribeWarmPoolOutput, error)
	DescribeScalingActivities(ctx context.Context, in *autoscaling.DescribeScalingActivitiesInput, opts ...func(*autoscaling.Options)) (*autoscaling.DescribeScalingActivitiesOutput, error)
}

// EC2 is the EC2 API status reads: the gateway instance.
type EC2 interface {
	DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
}

// SSM is the SSM API status reads: the join token parameter's metadata, never its value.
type SSM interface {
	DescribeParameters(ctx context.Context, in *ssm.DescribeParametersInput, opts ...func(*ssm.Options)) (*ssm.DescribeParametersOutput, error)
}

// WireGuard lists this host's WireGuard interfaces; wgctrl's client satisfies it.
type WireGuard interface {
	Devices() ([]*wgtypes.Device, error)
}

// Sources are what status reads, each with the operator's own credentials and read-only calls. A nil AWS source
// (no credentials) or WireGuard (none on this host) leaves its parts unread, with the reason in Unread or the
// tunnel's note; AWSError says why the AWS clients are missing.
type Sources struct {
	Kube        kubernetes.Interface
	Metadata    metadata.Interface
	AutoScaling AutoScaling
	EC2         EC2
	SSM         SSM
	AWSError    error
	// KubeError is why Kube and Metadata are nil.
	KubeError error
	WireGuard WireGuard
	// WireGuardError is why WireGuard is nil.
	WireGuardError error
}

// Input is what the report is of.
type Input struct {
	Stack  string
	Config *config.Config
	// Bill is the plan's idle bill of the stack (nil: BillError says why).
	Bill      *plan.IdleBill
	BillError error
	// Interface is the on-prem peer's WireGuard interface ("": the one whose peer routes the VPC).
	Interface string
	Now       time.Time
}

// RejectAfter is how old a WireGuard session may be before it is dropped (REJECT_AFTER_TIME, 180 s: the WireGuard
// paper, section 6.1): a latest handshake older than that means no traffic can cross the tunnel now. A peer with
// PersistentKeepalive, as the on-prem peer in dial-out mode, renews it every two minutes while the gateway runs.
const RejectAfter = 180 * time.Second

// Grace periods before a state counts as a problem: a Node may take this long to turn Ready, a gateway to bring its
// tunnel up after its start, a rotation to land after it was due.
const (
	nodeReadyGrace = 5 * time.Minute
	tunnelGrace    = 3 * time.Minute
	rotationGrace  = 5 * time.Minute
	// sameWrite is how far apart the token Secret's creation and the parameter's write may be (two clocks, the
	// API server's and SSM's, and the SSM call after the Secret).
	sameWrite = time.Minute
)

// callTimeout bounds each read: an unreachable service is reported, not waited on.
const callTimeout = 20 * time.Second

// Collect reads the stack's state. It never fails as a whole: each part that could not be read names why in
// Report.Unread, and what needs the operator is in Report.Problems.
func Collect(ctx context.Context, src Sources, in Input) Report {
	cfg := in.Config
	r := Report{Stack: in.Stack, Cluster: cfg.ClusterName, Region: cfg.Region, Time: in.Now.UTC(),
		Bill: in.Bill, Problems: []string{}, Unread: []string{}}
	if in.BillError != nil {
		r.BillError = in.BillError.Error()
	}
	c := collector{ctx: ctx, src: src, in: in, r: &r}
	// A missing client is said once, not at each part it leaves unread.
	if err := c.awsMissing(); err != nil {
		c.unread("AWS (the groups, the gateway, the join token parameter): %v", err)
	}
	if err := c.kubeMissing(); err != nil {
		c.unread("the cluster (the Nodes, the join token Secrets, the controller's Lease, the workloads): %v", err)
	}
	c.pools()
	c.gateway()
	c.tunnel()
	// A session younger than RejectAfter outlives a gateway that just stopped: the tunnel is up only while the
	// gateway runs, when its state is known.
	if st := r.Gateway.State; st != "" && st != string(ec2types.InstanceStateNameRunning) {
		r.Tunnel.Up = false
	}
	c.token()
	c.controller()
	c.parts()
	c.judge()
	return r
}

type collector struct {
	ctx context.Context
	src Sources
	in  Input
	r   *Report
}

func (c *collector) unread(format string, args ...any) string {
	msg := fmt.Sprintf(format, args...)
	c.r.Unread = append(c.r.Unread, msg)
	return msg
}

func (c *collector) problem(format string, args ...any) {
	c.r.Problems = append(c.r.Problems, fmt.Sprintf(format, args...))
}

func (c *collector) call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.ctx, callTimeout)
}

// awsMissing says why AWS is not read, once per part.
func (c *collector) awsMissing() error {
	if c.src.AutoScaling != nil && c.src.EC2 != nil && c.src.SSM != nil {
		return nil
	}
	return cmp.Or(c.src.AWSError, errors.New("no AWS client"))
}

// kubeMissing says why the cluster is not read.
func (c *collector) kubeMissing() error {
	if c.src.Kube != nil && c.src.Metadata != nil {
		return nil
	}
	return cmp.Or(c.src.KubeError, errors.New("no cluster client"))
}

// notRead is a part's error when its client is missing (said once in Unread).
const notRead = "not read (below)"

// pools reads every pool's group, warm pool and last launch, and its Nodes.
func (c *collector) pools() {
	cfg := c.in.Config
	for _, p := range cfg.NodePools {
		c.r.Pools = append(c.r.Pools, Pool{Name: p.Name, Min: p.MinSize, Max: p.MaxSize, Nodes: []Node{}})
	}
	nodes, err := c.poolNodes()
	if err != nil {
		c.unread("Nodes: %v", err)
	}
	groups, groupsErr := c.groups()
	if groupsErr != nil && c.awsMissing() == nil {
		c.unread("Auto Scaling groups: %v", groupsErr)
	}
	for i := range c.r.Pools {
		p := &c.r.Pools[i]
		p.Nodes = append(p.Nodes, nodes[p.Name]...)
		delete(nodes, p.Name)
		if groupsErr != nil {
			p.Error = notRead
			continue
		}
		g, ok := groups[p.Name]
		if !ok {
			p.Error = fmt.Sprintf("no Auto Scaling group tagged %s=%s and %s=%s (is the stack up?)",
				names.TagCluster, cfg.ClusterName, names.TagPool, p.Name)
			c.problem("pool %s: %s", p.Name, p.Error)
			continue
		}
		c.group(p, g)
	}
	for _, pool := range slices.Sorted(maps.Keys(nodes)) {
		for _, n := range nodes[pool] {
			c.problem("Node %s has %s=%s, a pool the stack does not declare: a pool removed with its nodes still "+
				"there (kubectl drain %s, then kubectl delete node %s)", n.Name, kube.LabelPool, pool, n.Name, n.Name)
		}
	}
}

// poolNodes are the Nodes with a pool label, by pool, sorted by name.
func (c *collector) poolNodes() (map[string][]Node, error) {
	if c.kubeMissing() != nil {
		return map[string][]Node{}, nil
	}
	ctx, cancel := c.call()
	defer cancel()
	list, err := c.src.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: kube.LabelPool})
	if err != nil {
		return map[string][]Node{}, err
	}
	out := map[string][]Node{}
	for _, n := range list.Items {
		node := Node{Name: n.Name, Created: n.CreationTimestamp.UTC()}
		if _, cond := nodeutil.GetNodeCondition(&n.Status, corev1.NodeReady); cond != nil {
			node.Ready = cond.Status == corev1.ConditionTrue
			if !cond.LastTransitionTime.IsZero() {
				node.Since = ptr(cond.LastTransitionTime.UTC())
			}
		}
		out[n.Labels[kube.LabelPool]] = append(out[n.Labels[kube.LabelPool]], node)
	}
	for _, ns := range out {
		slices.SortFunc(ns, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	}
	return out, nil
}

// groups are the stack's groups by pool: those tagged with the cluster, told apart by their pool tag.
func (c *collector) groups() (map[string]astypes.AutoScalingGroup, error) {
	if err := c.awsMissing(); err != nil {
		return nil, err
	}
	ctx, cancel := c.call()
	defer cancel()
	in := &autoscaling.DescribeAutoScalingGroupsInput{Filters: []astypes.Filter{
		{Name: aws.String("tag:" + names.TagCluster), Values: []string{c.in.Config.ClusterName}},
	}}
	out := map[string]astypes.AutoScalingGroup{}
	for p := autoscaling.NewDescribeAutoScalingGroupsPaginator(c.src.AutoScaling, in); p.HasMorePages(); {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("autoscaling:DescribeAutoScalingGroups: %w", err)
		}
		for _, g := range page.AutoScalingGroups {
			for _, t := range g.Tags {
				if aws.ToString(t.Key) == names.TagPool {
					pool := aws.ToString(t.Value)
					if prev, dup := out[pool]; dup {
						return nil, fmt.Errorf("two groups tagged %s=%s: %s and %s", names.TagPool, pool,
							aws.ToString(prev.AutoScalingGroupName), aws.ToString(g.AutoScalingGroupName))
					}
					out[pool] = g
				}
			}
		}
	}
	return out, nil
}

// group fills p from its group: the counts, the warm pool, the last launch.
func (c *collector) group(p *Pool, g astypes.AutoScalingGroup) {
	p.Group = aws.ToString(g.AutoScalingGroupName)
	p.Min, p.Max, p.Desired = int(aws.ToInt32(g.MinSize)), int(aws.ToInt32(g.MaxSize)), int(aws.ToInt32(g.DesiredCapacity))
	for _, i := range g.Instances {
		switch s := string(i.LifecycleState); {
		case s == string(astypes.LifecycleStateInService):
			p.InService++
		case strings.HasPrefix(s, "Pending"):
			p.Booting++
		case strings.HasPrefix(s, "Terminating"):
			p.Leaving++
		}
	}
	if g.WarmPoolConfiguration != nil {
		current := ""
		if g.LaunchTemplate != nil {
			current = aws.ToString(g.LaunchTemplate.Version)
		}
		warm, err := c.warmPool(p.Group, current)
		if err != nil {
			p.Error = c.unread("pool %s: warm pool: %v", p.Name, err)
		} else {
			p.Warm = warm
		}
	}
	last, err := c.lastLaunch(p.Group)
	if err != nil {
		p.Error = c.unread("pool %s: scaling activities: %v", p.Name, err)
		return
	}
	if last != nil && last.Instance != "" {
		for _, n := range p.Nodes {
			if n.Name == last.Instance && n.Ready && n.Since != nil {
				last.Ready = n.Since
			}
		}
	}
	p.LastScaleUp = last
}

// warmPool reads the group's warm pool; current is the launch template version the group launches, against which
// a warm instance launched from an older one is stale (it keeps the user data it was launched with).
func (c *collector) warmPool(group, current string) (*Warm, error) {
	ctx, cancel := c.call()
	defer cancel()
	warm := &Warm{States: map[string]int{}}
	p := autoscaling.NewDescribeWarmPoolPaginator(c.src.AutoScaling,
		&autoscaling.DescribeWarmPoolInput{AutoScalingGroupName: aws.String(group)})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("autoscaling:DescribeWarmPool: %w", err)
		}
		for _, i := range out.Instances {
			warm.Size++
			warm.States[string(i.LifecycleState)]++
			if i.LaunchTemplate != nil && names.OlderTemplateVersion(aws.ToString(i.LaunchTemplate.Version), current) {
				warm.Stale = append(warm.Stale, aws.ToString(i.InstanceId))
			}
		}
	}
	slices.Sort(warm.Stale)
	return warm, nil
}

// launchRE finds the instance a launch activity names ("Launching a new EC2 instance: i-0123...").
var launchRE = regexp.MustCompile(`^Launching a new EC2 instance(?: into warm pool)?: (` + names.InstanceIDPattern + `)`)

// lastLaunch is the group's newest activity that launched an instance into service (not into its warm pool);
// nil when EC2 Auto Scaling has none on record.
func (c *collector) lastLaunch(group string) (*Activity, error) {
	ctx, cancel := c.call()
	defer cancel()
	out, err := c.src.AutoScaling.DescribeScalingActivities(ctx, &autoscaling.DescribeScalingActivitiesInput{
		AutoScalingGroupName: aws.String(group), MaxRecords: aws.Int32(50)})
	if err != nil {
		return nil, fmt.Errorf("autoscaling:DescribeScalingActivities: %w", err)
	}
	var last *Activity
	for _, a := range out.Activities {
		desc := aws.ToString(a.Description)
		m := launchRE.FindStringSubmatch(desc)
		if m == nil || strings.Contains(desc, "into warm pool") || a.StartTime == nil {
			continue
		}
		act := &Activity{Description: desc, Status: string(a.StatusCode), Start: a.StartTime.UTC(), Instance: m[1]}
		if a.EndTime != nil {
			act.End = ptr(a.EndTime.UTC())
		}
		if last == nil || act.Start.After(last.Start) {
			last = act
		}
	}
	return last, nil
}

// gateway reads the gateway instance by its Name and cluster tags.
func (c *collector) gateway() {
	g := &c.r.Gateway
	if c.awsMissing() != nil {
		g.Error = notRead
		return
	}
	ctx, cancel := c.call()
	defer cancel()
	name := infra.GatewayName(c.in.Config.ClusterName)
	in := &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
		{Name: aws.String("tag:Name"), Values: []string{name}},
		{Name: aws.String("tag:" + names.TagCluster), Values: []string{c.in.Config.ClusterName}},
	}}
	var found []ec2types.Instance
	for p := ec2.NewDescribeInstancesPaginator(c.src.EC2, in); p.HasMorePages(); {
		page, err := p.NextPage(ctx)
		if err != nil {
			g.Error = c.unread("gateway: ec2:DescribeInstances: %v", err)
			return
		}
		for _, res := range page.Reservations {
			for _, i := range res.Instances {
				if i.State != nil && i.State.Name != ec2types.InstanceStateNameTerminated {
					found = append(found, i)
				}
			}
		}
	}
	switch len(found) {
	case 0:
		g.Error = fmt.Sprintf("no instance tagged Name=%s and %s=%s (is the stack up?)", name, names.TagCluster,
			c.in.Config.ClusterName)
		c.problem("gateway: %s", g.Error)
		return
	case 1:
	default:
		var ids []string
		for _, i := range found {
			ids = append(ids, aws.ToString(i.InstanceId))
		}
		c.problem("gateway: %d instances are tagged Name=%s: %s; the stack declares one", len(found), name,
			strings.Join(ids, ", "))
	}
	i := found[0]
	g.Instance, g.State = aws.ToString(i.InstanceId), string(i.State.Name)
	if i.LaunchTime != nil {
		g.Since = ptr(i.LaunchTime.UTC())
	}
	for _, t := range i.Tags {
		if aws.ToString(t.Key) == infra.IdleStopTag {
			g.IdleStop = aws.ToString(t.Value)
		}
	}
}

// tunnel reads the on-prem peer's interface: the one named, or the one whose peer's allowed IPs hold the VPC.
func (c *collector) tunnel() {
	t := &c.r.Tunnel
	if c.src.WireGuard == nil {
		t.Note = fmt.Sprintf("no WireGuard on this host (%v): run status on the on-prem peer, as root",
			cmp.Or(c.src.WireGuardError, errors.New("no client")))
		return
	}
	devices, err := c.src.WireGuard.Devices()
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			t.Note = "cannot read this host's WireGuard interfaces (not root): run status as root on the on-prem peer, or `sudo wg show`"
			return
		}
		t.Error = c.unread("tunnel: WireGuard interfaces: %v", err)
		return
	}
	vpc := c.in.Config.Network.VPCCIDR
	if d, p, ok := wgpeer.Find(devices, vpc, c.in.Interface); ok {
		t.Interface, t.ReceivedBytes, t.SentBytes = d.Name, p.ReceiveBytes, p.TransmitBytes
		if p.Endpoint != nil {
			t.Endpoint = p.Endpoint.String()
		}
		if !p.LastHandshakeTime.IsZero() {
			t.LastHandshake = ptr(p.LastHandshakeTime.UTC())
			t.Up = c.in.Now.Sub(p.LastHandshakeTime) < RejectAfter
		}
		return
	}
	if c.in.Interface != "" {
		t.Error = c.unread("tunnel: no WireGuard interface %s with a peer for the VPC %s on this host", c.in.Interface, vpc)
		return
	}
	t.Note = fmt.Sprintf("no WireGuard interface on this host has a peer for the VPC %s: run status on the on-prem peer", vpc)
}

// token reads the join token's Secrets (their metadata: status never reads a token) and its parameter's metadata.
func (c *collector) token() {
	t := &c.r.Token
	t.Parameter = infra.JoinTokenParameter(c.in.Config.ClusterName)
	t.Every = Duration(c.in.Config.Kubernetes.BootstrapTokenTTL / 3)
	var errs []string
	if c.kubeMissing() != nil {
		errs = append(errs, "Secrets "+notRead)
	} else {
		ctx, cancel := c.call()
		list, err := c.src.Metadata.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}).
			Namespace(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: names.JoinTokenSelector})
		cancel()
		if err != nil {
			errs = append(errs, c.unread("join token Secrets: %v", err))
		} else {
			for _, s := range list.Items {
				t.Count++
				if created := s.CreationTimestamp.UTC(); t.Newest == nil || created.After(*t.Newest) {
					t.Newest = &created
				}
			}
		}
	}
	if c.awsMissing() != nil {
		errs = append(errs, "parameter "+notRead)
	} else {
		ctx, cancel := c.call()
		out, err := c.src.SSM.DescribeParameters(ctx, &ssm.DescribeParametersInput{ParameterFilters: []ssmtypes.ParameterStringFilter{
			{Key: aws.String("Name"), Option: aws.String("Equals"), Values: []string{t.Parameter}}}})
		cancel()
		switch {
		case err != nil:
			errs = append(errs, c.unread("join token parameter: ssm:DescribeParameters: %v", err))
		case len(out.Parameters) == 0:
			c.problem("join token: no SSM parameter %s (is the stack up?)", t.Parameter)
		case out.Parameters[0].LastModifiedDate != nil:
			t.Written = ptr(out.Parameters[0].LastModifiedDate.UTC())
		}
	}
	t.Error = strings.Join(errs, "; ")
}

// controller reads dynk8s-controller's Lease.
func (c *collector) controller() {
	l := &c.r.Controller
	if c.kubeMissing() != nil {
		l.Error = notRead
		return
	}
	ctx, cancel := c.call()
	defer cancel()
	lease, err := c.src.Kube.CoordinationV1().Leases(metav1.NamespaceSystem).Get(ctx, addons.ControllerName, metav1.GetOptions{})
	if err != nil {
		l.Error = c.unread("controller Lease %s/%s: %v", metav1.NamespaceSystem, addons.ControllerName, err)
		return
	}
	l.Leader = ptrValue(lease.Spec.HolderIdentity)
	if lease.Spec.RenewTime != nil {
		l.Renewed = ptr(lease.Spec.RenewTime.UTC())
		d := time.Duration(ptrValue(lease.Spec.LeaseDurationSeconds)) * time.Second
		l.Leads = l.Leader != "" && c.in.Now.Before(l.Renewed.Add(d))
	}
}

// partOf selects the workloads of the stack's in-cluster component (infra/addons' common labels).
const partOf = "app.kubernetes.io/part-of=dynk8s,app.kubernetes.io/managed-by=pulumi"

// parts reads the stack's Deployments and DaemonSets.
func (c *collector) parts() {
	c.r.Parts = []Part{}
	if c.kubeMissing() != nil {
		c.r.PartsError = notRead
		return
	}
	ctx, cancel := c.call()
	defer cancel()
	apps := c.src.Kube.AppsV1()
	opts := metav1.ListOptions{LabelSelector: partOf}
	deployments, err := apps.Deployments(metav1.NamespaceAll).List(ctx, opts)
	if err != nil {
		c.r.PartsError = c.unread("in-cluster parts: Deployments: %v", err)
		return
	}
	daemonSets, err := apps.DaemonSets(metav1.NamespaceAll).List(ctx, opts)
	if err != nil {
		c.r.PartsError = c.unread("in-cluster parts: DaemonSets: %v", err)
		return
	}
	for _, d := range deployments.Items {
		c.r.Parts = append(c.r.Parts, Part{Kind: "Deployment", Namespace: d.Namespace, Name: d.Name,
			Want: int(ptrValue(cmp.Or(d.Spec.Replicas, ptr(int32(1))))), Ready: int(d.Status.ReadyReplicas)})
	}
	for _, d := range daemonSets.Items {
		c.r.Parts = append(c.r.Parts, daemonSetPart(d))
	}
	slices.SortFunc(c.r.Parts, func(a, b Part) int {
		return cmp.Or(strings.Compare(a.Kind, b.Kind), strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
}

func daemonSetPart(d appsv1.DaemonSet) Part {
	return Part{Kind: "DaemonSet", Namespace: d.Namespace, Name: d.Name, Want: int(d.Status.DesiredNumberScheduled),
		Ready: int(d.Status.NumberReady)}
}

// judge lists what needs the operator from what was read.
func (c *collector) judge() {
	now, r := c.in.Now, c.r
	running := r.Gateway.State == string(ec2types.InstanceStateNameRunning)
	for _, p := range r.Pools {
		for _, n := range p.Nodes {
			if !n.Ready && now.Sub(cmp.Or(ptrValue(n.Since), n.Created)) > nodeReadyGrace {
				c.problem("pool %s: Node %s is not Ready (since %s): kubectl describe node %s", p.Name, n.Name,
					clock(cmp.Or(ptrValue(n.Since), n.Created)), n.Name)
			}
		}
		if p.InService > 0 && r.Gateway.State == string(ec2types.InstanceStateNameStopped) {
			c.problem("pool %s: %d instance(s) in service while the gateway is stopped: they cannot reach the "+
				"cluster; a node's boot and the controller's wake-up start it (journalctl -u dynk8s-join on the node, "+
				"the controller's log)", p.Name, p.InService)
		}
	}
	if t := r.Tunnel; running && r.Gateway.Since != nil && now.Sub(*r.Gateway.Since) > tunnelGrace &&
		t.Interface != "" && !t.Up {
		last := "never"
		if t.LastHandshake != nil {
			last = clock(*t.LastHandshake)
		}
		c.problem("tunnel: the gateway has run since %s and the last handshake on %s was %s: on the gateway, "+
			"journalctl -u wg-quick@wg0 (docs/troubleshooting.md, \"When the tunnel does not come up\")",
			clock(*r.Gateway.Since), t.Interface, last)
	}
	if t := r.Token; t.Error == "" {
		switch {
		case t.Newest == nil:
			c.problem("join token: no token Secret in kube-system (%s): no node can join; is a controller leading?",
				names.JoinTokenSelector)
		case now.Sub(*t.Newest) > time.Duration(t.Every)+rotationGrace:
			c.problem("join token: the newest was issued %s ago, and the rotator issues one every %s: is a "+
				"controller leading? (its log: kubectl -n kube-system logs <the Lease's holder>)",
				age(now.Sub(*t.Newest)), t.Every)
		case t.Written != nil && t.Newest.Sub(*t.Written) > sameWrite:
			c.problem("join token: the newest token (issued %s) is not in SSM (written %s): the rotator cannot "+
				"write %s; the controller's log says why", clock(*t.Newest), clock(*t.Written), t.Parameter)
		}
	}
	if l := r.Controller; l.Error == "" && !l.Leads {
		c.problem("controller: no replica leads (Lease %s/%s renewed %s by %q): nothing approves a node's CSR; "+
			"kubectl -n kube-system get pods -l app.kubernetes.io/name=%s", metav1.NamespaceSystem,
			addons.ControllerName, clockOrNever(l.Renewed), l.Leader, addons.ControllerName)
	}
	for _, p := range r.Parts {
		if p.Ready < p.Want {
			c.problem("%s %s/%s: %d of %d ready: kubectl -n %s describe %s %s", p.Kind, p.Namespace, p.Name, p.Ready,
				p.Want, p.Namespace, strings.ToLower(p.Kind), p.Name)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func ptrValue[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}
