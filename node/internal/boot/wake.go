package boot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/internal/cloud"
	"github.com/dynk8s/dynk8s/node/internal/system"
)

// waker makes sure the stack's WireGuard gateway runs, which stops itself when the pools have been idle (the
// gateway's idle check). The join starts it first thing, so the gateway boots while this node installs its
// packages; the join then waits for the API server through the tunnel (its api-server phase).
//
// ec2:StartInstances is idempotent on a running instance; an instance that is still stopping refuses to start
// (IncorrectInstanceState), so that, throttling and transport errors are retried until the deadline. A refusal that
// a retry cannot change (no permission, no such instance) fails at once.
//
// A gateway that answers "was running, now running" may be powering itself off: its idle check ran before this
// node existed, and EC2 shows an instance running until its OS halts, so that start changed nothing. The start is
// then repeated through a settle window longer than a poweroff takes, until EC2 shows the gateway stopping (refused,
// retried) and then starting from stopped. A gateway still running at the end of the window stays up: its idle
// check now sees this node.
type waker struct {
	cloud            *cloud.Cloud
	log              *system.Logger
	clock            *system.Clock
	settle, interval time.Duration
	dryRun           bool
}

// refusals are the StartInstances errors no retry changes.
var refusals = []string{"UnauthorizedOperation", "AuthFailure", "OptInRequired"}

// errBootEnded is the cause with which a boot stops its wake-up when the boot ends first.
var errBootEnded = errors.New("the boot ended")

// wake starts gateway ("": the gateway never sleeps). Its failure is logged as the one reason, and returned; a
// wake-up the boot stopped (errBootEnded: the boot ended, successful or not, while the wake-up still watched a
// running gateway settle) is no failure of its own and logs nothing.
func (w *waker) wake(ctx context.Context, gateway string) error {
	err := w.run(ctx, gateway)
	if err != nil && !errors.Is(context.Cause(ctx), errBootEnded) {
		w.log.Printf("FAILED: %v", err)
	}
	return err
}

func (w *waker) run(ctx context.Context, gateway string) error {
	if gateway == "" {
		w.log.Printf("the gateway never sleeps (gateway.idleStop 0): nothing to wake")
		return nil
	}
	if !names.IsInstanceID(gateway) {
		return fmt.Errorf("'%s' is not an EC2 instance id", gateway)
	}
	if w.cloud.EC2 == nil {
		var region, domain string
		if err := w.clock.Retry(ctx, w.log, "read the region and the partition's domain from IMDS", func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, w.clock.Timeout(10*time.Second))
			defer cancel()
			var err error
			if region, err = w.cloud.IMDS.Get(ctx, "placement/region"); err != nil {
				return err
			}
			domain, err = w.cloud.IMDS.Get(ctx, "services/domain")
			return err
		}); err != nil {
			return err
		}
		w.cloud.Connect(w.cloud, region, domain)
	}
	previous := ""
	start := func(ctx context.Context) (err error) {
		previous, err = w.start(ctx, gateway)
		return err
	}
	if err := w.clock.Retry(ctx, w.log, "start the WireGuard gateway "+gateway, start); err != nil {
		return err
	}
	if previous != "running" {
		return nil
	}
	until := w.clock.Now().Add(w.settle)
	for !w.clock.Now().Add(w.interval).After(until) {
		if err := w.clock.Sleep(ctx, w.interval); err != nil {
			return err
		}
		if err := w.clock.Retry(ctx, w.log, "start the WireGuard gateway "+gateway+" again", start); err != nil {
			return err
		}
		if previous != "running" {
			return nil
		}
	}
	w.log.Printf("gateway %s stayed running for %s: it is up", gateway, w.settle)
	return nil
}

// start is one StartInstances of the gateway; it returns the state the gateway was in.
func (w *waker) start(ctx context.Context, gateway string) (string, error) {
	if w.dryRun {
		w.log.Printf("dry run: would start gateway %s", gateway)
		return "stopped", nil
	}
	ctx, cancel := context.WithTimeout(ctx, w.clock.Timeout(10*time.Second))
	defer cancel()
	out, err := w.cloud.EC2.StartInstances(ctx, &ec2.StartInstancesInput{InstanceIds: []string{gateway}})
	if err != nil {
		w.cloud.Forget(err)
		err = cloud.APIError("EC2 StartInstances", err)
		code := cloud.ErrorCode(err)
		switch {
		case code == "IncorrectInstanceState":
			return "", fmt.Errorf("gateway %s is not in a state it can start from (stopping): %w", gateway, err)
		case slices.Contains(refusals, code) || strings.HasPrefix(code, "InvalidInstanceID."):
			return "", system.Permanent(fmt.Errorf("cannot start gateway %s: %w", gateway, err))
		}
		return "", err
	}
	if len(out.StartingInstances) == 0 || out.StartingInstances[0].CurrentState == nil {
		return "", errors.New("StartInstances answered no instance")
	}
	in := out.StartingInstances[0]
	id, state := aws.ToString(in.InstanceId), string(in.CurrentState.Name)
	previous := "in an unknown state"
	if in.PreviousState != nil {
		previous = string(in.PreviousState.Name)
	}
	if state != "pending" && state != "running" {
		return "", fmt.Errorf("StartInstances answered state '%s' for '%s'", state, id)
	}
	w.log.Printf("gateway %s was %s, now %s", id, previous, state)
	return previous, nil
}
