package nodetest

import (
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
)

// The agent's world: what it reaches over the network (internal/fakeaws: IMDSv2, SSM's JSON API, Auto Scaling's
// and EC2's Query APIs, each checking the SigV4 signature with the role's credentials, and the API server), through
// its endpoint overrides; the node's files under a root of their own, as the rendered user data writes them; and
// the commands that change the host as stand-ins that record their argv.

func TestMain(m *testing.M) {
	code := m.Run()
	RemoveBuiltAgent()
	os.Exit(code)
}

// testGroup is the instance's Auto Scaling group, testHook the group's launch hook, testClusterName the cluster.
const (
	testGroup       = "homelab-spot-arm64-asg-1a2b3c"
	testHook        = "dynk8s-launch"
	testClusterName = "homelab"
)

// cloud is what the agent reaches for the instance fakeaws.NodeInstance() describes.
type cloud struct {
	inst fakeaws.IMDSInstance
	imds *fakeaws.IMDS
	ssm  *fakeaws.SSM
	asg  *fakeaws.AutoScaling
	ec2  *fakeaws.EC2
	api  *fakeaws.APIServer
}

// newCloud is the fakes for the instance with the domain and lifecycle state of inst (none: a plain instance),
// SSM holding params, and an API server that first drops apiDrops connections.
func newCloud(t *testing.T, params map[string]string, inst fakeaws.IMDSInstance, apiDrops int) *cloud {
	t.Helper()
	c := &cloud{inst: fakeaws.NodeInstance()}
	c.inst.Domain, c.inst.LifecycleState = inst.Domain, inst.LifecycleState
	sig := c.inst.SigV4()
	c.imds = fakeaws.NewIMDS(t, c.inst)
	c.ssm = fakeaws.NewSSM(t, sig)
	for name, value := range params {
		c.ssm.SetParameter(name, value)
	}
	c.asg = fakeaws.NewAutoScaling(t, sig, fakeaws.AutoScalingInstance{ID: c.inst.ID, Group: testGroup, Hook: testHook})
	// EC2 knows the instance itself, untagged (the gateway's idle check, which filters by the cluster tag, never
	// sees it), for the join's CreateTags.
	c.ec2 = fakeaws.NewEC2(t, sig, fakeaws.EC2Instance{ID: c.inst.ID, State: "running"})
	c.api = fakeaws.NewAPIServer(t, apiDrops)
	return c
}

// apiEndpoint is the API server's address, as the config names it.
func (c *cloud) apiEndpoint(t *testing.T) endpoint.HostPort {
	t.Helper()
	u, err := url.Parse(c.api.URL)
	assert.NilError(t, err)
	hp, err := endpoint.Parse(u.Host)
	assert.NilError(t, err)
	return hp
}

// Stub commands: each records its argv in $STUB_DIR/calls. curl is the real one, wrapped to record its argv too,
// so a test can check that no secret ever appears on a command line.
var stubs = map[string]string{
	// kubeadm join keeps the kubelet's bootstrap key each attempt finds (kubelet-key.N, its mode kubelet-key.N.mode,
	// absent: none); kubeadm reset empties /var/lib/kubelet, as cmd/kubeadm/app/cmd/phases/reset/cleanupnode.go does.
	"kubeadm": `echo "kubeadm $*" >>"$STUB_DIR/calls"
if [[ $1 == reset ]]; then rm -rf "$DYNK8S_ROOT/var/lib/kubelet/"*; fi
if [[ $1 == join ]]; then
  cp "$3" "$STUB_DIR/join-config.yaml"
  stat -c %a "$3" >"$STUB_DIR/join-config.mode"
  n=$(cat "$STUB_DIR/joins" 2>/dev/null || echo 0)
  echo $((n + 1)) >"$STUB_DIR/joins"
  key=$DYNK8S_ROOT/var/lib/kubelet/pki/kubelet-client.key.tmp
  if [[ -e $key ]]; then
    cp "$key" "$STUB_DIR/kubelet-key.$((n + 1))" && stat -c %a "$key" >"$STUB_DIR/kubelet-key.$((n + 1)).mode"
  fi
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

func newScriptEnv(t *testing.T, userData []byte, aws *cloud, env map[string]string, prepare func(root string)) *scriptEnv {
	t.Helper()
	realCurl := realtools.Require(t, "curl")
	e := &scriptEnv{root: t.TempDir(), stubDir: t.TempDir()}
	// The whole PATH: the shell utilities and the stand-ins below, nothing of the host's, so no outcome depends on
	// what the host has installed.
	bin := realtools.ClosedPath(t)
	assert.NilError(t, cloudinit.WriteFiles(userData, e.root))
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
		"DYNK8S_EC2_ENDPOINT":         aws.ec2.URL,
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
