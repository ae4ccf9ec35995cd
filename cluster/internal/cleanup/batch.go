package cleanup

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
)

// answerFor is how long one DescribeInstances answer serves the Nodes it was asked about: the Nodes that come due
// together (a tunnel outage makes every node NotReady at once) share one call instead of one each. A stale answer is
// safe: a gone instance (shutting-down, terminated, or unknown to EC2) never comes back, and a stale "exists" only
// keeps a Node a little longer.
const answerFor = 30 * time.Second

// answers is the last DescribeInstances answer; one call at a time, so that workers that need one wait for the
// call in flight and use its answer.
type answers struct {
	mu sync.Mutex
	// at is when it was asked; asked the instance ids it was asked about; found what EC2 knew of them.
	at    time.Time
	asked map[string]bool
	found map[string]cloud.Instance
}

// state is EC2's answer about instance at now: the instance and whether EC2 knows it. An answer younger than
// answerFor that covers instance is used as it is; otherwise EC2 is asked about instance and every other Node of
// the cache that is due (all rules but EC2's hold at now), in one call per 200.
func (c *Controller) state(ctx context.Context, instance string, now time.Time) (cloud.Instance, bool, error) {
	a := &c.answers
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.asked[instance] && now.Sub(a.at) < answerFor {
		inst, known := a.found[instance]
		return inst, known, nil
	}
	ids := append([]string{instance}, c.due(now)...)
	found, err := cloud.ByID(ctx, c.cfg.EC2, ids)
	if err != nil {
		return cloud.Instance{}, false, err
	}
	a.at, a.found, a.asked = now, found, make(map[string]bool, len(ids))
	for _, id := range ids {
		a.asked[id] = true
	}
	inst, known := found[instance]
	return inst, known, nil
}

// due are the instances of the cached pool Nodes that are due at now. A Node the rules cannot read is left out; its
// own sync reports it.
func (c *Controller) due(now time.Time) []string {
	req, err := labels.NewRequirement(c.cfg.PoolLabel, selection.Exists, nil)
	if err != nil {
		// The label key was validated in New.
		return nil
	}
	nodes, err := c.Nodes.List(labels.NewSelector().Add(*req))
	if err != nil {
		return nil
	}
	var ids []string
	for _, n := range nodes {
		if j, err := judge(c.cfg, n, now); err == nil && j.verdict == ask {
			ids = append(ids, j.instance)
		}
	}
	return ids
}
