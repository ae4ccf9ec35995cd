//go:build e2e

package e2e

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// The burst benchmark (make bench-burst): the burst's scale-up, from the build pod's creation to its success, run
// -burst.runs times for each variant -burst.variants names, and each phase's median, min and max printed as the
// Markdown table docs/warm-pools.md shows. It is a measurement, not a test: no figure fails it, and without
// -burst.runs it is skipped, so `make e2e` never runs it.
var (
	benchRuns     = flag.Int("burst.runs", 0, "TestBurstBenchmark: runs of each variant (0: skip the benchmark)")
	benchVariants = flag.String("burst.variants", "awake,asleep,asleep-node,baked,warm-stopped,warm-running",
		"TestBurstBenchmark: the variants, comma-separated: awake (the gateway up beforehand), asleep (woken by "+
			"the controller at the scale-up decision), asleep-node (woken by the node's boot alone), baked (the "+
			"gateway up, the instance booted from an image baked before the run), warm-stopped and warm-running "+
			"(the gateway up, the instance from a warm pool of that state)")
	benchOut = flag.String("burst.out", "", "TestBurstBenchmark: also write the tables to this file")
)

// benchVariantOptions are the variants by the names -burst.variants takes.
var benchVariantOptions = map[string]burstOptions{
	"awake":        {awake: true},
	"asleep":       {},
	"asleep-node":  {nodeWakeOnly: true},
	"baked":        {awake: true, baked: true},
	"warm-stopped": {awake: true, warm: "Stopped"},
	"warm-running": {awake: true, warm: "Running"},
}

func TestBurstBenchmark(t *testing.T) {
	if *benchRuns <= 0 {
		t.Skip("the burst benchmark runs with -burst.runs=N (make bench-burst)")
	}
	var variants []string
	for _, v := range strings.Split(*benchVariants, ",") {
		if _, ok := benchVariantOptions[v]; !ok {
			t.Fatalf("-burst.variants: no variant %q (%s)", v, strings.Join(slices.Sorted(maps.Keys(benchVariantOptions)), ", "))
		}
		variants = append(variants, v)
	}
	runs := map[string][]*phaseLog{}
	for i := range *benchRuns {
		// Round-robin, so that a slow stretch of the shared machine is spread over every variant.
		for _, v := range variants {
			t.Run(fmt.Sprintf("%s-%d", v, i+1), func(t *testing.T) {
				b := newBurst(t, benchVariantOptions[v])
				b.scaleUp(t)
				runs[v] = append(runs[v], b.phases)
			})
		}
	}
	var out strings.Builder
	fmt.Fprintf(&out, "Measured %s, %d runs of each variant; seconds from the build pod's creation: median "+
		"[min, max] (every run's value).\n", time.Now().UTC().Format("2006-01-02"), *benchRuns)
	for _, v := range variants {
		fmt.Fprintf(&out, "\n%s (%s):\n\n%s", v, benchVariantOptions[v], benchTable(runs[v]))
	}
	t.Logf("burst benchmark:\n%s", out.String())
	if *benchOut != "" {
		if err := os.WriteFile(*benchOut, []byte(out.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// benchTable is the runs' phases as a Markdown table: each phase's median, min and max and every run's value, and
// the median of the time after the phase before; a phase only some runs reached shows how many.
func benchTable(runs []*phaseLog) string {
	var names []string
	for _, r := range runs {
		for _, n := range r.names {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	var b strings.Builder
	b.WriteString("| phase | at (median [min, max]) | after the phase before (median) | runs |\n| --- | --- | --- | --- |\n")
	for i, n := range names {
		var at, step []float64
		for _, r := range runs {
			d, ok := r.at1(n)
			if !ok {
				continue
			}
			at = append(at, d.Seconds())
			if i > 0 {
				if prev, ok := r.at1(names[i-1]); ok {
					step = append(step, (d - prev).Seconds())
				}
			}
		}
		values := make([]string, len(at))
		for j, v := range at {
			values[j] = fmt.Sprintf("%.1f", v)
		}
		after := "-"
		if len(step) > 0 {
			after = fmt.Sprintf("%.1f s", median(step))
		}
		fmt.Fprintf(&b, "| %s | %.1f s [%.1f, %.1f] | %s | %s%s |\n", n, median(at), slices.Min(at), slices.Max(at),
			after, strings.Join(values, ", "), partial(len(at), len(runs)))
	}
	return b.String()
}

// at1 is when the phase was first seen, from the start.
func (p *phaseLog) at1(name string) (time.Duration, bool) {
	i := slices.Index(p.names, name)
	if i < 0 {
		return 0, false
	}
	return p.at[i], true
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func partial(n, of int) string {
	if n == of {
		return ""
	}
	return fmt.Sprintf(" (%d of %d runs)", n, of)
}
