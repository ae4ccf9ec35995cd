//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	asgtypes "github.com/aws/aws-sdk-go-v2/service/autoscaling/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The AWS rig: moto_server on a port it bound itself (motoSSM), the harness's own signed requests to it, and the
// dev stack replayed into it with IAM enforced (awsEnv, testdata/moto_aws.py).

// motoSSM is a moto_server of this test on a loopback port that it bound itself, stopped with the test.
type motoSSM struct {
	url  string
	done chan struct{} // closed when the process has exited
	logs *nodetest.SyncBuffer
}

// motoListening is werkzeug's start-up line, which names the port it actually bound.
var motoListening = regexp.MustCompile(`Running on http://127\.0\.0\.1:([0-9]+)`)

// motoClient bounds every request to moto.
var motoClient = &http.Client{Timeout: 10 * time.Second}

// startMoto starts moto_server on port 0 and reads the port it bound from its output. The port is then moto's own
// from the bind on. (Picking a free port here, closing it and passing it to moto left it unowned for as long as moto
// takes to start, 2 s warm and 9 s on a fresh machine whose Python has no bytecode cache yet; a process that bound it
// meanwhile made this moto exit with "Address already in use" while the readiness probe took that process's answer
// for moto's, and once that process stopped, the next request was refused.)
//
// env is added to moto's environment (moto's own settings, such as INITIAL_NO_AUTH_ACTION_COUNT).
func startMoto(ctx context.Context, t *testing.T, bin string, env ...string) *motoSSM {
	t.Helper()
	m := &motoSSM{done: make(chan struct{}), logs: &nodetest.SyncBuffer{}}
	cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", "0")
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = m.logs, m.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Dies with the test process even if the test is killed before its cleanup runs. The signal follows the
		// thread that started it; Go ends a thread only when a goroutine exits locked to it (runtime.LockOSThread),
		// which these tests never do.
		Pdeathsig: syscall.SIGKILL,
		// Its own process group: a signal meant for the test run's group (a script's `kill 0`, a terminal's ^C)
		// does not stop it in the middle of a test; the cleanup below does.
		Setpgid: true,
	}
	assert.NilError(t, cmd.Start(), "start moto_server")
	go func() { _ = cmd.Wait(); close(m.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-m.done
		}
		if t.Failed() {
			t.Logf("moto_server output:\n%s", m.logs.String())
		}
	})

	deadline := time.Now().Add(60 * time.Second)
	wait := func(what string) {
		t.Helper()
		select {
		case <-m.done:
			t.Fatalf("moto_server exited before %s:\n%s", what, m.logs.String())
		case <-ctx.Done():
			t.Fatalf("moto_server: %s: %v", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("moto_server: no %s after 60 s:\n%s", what, m.logs.String())
		}
	}
	for {
		if sub := motoListening.FindStringSubmatch(m.logs.String()); sub != nil {
			m.url = "http://127.0.0.1:" + sub[1]
			break
		}
		wait("start-up line")
	}
	for {
		resp, err := motoClient.Get(m.url + "/moto-api/")
		if err == nil {
			_ = resp.Body.Close()
			assert.NilError(t, m.alive())
			if resp.StatusCode == http.StatusOK {
				return m
			}
		}
		wait("answer on " + m.url)
	}
}

// alive reports an exited moto_server with its output: a refused request then says why.
func (m *motoSSM) alive() error {
	select {
	case <-m.done:
		return fmt.Errorf("moto_server has exited:\n%s", m.logs.String())
	default:
		return nil
	}
}

// ssm makes one SSM call (target e.g. "PutParameter") with the request as JSON and returns the status and body.
func (m *motoSSM) ssm(t *testing.T, region, target string, request map[string]any) (int, []byte) {
	t.Helper()
	body, err := json.Marshal(request)
	assert.NilError(t, err)
	req, err := http.NewRequest(http.MethodPost, m.url+"/", bytes.NewReader(body))
	assert.NilError(t, err)
	req.Header.Set("Content-Type", "application/x-amz-json-1.1")
	req.Header.Set("X-Amz-Target", "AmazonSSM."+target)
	signForMoto(t, req, "ssm", region)
	resp, err := motoClient.Do(req)
	if err != nil {
		t.Fatalf("SSM %s: %v", target, errors.Join(err, m.alive()))
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// putSecureString stores a SecureString the way the stack's IAM component does.
func (m *motoSSM) putSecureString(t *testing.T, region, name, value string) {
	t.Helper()
	status, b := m.ssm(t, region, "PutParameter",
		map[string]any{"Name": name, "Value": value, "Type": "SecureString", "Overwrite": true})
	if status != http.StatusOK {
		t.Fatalf("SSM PutParameter: HTTP %d: %s", status, strings.TrimSpace(string(b)))
	}
}

// signForMoto signs one of the harness's own requests to moto for service in region, as an SDK would: moto checks no
// signature, but keys its state by the credential scope's region.
func signForMoto(t *testing.T, req *http.Request, service, region string) {
	t.Helper()
	sig := fakeaws.SigV4{Region: region, Credentials: aws.Credentials{AccessKeyID: "AKIAE2ETEST", SecretAccessKey: "e2e-moto"}}
	assert.NilError(t, sig.Sign(req, service))
}

type replayPlan struct {
	VPCs             []map[string]any `json:"vpcs"`
	Subnets          []map[string]any `json:"subnets"`
	SecurityGroups   []map[string]any `json:"securityGroups"`
	InstanceProfiles []string         `json:"instanceProfiles"`
	LaunchTemplates  []map[string]any `json:"launchTemplates"`
	Groups           []map[string]any `json:"groups"`
	Users            []replayUser     `json:"users"`
	// Roles are instance roles to create and assume (their temporary credentials come back in awsEnv.roles).
	Roles []replayRole `json:"roles,omitempty"`
	// Gateway, when set, is the gateway instance to launch and leave stopped.
	Gateway *replayInstance `json:"gateway,omitempty"`
}

// replayInstance is a declared instance: the mock engine's id and its inputs.
type replayInstance struct {
	ID     string         `json:"id"`
	Inputs map[string]any `json:"inputs"`
}

// replayRole is an IAM role with its inline policies.
type replayRole struct {
	Name     string   `json:"name"`
	Policies []string `json:"policies"`
}

type replayUser struct {
	Name   string `json:"name"`
	Policy string `json:"policy"`
	// More are further inline policies of the user, replayed with their actions only (testdata/moto_aws.py
	// actions_only: their resources name the mock engine's ids).
	More []string `json:"more,omitempty"`
}

// awsEnv is moto with the stack replayed into it.
type awsEnv struct {
	url, region string
	logs        *nodetest.SyncBuffer
	script      string
	admin       awsKey
	users       map[string]awsKey
	// roles are the temporary credentials of the replayed roles, each assumed once, by role name.
	roles map[string]awsKey
	// ids are moto's ids of the replayed resources, by the mock engine's.
	ids map[string]string
}

type awsKey struct {
	Key    string `json:"key"`
	Secret string `json:"secret"`
	// Token is the session token of temporary credentials.
	Token string `json:"token,omitempty"`
}

type groupState struct {
	Desired   int               `json:"desired"`
	Tags      map[string]string `json:"tags"`
	Instances []groupInstance   `json:"instances"`
}

type groupInstance struct {
	ID   string `json:"id"`
	Zone string `json:"zone"`
}

// startAWS starts moto_server with IAM enforcement and replays the stack into it; users are the IAM users to make.
func startAWS(ctx context.Context, t *testing.T, s stackAutoscaling, users []replayUser) *awsEnv {
	t.Helper()
	bin := requireTool(t, "moto_server")
	requireTool(t, "python3")
	// The pyenv shim is a bash script: run the real entry point, so that the signal below reaches the server.
	if out, err := exec.Command("pyenv", "which", "moto_server").Output(); err == nil {
		bin = strings.TrimSpace(string(out))
	}
	// The first three AWS calls are free (moto_aws.py setup spends them on an admin user and its key); every call
	// after them must be signed by a known key and allowed by that user's policies. Readiness asks /moto-api/,
	// which is no AWS action and spends no free call.
	m := startMoto(ctx, t, bin, "INITIAL_NO_AUTH_ACTION_COUNT=3")
	a := &awsEnv{url: m.url, region: s.region, logs: m.logs}

	a.script = filepath.Join("testdata", "moto_aws.py")
	p := s.replay
	p.Users = users
	in, err := json.Marshal(p)
	assert.NilError(t, err)
	var out struct {
		Admin awsKey            `json:"admin"`
		Users map[string]awsKey `json:"users"`
		Roles map[string]awsKey `json:"roles"`
		IDs   map[string]string `json:"ids"`
	}
	a.python(ctx, t, in, &out, "setup")
	a.admin, a.users, a.roles, a.ids = out.Admin, out.Users, out.Roles, out.IDs
	return a
}

// python runs a moto_aws.py command and decodes its JSON answer into v.
func (a *awsEnv) python(ctx context.Context, t *testing.T, stdin []byte, v any, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "python3", append([]string{a.script, args[0], a.url, a.region}, args[1:]...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("moto_aws.py %s: %v\n%s", args[0], err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), v); err != nil {
		t.Fatalf("moto_aws.py %s: %v: %s", args[0], err, stdout.String())
	}
}

// ec2 and autoscaling are clients of moto's with the admin's key. The calls the burst's loops make every turn (the
// groups, the instances) go through them rather than moto_aws.py: a Python process that imports boto3 takes about
// half a second here, which a launcher polling through it added to every instance's launch.
func (a *awsEnv) ec2() *ec2.Client {
	return ec2.New(ec2.Options{Region: a.region, BaseEndpoint: aws.String(a.url),
		Credentials: credentials.NewStaticCredentialsProvider(a.admin.Key, a.admin.Secret, "")})
}

func (a *awsEnv) autoscaling() *autoscaling.Client {
	return autoscaling.New(autoscaling.Options{Region: a.region, BaseEndpoint: aws.String(a.url),
		Credentials: credentials.NewStaticCredentialsProvider(a.admin.Key, a.admin.Secret, "")})
}

// autoscalingGroups are every group moto's Auto Scaling describes.
func (a *awsEnv) autoscalingGroups(ctx context.Context, t *testing.T) []asgtypes.AutoScalingGroup {
	t.Helper()
	var groups []asgtypes.AutoScalingGroup
	pages := autoscaling.NewDescribeAutoScalingGroupsPaginator(a.autoscaling(), &autoscaling.DescribeAutoScalingGroupsInput{})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		assert.NilError(t, err, "DescribeAutoScalingGroups")
		groups = append(groups, page.AutoScalingGroups...)
	}
	return groups
}

// groups are the groups by name: desired capacity, tags and instances.
func (a *awsEnv) groups(ctx context.Context, t *testing.T) map[string]groupState {
	t.Helper()
	out := map[string]groupState{}
	for _, g := range a.autoscalingGroups(ctx, t) {
		st := groupState{Desired: int(aws.ToInt32(g.DesiredCapacity)), Tags: map[string]string{}}
		for _, tag := range g.Tags {
			st.Tags[aws.ToString(tag.Key)] = aws.ToString(tag.Value)
		}
		for _, i := range g.Instances {
			st.Instances = append(st.Instances, groupInstance{ID: aws.ToString(i.InstanceId),
				Zone: aws.ToString(i.AvailabilityZone)})
		}
		out[aws.ToString(g.AutoScalingGroupName)] = st
	}
	return out
}

// desired returns each group's desired capacity.
func (a *awsEnv) desired(ctx context.Context, t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for name, g := range a.groups(ctx, t) {
		out[name] = g.Desired
	}
	return out
}

// launchFromGroup launches one instance as group would, outside it: from the group's launch template, in its first
// subnet. It returns the instance's id and, as ec2Instances reads them, its zone and private IP.
func (a *awsEnv) launchFromGroup(ctx context.Context, t *testing.T, group string) (string, ec2Instance) {
	t.Helper()
	groups := a.autoscalingGroups(ctx, t)
	i := slices.IndexFunc(groups, func(g asgtypes.AutoScalingGroup) bool {
		return aws.ToString(g.AutoScalingGroupName) == group
	})
	if i < 0 {
		t.Fatalf("moto has no group %s", group)
	}
	g := groups[i]
	spec := g.LaunchTemplate
	if spec == nil && g.MixedInstancesPolicy != nil && g.MixedInstancesPolicy.LaunchTemplate != nil {
		spec = g.MixedInstancesPolicy.LaunchTemplate.LaunchTemplateSpecification
	}
	if spec == nil {
		t.Fatalf("group %s has no launch template", group)
	}
	out, err := a.ec2().RunInstances(ctx, &ec2.RunInstancesInput{MinCount: aws.Int32(1), MaxCount: aws.Int32(1),
		LaunchTemplate: &ec2types.LaunchTemplateSpecification{LaunchTemplateId: spec.LaunchTemplateId,
			LaunchTemplateName: spec.LaunchTemplateName, Version: spec.Version},
		SubnetId: aws.String(strings.Split(aws.ToString(g.VPCZoneIdentifier), ",")[0])})
	assert.NilError(t, err, "RunInstances")
	inst := out.Instances[0]
	id := aws.ToString(inst.InstanceId)
	if inst.Placement == nil || aws.ToString(inst.PrivateIpAddress) == "" {
		t.Fatalf("moto gave instance %s no zone or private IP", id)
	}
	return id, ec2Instance{State: string(inst.State.Name), Zone: aws.ToString(inst.Placement.AvailabilityZone),
		IP: aws.ToString(inst.PrivateIpAddress)}
}

// stopInstance stops an instance as EC2 does when the instance shuts itself down (its shutdown behaviour "stop").
func (a *awsEnv) stopInstance(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	_, err := a.ec2().StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{id}})
	assert.NilError(t, err, "StopInstances %s", id)
}

// startInstance starts an instance, as an operator's StartInstances would.
func (a *awsEnv) startInstance(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	_, err := a.ec2().StartInstances(ctx, &ec2.StartInstancesInput{InstanceIds: []string{id}})
	assert.NilError(t, err, "StartInstances %s", id)
}

// s3 makes one S3 request to moto (path-style) and returns the answer's headers.
func (m *motoSSM) s3(t *testing.T, region, method, path string, body []byte) http.Header {
	t.Helper()
	req, err := http.NewRequest(method, m.url+path, bytes.NewReader(body))
	assert.NilError(t, err)
	signForMoto(t, req, "s3", region)
	resp, err := motoClient.Do(req)
	assert.NilError(t, err, "S3 %s %s", method, path)
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("S3 %s %s: HTTP %d: %s", method, path, resp.StatusCode, b)
	}
	return resp.Header
}

// getParameter reads a SecureString back from moto, decrypted.
func (m *motoSSM) getParameter(t *testing.T, region, name string) string {
	t.Helper()
	status, b := m.ssm(t, region, "GetParameter", map[string]any{"Name": name, "WithDecryption": true})
	var out struct {
		Parameter struct{ Value, Type string }
	}
	if status != http.StatusOK || json.Unmarshal(b, &out) != nil || out.Parameter.Type != "SecureString" {
		t.Fatalf("SSM GetParameter %s: HTTP %d: %s", name, status, b)
	}
	return out.Parameter.Value
}
