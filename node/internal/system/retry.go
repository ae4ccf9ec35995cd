package system

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Clock is one deadline for a run: every step retries until then, and each attempt's own timeout is capped by it.
type Clock struct {
	deadline       time.Time
	budget         time.Duration // the deadline, as configured: for the log
	BackoffInitial time.Duration
	BackoffMax     time.Duration
	Now            func() time.Time
	Sleep          func(context.Context, time.Duration) error
}

// NewClock is a deadline budget from now, retried with backoff from backoffInitial up to backoffMax.
func NewClock(budget, backoffInitial, backoffMax time.Duration) *Clock {
	c := &Clock{budget: budget, BackoffInitial: backoffInitial, BackoffMax: backoffMax, Now: time.Now, Sleep: sleepCtx}
	c.deadline = c.Now().Add(budget)
	return c
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Capped is c with its deadline and its pause between attempts at most d, for a probe whose attempt costs little.
func (c *Clock) Capped(d time.Duration) *Clock {
	e := *c
	e.BackoffInitial, e.BackoffMax = min(c.BackoffInitial, d), min(c.BackoffMax, d)
	return &e
}

// left is what remains before the deadline.
func (c *Clock) left() time.Duration { return c.deadline.Sub(c.Now()) }

// Timeout is d capped by what is left before the deadline (d = 0: all of it), at least a second.
func (c *Clock) Timeout(d time.Duration) time.Duration {
	t := c.left()
	if d > 0 && d < t {
		t = d
	}
	return max(t, time.Second)
}

// permanent marks an error that no retry can change: retry returns it at once.
type permanent struct{ error }

func (p permanent) Unwrap() error { return p.error }

// Permanent marks err as one that no retry can change.
func Permanent(err error) error { return permanent{err} }

// Retry runs attempt until it succeeds, pausing with exponential backoff (capped), and gives up when the next
// attempt could not start before the deadline; a permanent error ends it at once. Each failed attempt is logged
// with its reason, a late success with its attempt number.
func (c *Clock) Retry(ctx context.Context, log *Logger, desc string, attempt func(context.Context) error) error {
	delay := c.BackoffInitial
	for n := 1; ; n++ {
		err := attempt(ctx)
		if err == nil {
			if n > 1 {
				log.Printf("%s: succeeded on attempt %d", desc, n)
			}
			return nil
		}
		if p := (permanent{}); errors.As(err, &p) {
			return p.error
		}
		if c.left() <= delay {
			return fmt.Errorf("%s: gave up after %d attempts (deadline %s): %w", desc, n, c.budget, err)
		}
		log.Printf("%s: attempt %d failed: %v; retrying in %.3fs", desc, n, err, delay.Seconds())
		if err := c.Sleep(ctx, delay); err != nil {
			return fmt.Errorf("%s: %w", desc, err)
		}
		delay = min(2*delay, c.BackoffMax)
	}
}
