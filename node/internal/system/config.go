package system

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// LoadConfig reads the node's configuration strictly, with the test hooks' deadlines.
func LoadConfig(path string) (nodeconfig.Node, error) {
	cfg, err := ReadConfig(path, nodeconfig.Decode)
	if err != nil {
		return cfg, err
	}
	d := &cfg.Deadlines
	return cfg, ApplyDeadlineHooks([]DeadlineHook{
		Hook("DYNK8S_DEADLINE_SECONDS", time.Second, &d.Join, &d.Wake, &d.Routes),
		Hook("DYNK8S_BACKOFF_INITIAL_MS", time.Millisecond, &d.BackoffInitial),
		Hook("DYNK8S_BACKOFF_MAX_MS", time.Millisecond, &d.BackoffMax),
		Hook("DYNK8S_WAKE_SETTLE_SECONDS", time.Second, &d.WakeSettle),
		Hook("DYNK8S_WAKE_INTERVAL_SECONDS", time.Second, &d.WakeInterval),
	})
}

// ReadConfig opens a configuration file and decodes it with decode (strict), naming the file in any error.
func ReadConfig[T any](path string, decode func(io.Reader) (T, error)) (T, error) {
	var zero T
	f, err := os.Open(path)
	if err != nil {
		return zero, fmt.Errorf("config %s is missing or unreadable: %w", path, err)
	}
	defer f.Close()
	cfg, err := decode(f)
	if err != nil {
		return zero, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// DeadlineHook is a test hook: an environment variable whose whole number, in unit, replaces the deadlines into.
type DeadlineHook struct {
	env  string
	into []*nodeconfig.Duration
	unit time.Duration
}

// Hook is the test hook env: its whole number, in unit, replaces the deadlines into.
func Hook(env string, unit time.Duration, into ...*nodeconfig.Duration) DeadlineHook {
	return DeadlineHook{env: env, into: into, unit: unit}
}

// ApplyDeadlineHooks applies the hooks whose variable is set.
func ApplyDeadlineHooks(hooks []DeadlineHook) error {
	for _, h := range hooks {
		v := os.Getenv(h.env)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errors.New(h.env + "=" + v + " is not a whole number")
		}
		for _, into := range h.into {
			*into = nodeconfig.Duration(time.Duration(n) * h.unit)
		}
	}
	return nil
}
