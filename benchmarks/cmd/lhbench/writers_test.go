package main

import (
	"cmp"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/pgtest"
)

// childEnv makes this test binary act as lhbench when a test re-executes
// it (os.Executable is the test binary): the hub (hublib) and the workers
// are processes, as in a real run. It is checked in init, before the
// testing package parses the child's arguments as test flags.
const childEnv = "LHBENCH_TEST_CHILD"

func init() {
	if os.Getenv(childEnv) == "1" && len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-") {
		main()
		os.Exit(0)
	}
}

// runSmallWriters runs the writers scenario small (4 writers, 4 queues, 2
// workers behind the embedded hub, 1 s per source, one round) against its
// own cluster, with set changing the parameters; with no workers there is
// no hub among the systems, since the scenario then needs none. The relay
// is the relay package embedded in this binary (`lhbench relay`), or the
// listenhub binary LHBENCH_TEST_RELAY_BIN names.
func runSmallWriters(t *testing.T, set func(*params)) *bench {
	t.Helper()
	if _, err := pgtest.BinDir(); err != nil {
		t.Skip(err)
	}
	t.Setenv(childEnv, "1")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := params{WritersW: []int{4}, WritersDur: time.Second, WritersDrain: 500 * time.Millisecond, WritersCatchUp: time.Minute, WritersRounds: 1,
		WritersQueues: 4, WritersWorkers: 2, WritersThrottle: 250 * time.Millisecond}
	set(&p)
	relayBin := cmp.Or(os.Getenv("LHBENCH_TEST_RELAY_BIN"), self)
	b := &bench{ctx: ctx, p: p, dir: t.TempDir(), logf: t.Logf, res: &Results{}, relayBin: relayBin}
	if p.WritersWorkers > 0 {
		b.systems = []*system{{name: "hublib", argv: []string{self, "hublib"}, appName: "listenhub"}}
	}
	if err := b.writersScenario(); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWritersSmoke runs the writers scenario small (4 writers, 4 queues, 2
// workers, 1 s per source) against its own cluster and the embedded hub:
// every source gives a row, the per-row trigger wakes for every insert and
// misses none, the throttled one wakes less, and the relay (the relay
// package embedded in this binary: `lhbench relay`; LHBENCH_TEST_RELAY_BIN
// names a listenhub binary to use instead) misses none either.
func TestWritersSmoke(t *testing.T) {
	b := runSmallWriters(t, func(p *params) { p.WritersSources = []string{"none", "trigger", "throttled", "relay"} })
	p := b.p
	rows := map[string]WritersRow{}
	for _, r := range b.res.Writers {
		if r.Err != "" || r.Rounds != 1 || r.Commits == 0 {
			t.Errorf("%s W=%d: %d rounds, %d commits, error %q", r.Source, r.W, r.Rounds, r.Commits, r.Err)
		}
		rows[r.Source] = r
	}
	if len(rows) != len(p.WritersSources) {
		t.Fatalf("rows for %d sources, want %d: %+v", len(rows), len(p.WritersSources), b.res.Writers)
	}
	if r := rows["none"]; r.Wakes != 0 {
		t.Errorf("no wake source, yet %d wakes", r.Wakes)
	}
	trig, thr := rows["trigger"], rows["throttled"]
	if trig.Misses != 0 || trig.WakesPerInsert < 0.5 || trig.Wake.Count == 0 {
		t.Errorf("per-row trigger: %d misses, %.2f wakes/insert, %d latencies; want 0, about 1, all", trig.Misses, trig.WakesPerInsert, trig.Wake.Count)
	}
	if thr.WakesPerInsert >= trig.WakesPerInsert {
		t.Errorf("throttled trigger: %.2f wakes/insert, not fewer than the per-row trigger's %.2f", thr.WakesPerInsert, trig.WakesPerInsert)
	}
	if r := rows["relay"]; r.Misses != 0 || r.Wakes == 0 || r.Wake.Count == 0 {
		t.Errorf("relay: %d misses, %d wakes, %d latencies", r.Misses, r.Wakes, r.Wake.Count)
	} else if r.Relay == nil || r.Relay.Transactions == 0 || r.Relay.quantile(0.5) == 0 {
		t.Errorf("relay: its own figures were not read: %+v", r.Relay)
	}
	for _, r := range rows {
		// Where the cores went: the writers' client side always (a
		// second of inserts), the workers after the per-row trigger's
		// wake and re-read per insert (the CPU is counted in 10 ms
		// ticks, which a source's few wakes may not reach).
		if r.WritersCPU <= 0 || (r.Source == "trigger" && r.WorkersCPU <= 0) {
			t.Errorf("%s: writers' client CPU %v s, workers' CPU %v s after %d wakes", r.Source, r.WritersCPU, r.WorkersCPU, r.Wakes)
		}
	}
	if i := b.res.WritersInfo; i == nil || !strings.Contains(strings.Join(i.Settings, " "), "fsync=on") || !strings.Contains(strings.Join(i.Settings, " "), "wal_level=logical") {
		t.Errorf("set-up: %+v", b.res.WritersInfo)
	}

	// The verdicts: W=64 and W=16 were not run; the misses were.
	ts := evaluateWriters(b.res)
	if len(ts) != 4 {
		t.Fatalf("%d writers targets, want 4", len(ts))
	}
	for _, x := range ts[:3] {
		if x.Met != "not run" {
			t.Errorf("%s: %q, want not run", x.Name, x.Met)
		}
	}
	if x := ts[3]; x.Met != "met" || !strings.Contains(x.Figure, "W=4: 0 of") {
		t.Errorf("%s: %q (%s), want met with the W=4 count", x.Name, x.Met, x.Figure)
	}
	b.res.TargetsWriters = ts
	var sb strings.Builder
	printAll(&sb, b.res)
	for _, want := range []string{"## Writers: W writers insert into 4 pgmq queue tables", "## Targets: the writers", "throttled"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("tables lack %q:\n%s", want, sb.String())
		}
	}
	if strings.Contains(sb.String(), "Targets: the listen side") {
		t.Errorf("a writers-only run prints the listen-side targets:\n%s", sb.String())
	}
}

// TestWritersNoWorkers runs the writers scenario with --writers-workers 0
// and no hub among the systems: no hub and no worker is started, every
// source still gives commits, the wake figures and misses are "-" in the
// table and not counted, their targets are not run (not met), and the
// relay's row still has its own figures (it waited until the relay had
// decoded every commit).
func TestWritersNoWorkers(t *testing.T) {
	b := runSmallWriters(t, func(p *params) { p.WritersWorkers, p.WritersSources = 0, []string{"none", "trigger", "relay"} })
	p := b.p
	rows := map[string]WritersRow{}
	for _, r := range b.res.Writers {
		if r.Err != "" || r.Rounds != 1 || r.Commits == 0 {
			t.Errorf("%s W=%d: %d rounds, %d commits, error %q", r.Source, r.W, r.Rounds, r.Commits, r.Err)
		}
		if r.Wakes != 0 || r.Reads != 0 || r.Wake.Count != 0 || r.WakesPerInsert != 0 || r.Misses != 0 || r.HubCPU != 0 {
			t.Errorf("%s: no workers, yet %d wakes, %d re-reads, %d latencies, %v wakes/insert, %d misses, hub CPU %v s",
				r.Source, r.Wakes, r.Reads, r.Wake.Count, r.WakesPerInsert, r.Misses, r.HubCPU)
		}
		if r.PGCPU <= 0 {
			t.Errorf("%s: PostgreSQL CPU %v s", r.Source, r.PGCPU)
		}
		rows[r.Source] = r
	}
	if len(rows) != len(p.WritersSources) {
		t.Fatalf("rows for %d sources, want %d: %+v", len(rows), len(p.WritersSources), b.res.Writers)
	}
	relay := rows["relay"]
	if relay.RelayCPU <= 0 || relay.Relay == nil || relay.Relay.Transactions < float64(relay.Commits) || relay.Relay.quantile(0.5) == 0 || relay.Relay.WalsenderCPU <= 0 {
		t.Errorf("relay: CPU %v s, its own figures %+v; want all of its %d commits decoded, a commit → NOTIFY, walsender CPU", relay.RelayCPU, relay.Relay, relay.Commits)
	}
	if i := b.res.WritersInfo; i == nil || i.Workers != 0 {
		t.Errorf("set-up: %+v", b.res.WritersInfo)
	}

	// The table: wake figures "-", the relay's own figures there.
	tab := writersTable(b.res)
	col := map[string]int{}
	for i, h := range tab.header {
		col[h] = i
	}
	if !strings.Contains(tab.title, "no hub and no workers") {
		t.Errorf("title: %q", tab.title)
	}
	for _, row := range tab.rows {
		for _, h := range []string{"wake p50", "wake p99", "wake max", "wakes/insert", "misses", "hub CPU/commit"} {
			if row[col[h]] != "-" {
				t.Errorf("%s: %s %q, want -", row[0], h, row[col[h]])
			}
		}
		if row[col["PG CPU/commit"]] == "-" {
			t.Errorf("%s: no PostgreSQL CPU per commit", row[0])
		}
		if row[0] == "relay" {
			for _, h := range []string{"relay CPU/commit", "relay commit→NOTIFY p50/p99", "relay caught up"} {
				if row[col[h]] == "-" {
					t.Errorf("relay: %s %q", h, row[col[h]])
				}
			}
			if c := row[col["relay CPU/commit"]]; !strings.Contains(c, "walsender") {
				t.Errorf("relay: CPU/commit %q, without the walsender's", c)
			}
		}
	}

	// The verdicts: the wake and misses targets are not run, not met.
	ts := evaluateWriters(b.res)
	if len(ts) != 4 {
		t.Fatalf("%d writers targets, want 4", len(ts))
	}
	if x := ts[3]; x.Met != "not run" || !strings.Contains(x.Figure, "not counted") {
		t.Errorf("%s: %q (%s), want not run", x.Name, x.Met, x.Figure)
	}
	b.res.TargetsWriters = ts
	var sb strings.Builder
	printAll(&sb, b.res)
	t.Logf("the tables:\n%s", sb.String())
}

// TestWritersVerdictsNoWorkers: the writers verdicts of a run without workers
// judge the writers' rates, and give the wake and misses targets no verdict
// (their zeros measured nothing), however good the relay's own figures.
func TestWritersVerdictsNoWorkers(t *testing.T) {
	relayFigs := &relayFigures{Transactions: 1000, CommitToNotify: map[string]float64{"0.001": 1000, "0.01": 1000, "+Inf": 1000}}
	row := func(src string, w int, rate float64) WritersRow {
		x := WritersRow{Source: src, W: w, Rounds: 1, Commits: int(rate), Seconds: 1, CommitsPerS: rate, PGCPU: 0.1}
		if src == "relay" {
			x.Relay = relayFigs
		}
		return x
	}
	r := &Results{WritersInfo: &WritersInfo{Workers: 0},
		Writers: []WritersRow{row("none", 64, 1000), row("trigger", 64, 200), row("relay", 64, 900), row("relay", 16, 900)}}
	ts := evaluateWriters(r)
	want := []string{"met", "met", "not run", "not run"}
	if len(ts) != len(want) {
		t.Fatalf("%d targets, want %d", len(ts), len(want))
	}
	for i, x := range ts {
		if x.Met != want[i] {
			t.Errorf("%s: %q (%s), want %q", x.Name, x.Met, x.Figure, want[i])
		}
	}
	if !strings.Contains(ts[2].Figure, "wakes not measured") || !strings.Contains(ts[2].Figure, "100.0% within 10 ms") {
		t.Errorf("%s: %s; want no workers, and the relay's own figure", ts[2].Name, ts[2].Figure)
	}

	// The same rows with workers are judged on their (zero) wake figures.
	r.WritersInfo.Workers = 8
	if ts := evaluateWriters(r); ts[2].Met != "met" || ts[3].Met != "met" {
		t.Errorf("with workers: %q, %q; want met, met", ts[2].Met, ts[3].Met)
	}
}

// TestWritersNoReread runs the writers scenario with workers that never
// re-read (--writers-no-reread): the per-row trigger's wakes still reach
// them, no queue is re-read, misses are not counted, and no writers
// target gets a verdict from such a run.
func TestWritersNoReread(t *testing.T) {
	b := runSmallWriters(t, func(p *params) { p.WritersNoReread, p.WritersSources = true, []string{"none", "trigger"} })
	var trig *WritersRow
	for i, r := range b.res.Writers {
		if r.Err != "" || r.Commits == 0 {
			t.Errorf("%s: %d commits, error %q", r.Source, r.Commits, r.Err)
		}
		if r.Reads != 0 || r.Misses != 0 {
			t.Errorf("%s: %d re-reads, %d misses; want none of either", r.Source, r.Reads, r.Misses)
		}
		if r.Source == "trigger" {
			trig = &b.res.Writers[i]
		}
	}
	if trig == nil || trig.WakesPerInsert < 0.5 || trig.Wake.Count == 0 {
		t.Fatalf("per-row trigger: %+v; want about one wake per insert, with latencies", trig)
	}
	if !strings.Contains(writersTable(b.res).title, "never re-read") {
		t.Errorf("title: %q", writersTable(b.res).title)
	}
	for _, x := range evaluateWriters(b.res) {
		if x.Met != "not run" {
			t.Errorf("%s: %q (%s), want not run", x.Name, x.Met, x.Figure)
		}
	}
}
