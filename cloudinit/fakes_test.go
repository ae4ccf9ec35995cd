package cloudinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/realtools"
)

// Fakes for what the agent and its bootstrap reach over the network: IMDSv2, SSM's JSON API, S3, Auto Scaling's and
// EC2's Query APIs and the API server. The bootstrap runs with the real curl against them, the built agent with its
// endpoint overrides; only the commands that change the host are stubs.

const (
	fakeInstanceID   = "i-0123456789abcdef0"
	fakeZone         = "eu-central-1a"
	fakeRegion       = "eu-central-1"
	fakeNodeIP       = "10.100.1.23"
	fakeInstanceType = "m7g.large"
	fakeRole         = "dynk8s-node"
	fakeAccessKey    = "AKIAFAKEACCESSKEY01"
	fakeSecretKey    = "fakeSecret/Key+0123456789abcdefghijklmn"
	fakeSession      = "FwoGZXIvYXdzEFAKE/session+token=="
	testClusterName  = "homelab"
)

type fakeAWS struct {
	t    *testing.T
	imds *fakeaws.IMDS
	ssm  *httptest.Server
	ec2  *fakeEC2
	asg  *httptest.Server

	mu sync.Mutex
	// ssmFailures is how many GetParameter calls get 400 before one succeeds; negative: all of them.
	ssmFailures int
	ssmError    string
	// params are the SecureStrings GetParameter can return.
	params map[string]string
	// queued values of a parameter are served one per GetParameter, before params; "" answers ParameterNotFound.
	queued      map[string][]string
	ssmRequests int
	problems    []string

	// group is the instance's Auto Scaling group ("": in none); pendingAction says whether a lifecycle action waits
	// for the instance, as in Pending:Wait or Warmed:Pending:Wait.
	group         string
	pendingAction bool
	// instanceVersion and groupVersion are the launch template versions DescribeAutoScalingInstances gives the
	// instance and DescribeAutoScalingGroups the group ("": none, and the group is not known).
	instanceVersion, groupVersion string
	// asgCalls are the Auto Scaling calls, one line each: the action and its sorted parameters but Action and
	// Version.
	asgCalls []string
}

const fakeGroup = "homelab-spot-arm64-asg-1a2b3c"

func newFakeAWS(t *testing.T, params map[string]string) *fakeAWS {
	return newFakeAWSIn(t, params, fakeaws.IMDSInstance{})
}

// newFakeAWSIn is newFakeAWS with the instance's domain and lifecycle state taken from inst.
func newFakeAWSIn(t *testing.T, params map[string]string, inst fakeaws.IMDSInstance) *fakeAWS {
	f := &fakeAWS{t: t, params: params, ssmError: "AccessDeniedException", group: fakeGroup}
	f.imds = fakeaws.NewIMDS(t, fakeaws.IMDSInstance{
		ID: fakeInstanceID, Zone: fakeZone, Region: fakeRegion, PrivateIP: fakeNodeIP, Type: fakeInstanceType,
		Role: fakeRole, AccessKeyID: fakeAccessKey, SecretAccessKey: fakeSecretKey, SessionToken: fakeSession,
		Domain: inst.Domain, LifecycleState: inst.LifecycleState,
	})
	f.ssm = httptest.NewServer(http.HandlerFunc(f.serveSSM))
	f.ec2 = &fakeEC2{aws: f, gatewayState: "running"}
	f.ec2.server = httptest.NewServer(http.HandlerFunc(f.ec2.serve))
	f.asg = httptest.NewServer(http.HandlerFunc(f.serveAutoScaling))
	t.Cleanup(func() {
		f.ssm.Close()
		f.ec2.server.Close()
		f.asg.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, p := range f.problems {
			t.Errorf("fake AWS: %s", p)
		}
	})
	return f
}

func (f *fakeAWS) problem(format string, args ...any) {
	f.problems = append(f.problems, fmt.Sprintf(format, args...))
}

// checkSigned reports a request that is not SigV4-signed for service with the role's credentials.
func (f *fakeAWS) checkSigned(r *http.Request, service, contentType string) {
	auth := r.Header.Get("Authorization")
	switch {
	case r.Method != http.MethodPost:
		f.problem("%s: %s", service, r.Method)
	case r.Header.Get("Content-Type") != contentType:
		f.problem("%s: content type %q", service, r.Header.Get("Content-Type"))
	case !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential="+fakeAccessKey+"/") ||
		!strings.Contains(auth, "/"+fakeRegion+"/"+service+"/aws4_request"):
		f.problem("%s: not SigV4-signed for %s/%s with the role's key: %q", service, fakeRegion, service, auth)
	case !strings.Contains(auth, "x-amz-security-token"):
		f.problem("%s: the session token header is not signed: %q", service, auth)
	case r.Header.Get("X-Amz-Security-Token") != fakeSession:
		f.problem("%s: session token %q", service, r.Header.Get("X-Amz-Security-Token"))
	}
}

func (f *fakeAWS) serveSSM(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ssmRequests++
	f.checkSigned(r, "ssm", "application/x-amz-json-1.1")
	if r.Header.Get("X-Amz-Target") != "AmazonSSM.GetParameter" {
		f.problem("SSM: target %q", r.Header.Get("X-Amz-Target"))
	}
	var req struct {
		Name           string
		WithDecryption bool
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !req.WithDecryption {
		f.problem("SSM: request %+v (%v): want a name and WithDecryption", req, err)
	}
	if f.ssmFailures != 0 {
		f.ssmFailures--
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = fmt.Fprintf(w, `{"__type":%q,"message":"fake SSM says no"}`, f.ssmError)
		return
	}
	v, ok := f.params[req.Name]
	if q := f.queued[req.Name]; len(q) > 0 {
		v, ok, f.queued[req.Name] = q[0], q[0] != "", q[1:]
	}
	if !ok {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"__type":"ParameterNotFound"}`)
		return
	}
	_, _ = fmt.Fprintf(w, `{"Parameter":{"Name":%q,"Type":"SecureString","Value":%q,"Version":1}}`, req.Name, v)
}

// serveAutoScaling answers the three EC2 Auto Scaling Query API actions the boot calls, in the API's XML.
func (f *fakeAWS) serveAutoScaling(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkSigned(r, "autoscaling", "application/x-www-form-urlencoded")
	if err := r.ParseForm(); err != nil {
		f.problem("autoscaling: %v", err)
	}
	form := r.PostForm
	action := form.Get("Action")
	if form.Get("Version") != "2011-01-01" {
		f.problem("autoscaling %s: version %q", action, form.Get("Version"))
	}
	var params []string
	for k := range form {
		if k != "Action" && k != "Version" {
			params = append(params, k+"="+form.Get(k))
		}
	}
	slices.Sort(params)
	f.asgCalls = append(f.asgCalls, strings.Join(append([]string{action}, params...), " "))
	ns := `xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/"`
	fail := func(code, msg string) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = fmt.Fprintf(w, `<ErrorResponse %s><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error></ErrorResponse>`, ns, code, msg)
	}
	switch action {
	case "DescribeAutoScalingInstances":
		member := ""
		if f.group != "" && form.Get("InstanceIds.member.1") == fakeInstanceID {
			member = fmt.Sprintf("<member><InstanceId>%s</InstanceId><AutoScalingGroupName>%s</AutoScalingGroupName>%s</member>",
				fakeInstanceID, f.group, fakeTemplate(f.instanceVersion))
		}
		_, _ = fmt.Fprintf(w, `<DescribeAutoScalingInstancesResponse %s><DescribeAutoScalingInstancesResult><AutoScalingInstances>%s</AutoScalingInstances></DescribeAutoScalingInstancesResult></DescribeAutoScalingInstancesResponse>`, ns, member)
	case "CompleteLifecycleAction":
		if !f.pendingAction || form.Get("AutoScalingGroupName") != f.group {
			fail("ValidationError", "No active Lifecycle Action found with instance ID "+form.Get("InstanceId"))
			return
		}
		f.pendingAction = false
		_, _ = fmt.Fprintf(w, `<CompleteLifecycleActionResponse %s><CompleteLifecycleActionResult/></CompleteLifecycleActionResponse>`, ns)
	case "DescribeAutoScalingGroups":
		if f.groupVersion == "" || form.Get("AutoScalingGroupNames.member.1") != f.group {
			fail("ValidationError", "fake autoscaling knows no such group")
			return
		}
		// As EC2 Auto Scaling answers: the group's template, then its instances, each with its own template.
		_, _ = fmt.Fprintf(w, `<DescribeAutoScalingGroupsResponse %s><DescribeAutoScalingGroupsResult><AutoScalingGroups><member>`+
			`<AutoScalingGroupName>%s</AutoScalingGroupName>%s<Instances><member><InstanceId>%s</InstanceId>%s</member></Instances>`+
			`</member></AutoScalingGroups></DescribeAutoScalingGroupsResult></DescribeAutoScalingGroupsResponse>`,
			ns, f.group, fakeTemplate(f.groupVersion), fakeInstanceID, fakeTemplate(f.instanceVersion))
	case "SetInstanceHealth":
		_, _ = fmt.Fprintf(w, `<SetInstanceHealthResponse %s/>`, ns)
	default:
		fail("InvalidAction", "fake autoscaling knows no "+action)
	}
}

// fakeTemplate is a LaunchTemplate element of an Auto Scaling answer, or nothing for version "".
func fakeTemplate(version string) string {
	if version == "" {
		return ""
	}
	return "<LaunchTemplate><LaunchTemplateId>lt-0123456789abcdef0</LaunchTemplateId>" +
		"<LaunchTemplateName>lab-x86-20260101</LaunchTemplateName><Version>" + version + "</Version></LaunchTemplate>"
}

func (f *fakeAWS) autoscalingCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.asgCalls)
}

// newFakeAPIServer answers /readyz over TLS after dropping the first drops connections.
func newFakeAPIServer(t *testing.T, drops int) *httptest.Server {
	var mu sync.Mutex
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		drop := drops > 0
		drops--
		mu.Unlock()
		if drop {
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// Stub commands: each records its argv in $STUB_DIR/calls. curl is the real one, wrapped to record its argv too,
// so a test can check that no secret ever appears on a command line.
var stubs = map[string]string{
	"kubeadm": `echo "kubeadm $*" >>"$STUB_DIR/calls"
if [[ $1 == join ]]; then
  cp "$3" "$STUB_DIR/join-config.yaml"
  stat -c %a "$3" >"$STUB_DIR/join-config.mode"
  n=$(cat "$STUB_DIR/joins" 2>/dev/null || echo 0)
  echo $((n + 1)) >"$STUB_DIR/joins"
  if ((n < ${STUB_KUBEADM_FAILURES:-0})); then echo "kubeadm stub: join $((n + 1)) fails" >&2; exit 1; fi
  mkdir -p "$DYNK8S_ROOT/etc/kubernetes" && touch "$DYNK8S_ROOT/etc/kubernetes/kubelet.conf"
fi`,
	// systemctl fails the one command line given in STUB_SYSTEMCTL_FAILS ("start dynk8s-imds-lock.service").
	"systemctl": `echo "systemctl $*" >>"$STUB_DIR/calls"
[[ "$*" != "${STUB_SYSTEMCTL_FAILS:-}" ]]`,
	// nft lists the counters the test wrote to $STUB_DIR/nft.json, or fails as with no such table.
	// nft lists counters from nft.json (the gateway's idle check) and loads rulesets unless STUB_NFT_FAILS is set.
	"nft": `echo "nft $*" >>"$STUB_DIR/calls"
[[ -z ${STUB_NFT_FAILS:-} ]] || exit 1
if [[ $1 == -j ]]; then
  if [[ -r $STUB_DIR/nft.json ]]; then cat "$STUB_DIR/nft.json"; else echo "Error: No such file or directory" >&2; exit 1; fi
fi`,
	"dnf": `echo "dnf $*" >>"$STUB_DIR/calls"
umask >>"$STUB_DIR/dnf-umask"
n=$(cat "$STUB_DIR/dnf-runs" 2>/dev/null || echo 0)
echo $((n + 1)) >"$STUB_DIR/dnf-runs"
if ((${STUB_DNF_FAILURES:-0} < 0 || n < ${STUB_DNF_FAILURES:-0})); then echo "Error: mirror hiccup (stub)" >&2; exit 1; fi
if [[ -n ${STUB_DNF_NEEDS_REPO:-} && " $* " != *" --repo=$STUB_DNF_NEEDS_REPO "* ]]; then
  echo "Error: nothing provides conntrack needed by kubelet (stub)" >&2; exit 1
fi
if [[ " $* " == *" kernel-modules-extra-"* ]]; then touch "$STUB_DIR/modules-installed"; fi`,
	"modprobe": `echo "modprobe $*" >>"$STUB_DIR/calls"
[[ " ${STUB_MODULES_MISSING:-} " != *" $1 "* || -e $STUB_DIR/modules-installed ]]`,
	"sysctl":  `echo "sysctl $*" >>"$STUB_DIR/calls"`,
	"swapoff": `echo "swapoff $*" >>"$STUB_DIR/calls"`,
	// STUB_CRICTL_AWAIT_JOIN: a pull takes until kubeadm join has run (10 s at most), as a big image would.
	"crictl": `echo "crictl $*" >>"$STUB_DIR/calls"
for ((i = 0; i < 100; i++)); do
  [[ -z ${STUB_CRICTL_AWAIT_JOIN:-} || -e $STUB_DIR/joins ]] && break
  sleep 0.1
done
[[ " $* " != *" ${STUB_CRICTL_FAILS:-none} "* ]]`,
	// The aws CLI, for a curl without --aws-sigv4: it reads the role from IMDS itself, so it gets no credentials.
	"aws": `echo "aws $*" >>"$STUB_DIR/calls"
case "$1 $2" in
"ssm get-parameter") printf '%s\n' "$STUB_AWS_PARAMETER_VALUE" ;;
"autoscaling describe-auto-scaling-instances") echo "$STUB_AWS_GROUP" ;;
esac`,
	// What kubeadm join's preflight looks for on PATH (InPathCheck) and the boot checks first; the boot only checks
	// them, so they only record.
	"iptables": `echo "iptables $*" >>"$STUB_DIR/calls"`,
	"mount":    `echo "mount $*" >>"$STUB_DIR/calls"`,
	"nsenter":  `echo "nsenter $*" >>"$STUB_DIR/calls"`,
	"rpm": `echo "rpm $*" >>"$STUB_DIR/calls"
[[ " ${STUB_RPM_MISSING:-} " != *" $3 "* ]]`,
	"logger": `echo "$*" >>"$STUB_DIR/journal"`,
	// ip answers "show default" as iproute2 6 does (-j: JSON) with an EC2-like default route, after STUB_IP_NO_ROUTE
	// answers without one.
	"ip": `echo "ip $*" >>"$STUB_DIR/calls"
if [[ "$*" == "-j -4 route show default" ]]; then
  n=$(cat "$STUB_DIR/ip-shows" 2>/dev/null || echo 0)
  echo $((n + 1)) >"$STUB_DIR/ip-shows"
  if ((n >= ${STUB_IP_NO_ROUTE:-0})); then
    echo '[{"dst":"default","gateway":"10.100.1.1","dev":"ens5","protocol":"dhcp","prefsrc":"10.100.1.23","metric":100,"flags":[]}]'
  else
    echo '[]'
  fi
fi`,
	// The real curl, but: STUB_CURL_NO_SIGV4 makes it an old curl without --aws-sigv4; STUB_ROUTE_SSM and
	// STUB_ROUTE_AUTOSCALING send the real endpoints' URLs (https://ssm.<region>.<domain>/) to the fakes, as DNS would.
	"curl": `echo "curl $*" >>"$STUB_DIR/calls"
args=()
for a in "$@"; do
  if [[ -n ${STUB_CURL_NO_SIGV4:-} && $a == --aws-sigv4 ]]; then
    echo "curl: option --aws-sigv4: is unknown" >&2; exit 2
  fi
  case $a in
  https://ssm.*) echo "$a" >>"$STUB_DIR/endpoints" && a=${STUB_ROUTE_SSM:-$a} ;;
  https://autoscaling.*) echo "$a" >>"$STUB_DIR/endpoints" && a=${STUB_ROUTE_AUTOSCALING:-$a} ;;
  esac
  args+=("$a")
done
exec "$STUB_REAL_CURL" "${args[@]}"`,
}

type scriptRun struct {
	env      *scriptEnv
	root     string
	stubDir  string
	stderr   string
	exitCode int
	elapsed  time.Duration
}

func (r scriptRun) file(name string) string {
	b, err := os.ReadFile(filepath.Join(r.stubDir, name))
	if err != nil {
		return ""
	}
	return string(b)
}

// scriptEnv is a node's root (the scripts' DYNK8S_ROOT) with the user data's files, a closed PATH of stubs and the
// shell utilities, and the fakes' endpoints with a fast backoff in the environment.
type scriptEnv struct {
	root, stubDir string
	environ       []string
}

func newScriptEnv(t *testing.T, userData []byte, aws *fakeAWS, env map[string]string, prepare func(root string)) *scriptEnv {
	t.Helper()
	realCurl := realtools.Require(t, "curl")
	e := &scriptEnv{root: t.TempDir(), stubDir: t.TempDir()}
	// The whole PATH: the shell utilities and the stand-ins below, nothing of the host's, so no outcome depends on
	// what the host has installed.
	bin := realtools.ClosedPath(t)
	materialize(t, userData, e.root)
	// The kernel settings kubeadm join checks, and the uptime the timeline reads, as a booted node has them.
	proc := filepath.Join(e.root, "proc")
	for path, content := range map[string]string{"sys/net/ipv4/ip_forward": "1\n", "uptime": "42.50 80.00\n"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(proc, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, path), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	omit := strings.Fields(env["STUB_OMIT"])
	for name, body := range stubs {
		if slices.Contains(omit, name) {
			continue
		}
		realtools.WriteStub(t, bin, name, "#!/usr/bin/env bash\n"+body+"\n")
	}
	if prepare != nil {
		prepare(e.root)
	}
	vars := map[string]string{
		"PATH":                        bin,
		"DYNK8S_ROOT":                 e.root,
		"DYNK8S_IMDS_ENDPOINT":        aws.imds.URL,
		"DYNK8S_SSM_ENDPOINT":         aws.ssm.URL,
		"DYNK8S_AUTOSCALING_ENDPOINT": aws.asg.URL,
		"DYNK8S_EC2_ENDPOINT":         aws.ec2.server.URL,
		"DYNK8S_PROC":                 proc,
		"DYNK8S_AWS_CLI":              "aws",
		"DYNK8S_DEADLINE_SECONDS":     "30",
		"DYNK8S_BACKOFF_INITIAL_MS":   "50",
		"DYNK8S_BACKOFF_MAX_MS":       "200",
		"STUB_DIR":                    e.stubDir,
		"STUB_REAL_CURL":              realCurl,
	}
	for k, v := range env {
		vars[k] = v
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, overridden := vars[k]; overridden || k == "JOURNAL_STREAM" || strings.HasPrefix(k, "DYNK8S_") ||
			strings.HasPrefix(k, "STUB_") || strings.HasSuffix(strings.ToLower(k), "_proxy") {
			continue
		}
		e.environ = append(e.environ, kv)
	}
	for k, v := range vars {
		e.environ = append(e.environ, k+"="+v)
	}
	return e
}

func (e *scriptEnv) run(t *testing.T, script string, args ...string) scriptRun {
	t.Helper()
	var out strings.Builder
	cmd := exec.Command(filepath.Join(e.root, script), args...)
	cmd.Env = e.environ
	cmd.Stdout = &out
	cmd.Stderr = &out
	start := time.Now()
	err := cmd.Run()
	run := scriptRun{env: e, root: e.root, stubDir: e.stubDir, stderr: out.String(), elapsed: time.Since(start)}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		run.exitCode = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %s: %v", script, err)
	}
	t.Logf("%s exited %d after %s:\n%s", script, run.exitCode, run.elapsed.Round(time.Millisecond), run.stderr)
	realtools.CheckNoMissingCommand(t, run.stderr)
	return run
}

// fakeEC2 answers the two EC2 Query API actions the scripts call, as EC2 does (API version 2016-11-15, XML answers):
// DescribeInstances over a list of instances, applying the filters the idle check must send, and StartInstances of
// the one gateway, through its states.
type fakeEC2 struct {
	aws    *fakeAWS
	server *httptest.Server

	// instances are what DescribeInstances searches (guarded by aws.mu, as is everything below).
	instances []fakeInstance
	// nextToken, when set, ends every DescribeInstances answer as a page that more pages follow.
	nextToken string
	// gatewayID is the only instance StartInstances knows; gatewayState its state. While stoppingCalls is above
	// zero, a start is refused with IncorrectInstanceState (the instance is still stopping); then it has stopped.
	gatewayID     string
	gatewayState  string
	stoppingCalls int
	// haltingCalls is the number of starts a running gateway still answers "running" while its OS powers off: after
	// the last of them it is stopping.
	haltingCalls int
	// failures answers that many calls with failCode (HTTP failStatus) first; negative: every call.
	failures   int
	failCode   string
	failStatus int
	// actions are the actions called, in order.
	actions []string
	// emptyPages answers that many DescribeInstances pages with no instance and a NextToken first, as EC2 may with
	// filters; tokens are the NextToken each DescribeInstances call sent ("" for none).
	emptyPages int
	tokens     []string
}

type fakeInstance struct {
	ID, State string
	Tags      map[string]string
}

func (e *fakeEC2) serve(w http.ResponseWriter, r *http.Request) {
	f := e.aws
	f.mu.Lock()
	defer f.mu.Unlock()
	auth := r.Header.Get("Authorization")
	switch {
	case r.Method != http.MethodPost || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded"):
		f.problem("EC2: %s with content type %q", r.Method, r.Header.Get("Content-Type"))
	case !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential="+fakeAccessKey+"/") ||
		!strings.Contains(auth, "/"+fakeRegion+"/ec2/aws4_request"):
		f.problem("EC2: not SigV4-signed for %s/ec2 with the role's key: %q", fakeRegion, auth)
	case !strings.Contains(auth, "x-amz-security-token") || r.Header.Get("X-Amz-Security-Token") != fakeSession:
		f.problem("EC2: the session token is missing or not signed: %q", auth)
	}
	if err := r.ParseForm(); err != nil {
		f.problem("EC2: form: %v", err)
	}
	action := r.PostForm.Get("Action")
	e.actions = append(e.actions, action)
	if v := r.PostForm.Get("Version"); v != "2016-11-15" {
		f.problem("EC2 %s: API version %q", action, v)
	}
	if e.failures != 0 {
		e.failures--
		e.fail(w, e.failStatus, e.failCode, "fake EC2 says no")
		return
	}
	switch action {
	case "DescribeInstances":
		e.describe(w, r.PostForm)
	case "StartInstances":
		e.start(w, r.PostForm)
	default:
		f.problem("EC2: unexpected action %q", action)
		e.fail(w, http.StatusBadRequest, "InvalidAction", "no such action")
	}
}

func (e *fakeEC2) fail(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>fake</RequestID></Response>`, code, msg)
}

const ec2NS = `xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"`

// describe applies the filters as EC2 does, after checking that they are exactly those of the idle check: the
// stack's pool instances (the cluster tag and the pool tag key) that are pending or running.
func (e *fakeEC2) describe(w http.ResponseWriter, form url.Values) {
	filters := map[string][]string{}
	for i := 1; form.Get(fmt.Sprintf("Filter.%d.Name", i)) != ""; i++ {
		name := form.Get(fmt.Sprintf("Filter.%d.Name", i))
		for j := 1; form.Get(fmt.Sprintf("Filter.%d.Value.%d", i, j)) != ""; j++ {
			filters[name] = append(filters[name], form.Get(fmt.Sprintf("Filter.%d.Value.%d", i, j)))
		}
	}
	want := map[string][]string{
		"tag:dynk8s:cluster":  {testClusterName},
		"tag-key":             {"dynk8s:pool"},
		"instance-state-name": {"pending", "running"},
	}
	if fmt.Sprint(filters) != fmt.Sprint(want) {
		e.aws.problem("EC2 DescribeInstances: filters %v, want %v", filters, want)
	}
	var b strings.Builder
	token := form.Get("NextToken")
	e.tokens = append(e.tokens, token)
	page := 0
	if token != "" {
		if _, err := fmt.Sscanf(token, "page-%d", &page); err != nil {
			e.aws.problem("EC2 DescribeInstances: NextToken %q is none the fake gave", token)
		}
	}
	if page < e.emptyPages {
		fmt.Fprintf(&b, `<DescribeInstancesResponse %s><requestId>fake</requestId><reservationSet/>`+
			`<nextToken>page-%d</nextToken></DescribeInstancesResponse>`, ec2NS, page+1)
		_, _ = io.WriteString(w, b.String())
		return
	}
	fmt.Fprintf(&b, `<DescribeInstancesResponse %s><requestId>fake</requestId><reservationSet>`, ec2NS)
	for _, in := range e.instances {
		match := in.Tags["dynk8s:cluster"] == testClusterName && slices.Contains(filters["instance-state-name"], in.State)
		if _, pool := in.Tags["dynk8s:pool"]; !match || !pool {
			continue
		}
		fmt.Fprintf(&b, `<item><reservationId>r-%s</reservationId><instancesSet><item><instanceId>%s</instanceId>`+
			`<instanceState><code>16</code><name>%s</name></instanceState><tagSet>`, in.ID[2:], in.ID, in.State)
		for _, k := range slices.Sorted(maps.Keys(in.Tags)) {
			fmt.Fprintf(&b, `<item><key>%s</key><value>%s</value></item>`, k, in.Tags[k])
		}
		b.WriteString(`</tagSet></item></instancesSet></item>`)
	}
	b.WriteString(`</reservationSet>`)
	if e.nextToken != "" {
		fmt.Fprintf(&b, `<nextToken>%s</nextToken>`, e.nextToken)
	}
	b.WriteString(`</DescribeInstancesResponse>`)
	_, _ = io.WriteString(w, b.String())
}

// start is StartInstances of the gateway: idempotent on a running instance, refused while it is stopping.
func (e *fakeEC2) start(w http.ResponseWriter, form url.Values) {
	id := form.Get("InstanceId.1")
	if id != e.gatewayID || form.Get("InstanceId.2") != "" {
		e.fail(w, http.StatusBadRequest, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id))
		return
	}
	if e.gatewayState == "running" && e.haltingCalls > 0 {
		if e.haltingCalls--; e.haltingCalls == 0 {
			defer func() { e.gatewayState = "stopping" }()
		}
	}
	if e.gatewayState == "stopping" {
		if e.stoppingCalls > 0 {
			e.stoppingCalls--
			e.fail(w, http.StatusBadRequest, "IncorrectInstanceState",
				fmt.Sprintf("The instance '%s' is not in a state from which it can be started.", id))
			return
		}
		e.gatewayState = "stopped"
	}
	previous := e.gatewayState
	current := "running"
	if previous == "stopped" {
		current = "pending"
	}
	e.gatewayState = "running"
	_, _ = fmt.Fprintf(w, `<StartInstancesResponse %s><requestId>fake</requestId><instancesSet><item>`+
		`<instanceId>%s</instanceId><currentState><code>0</code><name>%s</name></currentState>`+
		`<previousState><code>80</code><name>%s</name></previousState></item></instancesSet></StartInstancesResponse>`,
		ec2NS, id, current, previous)
}

// ec2Actions returns the actions called so far.
func (f *fakeAWS) ec2Actions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ec2.actions)
}
