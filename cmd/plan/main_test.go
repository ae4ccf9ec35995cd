package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// chdirRoot runs the command from the repository root, where the stack files are.
func chdirRoot(t *testing.T) {
	t.Helper()
	t.Chdir("../..")
}

func TestPlanTable(t *testing.T) {
	chdirRoot(t)
	var stdout, stderr bytes.Buffer
	assert.Equal(t, run([]string{"-stack", "dev"}, &stdout, &stderr), 0, stderr.String())
	out := stdout.String()
	assert.Check(t, is.Contains(out, "stand-ins"), "the plan says its lookups are stand-ins")
	assert.Check(t, is.Contains(out, "pulumi preview"))
	for _, want := range []string{"pool-builders-x86-asg", "pool-builders-arm-lt", "gateway-eip", "ignores desiredCapacity",
		"onPremWireGuardConfig", "[secret]"} {
		assert.Check(t, is.Contains(out, want))
	}
}

func TestPlanJSON(t *testing.T) {
	chdirRoot(t)
	var stdout, stderr bytes.Buffer
	assert.Equal(t, run([]string{"-stack", "dev", "-json"}, &stdout, &stderr), 0, stderr.String())
	var doc struct {
		Stack     string `json:"stack"`
		Resources []struct {
			Type          string         `json:"type"`
			Name          string         `json:"name"`
			Parent        string         `json:"parent"`
			Inputs        map[string]any `json:"inputs"`
			IgnoreChanges []string       `json:"ignoreChanges"`
			Protect       bool           `json:"protect"`
		} `json:"resources"`
		Outputs map[string]any `json:"outputs"`
	}
	assert.NilError(t, json.Unmarshal(stdout.Bytes(), &doc))
	assert.Equal(t, doc.Stack, "dev")
	assert.Check(t, len(doc.Resources) > 40)
	assert.Equal(t, doc.Outputs["onPremWireGuardConfig"], "[secret]")
	types := map[string]int{}
	for _, r := range doc.Resources {
		types[r.Type]++
		assert.Check(t, r.IgnoreChanges != nil, "ignoreChanges is always a list")
	}
	for _, typ := range []string{"dynk8s:infra:Network", "dynk8s:infra:WireGuardGateway", "dynk8s:infra:Identity",
		"dynk8s:infra:ClusterAddons"} {
		assert.Equal(t, types[typ], 1, typ)
	}
	assert.Equal(t, types["dynk8s:infra:NodePool"], 2)
}

func TestPlanArtifacts(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	assert.Equal(t, run([]string{"-stack", "dev", "-out", dir}, &stdout, &stderr), 0, stderr.String())
	for _, f := range []string{"userdata/builders-x86.yaml", "userdata/builders-arm.yaml", "userdata/gateway.yaml",
		"wireguard/onprem.conf"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		assert.NilError(t, err, f)
		assert.Check(t, len(b) > 0, f)
	}
	ud, _ := os.ReadFile(filepath.Join(dir, "userdata/builders-x86.yaml"))
	assert.Check(t, strings.HasPrefix(string(ud), "#cloud-config\n"))
	conf, _ := os.ReadFile(filepath.Join(dir, "wireguard/onprem.conf"))
	assert.Check(t, is.Contains(string(conf), "[Peer]"))
	manifests, err := filepath.Glob(filepath.Join(dir, "manifests", "*.yaml"))
	assert.NilError(t, err)
	assert.Check(t, len(manifests) >= 10, "in-cluster objects: %v", manifests)
	assert.Check(t, !strings.Contains(stdout.String(), "PrivateKey"))
}

func TestPlanBadConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "Pulumi.bad.yaml")
	src, err := os.ReadFile("../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	bad := strings.Replace(string(src), "maxSize: 6", "maxSize: -1", 1)
	bad = strings.Replace(bad, "mtu: 1420", "mtu: 100", 1)
	assert.NilError(t, os.WriteFile(file, []byte(bad), 0o644))
	var stdout, stderr bytes.Buffer
	assert.Equal(t, run([]string{"-config", file, "-json"}, &stdout, &stderr), 1)
	assert.Equal(t, stdout.String(), "", "nothing on stdout")
	assert.Check(t, is.Contains(stderr.String(), "dynk8s:nodePools[1].maxSize: must be >= minSize (0), got -1"))
	assert.Check(t, is.Contains(stderr.String(), "dynk8s:wireguard.mtu: must be 1280..8920"))
}

func TestPlanMissingStackFile(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, run([]string{"-stack", "nope"}, &stdout, &stderr), 1)
	assert.Equal(t, stdout.String(), "")
	assert.Check(t, is.Contains(stderr.String(), "Pulumi.nope.yaml"))
}
