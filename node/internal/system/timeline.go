package system

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Timeline times the boot's phases: each is logged as "phase=NAME took=12.3s" when it ends, and the whole boot as
// one "timeline: result=... mode=... total=... NAME=...s" line and /run/dynk8s/timeline.json, which the runbook
// and cmd/timeline's readers take as they are.
type Timeline struct {
	now   func() time.Time
	start time.Time

	mu      sync.Mutex
	phases  []phaseTime
	current string
	since   time.Time
}

type phaseTime struct {
	name string
	took time.Duration
}

// NewTimeline starts a boot's timeline at now().
func NewTimeline(now func() time.Time) *Timeline { return &Timeline{now: now, start: now()} }

// Phase runs fn as the phase name, and logs and records it when it succeeds; a failure is recorded by cut.
func (t *Timeline) Phase(log *Logger, name string, fn func() error) error {
	return t.NotedPhase(log, name, "", fn)
}

// NotedPhase is phase with a note after the time in its log line ("phase=packages took=0.1s (baked)").
func (t *Timeline) NotedPhase(log *Logger, name, note string, fn func() error) error {
	t.mu.Lock()
	t.current, t.since = name, t.now()
	t.mu.Unlock()
	if err := fn(); err != nil {
		return err
	}
	t.mu.Lock()
	took := t.now().Sub(t.since)
	t.phases = append(t.phases, phaseTime{name, took})
	t.current = ""
	t.mu.Unlock()
	log.Printf("phase=%s took=%ss%s", name, Seconds(took), note)
	return nil
}

// Add records a phase that ran beside the others (the pre-pull).
func (t *Timeline) Add(name string, took time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.phases = append(t.phases, phaseTime{name, took})
}

// Cut records the phase a failure ended, as far as it got.
func (t *Timeline) Cut() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.current != "" {
		t.phases = append(t.phases, phaseTime{t.current, t.now().Sub(t.since)})
		t.current = ""
	}
}

// Seconds is d in seconds with one decimal, truncated, as the log has always written it.
func Seconds(d time.Duration) string {
	ms := d.Milliseconds()
	return fmt.Sprintf("%d.%d", ms/1000, ms%1000/100)
}

// Outcome is what the timeline says of the boot.
type Outcome struct {
	InstanceID, Lifecycle, Mode, Result, Reason string
}

// TimelineDoc is /run/dynk8s/timeline.json.
type TimelineDoc struct {
	InstanceID              string          `json:"instanceId"`
	LifecycleState          string          `json:"lifecycleState"`
	Mode                    string          `json:"mode"`
	Phases                  []timelinePhase `json:"phases"`
	Reason                  string          `json:"reason"`
	Result                  string          `json:"result"`
	StartedSecondsAfterBoot *float64        `json:"startedSecondsAfterBoot"`
	TotalSeconds            float64         `json:"totalSeconds"`
}

type timelinePhase struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// Write logs the timeline line (to the kernel log too, at error level when the boot failed) and writes the JSON.
// uptime is /proc/uptime, from which the start's seconds after boot follow.
func (t *Timeline) Write(log *Logger, o Outcome, dir, uptimeFile string) error {
	t.mu.Lock()
	phases := append([]phaseTime(nil), t.phases...)
	t.mu.Unlock()
	total := t.now().Sub(t.start)
	mode := o.Mode
	if mode == "" {
		mode = "none"
	}
	line := fmt.Sprintf("timeline: result=%s mode=%s total=%ss", o.Result, mode, Seconds(total))
	doc := TimelineDoc{InstanceID: o.InstanceID, LifecycleState: o.Lifecycle, Mode: o.Mode, Result: o.Result,
		Reason: o.Reason, TotalSeconds: float64(total.Milliseconds()) / 1000, Phases: []timelinePhase{}}
	for _, p := range phases {
		line += fmt.Sprintf(" %s=%ss", p.name, Seconds(p.took))
		doc.Phases = append(doc.Phases, timelinePhase{p.name, float64(p.took.Milliseconds()) / 1000})
	}
	log.Printf("%s", line)
	level := 5
	if o.Result == "failed" {
		level = 3
	}
	log.Kernel(level, line)
	if b, err := os.ReadFile(uptimeFile); err == nil {
		if up, err := strconv.ParseFloat(strings.Fields(string(b) + " x")[0], 64); err == nil {
			started := math.Round((up-doc.TotalSeconds)*10) / 10
			doc.StartedSecondsAfterBoot = &started
		}
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, "timeline.json")
	if err := os.WriteFile(path+".new", append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(path+".new", path)
}
