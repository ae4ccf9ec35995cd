package cloudinit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The bootstrap (fetch-agent.sh, dynk8s-agent.service) run for real, with the real curl, against internal/fakeaws'
// IMDS and S3, which verifies each request's SigV4 signature with the role's key, secret and session token.

// testAgentBinary is the agent the fake S3 serves in the tests (testAgentSHA256 is its hash).
var testAgentBinary = []byte("#!/bin/sh\necho dynk8s-node test build\n")

func TestTestAgentSHA256(t *testing.T) {
	assert.Equal(t, sha256Of(testAgentBinary), testAgentSHA256)
}

func sha256Of(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

type agentRun struct {
	root, stubDir string
	out           string
	exitCode      int
	elapsed       time.Duration
}

func (r agentRun) installed() ([]byte, os.FileMode, error) {
	p := filepath.Join(r.root, "usr/local/bin/dynk8s-node")
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, 0, err
	}
	info, err := os.Stat(p)
	return b, info.Mode().Perm(), err
}

// binDir lists /usr/local/bin: nothing but the agent, and no temporary file left behind.
func (r agentRun) binDir(t *testing.T) []string {
	entries, err := os.ReadDir(filepath.Join(r.root, "usr/local/bin"))
	assert.NilError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// runFetchAgent renders spotPool's user data, lays its files out under a fresh root (root, if not empty) and runs
// the bootstrap with the unit's environment (its EnvironmentFile, then env over it), through a closed PATH whose curl
// is the real one behind a stand-in that records every argv.
func runFetchAgent(t *testing.T, root string, s3 *fakeaws.S3, env map[string]string) agentRun {
	t.Helper()
	realCurl := realtools.Require(t, "curl")
	ud, err := spotPool().userData()
	assert.NilError(t, err)
	if root == "" {
		root = t.TempDir()
		materialize(t, ud, root)
		assert.NilError(t, os.MkdirAll(filepath.Join(root, "usr/local/bin"), 0o755))
	}
	inst := fakeaws.NodeInstance()
	imds := fakeaws.NewIMDS(t, inst)
	stubDir := t.TempDir()
	bin := realtools.ClosedPath(t)
	realtools.WriteStub(t, bin, "curl", "#!/usr/bin/env bash\nprintf '%s\\n' \"$*\" >>"+stubDir+"/curl-argv\nexec "+realCurl+" \"$@\"\n")

	vars := parseEnv(t, fileByPath(t, parseCloudConfig(t, ud), agentEnvPath).Content)
	for k, v := range map[string]string{"PATH": bin, "DYNK8S_ROOT": root, "DYNK8S_IMDS_ENDPOINT": imds.URL,
		"DYNK8S_S3_ENDPOINT": s3.URL} {
		vars[k] = v
	}
	for k, v := range env {
		vars[k] = v
	}
	cmd := exec.Command(filepath.Join(root, agentScript))
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	run := agentRun{root: root, stubDir: stubDir, out: out.String(), elapsed: time.Since(start)}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		run.exitCode = ee.ExitCode()
	} else {
		assert.NilError(t, err)
	}
	t.Logf("fetch-agent.sh exited %d after %s:\n%s", run.exitCode, run.elapsed.Round(time.Millisecond), run.out)
	realtools.CheckNoMissingCommand(t, run.out)
	// The role's credentials and the IMDS token reach curl on stdin only: never in an argv, which any user can
	// read in /proc.
	argv, _ := os.ReadFile(filepath.Join(stubDir, "curl-argv"))
	for _, secret := range []string{inst.SecretAccessKey, inst.SessionToken, inst.AccessKeyID, fakeaws.IMDSSessionToken} {
		assert.Check(t, !strings.Contains(string(argv), secret), "a credential in curl's argv:\n%s", argv)
	}
	return run
}

func TestFetchAgent(t *testing.T) {
	t.Parallel()
	const key = "dynk8s-node/linux-arm64"
	for _, tc := range []struct {
		name string
		// object is what S3 holds at the pinned version (nil: nothing); failures as fakeaws.S3's Fail.
		object   []byte
		failures int
		secret   string // the fake S3's secret key, when not the role's
		env      map[string]string
		wantExit int
		// wantLog are lines (or parts) of the output in order; wantGET the requests S3 saw (at least, with a deadline:
		// bash's SECONDS counts whole seconds, so the attempts that fit may be one fewer or more).
		wantLog     []string
		wantGET     int
		deadline    bool
		wantInstall bool
	}{
		{name: "a good object installs", object: testAgentBinary, wantLog: []string{
			"dynk8s-agent: installed dynk8s-node " + testAgentSHA256 + " (s3://" + testAgentBucket + "/" + key +
				" version " + testAgentVersion + ")"},
			wantGET: 1, wantInstall: true},
		{name: "a wrong hash is refused", object: []byte("another build"), wantExit: 1, wantLog: []string{
			"dynk8s-agent: FAILED: the download's sha256 is " + sha256Of([]byte("another build")) + ", not the pinned " +
				testAgentSHA256 + ": nothing installed"}, wantGET: 1},
		{name: "an empty object is refused", object: []byte{},
			env:      map[string]string{"DYNK8S_AGENT_SHA256": sha256Of(nil)},
			wantExit: 1, wantLog: []string{"FAILED: the download is empty"}, wantGET: 1},
		{name: "a 5xx is retried", object: testAgentBinary, failures: 2, wantLog: []string{
			"attempt 1 failed: GET " + "%S3%/" + testAgentBucket + "/" + key + "?versionId=" + testAgentVersion +
				": HTTP 503: <Error><Code>SlowDown</Code></Error>; retrying in 1s",
			"attempt 2 failed:", "installed dynk8s-node " + testAgentSHA256}, wantGET: 3, wantInstall: true},
		// How many attempts fit in the deadline is the machine's to say (a loaded one took over 4 s for the first:
		// bash, curl and the IMDS round trips); that a failure is retried is the case above's.
		{name: "the deadline holds", object: testAgentBinary, failures: -1,
			env:      map[string]string{"DYNK8S_AGENT_DEADLINE_SECONDS": "4"},
			wantExit: 1, wantLog: []string{"FAILED: gave up after ", "attempts (deadline 4s): GET ", ": HTTP 503"},
			wantGET: 1, deadline: true},
		{name: "a missing version is retried to the deadline", env: map[string]string{"DYNK8S_AGENT_DEADLINE_SECONDS": "2"},
			wantExit: 1, wantLog: []string{"FAILED: gave up after ", "attempts (deadline 2s): GET ", ": HTTP 404: <Error><Code>NoSuchVersion</Code></Error>"},
			wantGET: 1, deadline: true},
		{name: "the fake S3 refuses another key's signature", object: testAgentBinary, secret: "not-the-role's-secret",
			env:      map[string]string{"DYNK8S_AGENT_DEADLINE_SECONDS": "2"},
			wantExit: 1, wantLog: []string{"FAILED: gave up after ", ": HTTP 403: <Error><Code>SignatureDoesNotMatch</Code>"}, wantGET: 1, deadline: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sig := fakeaws.NodeInstance().SigV4()
			if tc.secret != "" {
				sig.Credentials.SecretAccessKey = tc.secret
			}
			s3 := fakeaws.NewS3(t, sig)
			if tc.object != nil {
				s3.PutObject(testAgentBucket, key, testAgentVersion, tc.object)
			}
			s3.Fail(tc.failures)
			run := runFetchAgent(t, "", s3, tc.env)
			assert.Check(t, is.Equal(run.exitCode, tc.wantExit))
			rest := run.out
			for _, want := range tc.wantLog {
				want = strings.ReplaceAll(want, "%S3%", s3.URL)
				i := strings.Index(rest, want)
				if !assert.Check(t, i >= 0, "no %q (in order) in:\n%s", want, run.out) {
					break
				}
				rest = rest[i+len(want):]
			}
			assert.Check(t, is.Len(nodetest.FailedLines(run.out), min(tc.wantExit, 1)), "one reason when it fails, none else")
			if tc.secret != "" {
				refused := s3.Refusals()
				assert.Check(t, len(refused) > 0 && strings.Contains(refused[0], "the signature does not match"), "%v", refused)
			}
			if requests := s3.Requests(); tc.deadline {
				assert.Check(t, requests >= tc.wantGET, "%d requests", requests)
				// It gives up on its own (the deadline's message above), before systemd's timeout would stop it: the
				// unit allows agentUnitMargin past the deadline. Not a speed check: a loaded machine may take seconds
				// to start bash and curl, so only the margin bounds it.
				d, err := strconv.Atoi(tc.env["DYNK8S_AGENT_DEADLINE_SECONDS"])
				assert.NilError(t, err)
				assert.Check(t, run.elapsed < time.Duration(d)*time.Second+nodeconfig.AgentFetchUnitSlack, "ran %s", run.elapsed)
			} else {
				assert.Check(t, is.Equal(requests, tc.wantGET))
			}
			got, mode, err := run.installed()
			if tc.wantInstall {
				assert.Check(t, err)
				assert.Check(t, is.DeepEqual(got, testAgentBinary))
				assert.Check(t, is.Equal(mode, os.FileMode(0o755)))
			} else {
				assert.Check(t, errors.Is(err, os.ErrNotExist), "something was installed: %v", err)
			}
			assert.Check(t, is.DeepEqual(run.binDir(t), map[bool][]string{true: {"dynk8s-node"}}[tc.wantInstall]),
				"no temporary file is left")
		})
	}
}

// A reboot (or a warm instance's later boot) with the pinned agent installed asks S3 nothing; one with another
// build installed replaces it.
func TestFetchAgentOnLaterBoots(t *testing.T) {
	t.Parallel()
	s3 := fakeaws.NewS3(t, fakeaws.NodeInstance().SigV4())
	s3.PutObject(testAgentBucket, "dynk8s-node/linux-arm64", testAgentVersion, testAgentBinary)
	first := runFetchAgent(t, "", s3, nil)
	assert.Equal(t, first.exitCode, 0)
	again := runFetchAgent(t, first.root, s3, nil)
	assert.Check(t, is.Equal(again.exitCode, 0))
	assert.Check(t, is.Contains(again.out, "dynk8s-agent: dynk8s-node "+testAgentSHA256+" is installed"))
	assert.Check(t, is.Equal(s3.Requests(), 1), "S3 asked again")

	assert.NilError(t, os.WriteFile(filepath.Join(first.root, "usr/local/bin/dynk8s-node"), []byte("old build"), 0o755))
	replaced := runFetchAgent(t, first.root, s3, nil)
	assert.Check(t, is.Equal(replaced.exitCode, 0))
	got, _, err := replaced.installed()
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(got, testAgentBinary))
}

// The controller's init container runs the bootstrap with an IAM user's key from the environment and no IMDS: it
// signs with that key (no session token), installs where DYNK8S_AGENT_DEST says, and keeps the key off curl's argv.
func TestFetchAgentWithAKeyFromTheEnvironment(t *testing.T) {
	t.Parallel()
	realCurl := realtools.Require(t, "curl")
	const keyID, secret = "AKIAFAKECONTROLLER01", "fake/controller/secret+key0123456789ABCD"
	key := "dynk8s-controller/linux-" + map[string]string{"amd64": "amd64", "arm64": "arm64"}[runtime.GOARCH]
	s3 := fakeaws.NewS3(t, fakeaws.SigV4{Region: "eu-central-1", Credentials: aws.Credentials{AccessKeyID: keyID, SecretAccessKey: secret}})
	s3.PutObject(testAgentBucket, key, testAgentVersion, testAgentBinary)
	dest := filepath.Join(t.TempDir(), "dynk8s-controller")
	bin := realtools.ClosedPath(t)
	stubDir := t.TempDir()
	realtools.WriteStub(t, bin, "curl", "#!/usr/bin/env bash\nprintf '%s\\n' \"$*\" >>"+stubDir+"/curl-argv\nexec "+realCurl+" \"$@\"\n")
	cmd := exec.Command("scripts/fetch-agent.sh")
	// Both architectures' pins, the other one wrong: the machine's are taken.
	arch := strings.ToUpper(runtime.GOARCH)
	other := map[string]string{"AMD64": "ARM64", "ARM64": "AMD64"}[arch]
	cmd.Env = []string{"PATH=" + bin, "DYNK8S_AGENT_BUCKET=" + testAgentBucket, "DYNK8S_AGENT_KEY_" + arch + "=" + key,
		"DYNK8S_AGENT_VERSION_ID_" + arch + "=" + testAgentVersion, "DYNK8S_AGENT_SHA256_" + arch + "=" + testAgentSHA256,
		"DYNK8S_AGENT_KEY_" + other + "=not/this", "DYNK8S_AGENT_VERSION_ID_" + other + "=nope",
		"DYNK8S_AGENT_SHA256_" + other + "=" + sha256Of(nil),
		"DYNK8S_AGENT_DEADLINE_SECONDS=20", "DYNK8S_AGENT_DEST=" + dest, "DYNK8S_AWS_REGION=eu-central-1",
		"DYNK8S_S3_ENDPOINT=" + s3.URL, "AWS_ACCESS_KEY_ID=" + keyID, "AWS_SECRET_ACCESS_KEY=" + secret,
		// An IMDS that is not there: the environment's key is used, IMDS never asked.
		"DYNK8S_IMDS_ENDPOINT=http://127.0.0.1:9"}
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, "%s", out)
	realtools.CheckNoMissingCommand(t, string(out))
	assert.Check(t, is.Contains(string(out), "installed dynk8s-controller "+testAgentSHA256))
	got, err := os.ReadFile(dest)
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(got, testAgentBinary))
	assert.Check(t, is.Equal(s3.Requests(), 1))
	argv, _ := os.ReadFile(filepath.Join(stubDir, "curl-argv"))
	assert.Check(t, !strings.Contains(string(argv), secret) && !strings.Contains(string(argv), keyID), "the key in curl's argv:\n%s", argv)
	assert.Check(t, !strings.Contains(string(argv), "169.254") && !strings.Contains(string(argv), "127.0.0.1:9"), "IMDS asked:\n%s", argv)

	// Without the key the run stops at once, naming what is missing.
	cmd = exec.Command("scripts/fetch-agent.sh")
	cmd.Env = []string{"PATH=" + bin, "DYNK8S_AGENT_BUCKET=b", "DYNK8S_AGENT_KEY=k", "DYNK8S_AGENT_VERSION_ID=v",
		"DYNK8S_AGENT_SHA256=" + testAgentSHA256, "DYNK8S_AGENT_DEADLINE_SECONDS=20", "DYNK8S_AGENT_DEST=" + dest + "-2",
		"DYNK8S_AWS_REGION=eu-central-1", "DYNK8S_S3_ENDPOINT=" + s3.URL}
	out, err = cmd.CombinedOutput()
	assert.Check(t, err != nil, "ran without a key:\n%s", out)
	assert.Check(t, is.Contains(string(out), "AWS_ACCESS_KEY_ID"))
	assert.Check(t, is.Equal(s3.Requests(), 1), "S3 asked without a key")
}
