package main

// Tables and the target verdicts.

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Target is one target of the listen-side or at-scale targets with its verdict.
type Target struct {
	Name   string `json:"name"`
	Met    string `json:"met"` // "met", "NOT MET", "not measured" (listen side), "not run" (at scale)
	Figure string `json:"figure"`
}

func mb(b int64) string { return fmt.Sprintf("%.1f", float64(b)/1e6) }

func us(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v >= 10000:
		return fmt.Sprintf("%.1fms", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2fms", v/1000)
	}
	return fmt.Sprintf("%.0fµs", v)
}

func si(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func cpuCol(sec, kernel float64, sys string) string {
	if sys == "direct" {
		return "-"
	}
	return fmt.Sprintf("%.2fs (%.0f%% sys)", sec, 100*kernel/max(sec, 0.01))
}

func errCol(e string) string {
	if e == "" {
		return ""
	}
	if len(e) > 70 {
		e = e[:70] + "…"
	}
	return "ERROR: " + e
}

type table struct {
	title  string
	header []string
	rows   [][]string
}

func (t *table) add(cells ...any) {
	row := make([]string, len(cells))
	for i, c := range cells {
		row[i] = fmt.Sprint(c)
	}
	t.rows = append(t.rows, row)
}

func tables(r *Results) []*table {
	var ts []*table
	if len(r.Census) > 0 {
		t := &table{title: "Census: Postgres backends used for N subscribed workers",
			header: []string{"system", "N", "layout", "backends", ""}}
		for _, c := range r.Census {
			t.add(c.System, c.N, c.Layout, c.Backends, errCol(c.Err))
		}
		ts = append(ts, t)
	}
	if len(r.Paced) > 0 {
		t := &table{title: "Paced latency: one NOTIFY every 10 ms, NOTIFY→receipt in the worker",
			header: []string{"system", "N", "layout", "samples", "p50", "p95", "p99", "max", "lost", "evicted", "hub CPU", "hub CPU/delivery", "p99 of each round", ""}}
		for _, p := range r.Paced {
			var rp []string
			for _, v := range p.RoundP99 {
				rp = append(rp, us(v))
			}
			per := "-"
			if p.System != "direct" && p.Recv > 0 {
				per = fmt.Sprintf("%.1f µs", p.CPU*1e6/float64(p.Recv))
			}
			t.add(p.System, p.N, p.Layout, p.Lat.Count, us(p.Lat.P50), us(p.Lat.P95), us(p.Lat.P99), us(p.Lat.Max), p.Lost, p.Evicted, cpuCol(p.CPU, p.CPUSys, p.System),
				per, strings.Join(rp, " "), errCol(p.Err))
		}
		ts = append(ts, t)
	}
	if len(r.Saturation) > 0 {
		t := &table{title: fmt.Sprintf("Saturation: back-to-back notifier for %v; then the highest paced rate with 0 evictions, 0 loss, p99 < 10 ms", r.Params.FloodDur),
			header: []string{"system", "N", "layout", "NOTIFY/s", "deliveries/s", "lost (live)", "lost (evicted)", "evicted", "p50", "p99", "sustained NOTIFY/s", "sust. deliveries/s", "sust. p99", "sustained limited by", "hub CPU/delivery", ""}}
		for _, s := range r.Saturation {
			per := "-"
			if s.System != "direct" {
				per = fmt.Sprintf("%.0f ns", s.CPUPerDelivery)
			}
			t.add(s.System, s.N, s.Layout, si(s.NotifyPerSec), si(s.DeliveriesPerS), s.LostLive, s.LostEvicted, s.Evicted, us(s.Lat.P50), us(s.Lat.P99),
				si(s.SustainedRate), si(s.SustainedDeliv), us(s.SustainedLat.P99), s.SustainedLimit, per, errCol(s.Err))
		}
		ts = append(ts, t)
	}
	if len(r.Churn) > 0 {
		t := &table{title: fmt.Sprintf("Churn: connect/subscribe/close cycles (%s offered) while a steady worker gets %.0f NOTIFY/s (control: a direct LISTEN worker gets the same)",
			map[bool]string{true: "as fast as possible", false: si(r.Params.ChurnCycleRate) + "/s"}[r.Params.ChurnCycleRate == 0], r.Params.ChurnRate),
			header: []string{"system", "cycles", "procs", "cycles/s", "errors", "fds before", "fds after", "RSS MB before", "RSS MB +1s", "RSS MB +5s", "steady p99 idle", "steady p99 churn", "ratio", "control p99 idle", "control p99 churn", ""}}
		for _, c := range r.Churn {
			ratio := 0.0
			if c.Idle.P99 > 0 {
				ratio = c.During.P99 / c.Idle.P99
			}
			t.add(c.System, c.Cycles, c.Procs, si(c.CyclesPerS), c.Errors, c.FDBefore, c.FDAfter, mb(c.RSSBefore), mb(c.RSSAfter1s), mb(c.RSSAfter),
				us(c.Idle.P99), us(c.During.P99), fmt.Sprintf("%.2f×", ratio), us(c.ControlIdle.P99), us(c.ControlDuring.P99), errCol(c.Err))
		}
		ts = append(ts, t)
	}
	if len(r.Idle) > 0 {
		t := &table{title: "Idle memory: server RSS with N idle subscribed workers (one process holds the N sockets)",
			header: []string{"system", "N", "RSS MB base", "RSS MB with N", "RSS bytes/worker", "Go heap B/worker (after GC)", "stacks B/worker", "fds", ""}}
		for _, i := range r.Idle {
			heap, stack := "-", "-"
			if i.HeapPerWorker != 0 || i.StackPerWorker != 0 {
				heap, stack = fmt.Sprintf("%.0f", i.HeapPerWorker), fmt.Sprintf("%.0f", i.StackPerWorker)
			}
			t.add(i.System, i.N, mb(i.RSSBase), mb(i.RSSIdle), fmt.Sprintf("%.0f", i.PerWorker), heap, stack, i.FDs, errCol(i.Err))
		}
		ts = append(ts, t)
	}
	if len(r.Wedged) > 0 {
		t := &table{title: fmt.Sprintf("Wedged worker: 1 of %d worker processes SIGSTOPped, %.0f ephemeral NOTIFY/s of %d B", r.Params.WedgedN, r.Params.WedgedRate, r.Params.WedgedPad+30),
			header: []string{"system", "siblings p50 without", "p99 without", "p50 with", "p99 with", "ratio", "siblings lost", "wedged evicted", ""}}
		for _, x := range r.Wedged {
			ratio := 0.0
			if x.Without.P99 > 0 {
				ratio = x.With.P99 / x.Without.P99
			}
			t.add(x.System, us(x.Without.P50), us(x.Without.P99), us(x.With.P50), us(x.With.P99), fmt.Sprintf("%.2f×", ratio), x.SiblingsLost, x.WedgedEvicted, errCol(x.Err))
		}
		ts = append(ts, t)
	}
	if len(r.Channels) > 0 {
		t := &table{title: fmt.Sprintf("Many channels: one subscriber holding C channels, 4 back-to-back notifier connections round-robin over them for %v", r.Params.FloodDur),
			header: []string{"system", "channels", "backends", "LISTEN all", "NOTIFY/s sent", "delivered/s", "vs C=1000", "p50", "p99", "lost", "hub CPU/delivery", "backends CPU/delivery", ""}}
		base := map[string]float64{}
		for _, c := range r.Channels {
			if c.Channels == 1000 && c.Err == "" {
				base[c.System] = c.DeliveredPS
			}
		}
		for _, c := range r.Channels {
			per := "-"
			if c.System != "direct" {
				per = fmt.Sprintf("%.0f ns", c.ServerNsPerDelivery)
			}
			rel := "-"
			if b := base[c.System]; b > 0 && c.Err == "" {
				rel = fmt.Sprintf("%.0f%%", 100*c.DeliveredPS/b)
			}
			t.add(c.System, c.Channels, c.Backends, fmt.Sprintf("%.2fs", c.ListenSecs), si(c.NotifyPerSec), si(c.DeliveredPS), rel, us(c.Lat.P50), us(c.Lat.P99), c.Lost,
				per, fmt.Sprintf("%.0f ns", c.BackendNsPerDelivery), errCol(c.Err))
		}
		ts = append(ts, t)
	}
	if len(r.Writers) > 0 {
		ts = append(ts, writersTable(r))
	}
	// A run of the writers scenario alone has no row the listen-side and
	// at-scale targets look at: their tables would say so 27 times.
	writersOnly := len(r.Writers) > 0 && len(r.Census)+len(r.Paced)+len(r.Saturation)+len(r.Churn)+len(r.Idle)+len(r.Wedged)+len(r.Channels) == 0
	if len(r.Targets) > 0 && !writersOnly {
		t := &table{title: "Targets: the listen side", header: []string{"verdict", "target", "measured"}}
		for _, x := range r.Targets {
			t.add(x.Met, x.Name, x.Figure)
		}
		ts = append(ts, t)
	}
	if len(r.TargetsScale) > 0 && !writersOnly {
		t := &table{title: "Targets: at scale", header: []string{"verdict", "target", "measured"}}
		for _, x := range r.TargetsScale {
			t.add(x.Met, x.Name, x.Figure)
		}
		ts = append(ts, t)
	}
	if len(r.TargetsWriters) > 0 {
		t := &table{title: "Targets: the writers", header: []string{"verdict", "target", "measured"}}
		for _, x := range r.TargetsWriters {
			t.add(x.Met, x.Name, x.Figure)
		}
		ts = append(ts, t)
	}
	return ts
}

func header(r *Results) string {
	mode := "full"
	if r.Params.Quick {
		mode = "--quick"
	}
	return fmt.Sprintf("lhbench %s — %s\nelapsed %s, load at end %s; one-way Unix-socket hop to an idle process: p50 %s, p99 %s",
		mode, r.Machine, r.Elapsed, r.Machine.LoadEnd, us(r.Machine.UnixHop.P50), us(r.Machine.UnixHop.P99))
}

func printAll(w io.Writer, r *Results) {
	fmt.Fprintf(w, "\n%s\n", header(r))
	for _, t := range tables(r) {
		fmt.Fprintf(w, "\n## %s\n", t.title)
		tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', tabwriter.AlignRight)
		if strings.HasPrefix(t.title, "Targets (") {
			tw = tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
		}
		fmt.Fprintln(tw, strings.Join(t.header, "\t")+"\t")
		for _, row := range t.rows {
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		tw.Flush()
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
}

// writeMarkdown writes the same tables as Markdown (for docs/performance.md).
func writeMarkdown(w io.Writer, r *Results) {
	fmt.Fprintf(w, "%s\n", strings.ReplaceAll(header(r), "\n", "  \n"))
	for _, t := range tables(r) {
		fmt.Fprintf(w, "\n#### %s\n\n", t.title)
		hdr := t.header
		if hdr[len(hdr)-1] == "" {
			hdr = hdr[:len(hdr)-1]
			for _, row := range t.rows {
				if row[len(row)-1] != "" {
					hdr = append(hdr[:len(hdr):len(hdr)], "error")
					break
				}
			}
		}
		fmt.Fprintf(w, "| %s |\n|", strings.Join(hdr, " | "))
		for range hdr {
			fmt.Fprint(w, "---|")
		}
		fmt.Fprintln(w)
		for _, row := range t.rows {
			row = row[:len(hdr)]
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "\nnote: %s\n", n)
	}
}

// ---- verdicts

type finder struct{ r *Results }

func (f finder) paced(sys string, n int, oneProc bool) *LatencyRow {
	for i := range f.r.Paced {
		p := &f.r.Paced[i]
		if p.System == sys && p.N == n && (p.Layout.Procs == 1 && n > 1) == oneProc && p.Err == "" && p.Lat.Count > 0 {
			return p
		}
	}
	return nil
}

func (f finder) sat(sys string, n int, oneProc bool) *SatRow {
	for i := range f.r.Saturation {
		s := &f.r.Saturation[i]
		if s.System == sys && s.N == n && (s.Layout.Procs == 1 && n > 1) == oneProc && s.Err == "" {
			return s
		}
	}
	return nil
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}

// newTarget is one verdict row; absent is the verdict when the run has no
// figure for it.
func newTarget(name string, ran, ok bool, figure, absent string) Target {
	t := Target{Name: name, Figure: figure, Met: verdict(ok)}
	if !ran {
		t.Met = absent
	}
	return t
}

func evaluateListen(r *Results, _ func(string) *system) []Target {
	f := finder{r}
	var ts []Target
	add := func(name string, measured bool, ok bool, figure string) {
		ts = append(ts, newTarget(name, measured, ok, figure, "not measured"))
	}

	// census
	{
		var parts []string
		ok, any := true, false
		for _, c := range r.Census {
			if c.System != "hub" {
				continue
			}
			if c.Err != "" {
				parts = append(parts, fmt.Sprintf("N=%d error", c.N))
				ok = false
				continue
			}
			any = true
			parts = append(parts, fmt.Sprintf("N=%d: %d", c.N, c.Backends))
			ok = ok && c.Backends == 1
		}
		for _, c := range r.Census {
			if c.System == "direct" && c.Err == "" {
				parts = append(parts, fmt.Sprintf("(direct N=%d: %d)", c.N, c.Backends))
			}
		}
		add("census: hub uses 1 backend for any N", any, ok, strings.Join(parts, ", "))
	}
	// paced N=256
	if h, d := f.paced("hub", 256, false), f.paced("direct", 256, false); h != nil && d != nil {
		add("paced N=256 procs: hub p99 ≤ 1/3 of direct's", true, h.Lat.P99*3 <= d.Lat.P99,
			fmt.Sprintf("hub p99 %s, direct p99 %s (%.2f× direct)", us(h.Lat.P99), us(d.Lat.P99), h.Lat.P99/d.Lat.P99))
	} else {
		add("paced N=256 procs: hub p99 ≤ 1/3 of direct's", false, false, "")
	}
	if h := f.paced("hub", 256, true); h != nil {
		add("paced N=256 in one process: hub p99 ≤ 1 ms", true, h.Lat.P99 <= 1000, fmt.Sprintf("hub p99 %s (p50 %s)", us(h.Lat.P99), us(h.Lat.P50)))
	} else {
		add("paced N=256 in one process: hub p99 ≤ 1 ms", false, false, "")
	}
	if h, d := f.paced("hub", 1, false), f.paced("direct", 1, false); h != nil && d != nil {
		add("paced N=1: hub p50 ≤ direct p50 + 50 µs", true, h.Lat.P50 <= d.Lat.P50+50,
			fmt.Sprintf("hub p50 %s, direct p50 %s (+%.0fµs)", us(h.Lat.P50), us(d.Lat.P50), h.Lat.P50-d.Lat.P50))
	} else {
		add("paced N=1: hub p50 ≤ direct p50 + 50 µs", false, false, "")
	}
	// vs gohub
	for _, one := range []bool{false, true} {
		lbl := "procs"
		if one {
			lbl = "one process"
		}
		hs, gs := f.sat("hub", 256, one), f.sat("gohub", 256, one)
		hp, gp := f.paced("hub", 256, one), f.paced("gohub", 256, one)
		if hs != nil && gs != nil && hp != nil && gp != nil && gs.DeliveriesPerS > 0 {
			// Strict: the flood's deliveries/s and the sustained (zero
			// evictions, p99 < 10 ms) deliveries/s must both be ≥ 1.5×.
			ratio := hs.DeliveriesPerS / gs.DeliveriesPerS
			sratio := hs.SustainedDeliv / max(gs.SustainedDeliv, 1)
			add(fmt.Sprintf("vs gohub at N=256 (%s): ≥ 1.5× deliveries/s and lower p99", lbl), true, ratio >= 1.5 && sratio >= 1.5 && hp.Lat.P99 < gp.Lat.P99,
				fmt.Sprintf("flood deliveries/s hub %s vs gohub %s (%.2f×; evicted %d vs %d); sustained %s vs %s (%.2f×); paced p99 %s vs %s",
					si(hs.DeliveriesPerS), si(gs.DeliveriesPerS), ratio, hs.Evicted, gs.Evicted, si(hs.SustainedDeliv), si(gs.SustainedDeliv), sratio, us(hp.Lat.P99), us(gp.Lat.P99)))
		} else {
			add(fmt.Sprintf("vs gohub at N=256 (%s): ≥ 1.5× deliveries/s and lower p99", lbl), false, false, "")
		}
	}
	// saturation
	for _, one := range []bool{false, true} {
		lbl := "procs"
		if one {
			lbl = "one process"
		}
		h, d := f.sat("hub", 256, one), f.sat("direct", 256, one)
		name := fmt.Sprintf("saturation N=256 (%s): ≥ 10,000 NOTIFY/s, ≥ 35× direct, no ephemeral loss", lbl)
		if h != nil && d != nil && d.NotifyPerSec > 0 {
			ratio := h.NotifyPerSec / d.NotifyPerSec
			lost := h.LostLive + h.LostEvicted
			add(name, true, h.NotifyPerSec >= 10000 && ratio >= 35 && lost == 0,
				fmt.Sprintf("hub %s NOTIFY/s vs direct %s (%.0f×); lost %d on live conns, %d on %d evicted",
					si(h.NotifyPerSec), si(d.NotifyPerSec), ratio, h.LostLive, h.LostEvicted, h.Evicted))
		} else {
			add(name, false, false, "")
		}
	}
	for _, one := range []bool{false, true} {
		lbl := "64 procs"
		if one {
			lbl = "1×64"
		}
		name := fmt.Sprintf("sustained deliveries with 0 evictions ≥ 1,000,000/s at N=64 (%s)", lbl)
		if h := f.sat("hub", 64, one); h != nil && h.SustainedTested {
			add(name, true, h.SustainedDeliv >= 1e6,
				fmt.Sprintf("%s deliveries/s (%s NOTIFY/s × 64, p99 %s; limit: %s)", si(h.SustainedDeliv), si(h.SustainedRate), us(h.SustainedLat.P99), h.SustainedLimit))
		} else {
			add(name, false, false, "")
		}
	}
	// idle
	{
		var parts []string
		ok, any := true, false
		for _, i := range r.Idle {
			if i.System != "hub" || i.Err != "" {
				continue
			}
			any = true
			g := 0.0
			for _, j := range r.Idle {
				if j.System == "gohub" && j.N == i.N && j.Err == "" {
					g = j.PerWorker
				}
			}
			part := fmt.Sprintf("N=%d: %.0f B", i.N, i.PerWorker)
			if g > 0 {
				part += fmt.Sprintf(" vs gohub %.0f B (1/%.1f)", g, g/max(i.PerWorker, 1))
				ok = ok && i.PerWorker*8 <= g
			}
			ok = ok && i.PerWorker <= 512
			parts = append(parts, part)
		}
		add("idle memory ≤ 512 B/worker and ≤ 1/8 of gohub", any, ok, strings.Join(parts, "; "))
	}
	// churn
	for _, c := range r.Churn {
		if c.System != "hub" || c.Err != "" {
			continue
		}
		add("churn: fd count back to start", true, c.FDAfter == c.FDBefore, fmt.Sprintf("%d → %d after %d cycles", c.FDBefore, c.FDAfter, c.Cycles))
		var steps []string
		for _, r := range c.RSSRounds {
			steps = append(steps, mb(r))
		}
		add("churn: RSS growth < 5 MB", true, c.RSSAfter-c.RSSBefore < 5e6, fmt.Sprintf("%s → %s MB 5 s after (%+.2f MB; %+.2f MB 1 s after); after each fifth of the cycles: %s MB",
			mb(c.RSSBefore), mb(c.RSSAfter), float64(c.RSSAfter-c.RSSBefore)/1e6, float64(c.RSSAfter1s-c.RSSBefore)/1e6, strings.Join(steps, ", ")))
		add("churn: steady p99 during churn ≤ 1.5× idle", true, c.During.P99 <= 1.5*c.Idle.P99,
			fmt.Sprintf("idle %s, during %s (%.2f×); a direct LISTEN control worker: idle %s, during %s (%.2f×)", us(c.Idle.P99), us(c.During.P99), c.During.P99/max(c.Idle.P99, 1),
				us(c.ControlIdle.P99), us(c.ControlDuring.P99), c.ControlDuring.P99/max(c.ControlIdle.P99, 1)))
	}
	// gohub loses on every row
	{
		wins, cmp := gohubWins(r)
		add("the goroutine-per-connection hub loses on every row", cmp > 0, len(wins) == 0, winsFigure(wins))
	}
	return ts
}

// gohubWins lists the rows where the goroutine-per-connection baseline
// beats the hub, and how many hub/gohub pairs were compared.
func gohubWins(r *Results) (wins []string, cmp int) {
	f := finder{r}
	for _, h := range r.Paced {
		if h.System != "hub" || h.Err != "" {
			continue
		}
		if g := f.paced("gohub", h.N, h.Layout.Procs == 1 && h.N > 1); g != nil {
			cmp++
			if g.Lat.P99 < h.Lat.P99 {
				wins = append(wins, fmt.Sprintf("paced N=%d %s p99 %s < hub %s", h.N, h.Layout, us(g.Lat.P99), us(h.Lat.P99)))
			}
		}
	}
	for _, h := range r.Saturation {
		if h.System != "hub" || h.Err != "" {
			continue
		}
		if g := f.sat("gohub", h.N, h.Layout.Procs == 1); g != nil {
			cmp++
			if g.DeliveriesPerS > h.DeliveriesPerS {
				wins = append(wins, fmt.Sprintf("flood N=%d %s %s deliveries/s > hub %s", h.N, h.Layout, si(g.DeliveriesPerS), si(h.DeliveriesPerS)))
			}
			if g.SustainedDeliv > h.SustainedDeliv {
				wins = append(wins, fmt.Sprintf("sustained N=%d %s %s/s > hub %s", h.N, h.Layout, si(g.SustainedDeliv), si(h.SustainedDeliv)))
			}
		}
	}
	for _, p := range hubGohubPairs(r.Churn, func(c ChurnRow) (string, string) { return c.System, c.Err }) {
		h, g := p[0], p[1]
		cmp++
		if g.During.P99 < h.During.P99 {
			wins = append(wins, fmt.Sprintf("churn steady p99 %s < hub %s", us(g.During.P99), us(h.During.P99)))
		}
		if g.CyclesPerS > h.CyclesPerS {
			wins = append(wins, fmt.Sprintf("churn %s cycles/s > hub %s", si(g.CyclesPerS), si(h.CyclesPerS)))
		}
	}
	for _, p := range hubGohubPairs(r.Wedged, func(w WedgedRow) (string, string) { return w.System, w.Err }) {
		h, g := p[0], p[1]
		cmp++
		if g.With.P99 < h.With.P99 {
			wins = append(wins, fmt.Sprintf("wedged siblings p99 %s < hub %s", us(g.With.P99), us(h.With.P99)))
		}
	}
	return wins, cmp
}

// hubGohubPairs pairs every hub row of rows with every gohub row, both
// without an error; sys gives a row's system and error.
func hubGohubPairs[T any](rows []T, sys func(T) (system, err string)) [][2]T {
	var pairs [][2]T
	for _, h := range rows {
		for _, g := range rows {
			hs, he := sys(h)
			gs, ge := sys(g)
			if hs == "hub" && gs == "gohub" && he == "" && ge == "" {
				pairs = append(pairs, [2]T{h, g})
			}
		}
	}
	return pairs
}

func winsFigure(wins []string) string {
	if len(wins) == 0 {
		return "gohub wins none of the compared rows"
	}
	return "gohub wins: " + strings.Join(wins, "; ")
}

// ---- the at-scale targets

// need is one row a target compares; what names it when the run lacks it.
type need struct {
	ok   bool
	what string
}

// missing says which of a target's rows the run lacks (the figure of a
// "not run" verdict).
func missing(ns ...need) string {
	var m []string
	for _, n := range ns {
		if !n.ok {
			m = append(m, n.what)
		}
	}
	return "no " + strings.Join(m, ", no ") + " in this run"
}

// sizes are the (N, one process) layouts a per-size target covers: those
// of the full suite, then any other the run has for the hub.
type size struct {
	n   int
	one bool
}

func (s size) String() string {
	if s.one {
		return layout{Procs: 1, ConnsPerProc: s.n}.String()
	}
	return layout{Procs: s.n, ConnsPerProc: 1}.String()
}

func sizes(full []size, run []size) []size {
	out := append([]size(nil), full...)
	for _, s := range run {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// evaluateScale gives the verdicts of the at-scale targets from the same run.
// A target whose scenario or system is missing from the run is "not run".
func evaluateScale(r *Results) []Target {
	f := finder{r}
	var ts []Target
	add := func(name string, ran bool, ok bool, figure string) {
		ts = append(ts, newTarget(name, ran, ok, figure, "not run"))
	}

	// 1, 2: paced p99
	{
		name := "paced N=256 (256 procs): hub p99 < gohub's"
		if h, g := f.paced("hub", 256, false), f.paced("gohub", 256, false); h != nil && g != nil {
			add(name, true, h.Lat.P99 < g.Lat.P99, fmt.Sprintf("hub p99 %s, gohub p99 %s (%.2f×)", us(h.Lat.P99), us(g.Lat.P99), h.Lat.P99/max(g.Lat.P99, 1)))
		} else {
			add(name, false, false, missing(need{h != nil, "hub paced 256 procs"}, need{g != nil, "gohub paced 256 procs"}))
		}
		name = "paced 1×256 (one process): hub p99 ≤ 1 ms"
		if h := f.paced("hub", 256, true); h != nil {
			add(name, true, h.Lat.P99 <= 1000, fmt.Sprintf("hub p99 %s (%.2f× the 1 ms target; p50 %s)", us(h.Lat.P99), h.Lat.P99/1000, us(h.Lat.P50)))
		} else {
			add(name, false, false, missing(need{false, "hub paced 1×256"}))
		}
	}
	// 3: sustained deliveries/s at N=64 vs gohub
	for _, s := range []size{{64, false}, {64, true}} {
		name := fmt.Sprintf("sustained deliveries/s at N=64 (%s) ≥ gohub's", s)
		h, g := f.sat("hub", s.n, s.one), f.sat("gohub", s.n, s.one)
		if h != nil && g != nil && h.SustainedTested && g.SustainedTested {
			add(name, true, h.SustainedDeliv >= g.SustainedDeliv,
				fmt.Sprintf("hub %s/s (%s NOTIFY/s, p99 %s), gohub %s/s (%s NOTIFY/s, p99 %s) (%.2f×)", si(h.SustainedDeliv), si(h.SustainedRate), us(h.SustainedLat.P99),
					si(g.SustainedDeliv), si(g.SustainedRate), us(g.SustainedLat.P99), h.SustainedDeliv/max(g.SustainedDeliv, 1)))
		} else {
			add(name, false, false, missing(need{h != nil && h.SustainedTested, "hub sustained " + s.String()},
				need{g != nil && g.SustainedTested, "gohub sustained " + s.String()}))
		}
	}
	// 4: server CPU per delivery ≤ 0.8× gohub's, paced N ≥ 64 and every flood
	{
		// cpuRow judges one row; h and g are 0 when the run has no figure.
		cpuRow := func(row string, h, g float64, unit string) {
			name := "CPU/delivery ≤ 0.8× gohub's: " + row
			if h > 0 && g > 0 {
				add(name, true, h <= 0.8*g, fmt.Sprintf("hub "+unit+", gohub "+unit+" (%.2f×)", h, g, h/g))
			} else {
				add(name, false, false, missing(need{h > 0, "hub " + row + " CPU figure"}, need{g > 0, "gohub " + row + " CPU figure"}))
			}
		}
		var run []size
		for _, p := range r.Paced {
			if p.System == "hub" && p.N >= 64 {
				run = append(run, size{p.N, p.Layout.Procs == 1 && p.N > 1})
			}
		}
		perDelivery := func(p *LatencyRow) float64 { // µs
			if p == nil || p.Recv == 0 {
				return 0
			}
			return p.CPU * 1e6 / float64(p.Recv)
		}
		for _, s := range sizes([]size{{64, false}, {256, false}, {256, true}}, run) {
			cpuRow("paced "+s.String(), perDelivery(f.paced("hub", s.n, s.one)), perDelivery(f.paced("gohub", s.n, s.one)), "%.1f µs")
		}
		run = nil
		for _, x := range r.Saturation {
			if x.System == "hub" {
				run = append(run, size{x.N, x.Layout.Procs == 1 && x.N > 1})
			}
		}
		perDeliv := func(x *SatRow) float64 { // ns
			if x == nil {
				return 0
			}
			return x.CPUPerDelivery
		}
		for _, s := range sizes([]size{{64, false}, {256, false}, {64, true}, {256, true}}, run) {
			cpuRow("flood "+s.String(), perDeliv(f.sat("hub", s.n, s.one)), perDeliv(f.sat("gohub", s.n, s.one)), "%.0f ns")
		}
	}
	// 5: many channels: K=4 at 50,000 keeps ≥ 90% of its rate at 1,000
	{
		var at1k, at50k *ChannelsRow
		for i := range r.Channels {
			c := &r.Channels[i]
			if c.System == "hub K=4" && c.Err == "" {
				switch c.Channels {
				case 1000:
					at1k = c
				case 50000:
					at50k = c
				}
			}
		}
		name := "50,000 channels, K=4: ≥ 90% of the NOTIFY rate at 1,000"
		if at1k != nil && at50k != nil {
			fig := fmt.Sprintf("%s delivered/s at 50,000 vs %s at 1,000 (%.0f%%)", si(at50k.DeliveredPS), si(at1k.DeliveredPS), 100*at50k.DeliveredPS/max(at1k.DeliveredPS, 1))
			for _, c := range r.Channels {
				if c.System == "hub K=1" && c.Channels == 50000 && c.Err == "" {
					fig += fmt.Sprintf("; K=1 at 50,000: %s", si(c.DeliveredPS))
				}
			}
			add(name, true, at50k.DeliveredPS >= 0.9*at1k.DeliveredPS, fig)
		} else {
			add(name, false, false, missing(need{at1k != nil, "hub K=4 at 1,000 channels"}, need{at50k != nil, "hub K=4 at 50,000 channels"}))
		}
	}
	// 6: idle memory at N=10,000
	{
		var h, lib *IdleRow
		for i := range r.Idle {
			x := &r.Idle[i]
			if x.N == 10000 && x.Err == "" {
				switch x.System {
				case "hub":
					h = x
				case "hub (lib)":
					lib = x
				}
			}
		}
		name := "idle memory at N=10,000: hub ≤ 512 B RSS/worker"
		if h != nil {
			fig := fmt.Sprintf("hub %.0f B RSS/worker (%.2f× the 512 B target)", h.PerWorker, h.PerWorker/512)
			if lib != nil && lib.HeapPerWorker > 0 {
				fig += fmt.Sprintf("; hub (lib) Go heap %.0f B/worker (RSS %.0f B)", lib.HeapPerWorker, lib.PerWorker)
			} else {
				fig += "; no hub (lib) heap figure in this run"
			}
			add(name, true, h.PerWorker <= 512, fig)
		} else {
			add(name, false, false, missing(need{false, "hub idle N=10000"}))
		}
	}
	// 7: churn RSS growth per 100,000 cycles
	{
		var h *ChurnRow
		for i := range r.Churn {
			if c := &r.Churn[i]; c.System == "hub" && c.Err == "" && c.Cycles > 0 {
				h = c
			}
		}
		name := "churn: RSS growth (5 s after) < 5 MB per 100,000 cycles"
		if h != nil {
			per := float64(h.RSSAfter-h.RSSBefore) * 1e5 / float64(h.Cycles)
			add(name, true, per < 5e6, fmt.Sprintf("%s → %s MB 5 s after %d cycles: %+.2f MB per 100,000 cycles (%.2f× the 5 MB limit)",
				mb(h.RSSBefore), mb(h.RSSAfter), h.Cycles, per/1e6, per/5e6))
		} else {
			add(name, false, false, missing(need{false, "hub churn"}))
		}
	}
	// 8: gohub loses on every row
	{
		wins, cmp := gohubWins(r)
		fig := winsFigure(wins)
		if cmp == 0 {
			fig = "no hub/gohub pair in this run"
		}
		add("the goroutine-per-connection hub loses on every row", cmp > 0, len(wins) == 0, fig)
	}
	return ts
}
