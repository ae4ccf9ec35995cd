package fakeaws

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// AutoScaling is a stand-in for the EC2 Auto Scaling Query API (version 2011-01-01, XML answers) as a node calls
// it, for one instance of one group with a launch hook: DescribeAutoScalingInstances, DescribeAutoScalingGroups
// (the warm pool's launch template check), CompleteLifecycleAction and SetInstanceHealth. moto has no
// CompleteLifecycleAction, so the e2e's warm pools use this one too.
type AutoScaling struct {
	server
	inst AutoScalingInstance
	// pending says whether a lifecycle action waits for the instance (Pending:Wait, Warmed:Pending:Wait).
	pending bool
	// instanceVersion and groupVersion are the launch template versions of the instance and of the group ("": none
	// in the answer).
	instanceVersion, groupVersion string
	calls                         []string
	completed                     []string
}

// AutoScalingInstance is the one instance the fake knows, its group and the group's launch hook.
type AutoScalingInstance struct {
	ID, Group, Hook string
}

const autoscalingNS = `xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/"`

// NewAutoScaling starts an Auto Scaling that knows inst and takes requests signed with sig; it stops, and reports
// its problems, when t ends.
func NewAutoScaling(t testing.TB, sig SigV4, inst AutoScalingInstance) *AutoScaling {
	t.Helper()
	a := &AutoScaling{inst: inst}
	a.start(t, "Auto Scaling", "autoscaling", sig, func(w http.ResponseWriter, err error) {
		autoscalingError(w, http.StatusForbidden, "SignatureDoesNotMatch", err.Error())
	}, a.serve)
	return a
}

// Hold makes a lifecycle action wait for the instance, as the group does for a launch or a warm instance entering
// service.
func (a *AutoScaling) Hold() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending = true
}

// Pending says whether a lifecycle action still waits for the instance.
func (a *AutoScaling) Pending() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pending
}

// SetLaunchTemplateVersions sets the launch template versions of the instance and of its group ("": none).
func (a *AutoScaling) SetLaunchTemplateVersions(instance, group string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.instanceVersion, a.groupVersion = instance, group
}

// Calls are the calls so far, one line each: the action, then its parameters but Action and Version, sorted, as
// key=value.
func (a *AutoScaling) Calls() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

// Completed is how many lifecycle actions the instance completed with result (CONTINUE, ABANDON).
func (a *AutoScaling) Completed(result string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, r := range a.completed {
		if r == result {
			n++
		}
	}
	return n
}

func (a *AutoScaling) serve(w http.ResponseWriter, r *http.Request) {
	form, ok := a.queryForm(w, r, "2011-01-01", autoscalingError)
	if !ok {
		return
	}
	a.calls = append(a.calls, callLine(form))
	switch action := form.Get("Action"); action {
	case "DescribeAutoScalingInstances":
		member := ""
		if form.Get("InstanceIds.member.1") == a.inst.ID {
			member = fmt.Sprintf("<member><InstanceId>%s</InstanceId><AutoScalingGroupName>%s</AutoScalingGroupName>%s</member>",
				a.inst.ID, a.inst.Group, launchTemplate(a.instanceVersion))
		}
		_, _ = fmt.Fprintf(w, `<DescribeAutoScalingInstancesResponse %s><DescribeAutoScalingInstancesResult><AutoScalingInstances>%s</AutoScalingInstances></DescribeAutoScalingInstancesResult></DescribeAutoScalingInstancesResponse>`,
			autoscalingNS, member)
	case "DescribeAutoScalingGroups":
		// As EC2 Auto Scaling answers: a group it does not know is left out; the group's template, then its
		// instances, each with its own template.
		group := ""
		if form.Get("AutoScalingGroupNames.member.1") == a.inst.Group {
			group = fmt.Sprintf(`<member><AutoScalingGroupName>%s</AutoScalingGroupName>%s<Instances><member><InstanceId>%s</InstanceId>%s</member></Instances></member>`,
				a.inst.Group, launchTemplate(a.groupVersion), a.inst.ID, launchTemplate(a.instanceVersion))
		}
		_, _ = fmt.Fprintf(w, `<DescribeAutoScalingGroupsResponse %s><DescribeAutoScalingGroupsResult><AutoScalingGroups>%s</AutoScalingGroups></DescribeAutoScalingGroupsResult></DescribeAutoScalingGroupsResponse>`,
			autoscalingNS, group)
	case "CompleteLifecycleAction":
		if !a.pending || form.Get("AutoScalingGroupName") != a.inst.Group || form.Get("LifecycleHookName") != a.inst.Hook ||
			form.Get("InstanceId") != a.inst.ID {
			autoscalingError(w, http.StatusBadRequest, "ValidationError",
				"No active Lifecycle Action found with instance ID "+form.Get("InstanceId"))
			return
		}
		a.pending = false
		a.completed = append(a.completed, form.Get("LifecycleActionResult"))
		_, _ = fmt.Fprintf(w, `<CompleteLifecycleActionResponse %s><CompleteLifecycleActionResult/></CompleteLifecycleActionResponse>`, autoscalingNS)
	case "SetInstanceHealth":
		_, _ = fmt.Fprintf(w, `<SetInstanceHealthResponse %s/>`, autoscalingNS)
	default:
		a.problemf("unexpected action %q", action)
		autoscalingError(w, http.StatusBadRequest, "InvalidAction", "fake Auto Scaling knows no "+action)
	}
}

// launchTemplate is the LaunchTemplate element of an answer, nothing for version "".
func launchTemplate(version string) string {
	if version == "" {
		return ""
	}
	return "<LaunchTemplate><LaunchTemplateId>lt-0123456789abcdef0</LaunchTemplateId>" +
		"<LaunchTemplateName>lab-x86-20260101</LaunchTemplateName><Version>" + version + "</Version></LaunchTemplate>"
}

// autoscalingError answers as the Query API does for EC2 Auto Scaling.
func autoscalingError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `<ErrorResponse %s><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>fake</RequestId></ErrorResponse>`,
		autoscalingNS, code, xmlText(msg))
}

// errorAnswer answers a request with an error of the service's, in its format.
type errorAnswer func(w http.ResponseWriter, status int, code, msg string)

// queryForm reads a Query API request (a form POST) of API version, reporting one that is not; it answers a
// request it cannot read with fail. The caller holds s.mu.
func (s *server) queryForm(w http.ResponseWriter, r *http.Request, version string, fail errorAnswer) (url.Values, bool) {
	if r.Method != http.MethodPost || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		s.problemf("%s with content type %q", r.Method, r.Header.Get("Content-Type"))
	}
	if err := r.ParseForm(); err != nil {
		s.problemf("form: %v", err)
		fail(w, http.StatusBadRequest, "MalformedQueryString", err.Error())
		return nil, false
	}
	if v := r.PostForm.Get("Version"); v != version {
		s.problemf("%s: API version %q, not %s", r.PostForm.Get("Action"), v, version)
	}
	return r.PostForm, true
}

// callLine is a Query API call as the fakes record it: the action, then the other parameters but Version, sorted.
func callLine(form url.Values) string {
	var params []string
	for k := range form {
		if k != "Action" && k != "Version" {
			params = append(params, k+"="+form.Get(k))
		}
	}
	slices.Sort(params)
	return strings.Join(append([]string{form.Get("Action")}, params...), " ")
}
