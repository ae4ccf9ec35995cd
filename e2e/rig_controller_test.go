//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"gotest.tools/v3/assert"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/internal/testkit/csrtest"
)

// The controller rig: cluster/cmd/dynk8s-controller built once per test binary (builtController), run on this
// machine as the stack's Deployment runs it (its rendered or deployed args, with the controller ServiceAccount's
// token in a kubeconfig, so that its RBAC and the admission policies that match it are the ones under test), AWS
// pointed at moto, and read back through its JSON log, its probes and metrics, and the Lease it campaigns for.

// controllerBuild is the one build of the controller for this test binary.
var controllerBuild struct {
	once      sync.Once
	dir, path string
	err       error
}

// builtController is cluster/cmd/dynk8s-controller built for this machine, static, once per test binary (the Go
// build cache makes it quick after the first); TestMain removes it with removeBuiltController.
func builtController(t *testing.T) string {
	t.Helper()
	controllerBuild.once.Do(func() {
		if controllerBuild.dir, controllerBuild.err = os.MkdirTemp("", "dynk8s-controller-"); controllerBuild.err != nil {
			return
		}
		controllerBuild.path = filepath.Join(controllerBuild.dir, addons.ControllerName)
		cmd := exec.Command("go", "build", "-trimpath", "-o", controllerBuild.path,
			"github.com/dynk8s/dynk8s/cluster/cmd/dynk8s-controller")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			controllerBuild.err = fmt.Errorf("go build ./cluster/cmd/dynk8s-controller: %w\n%s", err, out)
		}
	})
	assert.NilError(t, controllerBuild.err)
	return controllerBuild.path
}

// removeBuiltController removes what builtController built.
func removeBuiltController() {
	if controllerBuild.dir != "" {
		_ = os.RemoveAll(controllerBuild.dir)
	}
}

// goldenControllerManifest is the dev stack's rendered controller Deployment (TestStackGolden holds it current).
var goldenControllerManifest = filepath.Join("..", "testdata", "stacks", "dev", "manifests",
	"deployment-kube-system-"+addons.ControllerName+".yaml")

// controllerContainer is the controller container of a Deployment, as rendered or as deployed.
type controllerContainer struct {
	Name string   `json:"name"`
	Args []string `json:"args"`
	Env  []struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct{ Name, Key string } `json:"secretKeyRef"`
		} `json:"valueFrom"`
	} `json:"env"`
}

// controllerOf is the container named controller of a Deployment's JSON or YAML.
func controllerOf(t *testing.T, doc []byte) controllerContainer {
	t.Helper()
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []controllerContainer `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	assert.NilError(t, yaml.Unmarshal(doc, &d), "controller Deployment")
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "controller" {
			return c
		}
	}
	t.Fatalf("the controller Deployment has no container named controller:\n%s", doc)
	return controllerContainer{}
}

// renderedControllerArgs are the controller's args in the dev stack's rendered Deployment.
func renderedControllerArgs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(goldenControllerManifest)
	assert.NilError(t, err)
	return controllerOf(t, raw).Args
}

// liveController is the deployed Deployment's controller container: its args, and its environment with the
// Secrets' values it references read as the kubelet would.
func liveController(ctx context.Context, t *testing.T, c cluster) (args []string, env map[string]string) {
	t.Helper()
	out, err := c.kubectl(ctx, "-n", "kube-system", "get", "deployment.v1.apps", addons.ControllerName, "-o", "json")
	assert.NilError(t, err)
	ctr := controllerOf(t, []byte(out))
	env = map[string]string{}
	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			var sec struct {
				Data map[string]string `json:"data"`
			}
			ref := e.ValueFrom.SecretKeyRef
			assert.NilError(t, c.getJSON(ctx, &sec, "secret.v1.", ref.Name, "-n", "kube-system"))
			v, err := base64.StdEncoding.DecodeString(sec.Data[ref.Key])
			if err != nil || len(v) == 0 {
				t.Fatalf("%s from %s/%s: %v", e.Name, ref.Name, ref.Key, err)
			}
			env[e.Name] = string(v)
		}
	}
	return ctr.Args, env
}

// argValue is the value of --name=value in args ("" without it).
func argValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// withArgs is args with each --name=value of set in place of the same flag (appended when args lack it).
func withArgs(args []string, set ...string) []string {
	out := slices.Clone(args)
	for _, s := range set {
		name, _, _ := strings.Cut(s, "=")
		if i := slices.IndexFunc(out, func(a string) bool { return strings.HasPrefix(a, name+"=") }); i >= 0 {
			out[i] = s
		} else {
			out = append(out, s)
		}
	}
	return out
}

// controllerObjects applies what the controller runs with, from the dev stack's rendered manifests, but not its
// Deployment (the test runs the binary): its ServiceAccount, roles and bindings, the node bootstrap bindings of the
// join tokens' group, and the controller's node policy. It removes them, the Lease, the approval record and every
// CSR when the test ends.
func controllerObjects(ctx context.Context, t *testing.T, c cluster) {
	t.Helper()
	t.Cleanup(func() {
		bg := context.Background()
		_, _ = c.kubectl(bg, "delete", "csr", "--all")
		_, _ = c.kubectl(bg, "-n", "kube-system", "delete", "lease", addons.ControllerName, "--ignore-not-found")
		_, _ = c.kubectl(bg, "-n", "kube-system", "delete", "configmap", addons.ApprovalRecordName, "--ignore-not-found")
	})
	applyRendered(ctx, t, c, func(name string) bool {
		for _, kind := range []string{"serviceaccount-", "clusterrole-", "clusterrolebinding-", "role-", "rolebinding-",
			"validatingadmissionpolicy-", "validatingadmissionpolicybinding-"} {
			if strings.HasPrefix(name, kind) && strings.Contains(name, addons.ControllerName) {
				return true
			}
		}
		return strings.Contains(name, "dynk8s-node-bootstrap-")
	}, 11)
}

// controllerSpec is one run of the controller: the Deployment's args, the changes a test makes to them, the
// AWS keys of its environment.
type controllerSpec struct {
	// args are the Deployment's (renderedControllerArgs or liveController).
	args []string
	// identity names the replica in the Lease.
	identity string
	// set are flags in place of the Deployment's (--loops=..., --not-ready-after=...), and the lease's timing.
	set []string
	// ec2, ssm are moto's endpoints.
	ec2, ssm string
	// ec2Key signs EC2 (AWS_ACCESS_KEY_ID, the cleanup IAM user's), ssmKey SSM (DYNK8S_SSM_ACCESS_KEY_ID).
	ec2Key, ssmKey awsKey
}

// controllerProcess is one controller running on this machine.
type controllerProcess struct {
	identity string
	cmd      *exec.Cmd
	logFile  string
	done     chan struct{}
}

// startController runs the built controller as the Deployment runs it, with spec's changes, the controller
// ServiceAccount's kubeconfig, its probes on a loopback port of its own choosing, and no AWS configuration but the
// keys given. It is stopped (SIGTERM) when the test ends.
func startController(ctx context.Context, t *testing.T, c cluster, spec controllerSpec) *controllerProcess {
	t.Helper()
	bin := builtController(t)
	dir := t.TempDir()
	args := withArgs(spec.args, append([]string{
		"--kubeconfig=" + serviceAccountKubeconfig(ctx, t, c, addons.ControllerName, dir),
		"--identity=" + spec.identity, "--addr=127.0.0.1:0",
		"--ec2-endpoint=" + spec.ec2, "--ssm-endpoint=" + spec.ssm,
	}, spec.set...)...)
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "AWS_EC2_METADATA_DISABLED=true",
		"AWS_CONFIG_FILE=" + filepath.Join(dir, "aws-config"), "AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(dir, "aws-creds"),
		"AWS_ACCESS_KEY_ID=" + spec.ec2Key.Key, "AWS_SECRET_ACCESS_KEY=" + spec.ec2Key.Secret,
		"DYNK8S_SSM_ACCESS_KEY_ID=" + spec.ssmKey.Key, "DYNK8S_SSM_SECRET_ACCESS_KEY=" + spec.ssmKey.Secret}
	// Its own process group (a signal for the test run's does not reach it), and it dies with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// A file, not a pipe: Wait then waits for the process only.
	p := &controllerProcess{identity: spec.identity, cmd: cmd, logFile: filepath.Join(dir, "controller.log"),
		done: make(chan struct{})}
	out, err := os.Create(p.logFile)
	assert.NilError(t, err)
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	assert.NilError(t, cmd.Start(), "start %s", bin)
	go func() { _ = cmd.Wait(); close(p.done) }()
	// No flag carries a secret (the kubeconfig is a path, the keys are in the environment).
	t.Logf("controller %s: %s", spec.identity, strings.Join(args, " "))
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("controller %s log (last lines):\n%s", p.identity, tail(p.log(), 60))
		}
		if dir := os.Getenv("DYNK8S_E2E_DIR"); dir != "" {
			file := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + p.identity + ".log"
			_ = os.WriteFile(filepath.Join(dir, "logs", file), []byte(p.log()), 0o600)
		}
	})
	return p
}

// log is what the controller has written so far.
func (p *controllerProcess) log() string {
	b, _ := os.ReadFile(p.logFile)
	return string(b)
}

// logLine is one JSON line of the controller's log, as slog's JSON handler writes it.
type logLine map[string]any

func (l logLine) str(k string) string { s, _ := l[k].(string); return s }

// lines are the controller's log lines so far that parse as JSON.
func (p *controllerProcess) lines() []logLine {
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(p.log()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

// waitLine waits up to timeout for a log line with msg whose string fields include want, and returns it.
func (p *controllerProcess) waitLine(t *testing.T, timeout time.Duration, msg string, want map[string]string) logLine {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, l := range p.lines() {
			if l.str("msg") != msg {
				continue
			}
			ok := true
			for k, v := range want {
				ok = ok && l.str(k) == v
			}
			if ok {
				return l
			}
		}
		select {
		case <-p.done:
			t.Fatalf("controller %s exited (%v) before logging %q %v:\n%s", p.identity, p.cmd.ProcessState, msg, want,
				tail(p.log(), 40))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("controller %s logged no %q %v in %s:\n%s", p.identity, msg, want, timeout, tail(p.log(), 40))
		}
	}
}

// addr is where the controller serves its probes and metrics, read from its log.
func (p *controllerProcess) addr(t *testing.T) string {
	t.Helper()
	return p.waitLine(t, time.Minute, "serving probes and metrics", nil).str("addr")
}

// get is one GET of path on the controller's server: the status and the body.
func (p *controllerProcess) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + p.addr(t) + path)
	assert.NilError(t, err, "GET %s from controller %s", path, p.identity)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// stop ends the controller as the kubelet ends its container: SIGTERM, and SIGKILL after the Deployment's grace
// period. The leader releases its Lease on the way out.
func (p *controllerProcess) stop(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Errorf("controller %s did not stop on SIGTERM within 30 s:\n%s", p.identity, tail(p.log(), 30))
		p.kill()
	}
}

// kill ends the controller at once (a node lost, an OOM kill): no release of the Lease.
func (p *controllerProcess) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// leaseHolder is the holderIdentity of the controller's Lease ("" with none or no Lease).
func leaseHolder(ctx context.Context, c cluster) string {
	out, err := c.kubectl(ctx, "-n", "kube-system", "get", "lease", addons.ControllerName, "-o",
		"jsonpath={.spec.holderIdentity}")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

// waitLeader waits up to timeout for the Lease to be held by one of ids and returns the holder.
func waitLeader(ctx context.Context, t *testing.T, c cluster, timeout time.Duration, ids ...string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if h := leaseHolder(ctx, c); slices.Contains(ids, h) {
			return h
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("the Lease is held by %q after %s, want one of %v", leaseHolder(ctx, c), timeout, ids)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kubeletRequest is a kubelet client CSR for node as a kubelet makes it (csrtest.Signed's ECDSA P-256 key), as
// one PEM block, with the lowercase hex sha256 of its key's DER SubjectPublicKeyInfo: what the instance's kubelet
// key mark (names.TagKubeletKey) must say for the controller to approve it.
func kubeletRequest(t *testing.T, node string) (request, keySHA256 string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	assert.NilError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: csrtest.KubeletSubject(node)},
		key)
	assert.NilError(t, err)
	cr, err := x509.ParseCertificateRequest(der)
	assert.NilError(t, err)
	sum := sha256.Sum256(cr.RawSubjectPublicKeyInfo)
	return csrtest.Block(der), hex.EncodeToString(sum[:])
}

// markKey tags instance in moto with the kubelet key mark, as the instance's own join does (with the admin's key
// here: the test plays the instance).
func (a *awsEnv) markKey(ctx context.Context, t *testing.T, instance, keySHA256 string) {
	t.Helper()
	_, err := a.ec2().CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{instance},
		Tags: []ec2types.Tag{{Key: aws.String(names.TagKubeletKey), Value: aws.String(keySHA256)}}})
	assert.NilError(t, err, "CreateTags %s %s", instance, names.TagKubeletKey)
}

// instanceTags are an instance's tags in moto.
func (a *awsEnv) instanceTags(ctx context.Context, t *testing.T, instance string) map[string]string {
	t.Helper()
	out, err := a.ec2().DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{instance}})
	assert.NilError(t, err, "DescribeInstances %s", instance)
	tags := map[string]string{}
	for _, r := range out.Reservations {
		for _, i := range r.Instances {
			for _, tag := range i.Tags {
				tags[aws.ToString(tag.Key)] = aws.ToString(tag.Value)
			}
		}
	}
	return tags
}
