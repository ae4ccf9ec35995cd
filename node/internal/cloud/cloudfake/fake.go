// Package cloudfake holds in-process fakes of the AWS clients the agent's cloud package takes: each answers as its
// service does, in the SDK's types, and records what it was asked.
package cloudfake

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	astypes "github.com/aws/aws-sdk-go-v2/service/autoscaling/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/dynk8s/dynk8s/node/internal/cloud"
)

// The fakes' instance, group, launch hook, join token parameter and token, gateway, and the cluster CA's pin.
const (
	InstanceID     = "i-0123456789abcdef0"
	Group          = "homelab-spot-arm64-asg-1a2b3c"
	Hook           = "dynk8s-launch"
	TokenParameter = "/dynk8s/test/join-token"
	Token          = "k7x2qa.0f9e8d7c6b5a4z3y"
	GatewayID      = "i-0feedfacecafe0001"
	CAHash         = "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// APIErr is an AWS error answer as the SDK returns it: the HTTP status and the service's code and message.
func APIErr(status int, code, msg string) error {
	return &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
		Err:      &smithy.GenericAPIError{Code: code, Message: msg},
	}
}

// IMDS answers the instance identity paths and the target lifecycle state.
type IMDS struct {
	mu            sync.Mutex
	values        map[string]string
	TokenFailures int
	Requests      int
}

// NewIMDS is InstanceID in eu-central-1 in lifecycle state lifecycle ("": none, 404) and partition domain ("":
// amazonaws.com).
func NewIMDS(lifecycle, domain string) *IMDS {
	f := &IMDS{values: map[string]string{
		"instance-id": InstanceID, "placement/availability-zone": "eu-central-1a",
		"placement/region": "eu-central-1", "services/domain": "amazonaws.com", "local-ipv4": "10.100.1.23",
		"instance-type": "m7g.large",
	}}
	if domain != "" {
		f.values["services/domain"] = domain
	}
	f.SetLifecycle(lifecycle)
	return f
}

// SetLifecycle moves the instance to state ("": none).
func (f *IMDS) SetLifecycle(state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if state == "" {
		delete(f.values, cloud.LifecyclePath)
	} else {
		f.values[cloud.LifecyclePath] = state
	}
}

// Get answers a meta-data path, 404 for one it does not have.
func (f *IMDS) Get(_ context.Context, path string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Requests++
	if f.TokenFailures > 0 {
		f.TokenFailures--
		return "", &cloud.IMDSErr{What: "IMDSv2 token", Status: 503}
	}
	v, ok := f.values[path]
	if !ok {
		return "", &cloud.IMDSErr{What: "IMDS meta-data/" + path, Status: 404}
	}
	return v, nil
}

// SSM holds one SecureString parameter: Name (empty: TokenParameter, the join token's).
type SSM struct {
	mu   sync.Mutex
	Name string
	// Failures answers that many calls with AccessDeniedException first; negative: every call.
	Failures int
	Value    string
	// Queued values are served one per call before value; "" answers ParameterNotFound.
	Queued   []string
	Requests int
}

// GetParameter answers the parameter, decrypted.
func (f *SSM) GetParameter(_ context.Context, in *ssm.GetParameterInput, _ ...func(*ssm.Options)) (*ssm.GetParameterOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Requests++
	name := f.Name
	if name == "" {
		name = TokenParameter
	}
	if aws.ToString(in.Name) != name || !aws.ToBool(in.WithDecryption) {
		return nil, fmt.Errorf("fake SSM: unexpected request %s (decrypt %v)", aws.ToString(in.Name), aws.ToBool(in.WithDecryption))
	}
	if f.Failures != 0 {
		f.Failures--
		return nil, APIErr(400, "AccessDeniedException", "fake SSM says no")
	}
	v := f.Value
	if len(f.Queued) > 0 {
		v, f.Queued = f.Queued[0], f.Queued[1:]
	}
	if v == "" {
		return nil, APIErr(400, "ParameterNotFound", "")
	}
	return &ssm.GetParameterOutput{Parameter: &ssmtypes.Parameter{Name: in.Name, Value: aws.String(v)}}, nil
}

// AutoScaling is the instance's group, its launch template versions and its lifecycle actions.
type AutoScaling struct {
	Mu sync.Mutex
	// PendingAction: a lifecycle action waits for the instance (Pending:Wait, Warmed:Pending:Wait).
	PendingAction bool
	// InstanceVersion and groupVersion are the launch template versions ("": none given).
	InstanceVersion, GroupVersion string
	calls                         []string
}

func (f *AutoScaling) record(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func template(version string) *astypes.LaunchTemplateSpecification {
	if version == "" {
		return nil
	}
	return &astypes.LaunchTemplateSpecification{LaunchTemplateId: aws.String("lt-0123456789abcdef0"), Version: aws.String(version)}
}

// DescribeAutoScalingInstances answers as Auto Scaling does, and records the call.
func (f *AutoScaling) DescribeAutoScalingInstances(_ context.Context, in *autoscaling.DescribeAutoScalingInstancesInput,
	_ ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingInstancesOutput, error) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.record("DescribeAutoScalingInstances %s", strings.Join(in.InstanceIds, ","))
	out := &autoscaling.DescribeAutoScalingInstancesOutput{}
	if slices.Equal(in.InstanceIds, []string{InstanceID}) {
		out.AutoScalingInstances = []astypes.AutoScalingInstanceDetails{{InstanceId: aws.String(InstanceID),
			AutoScalingGroupName: aws.String(Group), LaunchTemplate: template(f.InstanceVersion)}}
	}
	return out, nil
}

// DescribeAutoScalingGroups answers as Auto Scaling does, and records the call.
func (f *AutoScaling) DescribeAutoScalingGroups(_ context.Context, in *autoscaling.DescribeAutoScalingGroupsInput,
	_ ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.record("DescribeAutoScalingGroups %s", strings.Join(in.AutoScalingGroupNames, ","))
	if f.GroupVersion == "" || !slices.Equal(in.AutoScalingGroupNames, []string{Group}) {
		return nil, APIErr(400, "ValidationError", "fake autoscaling knows no such group")
	}
	return &autoscaling.DescribeAutoScalingGroupsOutput{AutoScalingGroups: []astypes.AutoScalingGroup{{
		AutoScalingGroupName: aws.String(Group), LaunchTemplate: template(f.GroupVersion)}}}, nil
}

// CompleteLifecycleAction answers as Auto Scaling does, and records the call.
func (f *AutoScaling) CompleteLifecycleAction(_ context.Context, in *autoscaling.CompleteLifecycleActionInput,
	_ ...func(*autoscaling.Options)) (*autoscaling.CompleteLifecycleActionOutput, error) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.record("CompleteLifecycleAction %s %s %s %s", aws.ToString(in.AutoScalingGroupName), aws.ToString(in.LifecycleHookName),
		aws.ToString(in.InstanceId), aws.ToString(in.LifecycleActionResult))
	if !f.PendingAction || aws.ToString(in.AutoScalingGroupName) != Group {
		return nil, APIErr(400, "ValidationError", "No active Lifecycle Action found with instance ID "+aws.ToString(in.InstanceId))
	}
	f.PendingAction = false
	return &autoscaling.CompleteLifecycleActionOutput{}, nil
}

// SetInstanceHealth answers as Auto Scaling does, and records the call.
func (f *AutoScaling) SetInstanceHealth(_ context.Context, in *autoscaling.SetInstanceHealthInput,
	_ ...func(*autoscaling.Options)) (*autoscaling.SetInstanceHealthOutput, error) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.record("SetInstanceHealth %s %s", aws.ToString(in.InstanceId), aws.ToString(in.HealthStatus))
	return &autoscaling.SetInstanceHealthOutput{}, nil
}

// Recorded is the calls so far.
func (f *AutoScaling) Recorded() []string {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	return slices.Clone(f.calls)
}

// EC2 is StartInstances of the one gateway, through its states (idempotent on a running instance, refused while
// it is stopping), and DescribeInstances over Instances with its filters applied as EC2 does, in pages.
type EC2 struct {
	mu    sync.Mutex
	State string
	// StoppingCalls: starts refused (IncorrectInstanceState) while stopping; haltingCalls: starts a running gateway
	// still answers "running" while its OS powers off, after which it is stopping.
	StoppingCalls, HaltingCalls int
	// Failures answers that many calls with failCode (failStatus) first; negative: every call.
	Failures   int
	FailCode   string
	FailStatus int
	calls      int
	// Instances are what DescribeInstances knows; EmptyPages answers that many pages with no instance and a
	// NextToken first, as EC2 may with filters.
	Instances  []Instance
	EmptyPages int
	// Tokens are the NextToken each DescribeInstances call sent ("" for none), Filters each call's filters.
	Tokens  []string
	Filters []map[string][]string
	// TagFailures answers that many CreateTags calls with TagFailCode (TagFailStatus) first; negative: every call.
	// They are apart from Failures, which the gateway's wake-up beside the join would share.
	TagFailures   int
	TagFailCode   string
	TagFailStatus int
	tagged        []string
	// Volumes are the build cache's volumes (volumes.go).
	Volumes Volumes
}

// CreateTags tags InstanceID (the boot's own instance) or one of Instances, as EC2 does: an unknown instance is
// InvalidInstanceID.NotFound, and nothing is tagged. Each call is recorded as "CreateTags <ids> <key>=<value>...".
func (f *EC2) CreateTags(_ context.Context, in *ec2.CreateTagsInput, _ ...func(*ec2.Options)) (*ec2.CreateTagsOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	line := "CreateTags " + strings.Join(in.Resources, ",")
	for _, t := range in.Tags {
		line += " " + aws.ToString(t.Key) + "=" + aws.ToString(t.Value)
	}
	f.tagged = append(f.tagged, line)
	if f.TagFailures != 0 {
		f.TagFailures--
		return nil, APIErr(f.TagFailStatus, f.TagFailCode, "fake EC2 says no")
	}
	var targets []int
	for _, id := range in.Resources {
		i := slices.IndexFunc(f.Instances, func(i Instance) bool { return i.ID == id })
		if i < 0 && id != InstanceID {
			return nil, APIErr(400, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id))
		}
		if i < 0 {
			f.Instances = append(f.Instances, Instance{ID: InstanceID, State: "running"})
			i = len(f.Instances) - 1
		}
		targets = append(targets, i)
	}
	for _, i := range targets {
		if f.Instances[i].Tags == nil {
			f.Instances[i].Tags = map[string]string{}
		}
		for _, t := range in.Tags {
			f.Instances[i].Tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
		}
	}
	return &ec2.CreateTagsOutput{}, nil
}

// Tagged is the CreateTags calls so far, as CreateTags records them.
func (f *EC2) Tagged() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.tagged)
}

// Tags are the tags of instance id ("" is InstanceID), nil for one with none.
func (f *EC2) Tags(id string) map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id == "" {
		id = InstanceID
	}
	for _, i := range f.Instances {
		if i.ID == id {
			return maps.Clone(i.Tags)
		}
	}
	return nil
}

// Instance is one instance DescribeInstances knows, its tags included.
type Instance struct {
	ID, State string
	Tags      map[string]string
}

// StartInstances starts the gateway, or answers with the error set for it.
func (f *EC2) StartInstances(_ context.Context, in *ec2.StartInstancesInput, _ ...func(*ec2.Options)) (*ec2.StartInstancesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.Failures != 0 {
		f.Failures--
		return nil, APIErr(f.FailStatus, f.FailCode, "fake EC2 says no")
	}
	if !slices.Equal(in.InstanceIds, []string{GatewayID}) {
		return nil, APIErr(400, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", in.InstanceIds[0]))
	}
	halting := false
	if f.State == "running" && f.HaltingCalls > 0 {
		f.HaltingCalls--
		halting = f.HaltingCalls == 0
	}
	if f.State == "stopping" {
		if f.StoppingCalls > 0 {
			f.StoppingCalls--
			return nil, APIErr(400, "IncorrectInstanceState", "The instance is not in a state from which it can be started.")
		}
		f.State = "stopped"
	}
	previous, current := f.State, ec2types.InstanceStateNameRunning
	if previous == "stopped" {
		current = ec2types.InstanceStateNamePending
	}
	f.State = "running"
	if halting {
		f.State = "stopping"
	}
	return &ec2.StartInstancesOutput{StartingInstances: []ec2types.InstanceStateChange{{InstanceId: aws.String(GatewayID),
		CurrentState:  &ec2types.InstanceState{Name: current},
		PreviousState: &ec2types.InstanceState{Name: ec2types.InstanceStateName(previous)}}}}, nil
}

// Started is how many StartInstances calls were made.
func (f *EC2) Started() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// DescribeInstances answers Instances that pass every filter (tag:KEY, tag-key, instance-state-name), EmptyPages
// empty pages first, or the failure set for it; it records each call's filters and token.
func (f *EC2) DescribeInstances(_ context.Context, in *ec2.DescribeInstancesInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Tokens = append(f.Tokens, aws.ToString(in.NextToken))
	filters := map[string][]string{}
	for _, flt := range in.Filters {
		filters[aws.ToString(flt.Name)] = flt.Values
	}
	f.Filters = append(f.Filters, filters)
	if f.Failures != 0 {
		f.Failures--
		return nil, APIErr(f.FailStatus, f.FailCode, "fake EC2 says no")
	}
	page := 0
	if tok := aws.ToString(in.NextToken); tok != "" {
		if _, err := fmt.Sscanf(tok, "page-%d", &page); err != nil {
			return nil, APIErr(400, "InvalidParameterValue", fmt.Sprintf("NextToken %q is none this fake gave", tok))
		}
	}
	if page < f.EmptyPages {
		return &ec2.DescribeInstancesOutput{NextToken: aws.String(fmt.Sprintf("page-%d", page+1))}, nil
	}
	out := &ec2.DescribeInstancesOutput{}
	for _, i := range f.Instances {
		if matches(i, filters) {
			out.Reservations = append(out.Reservations, ec2types.Reservation{Instances: []ec2types.Instance{{
				InstanceId: aws.String(i.ID), State: &ec2types.InstanceState{Name: ec2types.InstanceStateName(i.State)}}}})
		}
	}
	return out, nil
}

// matches says whether i passes every filter, as EC2 applies them: each names one of the values.
func matches(i Instance, filters map[string][]string) bool {
	for name, values := range filters {
		switch {
		case name == "instance-state-name":
			if !slices.Contains(values, i.State) {
				return false
			}
		case name == "tag-key":
			if !slices.ContainsFunc(values, func(k string) bool { _, ok := i.Tags[k]; return ok }) {
				return false
			}
		case strings.HasPrefix(name, "tag:"):
			v, ok := i.Tags[strings.TrimPrefix(name, "tag:")]
			if !ok || !slices.Contains(values, v) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// Described is how many DescribeInstances calls were made.
func (f *EC2) Described() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.Tokens)
}
