package approve

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud/cloudtest"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
)

// TestNewValidates: New refuses a Config with a field wrong, naming the field, and fills in the defaults of the
// optional ones.
func TestNewValidates(t *testing.T) {
	_, ec2 := cloudtest.EC2(t)
	good := Config{ClusterName: testCluster, Pools: testPools, BootstrapGroup: testGroup, Namespace: testNS,
		RecordName: testRecord, EC2: ec2}
	deps := func() loop.Deps {
		client := fake.NewClientset()
		return loop.Deps{Client: client, Informers: informers.NewSharedInformerFactory(client, 0),
			Recorder: record.NewFakeRecorder(1), Metrics: prometheus.NewRegistry(),
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Clock: clocktesting.NewFakeClock(time.Now())}
	}
	for name, tc := range map[string]struct {
		change func(*Config)
		field  string
	}{
		"no cluster":         {func(c *Config) { c.ClusterName = "" }, "ClusterName"},
		"no pools":           {func(c *Config) { c.Pools = nil }, "Pools"},
		"a pool twice":       {func(c *Config) { c.Pools = []string{"a", "a"} }, "Pools[1]"},
		"masters group":      {func(c *Config) { c.BootstrapGroup = "system:masters" }, "BootstrapGroup"},
		"bad namespace":      {func(c *Config) { c.Namespace = "Kube_System" }, "Namespace"},
		"no record name":     {func(c *Config) { c.RecordName = "" }, "RecordName"},
		"negative workers":   {func(c *Config) { c.Workers = -1 }, "Workers"},
		"negative mark wait": {func(c *Config) { c.KeyMarkWait = -time.Second }, "KeyMarkWait"},
		"no EC2 client":      {func(c *Config) { c.EC2 = nil }, "EC2"},
	} {
		cfg := good
		tc.change(&cfg)
		_, err := New(cfg, deps())
		assert.Check(t, is.ErrorContains(err, "approve: "+tc.field+": "), name)
	}
	c, err := New(good, deps())
	assert.NilError(t, err)
	assert.Check(t, is.Equal(c.cfg.Workers, DefaultWorkers))
	assert.Check(t, is.Equal(c.cfg.KeyMarkWait, DefaultKeyMarkWait))
	d := deps()
	_, err = New(good, d)
	assert.NilError(t, err)
	_, err = New(good, d)
	assert.Check(t, is.ErrorContains(err, "register metrics"), "a second loop on the same registry")
}
