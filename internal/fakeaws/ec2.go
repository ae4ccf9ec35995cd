package fakeaws

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// EC2 is a stand-in for the EC2 Query API (version 2016-11-15, XML answers) as the node agent calls it:
// DescribeInstances over the instances the test adds, applying its filters as EC2 does and in pages,
// StartInstances (the gateway's wake-up), through the instances' states, CreateTags (the join's kubelet key
// hash, the controller's mark on cache volumes), which a later Describe shows, TerminateInstances (the
// controller's stale warm instances), and DescribeVolumes and DeleteVolume (the controller's cache volumes).
type EC2 struct {
	server
	instances []*EC2Instance
	// failures answers that many calls with failCode (HTTP failStatus) first; negative: every call.
	failures   int
	failCode   string
	failStatus int
	// emptyPages answers that many DescribeInstances pages with no instance and a NextToken first, as EC2 may
	// with filters.
	emptyPages int
	actions    []string
	tokens     []string
	filters    []map[string][]string
	tagCalls   []string
	terminated []string
	// onTerminate is told the instances each TerminateInstances terminates.
	onTerminate func(ids []string)
	// volumes are the EBS volumes the fake knows (volumes.go), deleted those DeleteVolume deleted.
	volumes            []*EC2Volume
	deleted            []string
	attachBeforeDelete map[string]string
}

// EC2Instance is an instance the fake knows.
type EC2Instance struct {
	ID, State string
	Tags      map[string]string
	// StartsRefused is how many starts a stopping instance refuses (IncorrectInstanceState) before it has
	// stopped.
	StartsRefused int
}

const ec2NS = `xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"`

// NewEC2 starts an EC2 that knows instances and takes requests signed with sig; it stops, and reports its
// problems, when t ends.
func NewEC2(t testing.TB, sig SigV4, instances ...EC2Instance) *EC2 {
	t.Helper()
	e := &EC2{}
	e.AddInstances(instances...)
	e.start(t, "EC2", "ec2", sig, func(w http.ResponseWriter, err error) {
		ec2Error(w, http.StatusUnauthorized, "AuthFailure", err.Error())
	}, e.serve)
	return e
}

// AddInstances makes instances known.
func (e *EC2) AddInstances(instances ...EC2Instance) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, in := range instances {
		e.instances = append(e.instances, &in)
	}
}

// Fail answers the next n calls (every call: n < 0) with HTTP status and code, message "fake EC2 says no".
func (e *EC2) Fail(n, status int, code string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failures, e.failStatus, e.failCode = n, status, code
}

// EmptyPages makes the first n pages of each DescribeInstances listing empty, each with a NextToken.
func (e *EC2) EmptyPages(n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.emptyPages = n
}

// Actions are the actions called so far, in order.
func (e *EC2) Actions() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.actions)
}

// Tokens are the NextToken each DescribeInstances call sent, "" for none.
func (e *EC2) Tokens() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.tokens)
}

// Filters are the filters each DescribeInstances call sent: each filter's values by its name.
func (e *EC2) Filters() []map[string][]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.filters)
}

// TagCalls are the CreateTags calls so far, failed ones too, each as its action and its parameters but Version,
// sorted ("CreateTags ResourceId.1=i-... Tag.1.Key=... Tag.1.Value=...").
func (e *EC2) TagCalls() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.tagCalls)
}

// OnTerminate makes f be told the instances each TerminateInstances terminates (WarmPools.Replace: their group
// replaces them).
func (e *EC2) OnTerminate(f func(ids []string)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onTerminate = f
}

// Terminated are the instances terminated so far, in order.
func (e *EC2) Terminated() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.terminated)
}

// Tags are the tags of instance id, nil for one the fake does not know.
func (e *EC2) Tags(id string) map[string]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if in := e.instance(id); in != nil {
		return maps.Clone(in.Tags)
	}
	return nil
}

// State is the state of instance id, "" for one the fake does not know.
func (e *EC2) State(id string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if in := e.instance(id); in != nil {
		return in.State
	}
	return ""
}

func (e *EC2) instance(id string) *EC2Instance {
	for _, in := range e.instances {
		if in.ID == id {
			return in
		}
	}
	return nil
}

func (e *EC2) serve(w http.ResponseWriter, r *http.Request) {
	form, ok := e.queryForm(w, r, "2016-11-15", ec2Error)
	if !ok {
		return
	}
	action := form.Get("Action")
	e.actions = append(e.actions, action)
	var filters map[string][]string
	if action == "DescribeVolumes" {
		filters = queryFilters(form)
	}
	if action == "DescribeInstances" {
		filters = queryFilters(form)
		e.filters = append(e.filters, filters)
		e.tokens = append(e.tokens, form.Get("NextToken"))
	}
	if action == "CreateTags" {
		e.tagCalls = append(e.tagCalls, callLine(form))
	}
	if e.failures != 0 {
		e.failures--
		ec2Error(w, e.failStatus, e.failCode, "fake EC2 says no")
		return
	}
	switch action {
	case "DescribeInstances":
		e.describe(w, form.Get("NextToken"), filters)
	case "StartInstances":
		e.start1(w, form)
	case "CreateTags":
		e.createTags(w, form)
	case "TerminateInstances":
		e.terminate(w, form)
	case "DescribeVolumes":
		e.describeVolumes(w, filters)
	case "DeleteVolume":
		e.deleteVolume(w, form)
	default:
		e.problemf("unexpected action %q", action)
		ec2Error(w, http.StatusBadRequest, "InvalidAction", "The action "+action+" is not valid for this web service.")
	}
}

// queryFilters are a Query API request's Filter.N.Name and Filter.N.Value.M.
func queryFilters(form url.Values) map[string][]string {
	filters := map[string][]string{}
	for i := 1; form.Get(fmt.Sprintf("Filter.%d.Name", i)) != ""; i++ {
		name := form.Get(fmt.Sprintf("Filter.%d.Name", i))
		for j := 1; form.Get(fmt.Sprintf("Filter.%d.Value.%d", i, j)) != ""; j++ {
			filters[name] = append(filters[name], form.Get(fmt.Sprintf("Filter.%d.Value.%d", i, j)))
		}
	}
	return filters
}

// matches says whether in passes every filter (each one of its values), for the filters dynk8s sends.
func (e *EC2) matches(in *EC2Instance, filters map[string][]string) bool {
	for name, values := range filters {
		var have []string
		switch {
		case name == "instance-state-name":
			have = []string{in.State}
		case name == "instance-id":
			have = []string{in.ID}
		case name == "tag-key":
			have = slices.Collect(maps.Keys(in.Tags))
		case strings.HasPrefix(name, "tag:"):
			if v, ok := in.Tags[strings.TrimPrefix(name, "tag:")]; ok {
				have = []string{v}
			}
		default:
			e.problemf("DescribeInstances: a filter the fake does not know: %s", name)
			return false
		}
		if !slices.ContainsFunc(values, func(v string) bool { return slices.Contains(have, v) }) {
			return false
		}
	}
	return true
}

func (e *EC2) describe(w http.ResponseWriter, token string, filters map[string][]string) {
	page := 0
	if token != "" {
		if _, err := fmt.Sscanf(token, "page-%d", &page); err != nil {
			e.problemf("DescribeInstances: NextToken %q is none the fake gave", token)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<DescribeInstancesResponse %s><requestId>fake</requestId>`, ec2NS)
	if page < e.emptyPages {
		fmt.Fprintf(&b, `<reservationSet/><nextToken>page-%d</nextToken></DescribeInstancesResponse>`, page+1)
		_, _ = io.WriteString(w, b.String())
		return
	}
	b.WriteString(`<reservationSet>`)
	for _, in := range e.instances {
		if !e.matches(in, filters) {
			continue
		}
		fmt.Fprintf(&b, `<item><reservationId>r-%s</reservationId><instancesSet><item><instanceId>%s</instanceId>`+
			`<instanceState><code>%d</code><name>%s</name></instanceState><tagSet>`, strings.TrimPrefix(in.ID, "i-"), in.ID,
			stateCodes[in.State], in.State)
		for _, k := range slices.Sorted(maps.Keys(in.Tags)) {
			fmt.Fprintf(&b, `<item><key>%s</key><value>%s</value></item>`, xmlText(k), xmlText(in.Tags[k]))
		}
		b.WriteString(`</tagSet></item></instancesSet></item>`)
	}
	b.WriteString(`</reservationSet></DescribeInstancesResponse>`)
	_, _ = io.WriteString(w, b.String())
}

// stateCodes are the instance state codes of EC2's InstanceState.
var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64,
	"stopped": 80}

// start1 is StartInstances of one instance: idempotent on a running one, refused while one is stopping.
func (e *EC2) start1(w http.ResponseWriter, form url.Values) {
	id := form.Get("InstanceId.1")
	if form.Get("InstanceId.2") != "" {
		e.problemf("StartInstances of more than one instance")
	}
	in := e.instance(id)
	if in == nil {
		ec2Error(w, http.StatusBadRequest, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id))
		return
	}
	if in.State == "stopping" {
		if in.StartsRefused > 0 {
			in.StartsRefused--
			ec2Error(w, http.StatusBadRequest, "IncorrectInstanceState",
				fmt.Sprintf("The instance '%s' is not in a state from which it can be started.", id))
			return
		}
		in.State = "stopped"
	}
	previous, current := in.State, "running"
	if previous == "stopped" {
		current = "pending"
	}
	in.State = "running"
	_, _ = fmt.Fprintf(w, `<StartInstancesResponse %s><requestId>fake</requestId><instancesSet><item>`+
		`<instanceId>%s</instanceId><currentState><code>%d</code><name>%s</name></currentState>`+
		`<previousState><code>%d</code><name>%s</name></previousState></item></instancesSet></StartInstancesResponse>`,
		ec2NS, id, stateCodes[current], current, stateCodes[previous], previous)
}

// terminate is TerminateInstances (EC2 API Reference: InstanceId.N) of instances the fake knows: every one must be
// known, else the answer is InvalidInstanceID.NotFound and nothing is terminated; each goes to shutting-down (a
// terminated one stays terminated), and the answer gives each one's states.
func (e *EC2) terminate(w http.ResponseWriter, form url.Values) {
	var targets []*EC2Instance
	for i := 1; form.Get(fmt.Sprintf("InstanceId.%d", i)) != ""; i++ {
		id := form.Get(fmt.Sprintf("InstanceId.%d", i))
		in := e.instance(id)
		if in == nil {
			ec2Error(w, http.StatusBadRequest, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id))
			return
		}
		targets = append(targets, in)
	}
	if len(targets) == 0 {
		e.problemf("TerminateInstances without an instance")
		ec2Error(w, http.StatusBadRequest, "MissingParameter", "The request must contain the parameter InstanceId")
		return
	}
	var b strings.Builder
	var ids []string
	for _, in := range targets {
		previous := in.State
		if previous != "terminated" {
			in.State = "shutting-down"
		}
		ids = append(ids, in.ID)
		fmt.Fprintf(&b, `<item><instanceId>%s</instanceId><currentState><code>%d</code><name>%s</name></currentState>`+
			`<previousState><code>%d</code><name>%s</name></previousState></item>`,
			in.ID, stateCodes[in.State], in.State, stateCodes[previous], previous)
	}
	e.terminated = append(e.terminated, ids...)
	if e.onTerminate != nil {
		e.onTerminate(ids)
	}
	_, _ = fmt.Fprintf(w, `<TerminateInstancesResponse %s><requestId>fake</requestId><instancesSet>%s</instancesSet></TerminateInstancesResponse>`,
		ec2NS, b.String())
}

// createTags is CreateTags (EC2 API Reference: ResourceId.N, Tag.N.Key, Tag.N.Value) of instances and volumes the
// fake knows:
// every one must be known, else the answer is InvalidInstanceID.NotFound and nothing is tagged; a key already there
// takes the new value, as EC2 does.
func (e *EC2) createTags(w http.ResponseWriter, form url.Values) {
	var targets []*map[string]string
	for i := 1; form.Get(fmt.Sprintf("ResourceId.%d", i)) != ""; i++ {
		id := form.Get(fmt.Sprintf("ResourceId.%d", i))
		if v := e.volume(id); v != nil {
			targets = append(targets, &v.Tags)
			continue
		}
		in := e.instance(id)
		if in == nil {
			ec2Error(w, http.StatusBadRequest, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id))
			return
		}
		targets = append(targets, &in.Tags)
	}
	tags := map[string]string{}
	for i := 1; form.Get(fmt.Sprintf("Tag.%d.Key", i)) != ""; i++ {
		tags[form.Get(fmt.Sprintf("Tag.%d.Key", i))] = form.Get(fmt.Sprintf("Tag.%d.Value", i))
	}
	if len(targets) == 0 || len(tags) == 0 {
		e.problemf("CreateTags without a resource or a tag: %s", callLine(form))
		ec2Error(w, http.StatusBadRequest, "MissingParameter", "The request must contain the parameter resourceIdSet and tagSet")
		return
	}
	for _, t := range targets {
		// A copy: the map may be the test's own, from AddInstances.
		*t = maps.Clone(*t)
		if *t == nil {
			*t = map[string]string{}
		}
		maps.Copy(*t, tags)
	}
	_, _ = fmt.Fprintf(w, `<CreateTagsResponse %s><requestId>fake</requestId><return>true</return></CreateTagsResponse>`, ec2NS)
}

// ec2Error answers as EC2's Query API does.
func ec2Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>fake</RequestID></Response>`,
		code, xmlText(msg))
}
