// Package approve is the controller's CSR approval loop: it approves the kubelet client certificate of a dynk8s
// pool node, and only that, and denies every other kubelet client CSR of the join tokens' group.
//
// The join tokens authenticate with a group of dynk8s's own (Config.BootstrapGroup) that kubeadm's auto-approval
// binding does not name, so the controller manager's approver leaves their CSRs alone: its only check is that the
// requester may create node client CSRs and that the common name starts with system:node: (kubernetes
// pkg/controller/certificates/approver/sarapprove.go), which would give a token holder a certificate for any node
// name. This loop approves a CSR of that group when its request passes Read and its instance is, in a
// DescribeInstances snapshot started after the CSR was made, pending or running with this cluster's tag, an Auto
// Scaling group and one of the pools, has marked the CSR's key as its kubelet's (names.TagKubeletKey: a tag only
// the instance itself may write), has no Node, and had no certificate approved before (the approval record, a
// ConfigMap, written before each approval). When EC2 cannot be asked the CSRs it would decide stay pending: the
// loop fails closed, and a kubelet whose CSR is never approved does not join.
//
// A flood of CSRs cannot hold a real join back: a request is read once (by uid), denials are written by their own
// queue and workers, the judge queue is keyed by the claimed name, so that its work for a bogus name is a lookup in
// a shared snapshot, and the snapshots are coalesced (one DescribeInstances at a time, at most one per two
// seconds).
package approve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
	"github.com/dynk8s/dynk8s/internal/names"
)

// The conditions' reasons and messages' prefix (the message names the controller that wrote it).
const (
	ApprovedReason = "DynK8sLiveInstance"
	DeniedReason   = "DynK8sNotALiveInstance"
	messagePrefix  = "dynk8s-controller: "
)

// The Events' reasons.
const (
	EventApproved    = "DynK8sApproved"
	EventDenied      = "DynK8sDenied"
	EventWaiting     = "DynK8sWaitingForKeyMark"
	EventEC2Unusable = "DynK8sCannotAskEC2"
)

// DefaultKeyMarkWait is Config.KeyMarkWait's default: an instance tags itself before kubeadm join starts its
// kubelet, so its mark is normally in EC2 before its CSR is made; the wait covers EC2's eventual consistency and
// a slow boot, and bounds how long a CSR for a live instance that never marks a key stays pending.
const DefaultKeyMarkWait = 10 * time.Minute

// DefaultWorkers is Config.Workers' default.
const DefaultWorkers = 4

// Config is what the loop judges against.
type Config struct {
	// ClusterName is the cluster's names.TagCluster value; required.
	ClusterName string
	// Pools are the stack's pools (names.TagPool values); required, at least one.
	Pools []string
	// BootstrapGroup is the join tokens' group, system:bootstrappers:<...>; required.
	BootstrapGroup string
	// Namespace and RecordName name the approval record ConfigMap (e.g. kube-system/dynk8s-approved-nodes);
	// required.
	Namespace, RecordName string
	// Workers is how many judge workers run, and as many deny workers; optional, default DefaultWorkers.
	Workers int
	// KeyMarkWait is how long a CSR whose instance has no key mark yet stays pending before it is denied, counted
	// from the CSR's creation; optional, default DefaultKeyMarkWait.
	KeyMarkWait time.Duration
	// EC2 describes the instances; required.
	EC2 cloud.EC2
}

var bootstrapGroupRE = regexp.MustCompile(`^system:bootstrappers:[a-z0-9:-]+$`)

// withDefaults is cfg with its defaults, or every field that is wrong, each named.
func (cfg Config) withDefaults() (Config, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("approve: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if cfg.ClusterName == "" {
		bad("ClusterName", "empty")
	}
	if len(cfg.Pools) == 0 {
		bad("Pools", "none")
	}
	for i, p := range cfg.Pools {
		if p == "" || slices.Index(cfg.Pools, p) != i {
			bad(fmt.Sprintf("Pools[%d]", i), "%q is empty or named twice", p)
		}
	}
	if !bootstrapGroupRE.MatchString(cfg.BootstrapGroup) {
		bad("BootstrapGroup", "%q is not a bootstrap token group (system:bootstrappers:<name>)", cfg.BootstrapGroup)
	}
	if msgs := validation.IsDNS1123Label(cfg.Namespace); len(msgs) != 0 {
		bad("Namespace", "%q: %s", cfg.Namespace, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Subdomain(cfg.RecordName); len(msgs) != 0 {
		bad("RecordName", "%q: %s", cfg.RecordName, strings.Join(msgs, "; "))
	}
	switch {
	case cfg.Workers < 0:
		bad("Workers", "%d is negative", cfg.Workers)
	case cfg.Workers == 0:
		cfg.Workers = DefaultWorkers
	}
	switch {
	case cfg.KeyMarkWait < 0:
		bad("KeyMarkWait", "%s is negative", cfg.KeyMarkWait)
	case cfg.KeyMarkWait == 0:
		cfg.KeyMarkWait = DefaultKeyMarkWait
	}
	if cfg.EC2 == nil {
		bad("EC2", "no client")
	}
	return cfg, errors.Join(errs...)
}

// Controller is the approval loop.
type Controller struct {
	cfg       Config
	client    kubernetes.Interface
	informers informers.SharedInformerFactory
	csrs      certlisters.CertificateSigningRequestLister
	nodes     corelisters.NodeLister
	synced    []cache.InformerSynced
	recorder  record.EventRecorder
	log       *slog.Logger
	clock     clock.WithTicker
	snaps     *snapshots

	// judgeQ holds claimed node names; denyQ CSR names whose denial is decided.
	judgeQ, denyQ workqueue.TypedRateLimitingInterface[string]

	decisions *prometheus.CounterVec
	pending   prometheus.Gauge

	mu sync.Mutex
	// reads is Read's answer for every pending CSR of the group, by uid: a request is read once.
	reads map[types.UID]reading
	// claims are the names of the pending CSRs that claim a node, by node.
	claims map[string]map[string]bool
	// denials are the denials decided and not written yet, by CSR name.
	denials map[string]pendingDenial
	// told is the last wait or EC2 Event given on a CSR, so that a requeue does not repeat it.
	told map[types.UID]string
	// decided are the CSRs whose approval or denial is written and that the informer still shows pending.
	decided map[types.UID]bool
	// waited is, for a node whose judgement waits for its key mark, the start of the snapshot it waited on: the
	// next judgement needs a newer one.
	waited map[string]time.Time
}

type reading struct {
	name  string
	claim Claim
	err   error
}

type pendingDenial struct {
	uid    types.UID
	denial *Denial
}

// New is the loop for cfg, its handlers added to d.Informers and its metrics registered on d.Metrics.
func New(cfg Config, d loop.Deps) (*Controller, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if d.Client == nil || d.Informers == nil || d.Recorder == nil || d.Metrics == nil || d.Log == nil ||
		d.Clock == nil {
		return nil, errors.New("approve: loop.Deps needs Client, Informers, Recorder, Metrics, Log and Clock")
	}
	c := &Controller{
		cfg: cfg, client: d.Client, informers: d.Informers, recorder: d.Recorder, clock: d.Clock,
		log:    d.Log.With("loop", "approve"),
		judgeQ: loop.NewQueue("approve_judge", d.Clock), denyQ: loop.NewQueue("approve_deny", d.Clock),
		reads: map[types.UID]reading{}, claims: map[string]map[string]bool{}, denials: map[string]pendingDenial{},
		told: map[types.UID]string{}, waited: map[string]time.Time{}, decided: map[types.UID]bool{},
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynk8s_controller_csr_decisions_total",
			Help: "Kubelet client CSRs of the bootstrap group approved or denied, by decision and reason code.",
		}, []string{"decision", "reason"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dynk8s_controller_csr_pending",
			Help: "Pending kubelet client CSRs of the bootstrap group.",
		}),
	}
	c.snaps = &snapshots{ec2: cfg.EC2, cluster: cfg.ClusterName, clock: d.Clock, ctx: context.Background(),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dynk8s_controller_csr_ec2_describe_seconds",
			Help:    "Duration of the approval loop's DescribeInstances snapshots.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 10),
		})}
	for _, col := range []prometheus.Collector{c.decisions, c.pending, c.snaps.seconds} {
		if err := d.Metrics.Register(col); err != nil {
			return nil, fmt.Errorf("approve: register metrics: %w", err)
		}
	}
	c.decisions.WithLabelValues("approved", string(ReasonLiveInstance))
	csrInf := d.Informers.Certificates().V1().CertificateSigningRequests()
	nodeInf := d.Informers.Core().V1().Nodes()
	if _, err := csrInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.observe(obj, false) },
		UpdateFunc: func(_, obj any) { c.observe(obj, false) },
		DeleteFunc: func(obj any) { c.observe(obj, true) },
	}); err != nil {
		return nil, fmt.Errorf("approve: CSR informer handler: %w", err)
	}
	c.csrs, c.nodes = csrInf.Lister(), nodeInf.Lister()
	c.synced = []cache.InformerSynced{csrInf.Informer().HasSynced, nodeInf.Informer().HasSynced}
	return c, nil
}

// Name is the loop's name in logs.
func (c *Controller) Name() string { return "approve" }

// Run starts the informers, waits for their caches and judges until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.snaps.mu.Lock()
	c.snaps.ctx = ctx
	c.snaps.mu.Unlock()
	c.informers.Start(ctx.Done())
	if err := loop.WaitForSync(ctx, c.Name(), c.synced...); err != nil {
		return err
	}
	c.log.Info("judging kubelet client CSRs", "group", c.cfg.BootstrapGroup, "cluster", c.cfg.ClusterName,
		"pools", c.cfg.Pools)
	var wg sync.WaitGroup
	wg.Go(func() { loop.Work(ctx, c.log, c.denyQ, c.cfg.Workers, c.writeDenial) })
	loop.Work(ctx, c.log, c.judgeQ, c.cfg.Workers, c.judge)
	wg.Wait()
	return nil
}

// observe takes a CSR the informer reports: a pending one of the group is read (once) and queued for its denial
// or its name's judgement; any other, or a deleted one, is forgotten.
func (c *Controller) observe(obj any, deleted bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if deleted || !Ours(csr, c.cfg.BootstrapGroup) {
		c.forget(csr)
		return
	}
	if c.decided[csr.UID] {
		return // written; the informer has not seen it yet
	}
	r, seen := c.reads[csr.UID]
	if !seen {
		claim, err := Read(csr, c.cfg.BootstrapGroup)
		r = reading{name: csr.Name, claim: claim, err: err}
		c.reads[csr.UID] = r
		c.pending.Set(float64(len(c.reads)))
	}
	var d *Denial
	switch {
	case errors.As(r.err, &d):
		c.queueDenial(csr, d)
	case r.err == nil:
		if c.claims[r.claim.Node] == nil {
			c.claims[r.claim.Node] = map[string]bool{}
		}
		c.claims[r.claim.Node][csr.Name] = true
		c.judgeQ.Add(r.claim.Node)
	}
}

// forget drops what is known of a CSR that is decided or gone. The caller holds c.mu.
func (c *Controller) forget(csr *certificatesv1.CertificateSigningRequest) {
	if r, ok := c.reads[csr.UID]; ok {
		if set := c.claims[r.claim.Node]; set != nil {
			delete(set, csr.Name)
			if len(set) == 0 {
				delete(c.claims, r.claim.Node)
				delete(c.waited, r.claim.Node)
			}
		}
		delete(c.reads, csr.UID)
		c.pending.Set(float64(len(c.reads)))
	}
	if p, ok := c.denials[csr.Name]; ok && p.uid == csr.UID {
		delete(c.denials, csr.Name)
	}
	delete(c.told, csr.UID)
	delete(c.decided, csr.UID)
}

// queueDenial hands csr's denial to the deny workers. The caller holds c.mu.
func (c *Controller) queueDenial(csr *certificatesv1.CertificateSigningRequest, d *Denial) {
	if _, ok := c.denials[csr.Name]; !ok {
		c.denials[csr.Name] = pendingDenial{uid: csr.UID, denial: d}
	}
	c.denyQ.Add(csr.Name)
}

// candidate is a pending CSR of the group whose request claims a node.
type candidate struct {
	csr   *certificatesv1.CertificateSigningRequest
	claim Claim
}

// candidates are the pending CSRs that claim node, newest first (creationTimestamp, then name).
func (c *Controller) candidates(node string) []candidate {
	c.mu.Lock()
	defer c.mu.Unlock()
	var list []candidate
	for name := range c.claims[node] {
		csr, err := c.csrs.Get(name)
		if err != nil || !Ours(csr, c.cfg.BootstrapGroup) || c.decided[csr.UID] {
			continue
		}
		if _, denied := c.denials[name]; denied {
			continue
		}
		if r, ok := c.reads[csr.UID]; ok && r.err == nil && r.claim.Node == node {
			list = append(list, candidate{csr: csr, claim: r.claim})
		}
	}
	slices.SortFunc(list, func(a, b candidate) int {
		if c := b.csr.CreationTimestamp.Compare(a.csr.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.csr.Name, b.csr.Name)
	})
	return list
}

// stampSlack covers creationTimestamp's resolution: the API server keeps it in whole seconds (metav1.Time
// marshals RFC 3339 seconds), so a CSR made at 12:00:00.7 says 12:00:00, and only a snapshot started a second
// after its stamp is surely started after the CSR was made.
const stampSlack = time.Second

// judge decides the pending CSRs that claim node: the newest one that passes everything is approved, the others
// are denied (by the deny workers); when the instance has marked no key yet they wait, up to KeyMarkWait.
func (c *Controller) judge(ctx context.Context, node string) error {
	cands := c.candidates(node)
	if len(cands) == 0 {
		return nil
	}
	after := cands[0].csr.CreationTimestamp.Add(stampSlack)
	c.mu.Lock()
	if w, ok := c.waited[node]; ok && w.After(after) {
		after = w
	}
	c.mu.Unlock()
	snap, err := c.snaps.after(ctx, after)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		for _, cd := range cands {
			c.tell(cd.csr, corev1.EventTypeWarning, EventEC2Unusable, "cannot ask EC2: %v; the join waits", err)
		}
		c.log.Warn("cannot ask EC2; the CSRs wait", "node", node, "csrs", len(cands), "error", err.Error())
		return fmt.Errorf("judge %s: %w", node, err)
	}
	inst, live := snap.live[node]
	group, pool := inst.Tags[cloud.TagGroup], inst.Tags[names.TagPool]
	switch {
	case !live || !inst.Live() || inst.Tags[names.TagCluster] != c.cfg.ClusterName || group == "":
		c.denyAll(node, cands, deny(ReasonNotLive, "%s is no pending or running instance of an Auto "+
			"Scaling group of cluster %s", node, c.cfg.ClusterName))
		return nil
	case !slices.Contains(c.cfg.Pools, pool):
		c.denyAll(node, cands, deny(ReasonPool, "%s of group %s is in pool %q, not one of this stack's (%s)",
			node, group, pool, strings.Join(c.cfg.Pools, " ")))
		return nil
	}
	if _, err := c.nodes.Get(node); err == nil {
		c.denyAll(node, cands, deny(ReasonNodeExists, "a Node named %s exists already", node))
		return nil
	}
	rec, err := c.readRecord(ctx)
	if err != nil {
		return err
	}
	recorded, before := rec.of(node)
	if before {
		i := slices.IndexFunc(cands, func(cd candidate) bool { return cd.csr.UID == types.UID(recorded.UID) })
		if i < 0 {
			c.denyAll(node, cands, deny(ReasonApprovedBefore, "a certificate for %s was approved before", node))
			return nil
		}
		// The record names this CSR: an approval that was recorded and not written (a crash, a failed write).
		finish := cands[i]
		c.denyAll(node, slices.Delete(cands, i, i+1), deny(ReasonApprovedBefore,
			"a certificate for %s was approved before", node))
		cands = []candidate{finish}
	}
	mark := inst.Tags[names.TagKubeletKey]
	if mark == "" {
		return c.waitForMark(node, cands, snap)
	}
	var chosen *candidate
	for i, cd := range cands {
		switch {
		case cd.claim.KeySHA256 != mark:
			c.queue(node, cd.csr, deny(ReasonKeyMismatch, "its public key is not the one %s marked", node))
		case chosen == nil:
			chosen = &cands[i]
		default:
			c.queue(node, cd.csr, deny(ReasonSuperseded, "a newer CSR for %s, %s, is the one approved", node,
				chosen.csr.Name))
		}
	}
	c.mu.Lock()
	delete(c.waited, node)
	c.mu.Unlock()
	if chosen == nil {
		return nil
	}
	// Asked last, live, just before the approval: a Node of that name may have registered since the cache saw.
	switch _, err := c.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); {
	case err == nil:
		c.queue(node, chosen.csr, deny(ReasonNodeExists, "a Node named %s exists already", node))
		return nil
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("judge %s: get its Node: %w", node, err)
	}
	if !before {
		a := approval{UID: string(chosen.csr.UID), Time: c.clock.Now()}
		if err := c.writeRecord(ctx, rec, node, a, snap.live); err != nil {
			return fmt.Errorf("judge %s: %w", node, err)
		}
	}
	return c.approve(ctx, chosen.csr, node, group, pool)
}

// waitForMark handles a live instance that has marked no kubelet key yet: its CSRs younger than KeyMarkWait wait
// for a newer snapshot, the older ones are denied.
func (c *Controller) waitForMark(node string, cands []candidate, snap *snapshot) error {
	now := c.clock.Now()
	var again time.Duration
	for _, cd := range cands {
		left := cd.csr.CreationTimestamp.Add(c.cfg.KeyMarkWait).Sub(now)
		if left <= 0 {
			c.queue(node, cd.csr, deny(ReasonNoKeyMark, "%s marked no kubelet key (%s) within %s of the CSR",
				node, names.TagKubeletKey, c.cfg.KeyMarkWait))
			continue
		}
		c.tell(cd.csr, corev1.EventTypeNormal, EventWaiting, "waiting for %s's kubelet key mark", node)
		if again == 0 || left < again {
			again = left
		}
	}
	if again == 0 {
		return nil
	}
	c.mu.Lock()
	c.waited[node] = snap.start
	c.mu.Unlock()
	c.log.Info("wait for the kubelet key mark", "node", node, "csrs", len(cands))
	return loop.Requeue{After: min(again, snapshotGap)}
}

// denyAll queues the denial of every candidate of node.
func (c *Controller) denyAll(node string, cands []candidate, d *Denial) {
	for _, cd := range cands {
		c.queue(node, cd.csr, d)
	}
	c.mu.Lock()
	delete(c.waited, node)
	c.mu.Unlock()
}

func (c *Controller) queue(node string, csr *certificatesv1.CertificateSigningRequest, d *Denial) {
	c.log.Info("deny", "csr", csr.Name, "node", node, "reason", string(d.Reason), "message", d.Message)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queueDenial(csr, d)
}

// tell gives csr an Event, unless the last one given for a wait was the same.
func (c *Controller) tell(csr *certificatesv1.CertificateSigningRequest, kind, reason, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.mu.Lock()
	same := c.told[csr.UID] == reason+msg
	if _, ok := c.reads[csr.UID]; ok && !same {
		c.told[csr.UID] = reason + msg
	}
	c.mu.Unlock()
	if !same {
		c.recorder.Event(csr, kind, reason, msg)
	}
}

// condition is csr with cond appended, through the approval subresource as kubectl certificate approve does.
func (c *Controller) condition(ctx context.Context, csr *certificatesv1.CertificateSigningRequest,
	kind certificatesv1.RequestConditionType, reason, message string) error {
	csr = csr.DeepCopy()
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: kind, Status: corev1.ConditionTrue, Reason: reason, Message: message,
		LastUpdateTime: metav1.NewTime(c.clock.Now()),
	})
	_, err := c.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr,
		metav1.UpdateOptions{})
	return err
}

// approve writes csr's approval.
func (c *Controller) approve(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, node, group,
	pool string) error {
	msg := fmt.Sprintf("%slive instance of group %s, pool %s, node %s", messagePrefix, group, pool, node)
	if err := c.condition(ctx, csr, certificatesv1.CertificateApproved, ApprovedReason, msg); err != nil {
		return fmt.Errorf("approve CSR %s for %s: %w", csr.Name, node, err)
	}
	c.mu.Lock()
	if _, ok := c.reads[csr.UID]; ok {
		c.decided[csr.UID] = true
	}
	c.mu.Unlock()
	c.decisions.WithLabelValues("approved", string(ReasonLiveInstance)).Inc()
	c.log.Info("approve", "csr", csr.Name, "node", node, "group", group, "pool", pool)
	c.recorder.Event(csr, corev1.EventTypeNormal, EventApproved, msg)
	return nil
}

// writeDenial is the deny workers' sync: it writes the denial decided for the CSR name, if it is still pending
// and the same CSR.
func (c *Controller) writeDenial(ctx context.Context, name string) error {
	c.mu.Lock()
	p, ok := c.denials[name]
	ok = ok && !c.decided[p.uid]
	c.mu.Unlock()
	if !ok {
		return nil
	}
	csr, err := c.csrs.Get(name)
	if err != nil || csr.UID != p.uid || !Ours(csr, c.cfg.BootstrapGroup) {
		return nil // gone or decided: observe forgets it
	}
	msg := messagePrefix + p.denial.Message
	if err := c.condition(ctx, csr, certificatesv1.CertificateDenied, DeniedReason, msg); err != nil {
		return fmt.Errorf("deny CSR %s: %w", name, err)
	}
	c.mu.Lock()
	if _, ok := c.reads[p.uid]; ok {
		c.decided[p.uid] = true
	}
	c.mu.Unlock()
	c.decisions.WithLabelValues("denied", string(p.denial.Reason)).Inc()
	c.recorder.Event(csr, corev1.EventTypeWarning, EventDenied, msg)
	return nil
}
