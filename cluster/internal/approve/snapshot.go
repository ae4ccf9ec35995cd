package approve

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
)

// snapshotGap is the least time between the starts of two DescribeInstances calls: a flood of CSRs costs EC2 one
// call every two seconds at most, however many names it claims.
const snapshotGap = 2 * time.Second

// describeTimeout bounds one DescribeInstances call (its pages included), so that a hung EC2 fails the
// judgements waiting for it instead of holding them.
const describeTimeout = 30 * time.Second

// snapshot is EC2's answer about the cluster's live instances, and when the call that got it started.
type snapshot struct {
	start time.Time
	live  map[string]cloud.Instance
	err   error
	done  chan struct{} // closed once live or err is set
}

// snapshots shares EC2 snapshots among the judge workers: one call at a time, at most one per snapshotGap, and a
// worker that needs a snapshot started after some time waits for the next call rather than making its own.
type snapshots struct {
	ec2     cloud.EC2
	cluster string
	clock   clock.WithTicker
	seconds prometheus.Histogram

	mu       sync.Mutex
	last     *snapshot // the last finished call
	inflight *snapshot // the call under way, or nil
	ctx      context.Context
}

// after returns a snapshot whose call started after t, waiting for one; the error is EC2's when the call a worker
// waited for failed (the judgement waits: it fails closed), or ctx's.
func (s *snapshots) after(ctx context.Context, t time.Time) (*snapshot, error) {
	for {
		s.mu.Lock()
		if l := s.last; l != nil && l.err == nil && l.start.After(t) {
			s.mu.Unlock()
			return l, nil
		}
		call := s.inflight
		if call == nil {
			call = &snapshot{done: make(chan struct{})}
			s.inflight = call
			go s.describe(call, s.last)
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-call.done:
		}
		if call.err != nil {
			return nil, call.err
		}
		if call.start.After(t) {
			return call, nil
		}
	}
}

// describe makes call, snapshotGap after the start of previous at the earliest.
func (s *snapshots) describe(call, previous *snapshot) {
	s.mu.Lock()
	ctx := s.ctx
	s.mu.Unlock()
	if previous != nil {
		if wait := previous.start.Add(snapshotGap).Sub(s.clock.Now()); wait > 0 {
			select {
			case <-ctx.Done():
			case <-s.clock.After(wait):
			}
		}
	}
	call.start = s.clock.Now()
	if err := ctx.Err(); err != nil {
		call.err = err
	} else {
		cctx, cancel := context.WithTimeout(ctx, describeTimeout)
		call.live, call.err = cloud.LiveOfCluster(cctx, s.ec2, s.cluster)
		cancel()
		s.seconds.Observe(s.clock.Since(call.start).Seconds())
	}
	s.mu.Lock()
	s.last, s.inflight = call, nil
	s.mu.Unlock()
	close(call.done)
}
