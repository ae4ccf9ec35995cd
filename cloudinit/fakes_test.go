package cloudinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/internal/fakeimds"
	"github.com/dynk8s/dynk8s/internal/realtools"
)

// Fakes for what the boot scripts reach over the network: IMDSv2, SSM's JSON API and the API server. The scripts run
// with the real curl and python3 against them; only the commands that change the host are stubs.

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
)

type fakeAWS struct {
	t    *testing.T
	imds *fakeimds.Server
	ssm  *httptest.Server

	mu sync.Mutex
	// ssmFailures is how many GetParameter calls get 400 before one succeeds; negative: all of them.
	ssmFailures int
	ssmError    string
	// params are the SecureStrings GetParameter can return.
	params      map[string]string
	ssmRequests int
	problems    []string
}

func newFakeAWS(t *testing.T, params map[string]string) *fakeAWS {
	f := &fakeAWS{t: t, params: params, ssmError: "AccessDeniedException"}
	f.imds = fakeimds.New(t, fakeimds.Instance{
		ID: fakeInstanceID, Zone: fakeZone, Region: fakeRegion, PrivateIP: fakeNodeIP, Type: fakeInstanceType,
		Role: fakeRole, AccessKeyID: fakeAccessKey, SecretAccessKey: fakeSecretKey, SessionToken: fakeSession,
	})
	f.ssm = httptest.NewServer(http.HandlerFunc(f.serveSSM))
	t.Cleanup(func() {
		f.ssm.Close()
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

func (f *fakeAWS) serveSSM(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ssmRequests++
	auth := r.Header.Get("Authorization")
	switch {
	case r.Method != http.MethodPost || r.Header.Get("X-Amz-Target") != "AmazonSSM.GetParameter":
		f.problem("SSM: %s with target %q", r.Method, r.Header.Get("X-Amz-Target"))
	case r.Header.Get("Content-Type") != "application/x-amz-json-1.1":
		f.problem("SSM: content type %q", r.Header.Get("Content-Type"))
	case !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential="+fakeAccessKey+"/") ||
		!strings.Contains(auth, "/"+fakeRegion+"/ssm/aws4_request"):
		f.problem("SSM: not SigV4-signed for %s/ssm with the role's key: %q", fakeRegion, auth)
	case !strings.Contains(auth, "x-amz-security-token"):
		f.problem("SSM: the session token header is not signed: %q", auth)
	case r.Header.Get("X-Amz-Security-Token") != fakeSession:
		f.problem("SSM: session token %q", r.Header.Get("X-Amz-Security-Token"))
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
	if !ok {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"__type":"ParameterNotFound"}`)
		return
	}
	_, _ = fmt.Fprintf(w, `{"Parameter":{"Name":%q,"Type":"SecureString","Value":%q,"Version":1}}`, req.Name, v)
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
	"systemctl": `echo "systemctl $*" >>"$STUB_DIR/calls"`,
	"dnf": `echo "dnf $*" >>"$STUB_DIR/calls"
n=$(cat "$STUB_DIR/dnf-runs" 2>/dev/null || echo 0)
echo $((n + 1)) >"$STUB_DIR/dnf-runs"
if ((${STUB_DNF_FAILURES:-0} < 0 || n < ${STUB_DNF_FAILURES:-0})); then echo "Error: mirror hiccup (stub)" >&2; exit 1; fi
if [[ -n ${STUB_DNF_NEEDS_REPO:-} && " $* " != *" --repo=$STUB_DNF_NEEDS_REPO "* ]]; then
  echo "Error: nothing provides conntrack needed by kubelet (stub)" >&2; exit 1
fi`,
	"rpm": `echo "rpm $*" >>"$STUB_DIR/calls"
[[ " ${STUB_RPM_MISSING:-} " != *" $3 "* ]]`,
	"logger": `echo "$*" >>"$STUB_DIR/journal"`,
	// ip answers "show default" with an EC2-like default route, after STUB_IP_NO_ROUTE answers without one.
	"ip": `echo "ip $*" >>"$STUB_DIR/calls"
if [[ "$*" == "-4 route show default" ]]; then
  n=$(cat "$STUB_DIR/ip-shows" 2>/dev/null || echo 0)
  echo $((n + 1)) >"$STUB_DIR/ip-shows"
  if ((n >= ${STUB_IP_NO_ROUTE:-0})); then echo "default via 10.100.1.1 dev ens5 proto dhcp src 10.100.1.23 metric 100"; fi
fi`,
	"nft": `echo "nft $*" >>"$STUB_DIR/calls"
[[ -z ${STUB_NFT_FAILS:-} ]]`,
	// id knows one user, ec2-instance-connect, when STUB_EIC_UID is set.
	"id": `echo "id $*" >>"$STUB_DIR/calls"
[[ "$*" == "-u ec2-instance-connect" && -n ${STUB_EIC_UID:-} ]] && echo "$STUB_EIC_UID"`,
	"curl": `echo "curl $*" >>"$STUB_DIR/calls"
exec "$STUB_REAL_CURL" "$@"`,
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

// scriptEnv is a node's root (the scripts' DYNK8S_ROOT) with the user data's files, stubs first on PATH, and the
// fakes' endpoints with a fast backoff in the environment.
type scriptEnv struct {
	root, stubDir string
	environ       []string
}

// runScript materializes userData's write_files under a fresh root and runs script (a path on the node) there.
// prepare, when set, runs on the root before the script; env adds to or overrides the environment.
func runScript(t *testing.T, userData []byte, script string, aws *fakeAWS, env map[string]string, prepare func(root string)) scriptRun {
	t.Helper()
	return newScriptEnv(t, userData, aws, env, prepare).run(t, script)
}

func newScriptEnv(t *testing.T, userData []byte, aws *fakeAWS, env map[string]string, prepare func(root string)) *scriptEnv {
	t.Helper()
	realCurl := realtools.Require(t, "curl")
	realtools.Require(t, "python3")
	realtools.Require(t, "bash")
	e := &scriptEnv{root: t.TempDir(), stubDir: t.TempDir()}
	bin := t.TempDir()
	materialize(t, userData, e.root)
	for name, body := range stubs {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/usr/bin/env bash\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if prepare != nil {
		prepare(e.root)
	}
	vars := map[string]string{
		"PATH":                      bin + string(os.PathListSeparator) + os.Getenv("PATH"),
		"DYNK8S_ROOT":               e.root,
		"DYNK8S_IMDS_ENDPOINT":      aws.imds.URL,
		"DYNK8S_SSM_ENDPOINT":       aws.ssm.URL,
		"DYNK8S_DEADLINE_SECONDS":   "30",
		"DYNK8S_BACKOFF_INITIAL_MS": "50",
		"DYNK8S_BACKOFF_MAX_MS":     "200",
		"STUB_DIR":                  e.stubDir,
		"STUB_REAL_CURL":            realCurl,
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

func (e *scriptEnv) run(t *testing.T, script string) scriptRun {
	t.Helper()
	var out strings.Builder
	cmd := exec.Command(filepath.Join(e.root, script))
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
	return run
}
