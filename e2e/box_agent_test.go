//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra"
)

// putAgent does what the stack's agent bucket does: a versioned bucket, the binary under key; it returns the
// object's version id.
func (m *motoSSM) putAgent(t *testing.T, region, bucket, key string, binary []byte) string {
	t.Helper()
	m.s3(t, region, http.MethodPut, "/"+bucket, []byte("<CreateBucketConfiguration><LocationConstraint>"+region+
		"</LocationConstraint></CreateBucketConfiguration>"))
	m.s3(t, region, http.MethodPut, "/"+bucket+"?versioning",
		[]byte("<VersioningConfiguration><Status>Enabled</Status></VersioningConfiguration>"))
	version := m.s3(t, region, http.MethodPut, "/"+bucket+"/"+key, binary).Get("X-Amz-Version-Id")
	if version == "" {
		t.Fatal("S3 PutObject: no version id")
	}
	return version
}

// TestBoxNodeInstallsTheAgent boots a pool's user data with the bootstrap in a box: dynk8s-agent.service downloads
// the agent `make build` builds (for this machine's architecture) from moto's S3 with the instance role from the
// fake IMDS, checks its hash and installs it, the installed binary runs, and the boot still joins with cloud-init and
// systemd clean.
func TestBoxNodeInstallsTheAgent(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)
	cfg := devConfig(t)
	pool := firstTaintedPool(t, cfg)
	j := newBoxJoin(ctx, t, c, cfg, pool, "")

	dir := t.TempDir()
	build := exec.CommandContext(ctx, filepath.Join("hack", "build-agent.sh"), dir)
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	binary, err := os.ReadFile(filepath.Join(dir, "dynk8s-node-linux-"+runtime.GOARCH))
	assert.NilError(t, err)
	sum := sha256.Sum256(binary)
	agent := cloudinit.Agent{Bucket: "dynk8s-e2e-agent", Key: "dynk8s-node/linux-" + runtime.GOARCH,
		SHA256: hex.EncodeToString(sum[:])}
	agent.VersionID = j.moto.putAgent(t, cfg.Region, agent.Bucket, agent.Key, binary)

	// The pool's user data as the stack renders it, with the object's pin.
	cfg.Kubernetes.APIServerEndpoint = apiServerEndpoint(t, c)
	node, render := infra.NodeConfig(cfg, pool, []string{clusterInfoCAHash(ctx, t, c)}, j.param)
	render.Agent = &agent
	if j.userData, err = cloudinit.Node(node, render); err != nil {
		t.Fatal(err)
	}
	n := j.newNode(t, "box-agent", boxInstance{id: fakeInstanceID, zone: cfg.Region + fakeZoneSuffix, ip: fakeNodeIP})
	start := time.Now()
	n.boot(t)
	err = n.wait(ctx, 2*time.Minute, "dynk8s-agent.service active", func(ctx context.Context) bool {
		if n.unitFailed(ctx, "dynk8s-agent.service") {
			t.Fatal("dynk8s-agent.service failed")
		}
		out, _ := n.exec(ctx, "systemctl", "show", "-P", "ActiveState", "dynk8s-agent.service")
		return strings.TrimSpace(out) == "active"
	})
	assert.NilError(t, err)
	t.Logf("the agent installed %.1f s after the box started", time.Since(start).Seconds())
	if out, err := n.exec(ctx, "sha256sum", "/usr/local/bin/dynk8s-node"); err != nil || !strings.HasPrefix(out, agent.SHA256+" ") {
		t.Errorf("installed: %v: %s, want sha256 %s", err, out, agent.SHA256)
	}
	if out, err := n.exec(ctx, "stat", "-c", "%a %U", "/usr/local/bin/dynk8s-node"); err != nil || strings.TrimSpace(out) != "755 root" {
		t.Errorf("installed with mode and owner %q (%v), want 755 root", out, err)
	}
	if out, err := n.exec(ctx, "/usr/local/bin/dynk8s-node", "version"); err != nil || strings.TrimSpace(out) == "" {
		t.Errorf("the installed agent does not run: %v: %q", err, out)
	}
	journal, _ := n.exec(ctx, "journalctl", "-u", "dynk8s-agent.service", "--no-pager", "-o", "cat")
	if !strings.Contains(journal, "dynk8s-agent: installed dynk8s-node "+agent.SHA256) {
		t.Errorf("the agent unit's journal has no install line:\n%s", journal)
	}
	n.waitReady(ctx, t, 4*time.Minute)
	n.checkSettled(ctx, t)
	n.checkCloudInit(t)
}
