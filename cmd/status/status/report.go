package status

import (
	"time"

	"github.com/dynk8s/dynk8s/cmd/plan/plan"
)

// Report is one look at a running stack: what `status` prints, and its -o json. Each part carries the error of its
// own reads, so one unreachable service leaves the others' view intact.
type Report struct {
	Stack   string    `json:"stack"`
	Cluster string    `json:"cluster"`
	Region  string    `json:"region"`
	Time    time.Time `json:"time"`
	Pools   []Pool    `json:"pools"`
	Gateway Gateway   `json:"gateway"`
	Tunnel  Tunnel    `json:"tunnel"`
	Token   Token     `json:"joinToken"`
	// Controller is dynk8s-controller's leadership, read from its Lease.
	Controller Controller `json:"controller"`
	// Parts are the in-cluster workloads the stack runs (its Deployments and DaemonSets).
	Parts      []Part `json:"parts"`
	PartsError string `json:"partsError,omitempty"`
	// Bill is the idle bill the plan reads from the stack's config: every pool at its minimum.
	Bill      *plan.IdleBill `json:"idleBill,omitempty"`
	BillError string         `json:"idleBillError,omitempty"`
	// Problems are what needs the operator, one line each with where to look; Unread the reads that failed.
	Problems []string `json:"problems"`
	Unread   []string `json:"unread"`
}

// Pool is one node pool: its Auto Scaling group as EC2 Auto Scaling describes it, and its Nodes.
type Pool struct {
	Name  string `json:"name"`
	Group string `json:"group,omitempty"`
	Min   int    `json:"min"`
	Max   int    `json:"max"`
	// Desired is the group's desired capacity: what the Cluster Autoscaler asked for.
	Desired int `json:"desired"`
	// InService and Booting count the group's instances by lifecycle state (Pending and Pending:Wait/Proceed are
	// booting); Leaving counts those terminating.
	InService int `json:"inService"`
	Booting   int `json:"booting"`
	Leaving   int `json:"leaving"`
	// Warm is the warm pool's instances by lifecycle state (Warmed:Stopped, Warmed:Running, ...); nil with none.
	Warm *Warm `json:"warm,omitempty"`
	// Nodes are the pool's Nodes (label dynk8s.io/pool), by name.
	Nodes []Node `json:"nodes"`
	// LastScaleUp is the group's newest launch activity; nil when EC2 Auto Scaling has none on record (it keeps six
	// weeks).
	LastScaleUp *Activity `json:"lastScaleUp,omitempty"`
	Error       string    `json:"error,omitempty"`
}

// Warm is a pool's warm pool.
type Warm struct {
	// Size is the warm pool's instance count, and States counts them by lifecycle state.
	Size   int            `json:"size"`
	States map[string]int `json:"states"`
	// Stale are the warm instances launched from an older version of the group's launch template than it launches
	// now (docs/warm-pools.md: each one a scale-up takes is handed back after its start and boot), by id.
	Stale []string `json:"stale,omitempty"`
}

// Node is one Node of a pool.
type Node struct {
	Name  string `json:"name"`
	Ready bool   `json:"ready"`
	// Since is when the Ready condition last changed.
	Since *time.Time `json:"since,omitempty"`
	// Created is when the Node registered.
	Created time.Time `json:"created"`
}

// Activity is one scaling activity of a group.
type Activity struct {
	Description string     `json:"description"`
	Status      string     `json:"status"`
	Start       time.Time  `json:"start"`
	End         *time.Time `json:"end,omitempty"`
	// Instance is the instance it launched, and Ready when that instance's Node became Ready (nil: no Node of it
	// now, or not Ready).
	Instance string     `json:"instance,omitempty"`
	Ready    *time.Time `json:"ready,omitempty"`
}

// Gateway is the WireGuard gateway instance.
type Gateway struct {
	Instance string `json:"instance,omitempty"`
	// State is EC2's instance state: stopped is asleep, running awake.
	State string `json:"state,omitempty"`
	// Since is the instance's last launch or start (EC2's LaunchTime).
	Since *time.Time `json:"since,omitempty"`
	// IdleStop is how long idle it waits before it stops itself (its dynk8s:idleStop tag; "0s": never).
	IdleStop string `json:"idleStop,omitempty"`
	Error    string `json:"error,omitempty"`
}

// Tunnel is the on-prem peer's view of the tunnel, read from this host's WireGuard interface whose peer routes the
// VPC: only on the on-prem peer, as root.
type Tunnel struct {
	Interface string `json:"interface,omitempty"`
	Endpoint  string `json:"endpoint,omitempty"`
	// LastHandshake is the peer's latest handshake; nil when it has had none.
	LastHandshake *time.Time `json:"lastHandshake,omitempty"`
	// Up is a handshake within the last RejectAfter: WireGuard keeps no session older than that.
	Up            bool  `json:"up"`
	ReceivedBytes int64 `json:"receivedBytes"`
	SentBytes     int64 `json:"sentBytes"`
	// Note says why nothing was read (not the peer's host, not root); Error a read that failed.
	Note  string `json:"note,omitempty"`
	Error string `json:"error,omitempty"`
}

// Token is the join token the nodes read: its Secrets in kube-system and its SSM parameter.
type Token struct {
	// Newest is the newest token Secret's creation: the rotator's last issue. Count counts the Secrets (older ones
	// stay until the token cleaner deletes them at their expiration).
	Newest *time.Time `json:"newest,omitempty"`
	Count  int        `json:"count"`
	// Parameter is the SSM parameter, and Written its last modification: the rotator's last success (it writes the
	// parameter after the Secret).
	Parameter string     `json:"parameter"`
	Written   *time.Time `json:"written,omitempty"`
	// Every is how often the rotator issues one (the controller's default, a third of the TTL).
	Every Duration `json:"every"`
	Error string   `json:"error,omitempty"`
}

// Controller is dynk8s-controller's Lease.
type Controller struct {
	Leader  string     `json:"leader,omitempty"`
	Renewed *time.Time `json:"renewed,omitempty"`
	// Leads is a renewal within the Lease's duration: a leader runs the loops.
	Leads bool   `json:"leads"`
	Error string `json:"error,omitempty"`
}

// Part is one workload of the stack in the cluster.
type Part struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Want is the replicas (Deployment) or scheduled pods (DaemonSet) wanted, Ready those ready.
	Want  int `json:"want"`
	Ready int `json:"ready"`
}

// Duration is a time.Duration that JSON spells as Go does ("40m0s").
type Duration time.Duration

// MarshalText is the duration's String.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads what MarshalText writes.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

func (d Duration) String() string { return time.Duration(d).String() }
