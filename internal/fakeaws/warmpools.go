package fakeaws

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// WarmPools is a stand-in for the EC2 Auto Scaling Query API (version 2011-01-01, XML answers) as the
// controller's warm pools' loop calls it: DescribeAutoScalingGroups (a group's launch template version and warm
// pool configuration) and DescribeWarmPool (its warm instances, each with the version it was launched from and its
// lifecycle state, in pages) of the groups the test sets up. Replace does what the group does when one of its warm
// instances is terminated: it leaves the pool, and a new instance of the group's current version takes its place,
// preparing (the EC2 Auto Scaling User Guide's warm pool page, "Updating instances in a warm pool", in its earlier
// edition). moto models no warm instances, so the loop's tests use this one.
type WarmPools struct {
	server
	groups map[string]*WarmGroup
	// pageSize is how many instances a DescribeWarmPool page holds.
	pageSize int
	// failures answers calls of an action with an error code, by action.
	failures map[string]string
	launched int
	calls    []string
}

// WarmGroup is a group the fake knows.
type WarmGroup struct {
	// Version is the launch template version the group launches ("": none in the answer).
	Version string
	// NoWarmPool: the group has none (DescribeWarmPool answers no instance and no configuration).
	NoWarmPool bool
	Instances  []WarmInstance
}

// WarmInstance is an instance of a group's warm pool.
type WarmInstance struct {
	// ID, the launch template Version it was launched from, and its LifecycleState ("Warmed:Stopped", ...).
	ID, Version, State string
}

// NewWarmPools starts an Auto Scaling that knows groups and takes requests signed with sig; it stops, and reports
// its problems, when t ends.
func NewWarmPools(t testing.TB, sig SigV4, groups map[string]WarmGroup) *WarmPools {
	t.Helper()
	p := &WarmPools{groups: map[string]*WarmGroup{}, pageSize: 50, failures: map[string]string{}}
	for name, g := range groups {
		g.Instances = slices.Clone(g.Instances)
		p.groups[name] = &g
	}
	p.start(t, "Auto Scaling", "autoscaling", sig, func(w http.ResponseWriter, err error) {
		autoscalingError(w, http.StatusForbidden, "SignatureDoesNotMatch", err.Error())
	}, p.serve)
	return p
}

// PageSize makes each DescribeWarmPool page hold n instances at most.
func (p *WarmPools) PageSize(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pageSize = n
}

// Fail answers every call of action with code (HTTP 400) until Fail(action, "").
func (p *WarmPools) Fail(action, code string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failures[action] = code
}

// SetVersion gives group's launch template a new version, as a `pulumi up` does.
func (p *WarmPools) SetVersion(group, version string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.groups[group].Version = version
}

// Warm are the instances of group's warm pool, in the order the fake answers them.
func (p *WarmPools) Warm(group string) []WarmInstance {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.groups[group].Instances)
}

// Calls are the calls so far, each as its action and its parameters but Version, sorted.
func (p *WarmPools) Calls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// Replace is what the groups do when EC2 terminates instances ids (EC2.OnTerminate): each warm instance among
// them leaves its pool, and a new one, launched from its group's current version, starts preparing in its place.
func (p *WarmPools) Replace(ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(p.groups)) {
		g := p.groups[name]
		for i, in := range g.Instances {
			if !slices.Contains(ids, in.ID) {
				continue
			}
			p.launched++
			g.Instances[i] = WarmInstance{ID: fmt.Sprintf("i-0feed%012x", p.launched), Version: g.Version,
				State: "Warmed:Pending"}
		}
	}
}

func (p *WarmPools) serve(w http.ResponseWriter, r *http.Request) {
	form, ok := p.queryForm(w, r, "2011-01-01", autoscalingError)
	if !ok {
		return
	}
	p.calls = append(p.calls, callLine(form))
	action := form.Get("Action")
	if code := p.failures[action]; code != "" {
		autoscalingError(w, http.StatusBadRequest, code, "fake Auto Scaling says no")
		return
	}
	switch action {
	case "DescribeAutoScalingGroups":
		var b strings.Builder
		for i := 1; form.Get(fmt.Sprintf("AutoScalingGroupNames.member.%d", i)) != ""; i++ {
			name := form.Get(fmt.Sprintf("AutoScalingGroupNames.member.%d", i))
			g, ok := p.groups[name]
			if !ok {
				continue // as EC2 Auto Scaling answers: a group it does not know is left out
			}
			fmt.Fprintf(&b, `<member><AutoScalingGroupName>%s</AutoScalingGroupName>%s%s</member>`, xmlText(name),
				launchTemplate(g.Version), warmPoolConfiguration(g))
		}
		_, _ = fmt.Fprintf(w, `<DescribeAutoScalingGroupsResponse %s><DescribeAutoScalingGroupsResult><AutoScalingGroups>%s</AutoScalingGroups></DescribeAutoScalingGroupsResult></DescribeAutoScalingGroupsResponse>`,
			autoscalingNS, b.String())
	case "DescribeWarmPool":
		name := form.Get("AutoScalingGroupName")
		g, ok := p.groups[name]
		if !ok {
			autoscalingError(w, http.StatusBadRequest, "ValidationError", "AutoScalingGroup name not found - "+name)
			return
		}
		page := 0
		if token := form.Get("NextToken"); token != "" {
			if _, err := fmt.Sscanf(token, "page-%d", &page); err != nil {
				p.problemf("DescribeWarmPool: NextToken %q is none the fake gave", token)
			}
		}
		var instances []WarmInstance
		if !g.NoWarmPool {
			instances = g.Instances
		}
		from, to := min(page*p.pageSize, len(instances)), min((page+1)*p.pageSize, len(instances))
		var b strings.Builder
		for _, in := range instances[from:to] {
			fmt.Fprintf(&b, `<member><InstanceId>%s</InstanceId><InstanceType>c7i.2xlarge</InstanceType>`+
				`<AvailabilityZone>eu-central-1a</AvailabilityZone><LifecycleState>%s</LifecycleState>`+
				`<HealthStatus>Healthy</HealthStatus>%s<ProtectedFromScaleIn>false</ProtectedFromScaleIn></member>`,
				in.ID, in.State, launchTemplate(in.Version))
		}
		next := ""
		if to < len(instances) {
			next = fmt.Sprintf("<NextToken>page-%d</NextToken>", page+1)
		}
		_, _ = fmt.Fprintf(w, `<DescribeWarmPoolResponse %s><DescribeWarmPoolResult>%s<Instances>%s</Instances>%s</DescribeWarmPoolResult></DescribeWarmPoolResponse>`,
			autoscalingNS, warmPoolConfiguration(g), b.String(), next)
	default:
		p.problemf("unexpected action %q", action)
		autoscalingError(w, http.StatusBadRequest, "InvalidAction", "fake Auto Scaling knows no "+action)
	}
}

// warmPoolConfiguration is a group's WarmPoolConfiguration element, nothing for a group without a warm pool.
func warmPoolConfiguration(g *WarmGroup) string {
	if g.NoWarmPool {
		return ""
	}
	return `<WarmPoolConfiguration><MinSize>0</MinSize><PoolState>Stopped</PoolState></WarmPoolConfiguration>`
}
