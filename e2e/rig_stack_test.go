//go:build e2e

package e2e

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// The dev stack's rig: Pulumi.dev.yaml parsed at the e2e's Kubernetes release (devConfig, rig_devstack_test.go), and the stack run under the mock engine, read for what the
// autoscaler, the replay into moto and the instances' roles need (stackAutoscaling).

// What the tests read from the mock engine's record.
const (
	groupType          = "aws:autoscaling/group:Group"
	launchTemplateType = "aws:ec2/launchTemplate:LaunchTemplate"
	userPolicyType     = "aws:iam/userPolicy:UserPolicy"
	deploymentType     = "kubernetes:apps/v1:Deployment"
	nodeTemplatePrefix = "k8s.io/cluster-autoscaler/node-template/"
	// priorityExpanderConfigMap is the ConfigMap in kube-system the priority expander reads.
	priorityExpanderConfigMap = "cluster-autoscaler-priority-expander"
)

// stackAutoscaling is what the dev stack declares for the autoscaler, read from the mock engine's record.
type stackAutoscaling struct {
	// cfg is the stack's parsed config, for cmd/explain's package.
	cfg    *config.Config
	region string
	// groups are the Auto Scaling groups by name, as declared.
	groups map[string]declaredGroup
	// replay is the document testdata/moto_aws.py setup reads.
	replay replayPlan
	// userName and policy are the autoscaler's IAM user and its user policy document.
	userName, policy string
	// cleanupUser and cleanupPolicy are the stale-node cleanup's IAM user (the controller's EC2 key) and its user
	// policy document.
	cleanupUser, cleanupPolicy string
	// cleanupWake is the cleanup user's policy that lets the controller start the sleeping gateway ("" when the
	// gateway never sleeps).
	cleanupWake string
	// priorities is the priority expander's ConfigMap as rendered (nil without the priority expander).
	priorities map[string]any
	// command, args and env are the autoscaler container's, as rendered (env: the plain values only).
	command, args []string
	env           map[string]string
	// rolePolicies are the inline policy documents of each IAM role, by role name (the node's, the gateway's).
	rolePolicies map[string][]string
	// gateway is the gateway instance as declared.
	gateway *replayInstance
	// profileRoles are the instance profiles' roles, by profile name.
	profileRoles map[string]string
}

// declaredGroup is one group's node-template, read from its declared tags.
type declaredGroup struct {
	labels    map[string]string
	taints    []declaredTaint
	resources map[string]string
}

type declaredTaint struct{ key, value, effect string }

// loadStackAutoscaling runs the dev stack under the mock engine.
func loadStackAutoscaling(t *testing.T) stackAutoscaling {
	t.Helper()
	return loadStackVariant(t, func(map[string]any) {})
}

// loadStackVariant runs the dev stack, changed by change (its config map), under the mock engine.
func loadStackVariant(t *testing.T, change func(values map[string]any)) stackAutoscaling {
	t.Helper()
	values := devStackValues(t)
	change(values)
	sc, err := mockcloud.ConfigFromMap(values)
	assert.NilError(t, err)
	res, err := plan.RunConfig("dev", sc)
	assert.NilError(t, err, "dev stack under the mock engine")
	cfg, err := config.ParseValues(sc.Values)
	assert.NilError(t, err)
	s := stackAutoscaling{cfg: cfg, region: res.Cloud.Region, groups: map[string]declaredGroup{},
		rolePolicies: map[string][]string{}, profileRoles: map[string]string{}}
	plain := func(r mockcloud.Resource) map[string]any { return mockcloud.PlainMap(r.Inputs, true) }
	str := func(m map[string]any, k string) string { v, _ := m[k].(string); return v }
	for _, r := range res.Resources() {
		in := plain(r)
		switch r.Type {
		case "aws:ec2/vpc:Vpc":
			s.replay.VPCs = append(s.replay.VPCs, map[string]any{"id": r.ID, "cidrBlock": in["cidrBlock"]})
		case "aws:ec2/subnet:Subnet":
			s.replay.Subnets = append(s.replay.Subnets, map[string]any{"id": r.ID, "vpcId": in["vpcId"],
				"cidrBlock": in["cidrBlock"], "availabilityZone": in["availabilityZone"]})
		case "aws:ec2/securityGroup:SecurityGroup":
			s.replay.SecurityGroups = append(s.replay.SecurityGroups,
				map[string]any{"id": r.ID, "name": r.Name, "vpcId": in["vpcId"]})
		case "aws:iam/instanceProfile:InstanceProfile":
			s.replay.InstanceProfiles = append(s.replay.InstanceProfiles, str(in, "name"))
			s.profileRoles[str(in, "name")] = str(in, "role")
		case launchTemplateType:
			s.replay.LaunchTemplates = append(s.replay.LaunchTemplates,
				map[string]any{"id": r.ID, "name": r.Name, "inputs": in})
		case groupType:
			// The mock names a group by its resource name; moto gets the same name.
			s.replay.Groups = append(s.replay.Groups, map[string]any{"name": r.ID, "inputs": in})
			s.groups[r.ID] = groupTemplate(t, r.ID, in)
		case userPolicyType:
			switch str(in, "name") {
			case autoscalerName:
				s.userName, s.policy = str(in, "user"), str(in, "policy")
			case "node-cleanup":
				s.cleanupUser, s.cleanupPolicy = str(in, "user"), str(in, "policy")
			case "start-the-wireguard-gateway":
				s.cleanupWake = str(in, "policy")
			}
		case "aws:iam/rolePolicy:RolePolicy":
			s.rolePolicies[str(in, "role")] = append(s.rolePolicies[str(in, "role")], str(in, "policy"))
		case "aws:ec2/instance:Instance":
			s.gateway = &replayInstance{ID: r.ID, Inputs: in}
		case "kubernetes:core/v1:ConfigMap":
			meta, _ := in["metadata"].(map[string]any)
			if str(meta, "name") == priorityExpanderConfigMap {
				s.priorities = in
			}
		case deploymentType:
			meta, _ := in["metadata"].(map[string]any)
			if str(meta, "name") == autoscalerName {
				s.command, s.args, s.env = autoscalerContainer(t, in)
			}
		}
	}
	if len(s.groups) < 2 || s.policy == "" || len(s.args) == 0 {
		t.Fatalf("dev stack: %d groups, policy %t, autoscaler args %q: the test needs two pools, the "+
			"autoscaler's user policy and its Deployment", len(s.groups), s.policy != "", s.args)
	}
	return s
}

// groupTemplate reads the node-template tags of a declared group.
func groupTemplate(t *testing.T, name string, in map[string]any) declaredGroup {
	t.Helper()
	g := declaredGroup{labels: map[string]string{}, resources: map[string]string{}}
	tags, _ := in["tags"].([]any)
	for _, e := range tags {
		tag, _ := e.(map[string]any)
		k, _ := tag["key"].(string)
		v, _ := tag["value"].(string)
		rest, ok := strings.CutPrefix(k, nodeTemplatePrefix)
		if !ok {
			continue
		}
		switch kind, key, _ := strings.Cut(rest, "/"); kind {
		case "label":
			g.labels[key] = v
		case "resources":
			g.resources[key] = v
		case "taint":
			value, effect, ok := strings.Cut(v, ":")
			if !ok {
				t.Fatalf("group %s: taint tag %s=%q is not value:effect", name, k, v)
			}
			g.taints = append(g.taints, declaredTaint{key: key, value: value, effect: effect})
		}
	}
	return g
}

// autoscalerContainer returns the autoscaler container's command, args and plain env values.
func autoscalerContainer(t *testing.T, deployment map[string]any) (command, args []string, env map[string]string) {
	t.Helper()
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name    string   `json:"name"`
						Command []string `json:"command"`
						Args    []string `json:"args"`
						Env     []struct {
							Name  string `json:"name"`
							Value string `json:"value"`
						} `json:"env"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	raw, err := json.Marshal(deployment)
	assert.NilError(t, err)
	assert.NilError(t, json.Unmarshal(raw, &d), "autoscaler Deployment")
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name != autoscalerName {
			continue
		}
		env = map[string]string{}
		for _, e := range c.Env {
			if e.Value != "" {
				env[e.Name] = e.Value
			}
		}
		return c.Command, c.Args, env
	}
	t.Fatalf("autoscaler Deployment has no container %s", autoscalerName)
	return nil, nil, nil
}

// spotGroup is the group of the dev stack's spot pool: the one with a taint, which the scale-up pods must tolerate.
func (s stackAutoscaling) spotGroup(t *testing.T) (string, declaredGroup) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(s.groups)) {
		g := s.groups[name]
		if g.labels["dynk8s.io/capacity-type"] == "spot" && len(g.taints) > 0 {
			return name, g
		}
	}
	t.Fatal("the dev stack declares no tainted spot group")
	return "", declaredGroup{}
}

// instanceRoles are the stack's roles of the node's and the gateway's instance profiles, with their inline
// policies, for moto to create and assume: what IMDS hands an instance are that role's temporary credentials, which
// moto's IAM enforcement checks against the role's policies.
func (s stackAutoscaling) instanceRoles(t *testing.T) []replayRole {
	t.Helper()
	var roles []replayRole
	for _, name := range []string{s.nodeRole(t), s.gatewayRole(t)} {
		if len(s.rolePolicies[name]) == 0 {
			t.Fatalf("the dev stack declares no policy for role %s", name)
		}
		roles = append(roles, replayRole{Name: name, Policies: s.rolePolicies[name]})
	}
	return roles
}

// gatewayRole is the role of the gateway instance's profile.
func (s stackAutoscaling) gatewayRole(t *testing.T) string {
	t.Helper()
	profile, _ := s.gateway.Inputs["iamInstanceProfile"].(string)
	role := s.profileRoles[profile]
	if role == "" {
		t.Fatalf("the gateway's instance profile %q has no declared role", profile)
	}
	return role
}

// nodeRole is the role of the profile every pool's launch template names (by ARN: .../instance-profile/NAME).
func (s stackAutoscaling) nodeRole(t *testing.T) string {
	t.Helper()
	var role string
	for _, lt := range s.replay.LaunchTemplates {
		inputs, _ := lt["inputs"].(map[string]any)
		prof, _ := inputs["iamInstanceProfile"].(map[string]any)
		arn, _ := prof["arn"].(string)
		r := s.profileRoles[arn[strings.LastIndexByte(arn, '/')+1:]]
		if r == "" || (role != "" && r != role) {
			t.Fatalf("launch template %v names profile %q: no declared role, or not the other pools' (%s)", lt["name"], arn, role)
		}
		role = r
	}
	return role
}

// poolGroup is the name of the Auto Scaling group of the pool (its node-template label dynk8s.io/pool).
func (s stackAutoscaling) poolGroup(t *testing.T, pool string) string {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(s.groups)) {
		if s.groups[name].labels[kube.LabelPool] == pool {
			return name
		}
	}
	t.Fatalf("the dev stack declares no group for pool %s", pool)
	return ""
}

// firstTaintedPool is the stack's first pool with taints and labels of its own, so that both are proven.
func firstTaintedPool(t *testing.T, cfg *config.Config) config.NodePool {
	t.Helper()
	for _, p := range cfg.NodePools {
		if len(p.Taints) > 0 && len(p.Labels) > 0 {
			return p
		}
	}
	t.Fatal("the dev stack has no pool with both labels and taints")
	return config.NodePool{}
}
