package main

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// clock is one deadline for a run: every step retries until then, and each attempt's own timeout is capped by it.
type clock struct {
	deadline       time.Time
	budget         time.Duration // the deadline, as configured: for the log
	backoffInitial time.Duration
	backoffMax     time.Duration
	now            func() time.Time
	sleep          func(context.Context, time.Duration) error
}

func newClock(budget, backoffInitial, backoffMax time.Duration) *clock {
	c := &clock{budget: budget, backoffInitial: backoffInitial, backoffMax: backoffMax, now: time.Now, sleep: sleepCtx}
	c.deadline = c.now().Add(budget)
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

// left is what remains before the deadline.
func (c *clock) left() time.Duration { return c.deadline.Sub(c.now()) }

// timeout is d capped by what is left before the deadline (d = 0: all of it), at least a second.
func (c *clock) timeout(d time.Duration) time.Duration {
	t := c.left()
	if d > 0 && d < t {
		t = d
	}
	return max(t, time.Second)
}

// permanent marks an error that no retry can change: retry returns it at once.
type permanent struct{ error }

func (p permanent) Unwrap() error { return p.error }

// retry runs attempt until it succeeds, pausing with exponential backoff (capped), and gives up when the next
// attempt could not start before the deadline; a permanent error ends it at once. Each failed attempt is logged
// with its reason, a late success with its attempt number.
func (c *clock) retry(ctx context.Context, log *logger, desc string, attempt func(context.Context) error) error {
	delay := c.backoffInitial
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
		if err := c.sleep(ctx, delay); err != nil {
			return fmt.Errorf("%s: %w", desc, err)
		}
		delay = min(2*delay, c.backoffMax)
	}
}
