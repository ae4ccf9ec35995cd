package infra_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

const (
	componentType    = "aws:imagebuilder/component:Component"
	recipeType       = "aws:imagebuilder/imageRecipe:ImageRecipe"
	infraConfigType  = "aws:imagebuilder/infrastructureConfiguration:InfrastructureConfiguration"
	distributionType = "aws:imagebuilder/distributionConfiguration:DistributionConfiguration"
	imageType        = "aws:imagebuilder/image:Image"
	launchTemplate   = "aws:ec2/launchTemplate:LaunchTemplate"
)

// bakedDev is the dev stack with its x86_64 pool baked (the arm64 pool stays stock).
func bakedDev(t *testing.T) map[string]any {
	t.Helper()
	c := devConfig(t)
	pool(c, 0)["image"] = "baked"
	return c
}

func out(r *mockcloud.Resource, key string) any {
	return mockcloud.Plain(r.Outputs[resource.PropertyKey(key)], true)
}

// componentDoc is the component's inline document, parsed as plain YAML (not into the program's own types).
func componentDoc(t *testing.T, c *mockcloud.Resource) map[string]any {
	t.Helper()
	var doc map[string]any
	assert.NilError(t, yaml.Unmarshal([]byte(in(c, "data").(string)), &doc), "the component's data is YAML")
	return doc
}

// writtenFile is the content the component's WritePoolFiles step writes to path (its heredoc).
func writtenFile(t *testing.T, doc map[string]any, path string) string {
	t.Helper()
	re := regexp.MustCompile(`(?s)cat > ` + regexp.QuoteMeta(path) + ` <<'DYNK8S_FILE_END'\n(.*?)DYNK8S_FILE_END\n`)
	for _, cmd := range asList(dig(doc, "phases", 0, "steps", 0, "inputs", "commands")) {
		if m := re.FindStringSubmatch(cmd.(string)); m != nil {
			return m[1]
		}
	}
	t.Fatalf("the component writes no %s", path)
	return ""
}

// A baked pool declares its build as AWS expects it and boots the result: the component document has AWSTOE's
// schema (name, schemaVersion 1.0, build and validate phases of ExecuteBash steps with commands), writes the very
// node.json and agent pin the pool's user data carries, fetches the agent, prepares and cleans the identity in that
// order; the recipe builds from the pool's Fedora image with that component; the build's instance profile has
// Image Builder's managed policies and reads exactly the agent of its architecture; the launch template boots the
// image's AMI. The stock pool of the same stack declares none of it.
func TestBakedPoolDeclaresItsImage(t *testing.T) {
	stock := runStack(t, devConfig(t))
	for _, typ := range []string{componentType, recipeType, infraConfigType, distributionType, imageType, infra.ImageBuilderType} {
		assert.Check(t, is.Len(stock.Cloud.ByType(typ), 0), "a stack of stock pools declares no %s", typ)
	}
	stockAMI := in(find(t, stock, launchTemplate, "pool-builders-x86-lt"), "imageId")

	res := runStack(t, bakedDev(t))
	component := find(t, res, componentType, "pool-builders-x86-image-component")
	assert.Equal(t, component.Parent, "pool-builders-x86")
	assert.Equal(t, in(component, "platform"), "Linux")
	assert.Equal(t, in(component, "name"), "homelab-builders-x86")
	doc := componentDoc(t, component)
	assert.Equal(t, doc["name"], "homelab-builders-x86")
	assert.Equal(t, doc["schemaVersion"], "1.0")
	var phases, steps []string
	for _, p := range asList(doc["phases"]) {
		phases = append(phases, asMap(p)["name"].(string))
		for _, s := range asList(asMap(p)["steps"]) {
			step := asMap(s)
			steps = append(steps, step["name"].(string))
			assert.Check(t, is.Equal(step["action"], "ExecuteBash"), step["name"])
			commands := asList(dig(step, "inputs", "commands"))
			assert.Check(t, len(commands) > 0, step["name"])
			assert.Check(t, is.Equal(commands[0], "set -euo pipefail"), "%s fails on its first failed command", step["name"])
		}
	}
	assert.DeepEqual(t, phases, []string{"build", "validate"})
	assert.DeepEqual(t, steps, []string{"WritePoolFiles", "AddRepositories", "FetchAgent", "Prepare", "CleanIdentity",
		"CheckBakedImage"})
	command := func(step int) string {
		return strings.Join(stringsOf(dig(doc, "phases", 0, "steps", step, "inputs", "commands")), "\n")
	}
	assert.Check(t, is.Contains(command(3), "/usr/local/bin/dynk8s-node prepare --config /etc/dynk8s/node.json"))
	assert.Check(t, is.Contains(command(4), "/usr/local/bin/dynk8s-node clean-identity"))
	assert.Check(t, is.Contains(command(2), ". /etc/dynk8s/agent.env"))
	assert.Check(t, is.Contains(command(1), cloudinit.AddRepositories("/run/dynk8s-image/repos.yaml")))

	// The files are the pool's user data's own, byte for byte, but for the agent fetch's deadline: a bake's outlasts
	// S3's versioning window, a node's is short.
	lt := find(t, res, launchTemplate, "pool-builders-x86-lt")
	raw, err := cloudinit.Decode(in(lt, "userData").(string))
	assert.NilError(t, err)
	files, err := cloudinit.Files(raw)
	assert.NilError(t, err)
	for _, p := range []string{"/etc/dynk8s/node.json", "/etc/dynk8s/agent.env", "/etc/crio/crio.conf.d/90-dynk8s.conf",
		"/usr/local/libexec/dynk8s/fetch-agent.sh"} {
		i := slices.IndexFunc(files, func(f cloudinit.File) bool { return f.Path == p })
		assert.Assert(t, i >= 0, p)
		assert.Check(t, is.Equal(writtenFile(t, doc, p), bakedContent(t, files[i])), p)
	}

	recipe := find(t, res, recipeType, "pool-builders-x86-image-recipe")
	assert.Equal(t, in(recipe, "parentImage"), stockAMI, "built from the pool's pinned Fedora image")
	assert.Equal(t, dig(in(recipe, "components"), 0, "componentArn"), out(component, "arn"))
	assert.Equal(t, dig(in(recipe, "blockDeviceMappings"), 0, "deviceName"), "/dev/sda1", "the image's own root device")
	assert.Equal(t, dig(in(recipe, "blockDeviceMappings"), 0, "ebs", "encrypted"), "true")
	assert.Equal(t, dig(in(recipe, "systemsManagerAgent"), "uninstallAfterBuild"), true)

	builder := find(t, res, infraConfigType, "image-builder-x86_64")
	profile := find(t, res, "aws:iam/instanceProfile:InstanceProfile", "image-builder-profile")
	role := find(t, res, "aws:iam/role:Role", "image-builder-role")
	assert.Equal(t, in(builder, "instanceProfileName"), out(profile, "name"))
	assert.Equal(t, in(profile, "role"), out(role, "name"))
	var attached []string
	for _, a := range res.Cloud.ByType("aws:iam/rolePolicyAttachment:RolePolicyAttachment") {
		if in(&a, "role") == out(role, "name") {
			attached = append(attached, in(&a, "policyArn").(string))
		}
	}
	slices.Sort(attached)
	assert.DeepEqual(t, attached, []string{"arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
		"arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder"})
	read := policy(t, find(t, res, "aws:iam/rolePolicy:RolePolicy", "agent-image-build-read"), "policy")
	assert.Equal(t, in(find(t, res, "aws:iam/rolePolicy:RolePolicy", "agent-image-build-read"), "role"), out(role, "name"))
	bucket := out(find(t, res, "aws:s3/bucketV2:BucketV2", "agent"), "arn").(string)
	assert.DeepEqual(t, read.Statement[0].Resource, []string{bucket + "/dynk8s-node/linux-amd64"})
	assert.DeepEqual(t, read.Statement[0].Action, []string{"s3:GetObject", "s3:GetObjectVersion"})
	assert.Equal(t, in(builder, "terminateInstanceOnFailure"), true)
	assert.DeepEqual(t, in(builder, "instanceTypes"), []any{"c7i.large"})
	subnets := []any{}
	for _, s := range res.Cloud.ByType("aws:ec2/subnet:Subnet") {
		subnets = append(subnets, s.ID)
	}
	assert.Check(t, slices.Contains(subnets, in(builder, "subnetId")), "a subnet of the stack")
	assert.DeepEqual(t, in(builder, "securityGroupIds"), []any{find(t, res, "aws:ec2/securityGroup:SecurityGroup", "network-node-sg").ID})
	assert.Equal(t, dig(in(builder, "resourceTags"), "dynk8s:cluster"), "homelab")
	assert.Check(t, dig(in(builder, "resourceTags"), "dynk8s:pool") == nil, "a build instance is no pool instance")
	assert.Equal(t, dig(in(recipe, "tags"), infra.KubernetesVersionTag), "1.36.3")
	assert.Equal(t, dig(in(find(t, res, distributionType, "pool-builders-x86-image-distribution"), "distributions"), 0,
		"amiDistributionConfiguration", "amiTags", infra.KubernetesVersionTag), "1.36.3", "the AMI says what it holds")

	image := find(t, res, imageType, "pool-builders-x86-image")
	assert.Equal(t, in(image, "imageRecipeArn"), out(recipe, "arn"))
	assert.Equal(t, in(image, "infrastructureConfigurationArn"), out(builder, "arn"))
	assert.Equal(t, in(image, "distributionConfigurationArn"),
		out(find(t, res, distributionType, "pool-builders-x86-image-distribution"), "arn"))
	assert.Equal(t, dig(in(image, "imageTestsConfiguration"), "imageTestsEnabled"), false)
	assert.Equal(t, in(lt, "imageId"), dig(out(image, "outputResources"), 0, "amis", 0, "image"),
		"the pool boots the baked AMI")
	assert.Check(t, in(lt, "imageId") != stockAMI)

	// The stock pool beside it: its Fedora image, no build.
	arm := find(t, res, launchTemplate, "pool-builders-arm-lt")
	assert.Equal(t, in(arm, "imageId"), in(find(t, stock, launchTemplate, "pool-builders-arm-lt"), "imageId"))
	for _, typ := range []string{componentType, recipeType, imageType, distributionType} {
		assert.Check(t, is.Len(res.Cloud.ByType(typ), 1), "one %s, the baked pool's", typ)
	}
	assert.Check(t, is.Len(res.Cloud.ByType(infraConfigType), 1), "the x86_64 build only")
}

func stringsOf(v any) []string {
	var s []string
	for _, e := range asList(v) {
		s = append(s, e.(string))
	}
	return s
}

// buildVersions are the baked x86_64 pool's component and recipe versions and its AMI.
func buildVersions(t *testing.T, res *plan.Result) (component, recipe, ami string) {
	t.Helper()
	return in(find(t, res, componentType, "pool-builders-x86-image-component"), "version").(string),
		in(find(t, res, recipeType, "pool-builders-x86-image-recipe"), "version").(string),
		in(find(t, res, launchTemplate, "pool-builders-x86-lt"), "imageId").(string)
}

// What reaches the build is hashed into its versions: the same config gives the same versions (a second `up`
// changes nothing), and a new Kubernetes patch, Fedora release or pool config gives new ones, hence a new image.
func TestBakedImageVersionFollowsTheContent(t *testing.T) {
	first, second := runStack(t, bakedDev(t)), runStack(t, bakedDev(t))
	c1, r1, ami1 := buildVersions(t, first)
	c2, r2, ami2 := buildVersions(t, second)
	assert.Equal(t, c1, c2)
	assert.Equal(t, r1, r2)
	assert.Equal(t, ami1, ami2)
	var a, b bytes.Buffer
	assert.NilError(t, first.WriteJSON(&a))
	assert.NilError(t, second.WriteJSON(&b))
	assert.Check(t, bytes.Equal(a.Bytes(), b.Bytes()), "two runs of the same baked config differ")
	assert.Check(t, is.Regexp(`^36\.3\.\d+$`, r1), "the Kubernetes minor and patch, then the content's hash")

	patch := bakedDev(t)
	obj(patch, "kubernetes")["version"] = "1.36.4"
	cp, rp, amip := buildVersions(t, runStack(t, patch))
	assert.Check(t, cp != c1 && rp != r1 && amip != ami1, "a new patch: %s %s %s", cp, rp, amip)
	assert.Check(t, is.Regexp(`^36\.4\.\d+$`, rp))

	fedora := bakedDev(t)
	obj(fedora, "fedora")["release"] = 43
	cf, rf, _ := buildVersions(t, runStack(t, fedora))
	assert.Check(t, rf != r1, "a new Fedora image: a new recipe")
	assert.Check(t, is.Equal(cf, c1), "the same component: only the parent image changed")

	images := bakedDev(t)
	pool(images, 0)["prePullImages"] = []any{"quay.io/jenkins/agent:3.1"}
	ci, ri, _ := buildVersions(t, runStack(t, images))
	assert.Check(t, ci != c1 && ri != r1, "a new node config: a new component and recipe")
}

// The component document stays within Image Builder's inline limit for the dev pool, with room for a pool's own
// pre-pull images.
func TestBakedComponentFitsImageBuilder(t *testing.T) {
	c := bakedDev(t)
	var many []any
	for i := range 20 {
		many = append(many, "registry.example.com/team/build-image-number-"+strings.Repeat("x", 20)+":v"+string(rune('a'+i)))
	}
	pool(c, 0)["prePullImages"] = many
	res := runStack(t, c)
	data := in(find(t, res, componentType, "pool-builders-x86-image-component"), "data").(string)
	t.Logf("component document: %d characters with 20 pre-pull images", len(data))
	assert.Check(t, len(data) <= 16000, "%d characters", len(data))
}

// The components refuse what would declare a broken build: an image builder for no architecture, and a baked pool
// without the image builder's args.
func TestBakedImageRefusesBadInput(t *testing.T) {
	run := func(declare func(ctx *pulumi.Context) error) error {
		return mockcloud.Run(declare, "test", mockcloud.StackConfig{}, mockcloud.New("us-west-2"))
	}
	err := run(func(ctx *pulumi.Context) error {
		_, err := infra.NewImageBuilder(ctx, "image-builder", &infra.ImageBuilderArgs{ClusterName: "lab"})
		return err
	})
	assert.Check(t, is.ErrorContains(err, "at least one architecture"))

	err = run(func(ctx *pulumi.Context) error {
		_, err := infra.NewNodePool(ctx, "pool-x", &infra.NodePoolArgs{
			ClusterName: "lab", Agent: testAgentObject(),
			Pool: config.NodePool{Name: "x", Arch: kube.ArchX86_64, InstanceTypes: []string{"c7i.large"}, MaxSize: 1,
				Image: config.ImageBaked},
		})
		return err
	})
	assert.Check(t, is.ErrorContains(err, "a baked image needs the image builder's args"))
}

// The dev stack's x86_64 pool's component document, baked, as the golden testdata/baked-component.golden.yaml: any
// change to what the build runs shows as a reviewable diff (the agent's bootstrap script as its name, as the
// user-data goldens show it, and carried exactly as the stack's user data carries it).
func TestBakedComponentGolden(t *testing.T) {
	res := runStack(t, bakedDev(t))
	data := in(find(t, res, componentType, "pool-builders-x86-image-component"), "data").(string)
	var doc map[string]any
	assert.NilError(t, yaml.Unmarshal([]byte(data), &doc))
	again, err := yaml.Marshal(doc)
	assert.NilError(t, err)
	assert.Equal(t, string(again), data, "the document marshals back to itself, so only the script is stubbed")
	script := regexp.MustCompile(`(?s)(cat > /usr/local/libexec/dynk8s/fetch-agent.sh <<'DYNK8S_FILE_END'\n)(.*?)(\nDYNK8S_FILE_END\n)`)
	stubbed := 0
	commands := asList(dig(doc, "phases", 0, "steps", 0, "inputs", "commands"))
	for i, c := range commands {
		if m := script.FindStringSubmatch(c.(string)); m != nil {
			// As the user-data goldens stub it: the name, its form pinned once (cloudinit/testdata/scripts.golden).
			carried := fmt.Sprintf("sha256:%x %d lines", sha256.Sum256([]byte(m[2]+"\n")), strings.Count(m[2], "\n")+1)
			assert.Check(t, is.Equal(carried, fetchAgentCarried(t)), "the component carries fetch-agent.sh as user data does")
			commands[i] = strings.Replace(c.(string), m[0], m[1]+"<script fetch-agent.sh>"+m[3], 1)
			stubbed++
		}
	}
	assert.Equal(t, stubbed, 1, "the component writes fetch-agent.sh once")
	out, err := yaml.Marshal(doc)
	assert.NilError(t, err)
	golden.Assert(t, string(out), "baked-component.golden.yaml")
}

// The build's steps are sound bash: each passes shellcheck, and WritePoolFiles, run by the real bash (its paths moved
// under a temporary root), writes every file byte for byte and with the mode the pool's user data gives it: the
// quoted heredocs expand nothing.
func TestBakedStepsRunAsBash(t *testing.T) {
	res := runStack(t, bakedDev(t))
	doc := componentDoc(t, find(t, res, componentType, "pool-builders-x86-image-component"))
	shellcheck := realtools.Require(t, "shellcheck")
	dir := t.TempDir()
	for _, phase := range asList(doc["phases"]) {
		for _, s := range asList(asMap(phase)["steps"]) {
			step := asMap(s)
			script := filepath.Join(dir, step["name"].(string)+".sh")
			body := "#!/usr/bin/env bash\n" + strings.Join(stringsOf(dig(step, "inputs", "commands")), "\n") + "\n"
			assert.NilError(t, os.WriteFile(script, []byte(body), 0o755))
			// SC1091: the env file sourced exists on the build instance only.
			out, err := exec.Command(shellcheck, "--exclude=SC1091", script).CombinedOutput()
			assert.Check(t, err == nil, "shellcheck %s:\n%s", step["name"], out)
		}
	}

	lt := find(t, res, launchTemplate, "pool-builders-x86-lt")
	raw, err := cloudinit.Decode(in(lt, "userData").(string))
	assert.NilError(t, err)
	files, err := cloudinit.Files(raw)
	assert.NilError(t, err)
	root := t.TempDir()
	write := regexp.MustCompile(`(?s)^install -d -m 0755 (\S+)\ncat > (\S+) <<'DYNK8S_FILE_END'\n(.*\n)DYNK8S_FILE_END\nchmod ([0-7]{4}) (\S+)$`)
	commands := stringsOf(dig(doc, "phases", 0, "steps", 0, "inputs", "commands"))
	moved := []string{commands[0]}
	var written []string
	for _, c := range commands[1:] {
		m := write.FindStringSubmatch(c)
		assert.Assert(t, m != nil && m[2] == m[5] && filepath.Dir(m[2]) == m[1], "not a file write:\n%s", c)
		moved = append(moved, strings.NewReplacer(" "+m[1]+"\n", " "+root+m[1]+"\n", " "+m[2]+" ", " "+root+m[2]+" ",
			" "+m[2]+"\n", " "+root+m[2]+"\n").Replace(c[:len(c)-len(m[5])])+root+m[5])
		written = append(written, m[2])
	}
	cmd := exec.Command(realtools.Require(t, "bash"), "-c", strings.Join(moved, "\n"))
	cmd.Env = []string{"PATH=" + realtools.ClosedPath(t, "install")}
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, "%s", out)
	for _, f := range files {
		if !slices.Contains(written, f.Path) {
			continue
		}
		got, err := os.ReadFile(filepath.Join(root, f.Path))
		assert.NilError(t, err)
		assert.Check(t, is.Equal(string(got), bakedContent(t, f)), f.Path)
		info, err := os.Stat(filepath.Join(root, f.Path))
		assert.NilError(t, err)
		assert.Check(t, is.Equal(info.Mode().Perm(), f.Permissions.Perm()), f.Path)
		written = slices.DeleteFunc(written, func(p string) bool { return p == f.Path })
	}
	assert.DeepEqual(t, written, []string{"/run/dynk8s-image/repos.yaml"})
	repos, err := os.ReadFile(filepath.Join(root, "run/dynk8s-image/repos.yaml"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(repos), "yum_repos:"))
}

// fetchAgentCarried is how the stack's user data carries the bootstrap, from the dev stack's golden manifest.
func fetchAgentCarried(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../testdata/stacks/dev/userdata/scripts.txt")
	assert.NilError(t, err)
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "fetch-agent.sh "); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatal("testdata/stacks/dev/userdata/scripts.txt names no fetch-agent.sh")
	return ""
}

// bakedContent is what an image build writes for a file of the pool's user data: the file as it is, but for the
// agent fetch's deadline, a bake's (nodeconfig.BakeAgentFetch, past S3's versioning window) instead of a node's.
func bakedContent(t *testing.T, f cloudinit.File) string {
	t.Helper()
	if f.Path != "/etc/dynk8s/agent.env" {
		return f.Content
	}
	line := func(d time.Duration) string {
		return fmt.Sprintf("DYNK8S_AGENT_DEADLINE_SECONDS=%d\n", int(d.Seconds()))
	}
	assert.Assert(t, is.Contains(f.Content, line(nodeconfig.NodeAgentFetch)))
	return strings.Replace(f.Content, line(nodeconfig.NodeAgentFetch), line(nodeconfig.BakeAgentFetch), 1)
}
