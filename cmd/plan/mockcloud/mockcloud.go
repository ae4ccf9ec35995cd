// Package mockcloud runs a Pulumi program under the Pulumi mock engine with deterministic stand-ins for the cloud:
// resources get stable ids and ARNs, the AMI lookup answers a plausible Fedora image per architecture, random values
// are derived from the resource name, and the on-prem cluster's cluster-info carries a fixed CA. It records every
// declared resource with its inputs and options, and it is shared by the unit tests of every package and by
// cmd/plan, so that what the tests assert is exactly what the plan shows.
package mockcloud

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/internals"

	"github.com/dynk8s/dynk8s/infra/config"
)

// Account is the AWS account id the mock answers for getCallerIdentity and puts in ARNs.
const Account = "123456789012"

// Resource is one declared resource as the engine saw it.
type Resource struct {
	Type string
	Name string
	// URN is the resource's URN as the engine computes it from its stack, project, parent, type and name.
	URN string
	// Aliases are the URNs the resource's aliases name, each resolved as the engine does (an alias spec's unset
	// name, type or parent is the resource's own). The aliases a child inherits from its parent are not listed:
	// AcceptedURNs adds them.
	Aliases []string
	Parent  string // the parent's name; empty for resources parented to the stack
	// ParentURN is the parent's URN (the stack's for a resource without a parent of its own).
	ParentURN string
	ID        string
	Custom    bool
	// Inputs are the inputs as registered, secrets still wrapped as secrets.
	Inputs resource.PropertyMap
	// Outputs are what the mock answered: inputs plus computed fields.
	Outputs                 resource.PropertyMap
	IgnoreChanges           []string
	AdditionalSecretOutputs []string
	ReplaceOnChanges        []string
	DeleteBeforeReplace     bool
	Protect                 bool
	Provider                string
	// DependsOn are the names of the resources this one explicitly depends on (the dependsOn option), and
	// DependsOnURNs their URNs (a component's children may share a name).
	DependsOn, DependsOnURNs []string
	// InputDependencies are, per input, the names of the resources its value came from.
	InputDependencies map[string][]string
	// Read is true for a resource read from the cloud (a Get*), not declared.
	Read bool
}

// Call is one invoke (a data source lookup) the program made, and what the mock answered.
type Call struct {
	Token string
	Args  resource.PropertyMap
	// Result is the answer, Err the error the invoke failed with instead.
	Result resource.PropertyMap
	Err    error
}

// Cloud is a pulumi.MockResourceMonitor that records what the program declares.
type Cloud struct {
	// Region is the region the stand-ins answer for (ARNs, zones). Default "eu-central-1".
	Region string
	// ClusterServer is the API server URL the on-prem cluster's kube-public/cluster-info names. Default
	// https://192.168.10.10:6443.
	ClusterServer string
	// ClusterVersion is the control plane's version in kube-system/kubeadm-config, e.g. "v1.34.4". Default
	// v1.34.4.
	ClusterVersion string
	// ClusterPodSubnet and ClusterServiceSubnet are the networking.podSubnet and serviceSubnet kubeadm-config
	// states; default: none and kubeadm's default 10.96.0.0/12.
	ClusterPodSubnet, ClusterServiceSubnet string
	// EBSDefaultKey is the key ARN of the region's default EBS encryption key, a customer-managed key; empty: the
	// AWS managed alias/aws/ebs, as in an account that never changed it.
	EBSDefaultKey string
	// Caller is the ARN getCallerIdentity answers; empty: the IAM user arn:aws:iam::<Account>:user/operator. For
	// an assumed-role session (arn:aws:sts::<Account>:assumed-role/<role>/<session>) getSessionContext answers
	// the role at CallerRolePath ("/" when empty), as IAM knows it.
	Caller         string
	CallerRolePath string
	// NoBakedImage are the pools whose baked image the account lacks, as before their first bake (cmd/bake): the
	// lookup of their image by its tags fails as the provider's does when nothing matches. Every other pool's
	// lookup finds a stand-in baked image (StandInBakedImage): the plan assumes the bake ran.
	NoBakedImage []string
	// BakedArch is the architecture of the stand-in baked images, by pool name; NewFor sets each pool's own, as
	// cmd/bake bakes it (a pool not listed: x86_64). A test sets another to show the mismatch.
	BakedArch map[string]string

	mu        sync.Mutex
	resources []Resource
	calls     []Call
}

// New returns a Cloud for region.
func New(region string) *Cloud {
	if region == "" {
		region = "eu-central-1"
	}
	return &Cloud{Region: region}
}

// NewFor returns a Cloud for the stack's region whose stand-in on-prem cluster is set up as the stack's config says,
// as a correctly set up one is: its cluster-info names the configured API server, and its kubeadm-config states
// the configured Kubernetes version, pod range and service range. A test changes what it checks afterwards.
func NewFor(sc StackConfig) *Cloud {
	c := New(sc.Values["aws:region"])
	var pools []struct {
		Name string `json:"name"`
		Arch string `json:"arch"`
	}
	if json.Unmarshal([]byte(sc.Values[config.Namespace+":nodePools"]), &pools) == nil {
		c.BakedArch = map[string]string{}
		for _, p := range pools {
			c.BakedArch[p.Name] = p.Arch
		}
	}
	var k8s struct {
		APIServerEndpoint string `json:"apiServerEndpoint"`
		Version           string `json:"version"`
		PodCIDR           string `json:"podCidr"`
		ServiceCIDR       string `json:"serviceCidr"`
	}
	if json.Unmarshal([]byte(sc.Values[config.Namespace+":kubernetes"]), &k8s) == nil {
		c.ClusterPodSubnet, c.ClusterServiceSubnet = k8s.PodCIDR, k8s.ServiceCIDR
		if k8s.APIServerEndpoint != "" {
			c.ClusterServer = "https://" + k8s.APIServerEndpoint
		}
		if k8s.Version != "" {
			c.ClusterVersion = "v" + k8s.Version
		}
	}
	return c
}

// Resources returns the declared (and read) resources in registration order.
func (c *Cloud) Resources() []Resource {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Resource(nil), c.resources...)
}

// Calls returns the invokes in the order they were made.
func (c *Cloud) Calls() []Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Call(nil), c.calls...)
}

// ByType returns the resources of one type token, sorted by name.
func (c *Cloud) ByType(typ string) []Resource {
	var out []Resource
	for _, r := range c.Resources() {
		if r.Type == typ {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Find returns the resource of type typ named name, or nil.
func (c *Cloud) Find(typ, name string) *Resource {
	for _, r := range c.Resources() {
		if r.Type == typ && r.Name == name {
			return &r
		}
	}
	return nil
}

// NewResource implements pulumi.MockResourceMonitor.
func (c *Cloud) NewResource(args pulumi.MockResourceArgs) (string, resource.PropertyMap, error) {
	id := args.ID
	if id == "" {
		id = c.physicalID(args.TypeToken, args.Name)
		if args.TypeToken == "aws:s3/bucketV2:BucketV2" {
			// A bucket's id is its name.
			id = bucketName(args.Name, args.Inputs)
		}
	}
	outputs := args.Inputs.Copy()
	if err := c.computed(args.TypeToken, args.Name, id, args.Inputs, outputs); err != nil {
		return "", nil, err
	}

	r := Resource{
		Type:    args.TypeToken,
		Name:    args.Name,
		ID:      id,
		Custom:  args.Custom,
		Inputs:  args.Inputs,
		Outputs: outputs,
		Read:    args.ReadRPC != nil,
	}
	if rpc := args.RegisterRPC; rpc != nil {
		r.URN = childURN(rpc.GetParent(), args.TypeToken, args.Name)
		r.Aliases = aliasURNs(rpc.GetParent(), args.TypeToken, args.Name, rpc.GetAliases())
		r.Parent = urnName(rpc.GetParent())
		r.ParentURN = rpc.GetParent()
		r.IgnoreChanges = rpc.GetIgnoreChanges()
		r.AdditionalSecretOutputs = rpc.GetAdditionalSecretOutputs()
		r.ReplaceOnChanges = rpc.GetReplaceOnChanges()
		r.DeleteBeforeReplace = rpc.GetDeleteBeforeReplace()
		r.Protect = rpc.GetProtect()
		r.Provider = rpc.GetProvider()
		// Dependencies holds both the explicit dependsOn and those the inputs imply; only the explicit ones are kept.
		implied := map[string]bool{}
		r.InputDependencies = map[string][]string{}
		for key, pd := range rpc.GetPropertyDependencies() {
			for _, u := range pd.GetUrns() {
				implied[u] = true
				r.InputDependencies[key] = append(r.InputDependencies[key], urnName(u))
			}
			sort.Strings(r.InputDependencies[key])
		}
		for _, d := range rpc.GetDependencies() {
			if !implied[d] {
				r.DependsOn = append(r.DependsOn, urnName(d))
				r.DependsOnURNs = append(r.DependsOnURNs, d)
			}
		}
		sort.Strings(r.DependsOn)
		sort.Strings(r.DependsOnURNs)
		// The real engine marks additional secret outputs as secret in state; so does this stand-in.
		for _, k := range rpc.GetAdditionalSecretOutputs() {
			if v, ok := outputs[resource.PropertyKey(k)]; ok && !v.IsSecret() {
				outputs[resource.PropertyKey(k)] = resource.MakeSecret(v)
			}
		}
	}
	if rpc := args.ReadRPC; rpc != nil {
		r.Parent = urnName(rpc.GetParent())
		r.Provider = rpc.GetProvider()
	}

	c.mu.Lock()
	c.resources = append(c.resources, r)
	c.mu.Unlock()
	return id, outputs, nil
}

// Call implements pulumi.MockResourceMonitor: the data sources the program looks up.
func (c *Cloud) Call(args pulumi.MockCallArgs) (resource.PropertyMap, error) {
	result, err := c.answer(args)
	c.mu.Lock()
	c.calls = append(c.calls, Call{Token: args.Token, Args: args.Args, Result: result, Err: err})
	c.mu.Unlock()
	return result, err
}

// answer is the stand-in's answer to an invoke.
func (c *Cloud) answer(args pulumi.MockCallArgs) (resource.PropertyMap, error) {
	switch args.Token {
	case "aws:ec2/getAmi:getAmi":
		return c.ami(args.Args)
	case "aws:index/getCallerIdentity:getCallerIdentity":
		return resource.NewPropertyMapFromMap(map[string]any{
			"accountId": Account,
			"arn":       c.callerARN(),
			"userId":    "AIDAMOCKOPERATOR",
			"id":        Account,
		}), nil
	case "aws:iam/getSessionContext:getSessionContext":
		return c.sessionContext(args.Args)
	case "aws:index/getPartition:getPartition":
		return resource.NewPropertyMapFromMap(map[string]any{
			"partition": "aws", "dnsSuffix": "amazonaws.com", "id": "aws", "reverseDnsPrefix": "com.amazonaws",
		}), nil
	case "aws:index/getRegion:getRegion":
		return resource.NewPropertyMapFromMap(map[string]any{
			"name": c.Region, "id": c.Region, "endpoint": "ec2." + c.Region + ".amazonaws.com",
		}), nil
	case "aws:index/getAvailabilityZones:getAvailabilityZones":
		return c.zones(args.Args), nil
	case "aws:ec2/getInstanceType:getInstanceType":
		return c.getInstanceType(args.Args)
	case "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
		return c.getInstanceTypeOfferings(args.Args)
	case "aws:ebs/getDefaultKmsKey:getDefaultKmsKey":
		key := c.EBSDefaultKey
		if key == "" {
			key = "arn:aws:kms:" + c.Region + ":" + Account + ":alias/aws/ebs"
		}
		return resource.NewPropertyMapFromMap(map[string]any{"keyArn": key, "id": c.Region}), nil
	case "aws:kms/getKey:getKey":
		return c.kmsKey(args.Args)
	}
	return nil, fmt.Errorf("mockcloud: no stand-in for invoke %s", args.Token)
}

// callerARN is the ARN of Cloud.Caller, by default an IAM user.
func (c *Cloud) callerARN() string {
	if c.Caller != "" {
		return c.Caller
	}
	return "arn:aws:iam::" + Account + ":user/operator"
}

// assumedRole is an STS assumed-role session ARN: partition, account, role name, session name.
var assumedRole = regexp.MustCompile(`^arn:([a-z-]+):sts::([0-9]{12}):assumed-role/([^/]+)/(.+)$`)

// sessionContext answers iam.getSessionContext as the provider does: for an assumed-role session its role's IAM
// ARN, path included (the path is IAM's, so CallerRolePath), for any other ARN the ARN itself.
func (c *Cloud) sessionContext(args resource.PropertyMap) (resource.PropertyMap, error) {
	arn := args["arn"].StringValue()
	out := map[string]any{"arn": arn, "id": arn, "issuerArn": arn, "issuerId": "", "issuerName": "", "sessionName": ""}
	if m := assumedRole.FindStringSubmatch(arn); m != nil {
		path := c.CallerRolePath
		if path == "" {
			path = "/"
		}
		out["issuerArn"] = "arn:" + m[1] + ":iam::" + m[2] + ":role" + path + m[3]
		out["issuerId"] = "AROA" + strings.ToUpper(shortHash(m[3]))
		out["issuerName"], out["sessionName"] = m[3], m[4]
	}
	return resource.NewPropertyMapFromMap(out), nil
}

// zones answers getAvailabilityZones as EC2 does for an account that opted into a Local Zone: it comes first by
// name ("-" sorts before letters) unless the filters keep it out.
func (c *Cloud) zones(args resource.PropertyMap) resource.PropertyMap {
	type zone struct{ name, id, zoneType, optIn string }
	all := []zone{
		{c.Region + "-ham-1a", "euc1-ham1-az1", "local-zone", "opted-in"},
		{c.Region + "a", "euc1-az2", "availability-zone", "opt-in-not-required"},
		{c.Region + "b", "euc1-az3", "availability-zone", "opt-in-not-required"},
		{c.Region + "c", "euc1-az1", "availability-zone", "opt-in-not-required"},
	}
	filters := filterValues(args)
	var names, ids []any
	for _, z := range all {
		if vs, ok := filters["zone-type"]; ok && !slices.Contains(vs, z.zoneType) {
			continue
		}
		if vs, ok := filters["opt-in-status"]; ok && !slices.Contains(vs, z.optIn) {
			continue
		}
		names, ids = append(names, z.name), append(ids, z.id)
	}
	return resource.NewPropertyMapFromMap(map[string]any{"names": names, "id": c.Region, "zoneIds": ids})
}

// physicalID is a stable, type-flavoured id: the same resource name always gets the same id.
func (c *Cloud) physicalID(typ, name string) string {
	h := shortHash(typ + "/" + name)
	switch typ {
	case "aws:ec2/vpc:Vpc":
		return "vpc-" + h
	case "aws:ec2/subnet:Subnet":
		return "subnet-" + h
	case "aws:ec2/securityGroup:SecurityGroup":
		return "sg-" + h
	case "aws:ec2/internetGateway:InternetGateway":
		return "igw-" + h
	case "aws:ec2/routeTable:RouteTable":
		return "rtb-" + h
	case "aws:ec2/launchTemplate:LaunchTemplate":
		return "lt-" + h
	case "aws:ec2/instance:Instance":
		// EC2's form: 17 hex digits.
		sum := sha256.Sum256([]byte(typ + "/" + name))
		return "i-" + hex.EncodeToString(sum[:])[:17]
	case "aws:ec2/eip:Eip":
		return "eipalloc-" + h
	case "aws:iam/accessKey:AccessKey":
		return "AKIA" + strings.ToUpper(h) + "MOCK"
	}
	if strings.HasPrefix(typ, "aws:iam/") || strings.HasPrefix(typ, "aws:ssm/") ||
		strings.HasPrefix(typ, "aws:autoscaling/") {
		return name
	}
	return name + "-" + h
}

// Await resolves an output inside a mock run and reports its value and whether it is secret. For tests and the plan
// tool only: it blocks until the mock engine has resolved the value.
func Await(o pulumi.Output) (value any, secret bool, err error) {
	r, err := internals.UnsafeAwaitOutput(context.Background(), o)
	if err != nil {
		return nil, false, err
	}
	return r.Value, r.Secret, nil
}

// urnName is the last segment of a URN: the resource's name.
func urnName(urn string) string {
	if urn == "" {
		return ""
	}
	if resource.URN(urn).QualifiedType() == resource.RootStackType {
		return ""
	}
	return resource.URN(urn).Name()
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:12]
}
