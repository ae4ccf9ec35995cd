package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
	"github.com/dynk8s/dynk8s/cluster/internal/cloud/cloudtest"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
)

// The Deployment's flags (infra/addons, controllerArgs) build every loop.
func TestTheStacksFlagsBuildEveryLoop(t *testing.T) {
	var stderr bytes.Buffer
	f, err := parse([]string{"--region=eu-central-1", "--cluster=homelab", "--pools=builders-arm,builders-x86",
		"--bootstrap-group=system:bootstrappers:dynk8s:pool-nodes", "--approval-record=kube-system/dynk8s-approved-nodes",
		"--token-parameter=/dynk8s/homelab/join-token", "--token-kms-key=alias/aws/ssm", "--token-ttl=2h0m0s",
		"--not-ready-after=5m0s", "--loops=approve,rotate,cleanup,untaint,wake,warm,cache", "--addr=:8080", "--identity=a",
		"--wake-gateway=i-0123456789abcdef0", "--wake-groups=homelab-builders-arm-1,homelab-builders-x86-1",
		"--warm-groups=homelab-builders-x86-1", "--cache-pools=builders-x86:4:14"}, &stderr)
	assert.NilError(t, err, stderr.String())
	assert.NilError(t, f.o.Validate())
	client := fake.NewClientset()
	_, ec2 := cloudtest.EC2(t)
	_, ssm := cloudtest.SSM(t)
	_, asg := cloudtest.WarmPools(t, nil)
	loops, err := f.build(loop.Deps{Client: client, Informers: informers.NewSharedInformerFactory(client, 0),
		Recorder: record.NewFakeRecorder(10), Metrics: prometheus.NewRegistry(),
		Log: slog.New(slog.DiscardHandler), Clock: clock.RealClock{}}, cloud.Clients{EC2: ec2, SSM: ssm, AutoScaling: asg})
	assert.NilError(t, err)
	var names []string
	for _, l := range loops {
		names = append(names, l.Name())
	}
	assert.DeepEqual(t, names, []string{"approve", "rotate", "cleanup", "untaint", "wake", "warm", "cache"})
}

// A bad command line fails at once with one FAILED line that names what is wrong, and exit status 2.
func TestBadCommandLine(t *testing.T) {
	for args, want := range map[string]string{
		"--bogus":                       "flag provided but not defined: -bogus",
		"--approval-record=nonamespace": "--approval-record \\\"nonamespace\\\" is not <namespace>/<name>",
		"extra":                         "unexpected arguments: extra",
		"--cache-pools=builders:0:14":   "--cache-pools: \\\"builders:0:14\\\": the most volumes is a positive number",
	} {
		var stderr bytes.Buffer
		assert.Check(t, is.Equal(run(strings.Fields(args), &stderr), 2), args)
		assert.Check(t, is.Contains(stderr.String(), `"msg":"FAILED: bad command line"`), args)
		assert.Check(t, is.Contains(stderr.String(), want), args)
	}
}
