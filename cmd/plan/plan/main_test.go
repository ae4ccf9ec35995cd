package plan_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra"
)

// chdirRoot runs the command from the repository root, where the stack files are.
func chdirRoot(t *testing.T) {
	t.Helper()
	t.Chdir("../../..")
}

func TestPlanTable(t *testing.T) {
	chdirRoot(t)
	var stdout, stderr bytes.Buffer
	assert.Equal(t, plan.Main([]string{"-stack", "dev"}, &stdout, &stderr), 0, stderr.String())
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
	assert.Equal(t, plan.Main([]string{"-stack", "dev", "-json"}, &stdout, &stderr), 0, stderr.String())
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
	assert.Equal(t, plan.Main([]string{"-stack", "dev", "-out", dir}, &stdout, &stderr), 0, stderr.String())
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
	src, err := os.ReadFile("../../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	bad := strings.Replace(string(src), "maxSize: 6", "maxSize: -1", 1)
	bad = strings.Replace(bad, "mtu: 1420", "mtu: 100", 1)
	assert.NilError(t, os.WriteFile(file, []byte(bad), 0o644))
	var stdout, stderr bytes.Buffer
	assert.Equal(t, plan.Main([]string{"-config", file, "-json"}, &stdout, &stderr), 1)
	assert.Equal(t, stdout.String(), "", "nothing on stdout")
	assert.Check(t, is.Contains(stderr.String(), "dynk8s:nodePools[1].maxSize: must be >= minSize (0), got -1"))
	assert.Check(t, is.Contains(stderr.String(), "dynk8s:wireguard.mtu: must be 1280..8920"))
}

// A misspelt top-level key is refused, not ignored: the plan reads the stack file's keys as the engine lists them.
func TestPlanUnknownTopLevelKey(t *testing.T) {
	file := filepath.Join(t.TempDir(), "Pulumi.typo.yaml")
	src, err := os.ReadFile("../../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	typo := string(src) + "  dynk8s:autoscalr:\n    expander: random\n"
	assert.NilError(t, os.WriteFile(file, []byte(typo), 0o644))
	var stdout, stderr bytes.Buffer
	assert.Equal(t, plan.Main([]string{"-config", file}, &stdout, &stderr), 1, stdout.String())
	assert.Equal(t, stdout.String(), "", "nothing on stdout")
	assert.Check(t, is.Contains(stderr.String(), "dynk8s:autoscalr: unknown key: did you mean autoscaler? (known keys here: agent, autoscaler, "))
}

// The stack: a public on-prem range and an endpoint inside the on-prem ranges are refused, each at its key.
func TestPlanRefusesPublicOnPremRangeAndInnerEndpoint(t *testing.T) {
	file := filepath.Join(t.TempDir(), "Pulumi.public.yaml")
	src, err := os.ReadFile("../../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	bad := strings.Replace(string(src), "      - 192.168.10.0/24\n",
		"      - 192.168.10.0/24\n      - 8.8.8.0/24\n    onPremEndpoint: 192.168.10.5:51820\n", 1)
	assert.Assert(t, bad != string(src), "the dev stack's onPremCidrs moved")
	assert.NilError(t, os.WriteFile(file, []byte(bad), 0o644))
	var stdout, stderr bytes.Buffer
	assert.Equal(t, plan.Main([]string{"-config", file}, &stdout, &stderr), 1, stdout.String())
	assert.Check(t, is.Contains(stderr.String(), "2 problems"))
	assert.Check(t, is.Contains(stderr.String(), "dynk8s:wireguard.onPremCidrs[1]: 8.8.8.0/24 is not a private range"))
	assert.Check(t, is.Contains(stderr.String(),
		"dynk8s:wireguard.onPremEndpoint: 192.168.10.5 is inside wireguard.onPremCidrs[0] (192.168.10.0/24)"))
}

func TestPlanMissingStackFile(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, plan.Main([]string{"-stack", "nope"}, &stdout, &stderr), 1)
	assert.Equal(t, stdout.String(), "")
	assert.Check(t, is.Contains(stderr.String(), "Pulumi.nope.yaml"))
}

// idleBill runs the plan with -json on a stack file and returns its idleBill.
func idleBill(t *testing.T, args ...string) plan.IdleBill {
	t.Helper()
	var stdout, stderr bytes.Buffer
	assert.Equal(t, plan.Main(append(args, "-json", "-agent", fakeAgent(t)), &stdout, &stderr), 0, stderr.String())
	var doc struct {
		IdleBill *plan.IdleBill `json:"idleBill"`
	}
	assert.NilError(t, json.Unmarshal(stdout.Bytes(), &doc))
	assert.Assert(t, doc.IdleBill != nil, "-json carries no idleBill")
	return *doc.IdleBill
}

// fakeAgent is a directory with a built agent of 3 MiB and a byte per architecture, which the bill counts as 4 MiB
// each.
func fakeAgent(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		assert.NilError(t, os.WriteFile(filepath.Join(dir, "dynk8s-node-linux-"+arch), make([]byte, 3<<20+1), 0o755))
	}
	return dir
}

// quantities sums the bill's items by kind (instances by kind and type).
func quantities(items []plan.BillItem) map[string]int {
	q := map[string]int{}
	for _, it := range items {
		k := it.Kind
		if it.Kind == plan.BillInstance {
			k += " " + it.Detail
		}
		q[k] += it.Quantity
	}
	return q
}

// The dev stack's on-prem peer dials in: at zero nodes it bills the gateway's root volume (the image's 5 GiB), its
// Elastic IP and its alarm, and builders-x86's build caches (2 volumes of 50 GiB); the gateway itself is stopped. A node adds its type, volume and address, and the
// gateway's hour.
func TestPlanIdleBillDialIn(t *testing.T) {
	chdirRoot(t)
	bill := idleBill(t, "-stack", "dev")
	assert.DeepEqual(t, quantities(bill.Items), map[string]int{
		plan.BillVolume: 5 + devCaches, plan.BillPublicIPv4: 1, plan.BillAlarm: 1, plan.BillInstance + " t4g.micro": 0,
		plan.BillS3Storage: 2 * 4,
	})
	// The Elastic IP replaces the address EC2 would assign at each start.
	assert.DeepEqual(t, quantities(bill.WhileNodesRun), map[string]int{plan.BillInstance + " t4g.micro": 1})
	for i := range bill.NodeHour {
		bill.NodeHour[i].USDPerHour = nil // priced in TestPlanIdleBillPriced
	}
	assert.DeepEqual(t, bill.NodeHour, []plan.PoolHour{
		{Pool: "builders-arm", InstanceTypes: []string{"c7g.2xlarge", "c6g.2xlarge"}, Spot: true, VolumeGiB: 80, PublicIPv4: 1},
		{Pool: "builders-x86", InstanceTypes: []string{"c7i.2xlarge"}, VolumeGiB: 80, PublicIPv4: 1},
	})
	var table bytes.Buffer
	var stderr bytes.Buffer
	assert.Equal(t, plan.Main([]string{"-stack", "dev"}, &table, &stderr), 0, stderr.String())
	assert.Check(t, is.Contains(table.String(), "Idle bill, every pool at its minimum"))
	assert.Check(t, is.Regexp(`public-ipv4 +1 address +\$3\.65 +gateway-eip`, table.String()))
	assert.Check(t, is.Regexp(`pool builders-x86 +1 × c7i.2xlarge \(on-demand\) +80 GiB gp3 +1 public IPv4`, table.String()))
}

// devCaches is the dev stack's build cache GiB at zero nodes: builders-x86 keeps 2 volumes of 50 GiB.
const devCaches = 2 * 50

// Dialling out (the dev stack with an on-prem endpoint, and the prod stack), the idle bill is the volumes and the
// alarm: no address bills while the gateway sleeps; its address bills only while it runs.
func TestPlanIdleBillDialOut(t *testing.T) {
	chdirRoot(t)
	src, err := os.ReadFile("Pulumi.dev.yaml")
	assert.NilError(t, err)
	file := filepath.Join(t.TempDir(), "Pulumi.dialout.yaml")
	dialOut := strings.Replace(string(src), "    mtu: 1420\n", "    mtu: 1420\n    onPremEndpoint: 198.51.100.7:51820\n", 1)
	assert.Assert(t, dialOut != string(src))
	assert.NilError(t, os.WriteFile(file, []byte(dialOut), 0o644))
	for name, args := range map[string][]string{"dev dial-out": {"-config", file}, "prod": {"-stack", "prod"}} {
		bill := idleBill(t, args...)
		q := quantities(bill.Items)
		assert.Check(t, is.Equal(q[plan.BillPublicIPv4], 0), name)
		caches := 0
		if name == "dev dial-out" {
			caches = devCaches
		}
		assert.Check(t, is.Equal(q[plan.BillVolume], 5+caches), name)
		assert.Check(t, is.Equal(q[plan.BillAlarm], 1), name)
		assert.Check(t, is.Equal(quantities(bill.WhileNodesRun)[plan.BillPublicIPv4], 1), name)
	}

	// A pool with a minimum keeps a sleeping gateway awake: its hours and its dial-out address bill at zero
	// nodes too, not only while nodes run (AWS N14).
	kept := strings.Replace(dialOut, "      minSize: 0\n      maxSize: 4\n", "      minSize: 1\n      maxSize: 4\n", 1)
	assert.Assert(t, kept != dialOut, "the dev stack's pool bounds moved")
	assert.NilError(t, os.WriteFile(file, []byte(kept), 0o644))
	bill := idleBill(t, "-config", file)
	assert.DeepEqual(t, quantities(bill.Items), map[string]int{
		plan.BillVolume: 5 + 80 + devCaches, plan.BillPublicIPv4: 1 + 1, plan.BillAlarm: 1,
		plan.BillInstance + " t4g.micro": 1, plan.BillInstance + " c7i.2xlarge": 1, plan.BillS3Storage: 2 * 4,
	})
	assert.Check(t, is.Len(bill.WhileNodesRun, 0))

	// An always-on gateway bills its hours at zero nodes, and a pool with a minimum bills its nodes.
	always := strings.Replace(dialOut, "    instanceType: t4g.micro\n", "    instanceType: t4g.micro\n    idleStop: \"0\"\n", 1)
	always = strings.Replace(always, "      minSize: 0\n      maxSize: 4\n", "      minSize: 1\n      maxSize: 4\n", 1)
	assert.NilError(t, os.WriteFile(file, []byte(always), 0o644))
	bill = idleBill(t, "-config", file)
	assert.DeepEqual(t, quantities(bill.Items), map[string]int{
		plan.BillVolume: 5 + 80 + devCaches, plan.BillPublicIPv4: 1 + 1, plan.BillAlarm: 1,
		plan.BillInstance + " t4g.micro": 1, plan.BillInstance + " c7i.2xlarge": 1, plan.BillS3Storage: 2 * 4,
	})
	assert.Check(t, is.Len(bill.WhileNodesRun, 0))
}

// A warm pool bills its prepared instances' volumes while the pool is at zero; a Running one bills the instances and
// their addresses too.
func TestPlanIdleBillWarmPool(t *testing.T) {
	chdirRoot(t)
	src, err := os.ReadFile("Pulumi.dev.yaml")
	assert.NilError(t, err)
	file := filepath.Join(t.TempDir(), "Pulumi.warm.yaml")
	for state, want := range map[string]map[string]int{
		"Stopped": {plan.BillVolume: 5 + 2*80 + devCaches, plan.BillPublicIPv4: 1, plan.BillAlarm: 1, plan.BillInstance + " t4g.micro": 0,
			plan.BillS3Storage: 2 * 4},
		// The Running instances keep the gateway awake: it bills its hours (AWS N14).
		"Running": {plan.BillVolume: 5 + 2*80 + devCaches, plan.BillPublicIPv4: 1 + 2, plan.BillAlarm: 1,
			plan.BillInstance + " t4g.micro": 1, plan.BillInstance + " c7i.2xlarge": 2, plan.BillS3Storage: 2 * 4},
	} {
		warm := strings.Replace(string(src), "    - name: builders-x86\n",
			"    - name: builders-x86\n      warmPool: {size: 2, state: "+state+"}\n", 1)
		assert.Assert(t, warm != string(src), "the dev stack has no pool builders-x86")
		assert.NilError(t, os.WriteFile(file, []byte(warm), 0o644))
		assert.DeepEqual(t, quantities(idleBill(t, "-config", file).Items), want)
	}
}

// A baked pool: the table shows the image it boots, looked up by its tag dynk8s:bake-sha256 (a stand-in, as if
// cmd/bake had baked it), and the command that bakes it; the idle bill the snapshots of the images cmd/bake keeps
// (at most infra.BakeKeep of the image's size); -json the same image. Without the image the program refuses the
// stack, naming the command; the stock dev stack shows none of it.
func TestPlanBakedImage(t *testing.T) {
	chdirRoot(t)
	src, err := os.ReadFile("Pulumi.dev.yaml")
	assert.NilError(t, err)
	stock := idleBill(t, "-stack", "dev")
	assert.Check(t, quantities(stock.Items)[plan.BillSnapshot] == 0)

	baked := strings.Replace(string(src), "    - name: builders-x86\n", "    - name: builders-x86\n      image: baked\n", 1)
	assert.Assert(t, baked != string(src), "the dev stack has no pool builders-x86")
	file := filepath.Join(t.TempDir(), "Pulumi.baked.yaml")
	assert.NilError(t, os.WriteFile(file, []byte(baked), 0o644))

	bill := idleBill(t, "-config", file)
	kept := infra.BakeKeep * mockcloud.BakedSnapshotGiB
	// The kept images' snapshots join the idle bill, nothing else.
	want := quantities(stock.Items)
	want[plan.BillSnapshot] = kept
	assert.DeepEqual(t, quantities(bill.Items), want)

	var stdout, stderr bytes.Buffer
	assert.Equal(t, plan.Main([]string{"-config", file}, &stdout, &stderr), 0, stderr.String())
	assert.Check(t, is.Contains(stdout.String(), "cmd/bake bakes each before `pulumi up`"))
	assert.Check(t, is.Regexp(`(?m)^  builders-x86 +x86_64 +ami-0[0-9a-f]{16} \(stand-in\) +tag dynk8s:bake-sha256=[0-9a-f]{64} `+
		`+go run \./cmd/bake -stack dev -pool builders-x86$`, stdout.String()))
	assert.Check(t, !strings.Contains(stdout.String(), "-pool builders-arm"), "the stock pool bakes nothing")

	stdout.Reset()
	assert.Equal(t, plan.Main([]string{"-config", file, "-json"}, &stdout, &stderr), 0, stderr.String())
	var doc struct {
		BakedImages []plan.BakedImage `json:"bakedImages"`
		Resources   []struct {
			Name   string         `json:"name"`
			Inputs map[string]any `json:"inputs"`
		} `json:"resources"`
	}
	assert.NilError(t, json.Unmarshal(stdout.Bytes(), &doc))
	assert.Assert(t, is.Len(doc.BakedImages, 1))
	b := doc.BakedImages[0]
	assert.Check(t, is.Equal(b.Pool, "builders-x86"))
	assert.Check(t, is.Equal(b.Arch, "x86_64"))
	assert.Check(t, is.Equal(b.VolumeGiB, mockcloud.BakedSnapshotGiB))
	assert.Check(t, is.Regexp(`^the newest image of the account tagged dynk8s:cluster=homelab, dynk8s:pool=builders-x86 `+
		`and dynk8s:bake-sha256=[0-9a-f]{64}; without one the preview fails: bake it with `+
		"`go run ./cmd/bake -stack dev -pool builders-x86`$", b.Note))
	for _, r := range doc.Resources {
		if r.Name == "pool-builders-x86-lt" {
			assert.Check(t, is.Equal(r.Inputs["imageId"], b.Image), "the pool boots the image the plan names")
		}
	}

	cfg, err := mockcloud.LoadStackFile(file)
	assert.NilError(t, err)
	cfg.NoBakedImage = []string{"builders-x86"}
	_, err = plan.RunConfig("dev", cfg)
	var cfgErr *plan.ConfigError
	assert.Assert(t, errors.As(err, &cfgErr), "got %v", err)
	assert.Check(t, is.ErrorContains(err, "dynk8s:nodePools[0].image: no baked image of pool builders-x86 for this "+
		"config (tag dynk8s:bake-sha256="))
	assert.Check(t, is.ErrorContains(err, "bake it with `go run ./cmd/bake -stack dev -pool builders-x86`, then run "+
		"the preview again"))
}

// The bill is priced for the example stacks' regions from the table in the code: the dev stack (dial-in,
// eu-central-1) at $13.75 a month at zero nodes (the Elastic IP, the gateway's 5 GiB and its alarm, builders-x86's
// 100 GiB of caches), the prod stack
// (dial-out, eu-west-1) at $0.54; an on-demand node-hour is its type, volume and address; a spot pool and a type the
// table lacks are not priced, and a region without a table gets quantities only.
func TestPlanIdleBillPriced(t *testing.T) {
	chdirRoot(t)
	dev := idleBill(t, "-stack", "dev")
	assert.Equal(t, dev.Region, "eu-central-1")
	assert.Assert(t, dev.MonthlyUSD != nil)
	assert.Check(t, is.Equal(fmt.Sprintf("%.2f", *dev.MonthlyUSD), "13.75"))
	for _, h := range dev.NodeHour {
		switch h.Pool {
		case "builders-x86":
			assert.Assert(t, h.USDPerHour != nil)
			// c7i.2xlarge, 80 GiB of gp3 over 730 hours, one address.
			assert.Check(t, is.Equal(fmt.Sprintf("%.4f", *h.USDPerHour), fmt.Sprintf("%.4f", 0.41+80*0.0952/730+0.005)))
		case "builders-arm":
			assert.Check(t, h.USDPerHour == nil, "a spot pool is priced")
		}
	}
	prod := idleBill(t, "-stack", "prod")
	assert.Assert(t, prod.MonthlyUSD != nil)
	assert.Check(t, is.Equal(fmt.Sprintf("%.2f", *prod.MonthlyUSD), "0.54"))
	for _, h := range prod.NodeHour {
		assert.Check(t, h.USDPerHour == nil, "%s: m7i.4xlarge has no price in the table, arm-spot is spot", h.Pool)
	}
	var out, stderr bytes.Buffer
	assert.Equal(t, plan.Main([]string{"-stack", "dev"}, &out, &stderr), 0, stderr.String())
	assert.Check(t, is.Contains(out.String(), "  total at zero nodes: $13.75 a month\n  prices: eu-central-1 list prices as of 2025"))
	assert.Check(t, is.Regexp(`pool builders-x86 .* \$0\.4254/h`, out.String()))

	src, err := os.ReadFile("Pulumi.dev.yaml")
	assert.NilError(t, err)
	file := filepath.Join(t.TempDir(), "Pulumi.ohio.yaml")
	ohio := strings.Replace(string(src), "aws:region: eu-central-1", "aws:region: us-east-2", 1)
	assert.Assert(t, ohio != string(src))
	assert.NilError(t, os.WriteFile(file, []byte(strings.ReplaceAll(ohio, "eu-central-1", "us-east-2")), 0o644))
	out.Reset()
	stderr.Reset()
	assert.Equal(t, plan.Main([]string{"-config", file}, &out, &stderr), 0, stderr.String())
	assert.Check(t, is.Contains(out.String(), "(quantities; no price table for us-east-2"))
	assert.Check(t, !strings.Contains(out.String(), "total at zero nodes"))
}

// TestPlanJSONFieldsDocumented: every field name of the -json document (of a stack with a baked pool, so that every
// part is there) is named in docs/plan.md's `-json` row, but the free-form maps' (a resource's inputs, the outputs).
func TestPlanJSONFieldsDocumented(t *testing.T) {
	chdirRoot(t)
	src, err := os.ReadFile("Pulumi.dev.yaml")
	assert.NilError(t, err)
	baked := strings.Replace(string(src), "    - name: builders-x86\n", "    - name: builders-x86\n      image: baked\n", 1)
	file := filepath.Join(t.TempDir(), "Pulumi.baked.yaml")
	assert.NilError(t, os.WriteFile(file, []byte(baked), 0o644))
	var stdout, stderr bytes.Buffer
	assert.Equal(t, plan.Main([]string{"-config", file, "-json"}, &stdout, &stderr), 0, stderr.String())
	var doc any
	assert.NilError(t, json.Unmarshal(stdout.Bytes(), &doc))

	page, err := os.ReadFile(filepath.Join("docs", "plan.md"))
	assert.NilError(t, err)
	var row string
	for _, line := range strings.Split(string(page), "\n") {
		if strings.HasPrefix(line, "| `-json` |") {
			row = line
		}
	}
	assert.Assert(t, row != "", "docs/plan.md has no -json row")

	seen := map[string]bool{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, sub := range v {
				if !seen[k] {
					seen[k] = true
					assert.Check(t, strings.Contains(row, `"`+k+`"`), "docs/plan.md's -json row does not name %s.%s",
						path, k)
				}
				if k != "inputs" && k != "outputs" {
					walk(path+"."+k, sub)
				}
			}
		case []any:
			for _, sub := range v {
				walk(path+"[]", sub)
			}
		}
	}
	walk("", doc)
	for _, k := range []string{"bakedImages", "nodeHour", "whileNodesRun", "ignoreChanges"} {
		assert.Check(t, seen[k], "the document has no %s: the test no longer covers it", k)
	}
}

// A pool's build cache bills its kept volumes at zero nodes: up to its most (here the pool's maxSize, 4) of its
// size, read from the pool's node.json; the node role's cache policy is declared with it.
func TestPlanBuildCache(t *testing.T) {
	chdirRoot(t)
	src, err := os.ReadFile("Pulumi.dev.yaml")
	assert.NilError(t, err)
	stock := idleBill(t, "-stack", "dev")
	cached := strings.Replace(string(src), "    - name: builders-arm\n",
		"    - name: builders-arm\n      cache:\n        sizeGiB: 40\n", 1)
	assert.Assert(t, cached != string(src), "the dev stack has no pool builders-arm")
	file := filepath.Join(t.TempDir(), "Pulumi.cached.yaml")
	assert.NilError(t, os.WriteFile(file, []byte(cached), 0o644))

	bill := idleBill(t, "-config", file)
	want := quantities(stock.Items)
	want[plan.BillVolume] += 6 * 40
	assert.DeepEqual(t, quantities(bill.Items), want)
	i := slices.IndexFunc(bill.Items, func(it plan.BillItem) bool {
		return strings.Contains(it.Note, "builders-arm's build cache")
	})
	assert.Assert(t, i >= 0)
	assert.Check(t, is.Equal(bill.Items[i].Note, "pool builders-arm's build cache: up to 6 volumes of 40 GiB kept at "+
		"zero nodes (3000 IOPS, 125 MiB/s: above gp3's 3000 and 125 they bill besides, not priced here)"))

	var stdout, stderr bytes.Buffer
	assert.Equal(t, plan.Main([]string{"-config", file, "-json"}, &stdout, &stderr), 0, stderr.String())
	assert.Check(t, is.Contains(stdout.String(), `"name": "attach-pool-cache"`))
}
