package infra

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/iam"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/s3"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumix"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/names"
)

// AgentBucketType is the type token of the AgentBucket component.
const AgentBucketType = "dynk8s:infra:AgentBucket"

// AgentDir is where `make build` writes the node agent (hack/build-agent.sh), relative to the project directory,
// where the engine runs the program.
const AgentDir = "build/agent"

// AgentPrefix is the key prefix of the agent's objects: one object per architecture, "dynk8s-node/linux-<arch>".
const AgentPrefix = string(NodeAgent) + "/"

// Executable is one of the binaries the agent bucket serves, by its name: the file `make build` writes is
// <name>-linux-<arch>, its key <name>/linux-<arch>.
type Executable string

const (
	// NodeAgent runs on the pool instances and the gateway (node/cmd/dynk8s-node).
	NodeAgent Executable = "dynk8s-node"
	// Controller runs in the on-prem cluster (cluster/cmd/dynk8s-controller): its init container fetches it.
	Controller Executable = "dynk8s-controller"
)

// ControllerArches are the architectures the controller is built and uploaded for: it runs on an on-prem node,
// which may be of either.
var ControllerArches = []kube.Arch{kube.ArchArm64, kube.ArchX86_64}

// StandInSHA256 is the sha256 of no bytes: the hash of the empty object the offline plan declares for an agent that
// was not built. The engine's run never declares one (BuiltAgent), and the bootstrap refuses an empty download.
const StandInSHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// AgentBinary is one program built for one architecture.
type AgentBinary struct {
	// Executable is what was built ("": NodeAgent).
	Executable Executable
	Arch       kube.Arch
	// Path is the built file; "" for the plan's stand-in (an empty object).
	Path string
	// SHA256 is the file's sha256, lowercase hex; StandInSHA256 for the stand-in.
	SHA256 string
	// Size is the file's size in bytes (0 for the stand-in).
	Size int64
}

// StandIn reports whether b is the plan's stand-in rather than a built binary.
func (b AgentBinary) StandIn() bool { return b.Path == "" }

// program is b's program, NodeAgent when unset.
func (b AgentBinary) program() Executable { return cmp.Or(b.Executable, NodeAgent) }

// AgentFiles finds a program built for an architecture.
type AgentFiles func(p Executable, arch kube.Arch) (AgentBinary, error)

// BuiltAgent is the engine's AgentFiles: the binaries under dir, and an error naming the command that builds a
// missing one. A stack never uploads a stand-in.
func BuiltAgent(dir string) AgentFiles {
	return func(p Executable, arch kube.Arch) (AgentBinary, error) {
		b, err := readAgent(dir, p, arch)
		if errors.Is(err, os.ErrNotExist) {
			return AgentBinary{}, fmt.Errorf("%s for %s: %s is not built: run `make build` first", p.what(), arch,
				agentPath(dir, p, arch))
		}
		return b, err
	}
}

// what names p in an error.
func (p Executable) what() string {
	if p == Controller {
		return "controller"
	}
	return "node agent"
}

// AgentOrStandIn is the offline plan's AgentFiles: the binary under dir when it was built, else the stand-in; dir
// "" always gives the stand-in (the goldens, which must not depend on whether `make build` ran).
func AgentOrStandIn(dir string) AgentFiles {
	return func(p Executable, arch kube.Arch) (AgentBinary, error) {
		if dir == "" {
			return AgentBinary{Executable: p, Arch: arch, SHA256: StandInSHA256}, nil
		}
		b, err := readAgent(dir, p, arch)
		if errors.Is(err, os.ErrNotExist) {
			return AgentBinary{Executable: p, Arch: arch, SHA256: StandInSHA256}, nil
		}
		return b, err
	}
}

func agentPath(dir string, p Executable, arch kube.Arch) string {
	return filepath.Join(dir, string(p)+"-linux-"+arch.Label())
}

func readAgent(dir string, p Executable, arch kube.Arch) (AgentBinary, error) {
	path := agentPath(dir, p, arch)
	f, err := os.Open(path)
	if err != nil {
		return AgentBinary{}, err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return AgentBinary{}, fmt.Errorf("%s for %s: %w", p.what(), arch, err)
	}
	if n == 0 {
		return AgentBinary{}, fmt.Errorf("%s for %s: %s is empty", p.what(), arch, path)
	}
	return AgentBinary{Executable: p, Arch: arch, Path: path, SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}, nil
}

// AgentObject is one architecture's agent in the bucket: what a node's user data pins.
type AgentObject struct {
	Bucket pulumi.StringOutput
	Key    string
	// VersionID is the S3 version of the object that holds exactly these bytes.
	VersionID pulumi.StringOutput
	SHA256    string
	// StandIn marks the plan's stand-in (AgentBinary.StandIn).
	StandIn bool
	arn     pulumi.StringOutput
}

// AgentBucket is the private S3 bucket the instances download the node agent from: one object per architecture
// under a stable key, each update a new S3 version that the launch template's user data pins by version id and
// sha256. A version the stack has replaced stays readable for RetentionDays, for instances of older launch template
// versions, then a lifecycle rule expires it. Content-addressed keys would not give that: Pulumi deletes a replaced
// object at the end of the update (and, in a versioned bucket, every version of its key), and an age rule on the
// keys would expire the live object too.
type AgentBucket struct {
	pulumi.ResourceState

	BucketName pulumi.StringOutput `pulumi:"bucketName"`
	// Objects are the node agent's, by architecture, for those in Binaries.
	Objects map[kube.Arch]AgentObject
	// Controller are the controller's objects, by architecture, for those in Binaries.
	Controller map[kube.Arch]AgentObject
}

// AgentBucketArgs are the inputs of AgentBucket.
type AgentBucketArgs struct {
	// ClusterName names and tags the bucket (required).
	ClusterName string
	// Binaries are the agent's builds to upload, one per architecture the stack runs (required).
	Binaries []AgentBinary
	// RetentionDays is agent.retentionDays (required, at least 1).
	RetentionDays int
	// Readers are the instance roles (by name) that download the agent, each with the architectures it runs: a
	// role may read exactly those objects.
	Readers []AgentReader
	// ControllerReader is the IAM user (by name) whose key the controller's init container downloads the
	// controller with (optional): it may read exactly the controller's objects.
	ControllerReader pulumi.StringInput
	// Deployer is the principal running `pulumi up` (DeployerARN), the only one the bucket policy lets write,
	// delete or supersede the objects (required).
	Deployer pulumi.StringInput
}

// AgentReader is an instance role that downloads the agent for the architectures listed.
type AgentReader struct {
	// Name is the RolePolicy's resource name suffix, e.g. "node".
	Name   string
	Role   pulumi.StringInput
	Arches []kube.Arch
}

// NewAgentBucket declares the bucket, its protections, the objects and the readers' policies.
func NewAgentBucket(ctx *pulumi.Context, name string, args *AgentBucketArgs, opts ...pulumi.ResourceOption) (*AgentBucket, error) {
	if args == nil || len(args.Binaries) == 0 || args.Deployer == nil {
		return nil, errors.New("agent bucket: args with at least one binary and the deployer are required")
	}
	if args.RetentionDays < config.MinAgentRetentionDays {
		return nil, fmt.Errorf("agent bucket: retention of %d days is under %d", args.RetentionDays,
			config.MinAgentRetentionDays)
	}
	comp := &AgentBucket{Objects: map[kube.Arch]AgentObject{}, Controller: map[kube.Arch]AgentObject{}}
	if err := ctx.RegisterComponentResource(AgentBucketType, name, comp, opts...); err != nil {
		return nil, err
	}
	parent := pulumi.Parent(comp)
	fail := func(what string, err error) (*AgentBucket, error) {
		return nil, fmt.Errorf("agent bucket %q: %s: %w", name, what, err)
	}

	bucket, err := s3.NewBucketV2(ctx, name, &s3.BucketV2Args{
		BucketPrefix: pulumi.String(agentBucketPrefix(args.ClusterName)),
		// `pulumi destroy` removes the binaries with the bucket, every retained version included.
		ForceDestroy: pulumi.Bool(true),
		Tags:         awsTags(config.IdentityTags(args.ClusterName, "", args.ClusterName+"-node-agent")),
	}, parent)
	if err != nil {
		return fail("bucket", err)
	}
	if _, err := s3.NewBucketPublicAccessBlock(ctx, name, &s3.BucketPublicAccessBlockArgs{
		Bucket:                bucket.ID(),
		BlockPublicAcls:       pulumi.Bool(true),
		BlockPublicPolicy:     pulumi.Bool(true),
		IgnorePublicAcls:      pulumi.Bool(true),
		RestrictPublicBuckets: pulumi.Bool(true),
	}, parent); err != nil {
		return fail("public access block", err)
	}
	// No ACLs: the bucket owner owns every object, and only IAM policies grant access.
	if _, err := s3.NewBucketOwnershipControls(ctx, name, &s3.BucketOwnershipControlsArgs{
		Bucket: bucket.ID(),
		Rule:   &s3.BucketOwnershipControlsRuleArgs{ObjectOwnership: pulumi.String("BucketOwnerEnforced")},
	}, parent); err != nil {
		return fail("ownership controls", err)
	}
	sse, err := s3.NewBucketServerSideEncryptionConfigurationV2(ctx, name, &s3.BucketServerSideEncryptionConfigurationV2Args{
		Bucket: bucket.ID(),
		Rules: s3.BucketServerSideEncryptionConfigurationV2RuleArray{
			&s3.BucketServerSideEncryptionConfigurationV2RuleArgs{
				ApplyServerSideEncryptionByDefault: &s3.BucketServerSideEncryptionConfigurationV2RuleApplyServerSideEncryptionByDefaultArgs{
					// SSE-S3: nothing secret is in the binary, and a KMS key would need a grant per reader.
					SseAlgorithm: pulumi.String("AES256"),
				},
			},
		},
	}, parent)
	if err != nil {
		return fail("encryption", err)
	}
	versioning, err := s3.NewBucketVersioningV2(ctx, name, &s3.BucketVersioningV2Args{
		Bucket:                  bucket.ID(),
		VersioningConfiguration: &s3.BucketVersioningV2VersioningConfigurationArgs{Status: pulumi.String("Enabled")},
	}, parent)
	if err != nil {
		return fail("versioning", err)
	}
	expire := func(id string, p Executable) *s3.BucketLifecycleConfigurationV2RuleArgs {
		return &s3.BucketLifecycleConfigurationV2RuleArgs{
			Id:     pulumi.String(id),
			Status: pulumi.String("Enabled"),
			Filter: &s3.BucketLifecycleConfigurationV2RuleFilterArgs{Prefix: pulumi.String(string(p) + "/")},
			NoncurrentVersionExpiration: &s3.BucketLifecycleConfigurationV2RuleNoncurrentVersionExpirationArgs{
				NoncurrentDays: pulumi.Int(args.RetentionDays),
			},
		}
	}
	rules := s3.BucketLifecycleConfigurationV2RuleArray{expire("expire-replaced-agents", NodeAgent)}
	if slices.ContainsFunc(args.Binaries, func(b AgentBinary) bool { return b.program() == Controller }) {
		// A replaced controller is kept as long: a Deployment rolled back, or a pod that restarts before the update
		// reaches it, fetches the pinned older one.
		rules = append(rules, expire("expire-replaced-controllers", Controller))
	}
	if _, err := s3.NewBucketLifecycleConfigurationV2(ctx, name, &s3.BucketLifecycleConfigurationV2Args{
		Bucket: bucket.ID(),
		Rules:  rules,
	}, parent, pulumi.DependsOn([]pulumi.Resource{versioning})); err != nil {
		return fail("lifecycle", err)
	}
	// The objects are written after the policy: a deployer other than the one the policy names (another operator,
	// CI) first names itself there, then uploads. `pulumi destroy` deletes them before the policy, as the deployer
	// the policy names; another principal's destroy is refused until its `pulumi up` has named it (or the root
	// user deletes the bucket policy).
	policy, err := s3.NewBucketPolicy(ctx, name, &s3.BucketPolicyArgs{
		Bucket: bucket.ID(),
		Policy: pulumix.Cast[pulumi.StringOutput](pulumix.Apply2Err(bucket.Arn, args.Deployer.ToStringOutput(),
			func(arn, deployer string) (string, error) { return AgentBucketPolicy(arn, deployer).JSON() })),
	}, parent)
	if err != nil {
		return fail("bucket policy", err)
	}

	binaries := slices.Clone(args.Binaries)
	slices.SortFunc(binaries, func(a, b AgentBinary) int {
		return cmp.Or(cmp.Compare(a.program(), b.program()), cmp.Compare(a.Arch, b.Arch))
	})
	for _, b := range binaries {
		key := string(b.program()) + "/linux-" + b.Arch.Label()
		// The node agent's objects keep the resource names they had before the bucket served a second program.
		resource := name + "-linux-" + b.Arch.Label()
		if b.program() != NodeAgent {
			resource = name + "-" + strings.TrimPrefix(string(b.program()), "dynk8s-") + "-linux-" + b.Arch.Label()
		}
		objArgs := &s3.BucketObjectv2Args{
			Bucket:      bucket.ID(),
			Key:         pulumi.String(key),
			ContentType: pulumi.String("application/octet-stream"),
			// The hash the user data pins, also on the object for whoever inspects the bucket.
			Metadata: pulumi.StringMap{"sha256": pulumi.String(b.SHA256)},
			Tags:     awsTags([]config.Tag{{Key: names.TagCluster, Value: args.ClusterName}}),
		}
		if b.StandIn() {
			objArgs.Metadata = pulumi.StringMap{"sha256": pulumi.String(b.SHA256),
				"stand-in": pulumi.String("the " + b.program().what() + " was not built (make build): an empty object")}
			objArgs.Content = pulumi.String("")
		} else {
			objArgs.Source = pulumi.NewFileAsset(b.Path)
		}
		obj, err := s3.NewBucketObjectv2(ctx, resource, objArgs, parent,
			pulumi.DependsOn([]pulumi.Resource{versioning, sse, policy}))
		if err != nil {
			return fail("object "+key, err)
		}
		objects := comp.Objects
		if b.program() == Controller {
			objects = comp.Controller
		}
		objects[b.Arch] = AgentObject{Bucket: bucket.Bucket, Key: key, VersionID: obj.VersionId,
			SHA256: b.SHA256, StandIn: b.StandIn(), arn: pulumi.Sprintf("%s/%s", bucket.Arn, key)}
	}

	for _, r := range args.Readers {
		var arns pulumi.StringArray
		for _, arch := range r.Arches {
			o, ok := comp.Objects[arch]
			if !ok {
				return fail("reader "+r.Name, fmt.Errorf("no binary for %s", arch))
			}
			arns = append(arns, o.arn)
		}
		policy := pulumix.ApplyErr(arns.ToStringArrayOutput(), func(arns []string) (string, error) {
			return ReadAgentPolicy(slices.Compact(slices.Sorted(slices.Values(arns)))).JSON()
		})
		if _, err := iam.NewRolePolicy(ctx, name+"-"+r.Name+"-read", &iam.RolePolicyArgs{
			Role:   r.Role,
			Name:   pulumi.String("read-node-agent"),
			Policy: pulumix.Cast[pulumi.StringOutput](policy),
		}, parent); err != nil {
			return fail("reader "+r.Name, err)
		}
	}

	if args.ControllerReader != nil {
		var arns pulumi.StringArray
		for _, arch := range slices.Sorted(maps.Keys(comp.Controller)) {
			arns = append(arns, comp.Controller[arch].arn)
		}
		if len(arns) == 0 {
			return fail("controller reader", errors.New("no controller binary"))
		}
		policy := pulumix.ApplyErr(arns.ToStringArrayOutput(), func(arns []string) (string, error) {
			return ReadControllerPolicy(arns).JSON()
		})
		if _, err := iam.NewUserPolicy(ctx, name+"-controller-read", &iam.UserPolicyArgs{
			User:   args.ControllerReader,
			Name:   pulumi.String("read-controller"),
			Policy: pulumix.Cast[pulumi.StringOutput](policy),
		}, parent); err != nil {
			return fail("controller reader", err)
		}
	}

	comp.BucketName = bucket.Bucket
	if err := ctx.RegisterResourceOutputs(comp, pulumi.Map{"bucketName": comp.BucketName}); err != nil {
		return fail("outputs", err)
	}
	return comp, nil
}

// agentBucketPrefix is the bucket name's prefix: S3 names are global, so Pulumi appends a unique suffix, and a
// prefix may have at most 37 characters (the provider's bucket_prefix limit); the cluster name is cut to fit.
func agentBucketPrefix(clusterName string) string {
	const head, tail, limit = "dynk8s-", "-agent-", 37
	if n := limit - len(head) - len(tail); len(clusterName) > n {
		clusterName = clusterName[:n]
	}
	return head + clusterName + tail
}

// ReadControllerPolicy lets the controller's IAM user download the controller: exactly its objects (one per
// architecture), at any of their versions, and nothing else of the bucket.
func ReadControllerPolicy(objectARNs []string) PolicyDocument {
	return PolicyDocument{Version: policyVersion, Statement: []PolicyStatement{{
		Sid:      "ReadTheController",
		Effect:   "Allow",
		Action:   []string{"s3:GetObject", "s3:GetObjectVersion"},
		Resource: objectARNs,
	}}}
}
