//go:build e2e

package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cmd/bake/bake"
	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/names"
)

// TestBakeAgainstMoto runs cmd/bake against moto_server holding what a stack that is up has (its tagged subnets,
// nodes' security group, bake profile, agent bucket and object, older images of the pool) and the Fedora images
// EC2 lists: the dev stack's x86 pool, made baked. A stand-in for the agent stops the bake instance once it has
// checked its user data (what the agent's power-off does on EC2). The bake launches the newest matching Fedora
// image with the pool's bake user data (bake.json, the bake unit, the agent's pin from the bucket), waits for the
// stop, images the instance with the pool's tags and BakeID, tags the snapshots, terminates the instance, and
// prunes the pool's images to the newest -keep with their snapshots; a second run with the same config does
// nothing; a bake that never stops fails at its -timeout with one line, and its instance is terminated.
func TestBakeAgainstMoto(t *testing.T) {
	bin := requireTool(t, "moto_server")
	requireTool(t, "python3")
	if out, err := exec.Command("pyenv", "which", "moto_server").Output(); err == nil {
		bin = strings.TrimSpace(string(out))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	values := devStackValues(t)
	pools := values["dynk8s:nodePools"].([]any)
	poolValues := pools[0].(map[string]any)
	poolValues["image"] = config.ImageBaked
	stackFile := func(t *testing.T) (string, *config.Config) {
		b, err := yaml.Marshal(map[string]any{"config": values})
		assert.NilError(t, err)
		path := filepath.Join(t.TempDir(), "Pulumi.dev.yaml")
		assert.NilError(t, os.WriteFile(path, b, 0o644))
		sc, err := mockcloud.ConfigFromMap(values)
		assert.NilError(t, err)
		cfg, err := config.ParseValues(sc.Values)
		assert.NilError(t, err)
		return path, cfg
	}
	file, cfg := stackFile(t)
	pool := cfg.NodePools[0]
	assert.Equal(t, pool.Arch.Fedora(), "x86_64", "the dev stack's first pool is the x86 one")

	// The Fedora images EC2 lists (moto's MOTO_AMIS_PATH): a GA respin of the release, and a compose image of it,
	// which the query must refuse. (No creation dates: moto 5.2.1 parses them in place, in the one list every
	// region's backend loads, and the second region's load fails on the first's datetime.)
	fedora := func(id, name string) map[string]any {
		return map[string]any{"ami_id": id, "name": name, "owner_id": infra.FedoraOwner, "architecture": "x86_64",
			"root_device_name": "/dev/sda1", "root_device_type": "ebs", "virtualization_type": "hvm",
			"state": "available", "public": true}
	}
	rel := cfg.Fedora.Release
	amis := []map[string]any{
		fedora("ami-0fed0000000000001", fmt.Sprintf("Fedora-Cloud-Base-AmazonEC2.x86_64-%d-20260911.0", rel)),
		fedora("ami-0fed0000000000002", fmt.Sprintf("Fedora-Cloud-Base-AmazonEC2.x86_64-%d-1.5", rel)),
	}
	const parent = "ami-0fed0000000000002"
	amisPath := filepath.Join(t.TempDir(), "amis.json")
	b, err := json.Marshal(amis)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(amisPath, b, 0o644))
	m := startMoto(ctx, t, bin, "MOTO_AMIS_PATH="+amisPath)

	agentKey := infra.AgentPrefix + "linux-" + pool.Arch.Label()
	const agentSHA = "5e0f2c1b8d4a7e9f3c6b2a1d0e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f"
	spec, err := json.Marshal(map[string]any{"cluster": cfg.ClusterName, "pool": pool.Name,
		"zones": []string{cfg.Region + "a", cfg.Region + "b"}, "profile": infra.BakeProfileName(cfg.ClusterName),
		"bucketPrefix": infra.AgentBucketPrefix(cfg.ClusterName), "agentKey": agentKey, "agentSHA256": agentSHA,
		"fedoraImage": parent, "older": 3})
	assert.NilError(t, err)
	cmd := exec.CommandContext(ctx, "python3", filepath.Join("testdata", "moto_bake.py"), m.url, cfg.Region)
	cmd.Stdin = bytes.NewReader(spec)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	assert.NilError(t, err, "moto_bake.py: %s", stderr.String())
	var fixture struct {
		Bucket      string              `json:"bucket"`
		OlderImages []string            `json:"olderImages"`
		Snapshots   map[string][]string `json:"snapshots"`
	}
	assert.NilError(t, json.Unmarshal(out, &fixture))

	for k, v := range map[string]string{"AWS_ENDPOINT_URL": m.url, "AWS_ACCESS_KEY_ID": "test",
		"AWS_SECRET_ACCESS_KEY": "test", "AWS_EC2_METADATA_DISABLED": "true",
		"AWS_CONFIG_FILE": filepath.Join(t.TempDir(), "none"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(t.TempDir(), "none")} {
		t.Setenv(k, v)
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(cfg.Region),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
	assert.NilError(t, err)
	client := ec2.NewFromConfig(awsCfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(m.url) })

	// The agent's stand-in: checks each bake instance's user data, then stops it, unless the test hangs its bake.
	agent := &bakeAgent{client: client, hang: map[string]bool{}, checked: map[string]string{}, roles: map[string]string{}}
	agentCtx, stopAgent := context.WithCancel(ctx)
	defer stopAgent()
	go agent.run(agentCtx, t)

	bakeRun := func(t *testing.T, file string, args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		rc := bake.Main(ctx, append([]string{"-config", file, "-poll", "200ms"}, args...), &stdout, &stderr)
		t.Logf("bake %s: rc %d\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), rc, stdout.String(), stderr.String())
		return rc, stdout.String(), stderr.String()
	}
	id, err := infra.BakeID(cfg, pool)
	assert.NilError(t, err)
	var image string

	t.Run("check before the bake", func(t *testing.T) {
		rc, stdout, stderr := bakeRun(t, file, "-check")
		assert.Check(t, is.Equal(rc, bake.ExitMissing))
		assert.Check(t, is.Equal(stdout, pool.Name+"\tmissing\t"+infra.BakeTag+"="+id+"\n"))
		assert.Check(t, is.Contains(stderr, infra.BakeCommand("dev", pool.Name)))
		assert.Check(t, is.Len(bakeInstances(ctx, t, client), 0), "-check launched an instance")
	})

	t.Run("bake", func(t *testing.T) {
		rc, stdout, _ := bakeRun(t, file, "-pool", pool.Name, "-keep", "2")
		assert.Equal(t, rc, 0)
		fields := strings.Fields(stdout)
		assert.Assert(t, is.Len(fields, 3), stdout)
		assert.Check(t, is.Equal(fields[0], pool.Name))
		assert.Check(t, is.Equal(fields[2], infra.BakeTag+"="+id))
		image = fields[1]

		img := describeImage(ctx, t, client, image)
		assert.Check(t, is.Equal(img.State, ec2types.ImageStateAvailable))
		tags := tagMap(img.Tags)
		for k, v := range map[string]string{names.TagCluster: cfg.ClusterName, names.TagPool: pool.Name,
			infra.BakeTag: id, infra.ParentImageTag: parent, infra.KubernetesVersionTag: cfg.Kubernetes.Version.String()} {
			assert.Check(t, is.Equal(tags[k], v), k)
		}
		snaps := imageSnapshots(img)
		assert.Assert(t, len(snaps) > 0, "the image has no snapshot")
		ds, err := client.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{SnapshotIds: snaps})
		assert.NilError(t, err)
		for _, s := range ds.Snapshots {
			assert.Check(t, is.Equal(tagMap(s.Tags)[infra.BakeTag], id), "snapshot %s", aws.ToString(s.SnapshotId))
		}

		instances := bakeInstances(ctx, t, client)
		assert.Assert(t, is.Len(instances, 1))
		inst := instances[0]
		assert.Check(t, is.Equal(inst.State.Name, ec2types.InstanceStateNameTerminated))
		assert.Check(t, is.Equal(aws.ToString(inst.ImageId), parent), "the bake did not start from the GA image")
		assert.Check(t, is.Equal(string(inst.InstanceType), pool.InstanceTypes[0]))
		itags := tagMap(inst.Tags)
		assert.Check(t, is.Equal(itags[names.TagCluster], cfg.ClusterName))
		_, hasPool := itags[names.TagPool]
		assert.Check(t, !hasPool, "the bake instance carries the pool's tag: it would count as a node")
		// (moto drops the profile's association at the termination: the stand-in saw it while the bake ran.)
		assert.Check(t, strings.HasSuffix(agent.profile(aws.ToString(inst.InstanceId)), "/"+infra.BakeProfileName(cfg.ClusterName)),
			"the bake ran as %q", agent.profile(aws.ToString(inst.InstanceId)))
		assert.Check(t, is.Contains(agent.userData(aws.ToString(inst.InstanceId)),
			"DYNK8S_AGENT_BUCKET="+fixture.Bucket+"\n"), "the bake's agent pin is not the stack's bucket")

		// -keep 2: the new image and the newest older one stay; the two oldest go with their snapshots.
		left := poolImages(ctx, t, client, cfg.ClusterName, pool.Name)
		assert.Check(t, is.DeepEqual(left, []string{image, fixture.OlderImages[2]}))
		for _, old := range fixture.OlderImages[:2] {
			out, err := client.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{
				Filters: []ec2types.Filter{{Name: aws.String("snapshot-id"), Values: fixture.Snapshots[old]}}})
			assert.NilError(t, err)
			assert.Check(t, is.Len(out.Snapshots, 0), "image %s's snapshots are left", old)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("same config, nothing to do", func(t *testing.T) {
		rc, stdout, _ := bakeRun(t, file, "-check")
		assert.Check(t, is.Equal(rc, 0))
		assert.Check(t, is.Equal(stdout, pool.Name+"\t"+image+"\t"+infra.BakeTag+"="+id+"\n"))
		rc, stdout, stderr := bakeRun(t, file, "-keep", "2")
		assert.Equal(t, rc, 0)
		assert.Check(t, is.Contains(stdout, pool.Name+"\t"+image+"\t"))
		assert.Check(t, is.Contains(stderr, "nothing to bake"))
		assert.Check(t, is.Len(bakeInstances(ctx, t, client), 1), "a second bake launched an instance")
		assert.Check(t, is.DeepEqual(poolImages(ctx, t, client, cfg.ClusterName, pool.Name), []string{image, fixture.OlderImages[2]}))
	})

	t.Run("a bake that never powers off", func(t *testing.T) {
		poolValues["prePullImages"] = []any{"quay.io/buildah/stable:v1.39"}
		defer delete(poolValues, "prePullImages")
		changed, changedCfg := stackFile(t)
		newID, err := infra.BakeID(changedCfg, changedCfg.NodePools[0])
		assert.NilError(t, err)
		assert.Assert(t, newID != id, "a pre-pull did not change the image's identity")
		agent.hangBake(newID)
		// -timeout bounds the launch too: 20 s leaves a slow, loaded machine's moto room to launch before the wait
		// for the stop runs out, which is what this case is about.
		rc, _, stderr := bakeRun(t, changed, "-timeout", "20s")
		assert.Equal(t, rc, 1)
		assert.Check(t, is.Contains(stderr, "FAILED: pool "+pool.Name+": bake instance"))
		assert.Check(t, is.Contains(stderr, "not stopped after"))
		for _, inst := range bakeInstances(ctx, t, client) {
			assert.Check(t, is.Equal(inst.State.Name, ec2types.InstanceStateNameTerminated), aws.ToString(inst.InstanceId))
		}
		assert.Check(t, is.DeepEqual(poolImages(ctx, t, client, cfg.ClusterName, pool.Name), []string{image, fixture.OlderImages[2]}))
	})
}

// bakeAgent stands in for the agent on moto's bake instances: it reads each one's user data, and stops it.
type bakeAgent struct {
	client  *ec2.Client
	mu      sync.Mutex
	hang    map[string]bool   // bake ids whose instances never stop
	checked map[string]string // instance id -> its user data's cloud-config
	roles   map[string]string // instance id -> its instance profile's ARN
}

func (a *bakeAgent) profile(instance string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.roles[instance]
}

func (a *bakeAgent) hangBake(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hang[id] = true
}

func (a *bakeAgent) userData(instance string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.checked[instance]
}

func (a *bakeAgent) run(ctx context.Context, t *testing.T) {
	for ctx.Err() == nil {
		out, err := a.client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
			{Name: aws.String("tag-key"), Values: []string{infra.BakeTag}},
			{Name: aws.String("instance-state-name"), Values: []string{"pending", "running"}}}})
		if err == nil {
			for _, r := range out.Reservations {
				for _, inst := range r.Instances {
					a.check(ctx, t, inst)
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (a *bakeAgent) check(ctx context.Context, t *testing.T, inst ec2types.Instance) {
	id := aws.ToString(inst.InstanceId)
	a.mu.Lock()
	_, seen := a.checked[id]
	hang := a.hang[tagMap(inst.Tags)[infra.BakeTag]]
	a.mu.Unlock()
	if seen {
		return
	}
	// moto lists the profile in its associations, not in the instance's description, and makes the association
	// after the instance: an instance seen before it is looked at again.
	assoc, err := a.client.DescribeIamInstanceProfileAssociations(ctx, &ec2.DescribeIamInstanceProfileAssociationsInput{})
	if err != nil {
		return
	}
	profile := ""
	for _, as := range assoc.IamInstanceProfileAssociations {
		if aws.ToString(as.InstanceId) == id {
			profile = aws.ToString(as.IamInstanceProfile.Arn)
		}
	}
	if profile == "" {
		return
	}
	attr, err := a.client.DescribeInstanceAttribute(ctx, &ec2.DescribeInstanceAttributeInput{InstanceId: inst.InstanceId,
		Attribute: ec2types.InstanceAttributeNameUserData})
	if err != nil || attr.UserData == nil {
		return
	}
	raw, err := base64.StdEncoding.DecodeString(aws.ToString(attr.UserData.Value))
	if err != nil {
		t.Errorf("bake instance %s: user data is not base64: %v", id, err)
		return
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Errorf("bake instance %s: user data is not gzip: %v", id, err)
		return
	}
	text, _ := io.ReadAll(zr)
	a.mu.Lock()
	a.checked[id] = string(text)
	a.roles[id] = profile
	a.mu.Unlock()
	for _, want := range []string{"path: /etc/dynk8s/bake.json", "ExecStart=/usr/local/bin/dynk8s-node bake --config /etc/dynk8s/bake.json",
		"DYNK8S_AGENT_VERSION_ID=", "- dynk8s-bake.service"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("bake instance %s: its user data lacks %q:\n%s", id, want, text)
		}
	}
	if strings.Contains(string(text), "/etc/dynk8s/node.json") {
		t.Errorf("bake instance %s: its user data writes node.json", id)
	}
	if hang {
		return
	}
	if _, err := a.client.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{id}}); err != nil {
		t.Errorf("stop bake instance %s: %v", id, err)
	}
}

func describeImage(ctx context.Context, t *testing.T, c *ec2.Client, id string) ec2types.Image {
	t.Helper()
	out, err := c.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{id}})
	assert.NilError(t, err)
	assert.Assert(t, is.Len(out.Images, 1))
	return out.Images[0]
}

func imageSnapshots(img ec2types.Image) []string {
	var ids []string
	for _, m := range img.BlockDeviceMappings {
		if m.Ebs != nil && m.Ebs.SnapshotId != nil {
			ids = append(ids, aws.ToString(m.Ebs.SnapshotId))
		}
	}
	return ids
}

func bakeInstances(ctx context.Context, t *testing.T, c *ec2.Client) []ec2types.Instance {
	t.Helper()
	out, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
		{Name: aws.String("tag-key"), Values: []string{infra.BakeTag}}}})
	assert.NilError(t, err)
	var all []ec2types.Instance
	for _, r := range out.Reservations {
		all = append(all, r.Instances...)
	}
	return all
}

// poolImages are the pool's registered images, newest first.
func poolImages(ctx context.Context, t *testing.T, c *ec2.Client, cluster, pool string) []string {
	t.Helper()
	out, err := c.DescribeImages(ctx, &ec2.DescribeImagesInput{Owners: []string{"self"}, Filters: []ec2types.Filter{
		{Name: aws.String("tag:" + names.TagCluster), Values: []string{cluster}},
		{Name: aws.String("tag:" + names.TagPool), Values: []string{pool}}}})
	assert.NilError(t, err)
	imgs := out.Images
	var ids []string
	for len(imgs) > 0 {
		newest := 0
		for i, img := range imgs {
			if aws.ToString(img.CreationDate) > aws.ToString(imgs[newest].CreationDate) {
				newest = i
			}
		}
		ids = append(ids, aws.ToString(imgs[newest].ImageId))
		imgs = append(imgs[:newest], imgs[newest+1:]...)
	}
	return ids
}

func tagMap(tags []ec2types.Tag) map[string]string {
	m := map[string]string{}
	for _, t := range tags {
		m[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	return m
}
