package status

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dynk8s/dynk8s/cmd/plan/plan"
)

// WriteText writes the report as one screen: a table of the pools, then a line per part of the stack, then the
// problems and what could not be read. Times are UTC, with their age at the report's time.
func (r Report) WriteText(w io.Writer) error {
	now := r.Time
	fmt.Fprintf(w, "stack %s, cluster %s, %s, at %s\n\n", r.Stack, r.Cluster, r.Region, clock(now))

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tGROUP\tDESIRED\tMIN-MAX\tIN SERVICE\tBOOTING\tWARM\tNODES READY\tLAST SCALE-UP")
	for _, p := range r.Pools {
		if p.Group == "" {
			fmt.Fprintf(tw, "%s\t-\t-\t%d-%d\t-\t-\t-\t%s\t%s\n", p.Name, p.Min, p.Max, nodesCell(p.Nodes), p.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d-%d\t%d\t%d\t%s\t%s\t%s\n", p.Name, p.Group, p.Desired, p.Min, p.Max,
			p.InService, p.Booting, warmCell(p.Warm), nodesCell(p.Nodes), scaleUpCell(p, now))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)

	row := func(what, line string) { fmt.Fprintf(tw, "%s\t%s\n", what, line) }
	row("gateway", gatewayLine(r.Gateway, now))
	row("tunnel", tunnelLine(r.Tunnel, r.Gateway, now))
	row("join token", tokenLine(r.Token, now))
	row("controller", controllerLine(r.Controller, now))
	row("in cluster", partsLine(r.Parts, r.PartsError))
	row("bill", billLine(r))
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(r.Problems) > 0 {
		fmt.Fprintln(w, "\nProblems:")
		for _, p := range r.Problems {
			fmt.Fprintf(w, "  - %s\n", p)
		}
	}
	if len(r.Unread) > 0 {
		fmt.Fprintln(w, "\nNot read:")
		for _, u := range r.Unread {
			fmt.Fprintf(w, "  - %s\n", u)
		}
	}
	if len(r.Problems) == 0 && len(r.Unread) == 0 {
		fmt.Fprintln(w, "\nNo problem found.")
	}
	return nil
}

func nodesCell(nodes []Node) string {
	ready := 0
	for _, n := range nodes {
		if n.Ready {
			ready++
		}
	}
	return fmt.Sprintf("%d/%d", ready, len(nodes))
}

func warmCell(w *Warm) string {
	if w == nil {
		return "-"
	}
	if w.Size == 0 {
		return "0"
	}
	var states []string
	for _, s := range slices.Sorted(maps.Keys(w.States)) {
		states = append(states, fmt.Sprintf("%d %s", w.States[s], strings.TrimPrefix(s, "Warmed:")))
	}
	if len(w.Stale) > 0 {
		states = append(states, fmt.Sprintf("%d stale", len(w.Stale)))
	}
	return strings.Join(states, ", ")
}

func scaleUpCell(p Pool, now time.Time) string {
	a := p.LastScaleUp
	if a == nil {
		return "none on record"
	}
	cell := fmt.Sprintf("%s ago, %s", age(now.Sub(a.Start)), a.Instance)
	if a.End != nil {
		cell += fmt.Sprintf(", %s in %s", a.Status, age(a.End.Sub(a.Start)))
	} else {
		cell += ", " + a.Status
	}
	if a.Ready != nil {
		cell += fmt.Sprintf(", Node Ready after %s", age(a.Ready.Sub(a.Start)))
	}
	return cell
}

func gatewayLine(g Gateway, now time.Time) string {
	if g.Instance == "" {
		return g.Error
	}
	line := g.Instance + " " + g.State
	switch g.State {
	case "stopped":
		line += " (asleep)"
	case "running":
		line += " (awake)"
		if g.Since != nil {
			line += fmt.Sprintf(" for %s, since %s", age(now.Sub(*g.Since)), clock(*g.Since))
		}
	}
	switch g.IdleStop {
	case "":
	case "0s":
		line += ", never stops itself"
	default:
		line += ", stops itself after " + g.IdleStop + " idle"
	}
	return line
}

func tunnelLine(t Tunnel, g Gateway, now time.Time) string {
	switch {
	case t.Error != "":
		return t.Error
	case t.Interface == "":
		return t.Note
	}
	state := "down"
	switch {
	case t.Up:
		state = "up"
	case g.State == "stopped":
		state = "down (the gateway sleeps)"
	}
	last := "no handshake yet"
	if t.LastHandshake != nil {
		last = "last handshake " + sinceAgo(*t.LastHandshake, now)
	}
	return fmt.Sprintf("%s %s: %s, peer %s, %s received, %s sent", t.Interface, state, last,
		cmp.Or(t.Endpoint, "(no endpoint yet)"), byteSize(t.ReceivedBytes), byteSize(t.SentBytes))
}

func tokenLine(t Token, now time.Time) string {
	var parts []string
	if t.Newest != nil {
		parts = append(parts, fmt.Sprintf("newest issued %s, one every %s, %s", sinceAgo(*t.Newest, now),
			t.Every, plural(t.Count, "Secret")))
	} else if t.Count == 0 && !strings.Contains(t.Error, "Secrets") {
		parts = append(parts, "no token Secret")
	}
	if t.Written != nil {
		parts = append(parts, fmt.Sprintf("%s written %s", t.Parameter, sinceAgo(*t.Written, now)))
	}
	if t.Error != "" {
		parts = append(parts, t.Error)
	}
	return strings.Join(parts, "; ")
}

func controllerLine(l Controller, now time.Time) string {
	switch {
	case l.Error != "":
		return l.Error
	case l.Leads:
		return fmt.Sprintf("%s leads, its Lease renewed %s", l.Leader, sinceAgo(*l.Renewed, now))
	case l.Renewed != nil:
		return fmt.Sprintf("no leader: the Lease was last renewed %s by %s", sinceAgo(*l.Renewed, now), l.Leader)
	}
	return "no leader: the Lease was never renewed"
}

func partsLine(parts []Part, err string) string {
	if err != "" {
		return err
	}
	if len(parts) == 0 {
		return "none of the stack's workloads found (app.kubernetes.io/part-of=dynk8s)"
	}
	var cells []string
	for _, p := range parts {
		cells = append(cells, fmt.Sprintf("%s %d/%d", p.Name, p.Ready, p.Want))
	}
	return strings.Join(cells, ", ")
}

// billLine is the idle bill's monthly total and what the stack bills per hour now, beside it: the awake gateway's
// hours and the running instances'.
func billLine(r Report) string {
	b := r.Bill
	if b == nil {
		return "not computed: " + r.BillError
	}
	line := "idle: not priced for " + b.Region
	if b.MonthlyUSD != nil {
		line = fmt.Sprintf("idle: %s a month at zero nodes (%s list prices, see docs/costs.md)", usd(*b.MonthlyUSD), b.Region)
	}
	if r.Gateway.State == "" {
		return line + "; now: not known (the gateway was not read)"
	}
	hourly, terms, priced := NowHourly(r)
	if len(terms) == 0 {
		return line + "; now nothing more"
	}
	line += "; now " + strings.Join(terms, " + ")
	if priced {
		return line + fmt.Sprintf(" = $%.4f/h more", hourly)
	}
	return line + " more (not all priced)"
}

// NowHourly is what the stack bills per hour now beyond its idle bill: the gateway's instance hour while it runs
// (the idle bill counts it stopped) and one node-hour per pool instance in service or booting. priced is false when
// a term has no price (a spot pool's, a region without prices).
func NowHourly(r Report) (usdPerHour float64, terms []string, priced bool) {
	b := r.Bill
	if b == nil {
		return 0, nil, false
	}
	priced = true
	if r.Gateway.State == "running" || r.Gateway.State == "pending" {
		for _, it := range b.WhileNodesRun {
			if it.USD == nil {
				priced = false
				terms = append(terms, "gateway (not priced)")
				continue
			}
			usdPerHour += *it.USD
			terms = append(terms, fmt.Sprintf("gateway $%.4f/h", *it.USD))
		}
	}
	hours := map[string]plan.PoolHour{}
	for _, h := range b.NodeHour {
		hours[h.Pool] = h
	}
	for _, p := range r.Pools {
		n := p.InService + p.Booting
		if n == 0 {
			continue
		}
		h, ok := hours[p.Name]
		if !ok || h.USDPerHour == nil {
			priced = false
			reason := "not priced"
			if h.Spot {
				reason = "spot, not priced"
			}
			terms = append(terms, fmt.Sprintf("%d × %s (%s)", n, p.Name, reason))
			continue
		}
		usdPerHour += float64(n) * *h.USDPerHour
		terms = append(terms, fmt.Sprintf("%d × %s $%.4f/h", n, p.Name, *h.USDPerHour))
	}
	return usdPerHour, terms, priced
}

// clock is a time as the report prints it: UTC, to the second.
func clock(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func clockOrNever(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return clock(*t)
}

// sinceAgo is "<age> ago (<clock>)".
func sinceAgo(t, now time.Time) string {
	return fmt.Sprintf("%s ago (%s)", age(now.Sub(t)), clock(t))
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// age is a duration to the second, at most to the minute past an hour, at most to the hour past a day.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d >= 24*time.Hour:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	case d >= time.Hour:
		return d.Truncate(time.Minute).String()
	}
	return d.Truncate(time.Second).String()
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func usd(v float64) string { return fmt.Sprintf("$%.2f", v) }
