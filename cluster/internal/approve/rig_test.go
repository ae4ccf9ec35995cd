package approve

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
	"github.com/dynk8s/dynk8s/cluster/internal/cloud/cloudtest"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/internal/testkit/csrtest"
)

const (
	testCluster = "homelab"
	testGroup   = "system:bootstrappers:dynk8s:pool-nodes"
	testNS      = "kube-system"
	testRecord  = "dynk8s-approved-nodes"
)

var testPools = []string{"builders-arm", "builders-x86"}

// rig is one fake cluster (the fake clientset), one fake EC2, a fake clock, and the controllers run against them
// one after another (a restart is a new controller on the same fakes).
type rig struct {
	client *fake.Clientset
	ec2    *fakeaws.EC2
	cfg    Config
	clock  *clocktesting.FakeClock
	events *record.FakeRecorder
	reg    *prometheus.Registry
	ctrl   *Controller

	mu       sync.Mutex
	seen     []string // events drained so far
	watching chan string
	stop     func()
	// timeout and delay are until's: 30 s, and a try every 10 ms.
	timeout, delay time.Duration
}

// newRig is a rig whose EC2 knows instances and whose API server has objs.
func newRig(t *testing.T, instances []fakeaws.EC2Instance, objs ...runtime.Object) *rig {
	t.Helper()
	fakeEC2, client := cloudtest.EC2(t, instances...)
	r := &rig{
		ec2:      fakeEC2,
		clock:    clocktesting.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)),
		watching: make(chan string, 64),
		timeout:  30 * time.Second,
		delay:    10 * time.Millisecond,
		cfg: Config{ClusterName: testCluster, Pools: testPools, BootstrapGroup: testGroup, Namespace: testNS,
			RecordName: testRecord, EC2: client},
	}
	r.client = fakeClientset(objs, r.watching)
	return r
}

// fakeClientset is fake.NewClientset with a watch of a deep buffer: the fake's own watch channel holds 100 events
// and panics when full, which a flood of writes fills faster than an informer on a loaded machine reads it; and
// each watch opened is reported on watching, so that a test creates objects only once the informer watches
// (the fake's watch starts now, and misses what is created between an informer's list and its watch).
func fakeClientset(objs []runtime.Object, watching chan<- string) *fake.Clientset {
	client := fake.NewClientset(objs...)
	client.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if w, ok := action.(k8stesting.WatchActionImpl); ok {
			opts = w.ListOptions
		}
		w, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return true, nil, err
		}
		ch := make(chan watch.Event, 1<<16)
		proxy := watch.NewProxyWatcher(ch)
		go func() {
			defer close(ch)
			for {
				select {
				case ev, ok := <-w.ResultChan():
					if !ok {
						return
					}
					ch <- ev
				case <-proxy.StopChan():
					w.Stop()
					return
				}
			}
		}()
		select {
		case watching <- action.GetResource().Resource:
		default:
		}
		return true, proxy, nil
	})
	return client
}

// start runs a new controller on the rig's fakes until the test ends or r.stop, and waits until its CSR
// informer watches.
func (r *rig) start(t *testing.T) *Controller {
	t.Helper()
	r.events = record.NewFakeRecorder(1 << 16)
	r.reg = prometheus.NewRegistry()
	factory := informers.NewSharedInformerFactory(r.client, 0)
	ctrl, err := New(r.cfg, loop.Deps{Client: r.client, Informers: factory, Recorder: r.events, Metrics: r.reg,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Clock: r.clock})
	assert.NilError(t, err)
	r.ctrl = ctrl
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	stopped := false
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			assert.Check(t, err)
		case <-time.After(30 * time.Second):
			t.Error("the controller did not stop within 30 s of its context's end")
		}
	}
	t.Cleanup(r.stop)
	for deadline := time.After(30 * time.Second); ; {
		select {
		case res := <-r.watching:
			if res == "certificatesigningrequests" {
				return ctrl
			}
		case <-deadline:
			t.Fatal("the CSR informer does not watch after 30 s")
		}
	}
}

// until polls check, stepping the fake clock a second each time (the loop's requeues and snapshot gap run on it),
// for up to r.timeout.
func (r *rig) until(t *testing.T, check func() (bool, string)) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if ok, why := check(); !ok {
			r.clock.Step(time.Second)
			return poll.Continue("%s", why)
		}
		return poll.Success()
	}, poll.WithTimeout(r.timeout), poll.WithDelay(r.delay))
}

// decided waits until every CSR of names has a condition.
func (r *rig) decided(t *testing.T, names ...string) {
	t.Helper()
	r.until(t, func() (bool, string) {
		list, err := r.client.CertificatesV1().CertificateSigningRequests().List(context.Background(),
			metav1.ListOptions{})
		assert.NilError(t, err)
		done := map[string]bool{}
		for _, c := range list.Items {
			done[c.Name] = len(c.Status.Conditions) > 0
		}
		for _, n := range names {
			if !done[n] {
				return false, n + " is pending"
			}
		}
		return true, ""
	})
}

// condition is the last condition of CSR name, nil while it has none.
func (r *rig) condition(t *testing.T, name string) *certificatesv1.CertificateSigningRequestCondition {
	t.Helper()
	csr, err := r.client.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name,
		metav1.GetOptions{})
	assert.NilError(t, err)
	if n := len(csr.Status.Conditions); n > 0 {
		return &csr.Status.Conditions[n-1]
	}
	return nil
}

// approvalWrites are the CSR names of the approval subresource's updates so far, in order, each with the
// condition type it wrote.
func (r *rig) approvalWrites() []string {
	var out []string
	for _, a := range r.client.Actions() {
		u, ok := a.(k8stesting.UpdateAction)
		if !ok || u.GetSubresource() != "approval" {
			continue
		}
		csr := u.GetObject().(*certificatesv1.CertificateSigningRequest)
		out = append(out, csr.Name+" "+string(csr.Status.Conditions[len(csr.Status.Conditions)-1].Type))
	}
	return out
}

// eventsSeen are the Events recorded so far.
func (r *rig) eventsSeen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		select {
		case e := <-r.events.Events:
			r.seen = append(r.seen, e)
		default:
			return append([]string(nil), r.seen...)
		}
	}
}

// hasEvent reports whether an Event containing text was recorded. The worker records a decision's Event after it
// wrote the decision, which the test may already have seen, so an Event not there yet is waited for, up to a bound
// that only a hang reaches.
func (r *rig) hasEvent(text string) bool {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		for _, e := range r.eventsSeen() {
			if strings.Contains(e, text) {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func (r *rig) create(t *testing.T, csrs ...*certificatesv1.CertificateSigningRequest) {
	t.Helper()
	for _, c := range csrs {
		_, err := r.client.CertificatesV1().CertificateSigningRequests().Create(context.Background(), c,
			metav1.CreateOptions{})
		assert.NilError(t, err)
	}
}

// newKey is a kubelet's bootstrap key, ECDSA P-256 (kubernetes pkg/kubelet/certificate/bootstrap).
func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	assert.NilError(t, err)
	return k
}

// keyMark is the names.TagKubeletKey value of key: the hex sha256 of its DER SubjectPublicKeyInfo.
func keyMark(t testing.TB, key *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	assert.NilError(t, err)
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// requestFor is the PEM request a kubelet's client-go makes for node with key: x509.CreateCertificateRequest of
// the kubelet subject, pem.EncodeToMemory.
func requestFor(t testing.TB, subject pkix.Name, key *ecdsa.PrivateKey, dnsNames ...string) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: subject,
		DNSNames: dnsNames}, key)
	assert.NilError(t, err)
	return []byte(csrtest.Block(der))
}

// requestForRaw is a request with key whose subject is raw, byte for byte.
func requestForRaw(t testing.TB, raw []byte, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{RawSubject: raw}, key)
	assert.NilError(t, err)
	return []byte(csrtest.Block(der))
}

// kubeletCSR is the CSR the kubelet of the join tokens' group makes, named name, created at created.
func kubeletCSR(name string, request []byte, created time.Time) *certificatesv1.CertificateSigningRequest {
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(created)},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: request, SignerName: KubeletClientSigner,
			Username: "system:bootstrap:abcdef", Groups: []string{"system:bootstrappers", testGroup,
				"system:authenticated"},
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}},
	}
}

// instance is a running instance of the cluster in pool's group, marked with mark ("" for none).
func instance(id, pool, mark string) fakeaws.EC2Instance {
	tags := map[string]string{names.TagCluster: testCluster, cloud.TagGroup: pool + "-asg", names.TagPool: pool}
	if mark != "" {
		tags[names.TagKubeletKey] = mark
	}
	return fakeaws.EC2Instance{ID: id, State: "running", Tags: tags}
}

func node(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// recordOf is the approval record with entries.
func recordOf(entries map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: testRecord}, Data: entries}
}

// readBack is what the API server and the kubelet client signer read of a request (pem.Decode, then
// x509.ParseCertificateRequest and CheckSignature: kubernetes pkg/apis/certificates/helpers.go ParseCSR,
// validation.validateCSR), or why they refuse it.
func readBack(request []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("PEM block type must be CERTIFICATE REQUEST")
	}
	cr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	return cr, cr.CheckSignature()
}

// metricValue is a counter's or gauge's value. (client_golang's testutil would do, but its diff dependency has no
// go.sum entry in this module.)
func metricValue(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	assert.NilError(t, m.Write(&out))
	switch {
	case out.Counter != nil:
		return out.Counter.GetValue()
	case out.Gauge != nil:
		return out.Gauge.GetValue()
	}
	t.Fatalf("%s is neither a counter nor a gauge", m.Desc())
	return 0
}
