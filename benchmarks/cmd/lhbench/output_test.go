package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/benchmarks/internal/hist"
)

// targetScale returns the at-scale target whose name starts with prefix.
func targetScale(t *testing.T, ts []Target, prefix string) Target {
	t.Helper()
	for _, x := range ts {
		if strings.HasPrefix(x.Name, prefix) {
			return x
		}
	}
	t.Fatalf("no at-scale target %q in %+v", prefix, ts)
	return Target{}
}

// TestTargetsScale feeds a hand-built run (paced 256 procs, the 64-procs
// flood, churn; no 1×256, no many-channels scenario) to the at-scale
// verdicts and to the tables.
func TestTargetsScale(t *testing.T) {
	procs := func(n int) layout { return layout{Procs: n, ConnsPerProc: 1} }
	r := &Results{
		Paced: []LatencyRow{
			{System: "hub", N: 256, Layout: procs(256), Recv: 100000, CPU: 1.0, Lat: hist.Summary{Count: 100000, P50: 9000, P99: 30000}},
			{System: "gohub", N: 256, Layout: procs(256), Recv: 100000, CPU: 2.0, Lat: hist.Summary{Count: 100000, P50: 9000, P99: 40000}},
		},
		Saturation: []SatRow{
			{System: "hub", N: 64, Layout: procs(64), DeliveriesPerS: 200000, SustainedTested: true, SustainedDeliv: 60000, CPUPerDelivery: 900},
			{System: "gohub", N: 64, Layout: procs(64), DeliveriesPerS: 100000, SustainedTested: true, SustainedDeliv: 50000, CPUPerDelivery: 1000},
		},
		Churn: []ChurnRow{{System: "hub", Cycles: 100000, RSSBefore: 10e6, RSSAfter: 16e6}},
	}
	r.Targets, r.TargetsScale = evaluateListen(r, nil), evaluateScale(r)
	ts := r.TargetsScale

	for _, c := range []struct{ prefix, want string }{
		{"paced N=256 (256 procs)", "met"},                      // 30 ms < 40 ms
		{"paced 1×256", "not run"},                              // no 1×256 rows
		{"sustained deliveries/s at N=64 (64 procs)", "met"},    // 60k ≥ 50k
		{"sustained deliveries/s at N=64 (1×64)", "not run"},    // no 1×64 rows
		{"CPU/delivery ≤ 0.8× gohub's: paced 256 procs", "met"}, // 10 µs vs 20 µs
		{"CPU/delivery ≤ 0.8× gohub's: paced 64 procs", "not run"},
		{"CPU/delivery ≤ 0.8× gohub's: flood 64 procs", "NOT MET"}, // 0.9×
		{"50,000 channels", "not run"},                             // no many-channels scenario
		{"idle memory", "not run"},
		{"churn: RSS growth", "NOT MET"},                  // +6 MB per 100,000 cycles
		{"the goroutine-per-connection hub loses", "met"}, // gohub wins no compared row
	} {
		if got := targetScale(t, ts, c.prefix); got.Met != c.want {
			t.Errorf("%s: verdict %q, want %q (figure %q)", c.prefix, got.Met, c.want, got.Figure)
		}
	}
	if f := targetScale(t, ts, "paced 1×256").Figure; !strings.Contains(f, "no hub paced 1×256") {
		t.Errorf("not-run figure %q does not name the missing row", f)
	}
	if f := targetScale(t, ts, "CPU/delivery ≤ 0.8× gohub's: paced 256 procs").Figure; !strings.Contains(f, "(0.50×)") {
		t.Errorf("CPU figure %q lacks the hub/gohub ratio 0.50×", f)
	}

	// The at-scale table is printed right after the listen-side one, which no
	// longer carries the many-channels target.
	tbls := tables(r)
	if n := len(tbls); n < 2 || tbls[n-2].title != "Targets: the listen side" || tbls[n-1].title != "Targets: at scale" {
		t.Fatalf("last tables are not the listen side then at scale: %v", titles(tbls))
	}
	for _, row := range tbls[len(tbls)-2].rows {
		if strings.Contains(row[1], "channels") {
			t.Errorf("listen-side table still has %q", row[1])
		}
	}
	if got, want := len(tbls[len(tbls)-1].rows), len(ts); got != want {
		t.Errorf("at-scale table has %d rows, want %d", got, want)
	}
}

func titles(ts []*table) []string {
	var s []string
	for _, t := range ts {
		s = append(s, t.title)
	}
	return s
}

// TestTargetsScaleSavedRun re-evaluates a saved many-channels run: the
// channels target is measured there, the scenarios it did not run are not.
func TestTargetsScaleSavedRun(t *testing.T) {
	b, err := os.ReadFile("../../results/2026-12-03-channels.json")
	if err != nil {
		t.Fatal(err)
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	ts := evaluateScale(&r)
	if got := targetScale(t, ts, "50,000 channels"); got.Met != "met" || !strings.Contains(got.Figure, "(109%)") {
		t.Errorf("channels target: %+v, want met at 109%%", got)
	}
	if got := targetScale(t, ts, "paced N=256 (256 procs)"); got.Met != "not run" {
		t.Errorf("paced target of a channels-only run: %q, want not run", got.Met)
	}
	if got := targetScale(t, ts, "the goroutine-per-connection hub loses"); got.Met != "not run" {
		t.Errorf("gohub target without gohub rows: %q, want not run", got.Met)
	}
}
