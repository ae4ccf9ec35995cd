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
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

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
	if err := cmd.Start(); err != nil {
		t.Fatalf("start moto_server: %v", err)
	}
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
			if err := m.alive(); err != nil {
				t.Fatal(err)
			}
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
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, m.url+"/", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
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
	if err := sig.Sign(req, service); err != nil {
		t.Fatal(err)
	}
}
