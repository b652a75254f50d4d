package main

// The writers scenario's table and its verdicts.

import (
	"fmt"
	"math"
	"strings"
)

func writersTable(r *Results) *table {
	title := "Writers: W writers insert into pgmq queue tables, one row per transaction"
	if i := r.WritersInfo; i != nil {
		fsync := "pg_test_fsync: not run"
		if i.FsyncUS > 0 {
			fsync = fmt.Sprintf("pg_test_fsync fdatasync %.0f µs/op", i.FsyncUS)
		}
		listeners := fmt.Sprintf("a hub with %d workers subscribed to every queue", i.Workers)
		if i.NoReread {
			listeners += " that never re-read their queues (misses not measured)"
		}
		if i.Workers == 0 {
			listeners = "no hub and no workers: what the wake sources cost the writers alone, wakes not measured"
		}
		if i.Autogroup != "" {
			fsync += "; kernel.sched_autogroup_enabled=" + i.Autogroup
		}
		title = fmt.Sprintf("Writers: W writers insert into %d pgmq queue tables for %s × %d rounds, one row per transaction (%s; %s); %s",
			i.Queues, i.Dur, i.Rounds, strings.Join(i.Settings, ", "), fsync, listeners)
	}
	wakes := writersWakes(r)
	t := &table{title: title,
		header: []string{"source", "W", "commits/s", "each round", "commit p50", "commit p99", "wake p50", "wake p99", "wake max", "wakes/insert", "misses", "PG CPU/commit", "relay CPU/commit", "hub CPU/commit", "workers CPU/commit", "writers' client CPU/commit", "relay commit→NOTIFY p50/p99", "relay caught up", ""}}
	for _, w := range r.Writers {
		var rounds []string
		for _, v := range w.RoundRates {
			rounds = append(rounds, si(v))
		}
		wp50, wp99, wmax, wpi, miss := "-", "-", "-", "-", "-"
		if w.Source != "none" && w.Rounds > 0 && wakes {
			wp50, wp99, wmax = us(w.Wake.P50), us(w.Wake.P99), us(w.Wake.Max)
			wpi, miss = fmt.Sprintf("%.3f", w.WakesPerInsert), fmt.Sprint(w.Misses)
			if w.Misses > 0 {
				miss += fmt.Sprintf(" (%.1f%%)", 100*float64(w.Misses)/float64(w.Commits))
			}
		}
		per := func(sec float64) string {
			if w.Commits == 0 || sec == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f µs", sec*1e6/float64(w.Commits))
		}
		relay := "-"
		if w.Source == "relay" {
			relay = per(w.RelayCPU)
			if w.Relay != nil && w.Relay.WalsenderCPU > 0 {
				relay += " (walsender " + per(w.Relay.WalsenderCPU) + ")"
			}
		}
		c2n, caught := "-", "-"
		if w.Relay != nil {
			c2n = "≤ " + bound(w.Relay.quantile(0.5)) + " / ≤ " + bound(w.Relay.quantile(0.99))
			if len(w.Relay.CommitToDecode) > 0 {
				c2n += " (decoded ≤ " + bound(bucketQuantile(w.Relay.CommitToDecode, 0.5)) + " / ≤ " + bound(bucketQuantile(w.Relay.CommitToDecode, 0.99)) + ")"
			}
			caught = fmt.Sprintf("%.1f s", w.Relay.CatchUpS)
		}
		t.add(w.Source, w.W, si(w.CommitsPerS), strings.Join(rounds, " "), us(w.Commit.P50), us(w.Commit.P99), wp50, wp99, wmax, wpi, miss,
			per(w.PGCPU), relay, per(w.HubCPU), per(w.WorkersCPU), per(w.WritersCPU), c2n, caught, errCol(w.Err))
	}
	return t
}

// bound formats a histogram bucket's upper bound (seconds).
func bound(s float64) string {
	switch {
	case math.IsInf(s, 1):
		return "∞"
	case s >= 1:
		return fmt.Sprintf("%.3g s", s)
	}
	return us(s * 1e6)
}

// writersWakes says whether the run had workers, hence wake figures and
// misses (a run with --writers-workers 0 has neither).
func writersWakes(r *Results) bool {
	return r.WritersInfo == nil || r.WritersInfo.Workers > 0
}

// writersRow finds the (source, W) row with figures.
func (f finder) writers(src string, w int) *WritersRow {
	for i := range f.r.Writers {
		x := &f.r.Writers[i]
		if x.Source == src && x.W == w && x.Err == "" && x.Rounds > 0 {
			return x
		}
	}
	return nil
}

// evaluateWriters gives the verdicts of the writers scenario's relay
// targets. A target whose rows the run lacks is "not run".
func evaluateWriters(r *Results) []Target {
	if len(r.Writers) == 0 {
		return nil
	}
	f := finder{r}
	var ts []Target
	add := func(name string, ran, ok bool, figure string) {
		ts = append(ts, newTarget(name, ran, ok, figure, "not run"))
	}
	fsync := ""
	if i := r.WritersInfo; i != nil && i.FsyncUS > 0 {
		fsync = fmt.Sprintf("; fdatasync %.0f µs", i.FsyncUS)
	}
	relay, none, trig := f.writers("relay", 64), f.writers("none", 64), f.writers("trigger", 64)
	// A target: the relay's commits/s at W=64 are at least least times
	// those of the wake source named source (its row: other).
	relayRatio := func(name, source string, other *WritersRow, least float64) {
		if relay == nil || other == nil {
			add(name, false, false, missing(need{relay != nil, "relay row at W=64"}, need{other != nil, source + " row at W=64"}))
			return
		}
		ratio := relay.CommitsPerS / other.CommitsPerS
		add(name, true, ratio >= least, fmt.Sprintf("relay %s/s, %s %s/s (%.2f×)%s", si(relay.CommitsPerS), source, si(other.CommitsPerS), ratio, fsync))
	}
	relayRatio("relay: commits/s at W=64 ≥ 0.75× no wake source", "none", none, 0.75)
	relayRatio("relay: commits/s at W=64 ≥ 4× the per-row trigger", "trigger", trig, 4)
	{
		// Two figures: when the workers knew of each row (a wake of an
		// earlier commit counts, which hides a relay that lags), and the
		// relay's own commit → NOTIFY, which the wake of the commit itself
		// cannot beat. Both must be within 10 ms.
		name := "relay: wake p99 ≤ 10 ms at W=16"
		if x := f.writers("relay", 16); x != nil && !writersWakes(r) {
			fig := "no workers (--writers-workers 0): wakes not measured"
			if x.Relay != nil {
				fig += fmt.Sprintf("; relay's own commit → NOTIFY: %.1f%% within 10 ms, p50 ≤ %s, p99 ≤ %s%s",
					100*max(x.Relay.fractionWithin(0.01), 0), bound(x.Relay.quantile(0.5)), bound(x.Relay.quantile(0.99)), x.Relay.decodeNote())
			}
			add(name, false, false, fig)
		} else if x != nil {
			ok := x.Wake.P99 <= 10000
			fig := fmt.Sprintf("workers: p99 %s (p50 %s, max %s) over %d inserts", us(x.Wake.P99), us(x.Wake.P50), us(x.Wake.Max), x.Commits)
			if x.Relay != nil {
				within := x.Relay.fractionWithin(0.01)
				ok = ok && within >= 0.99
				fig += fmt.Sprintf("; relay's own commit → NOTIFY: %.1f%% within 10 ms, p50 ≤ %s, p99 ≤ %s%s, caught up %.1f s after the writers stopped",
					100*max(within, 0), bound(x.Relay.quantile(0.5)), bound(x.Relay.quantile(0.99)), x.Relay.decodeNote(), x.Relay.CatchUpS)
			}
			add(name, true, ok, fig)
		} else {
			add(name, false, false, missing(need{false, "relay row at W=16"}))
		}
	}
	{
		name := "relay: 0 misses"
		var parts []string
		misses, ran := 0, false
		for _, x := range r.Writers {
			if x.Source == "relay" && x.Err == "" && x.Rounds > 0 {
				ran = true
				misses += x.Misses
				parts = append(parts, fmt.Sprintf("W=%d: %d of %d", x.W, x.Misses, x.Commits))
			}
		}
		fig := strings.Join(parts, ", ")
		if !ran {
			fig = missing(need{false, "relay row"})
		}
		for _, x := range r.Writers {
			if x.Source == "throttled" && x.Err == "" && x.Rounds > 0 {
				fig += fmt.Sprintf("; throttled trigger W=%d: %d (%.1f%%)", x.W, x.Misses, 100*float64(x.Misses)/float64(max(x.Commits, 1)))
			}
		}
		if i := r.WritersInfo; i != nil && i.NoReread {
			fig = "workers never re-read (--writers-no-reread): misses not counted"
		}
		if !writersWakes(r) {
			// Nobody listened: a miss could not happen, so 0 is no verdict.
			ran, fig = false, "no workers (--writers-workers 0): misses not counted"
		}
		add(name, ran, misses == 0, fig)
	}
	if i := r.WritersInfo; i != nil && i.NoReread && i.Workers > 0 {
		// Workers that never re-read are a diagnostic, not the scenario's
		// benchmark: the figures stay, no verdict.
		for k := range ts {
			ts[k].Met = "not run"
			ts[k].Figure += " (workers never re-read: a diagnostic, no verdict)"
		}
	}
	return ts
}
