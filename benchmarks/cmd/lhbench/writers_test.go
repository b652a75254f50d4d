package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/benchmarks/internal/pgcluster"
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

// TestWritersSmoke runs the writers scenario small (4 writers, 4 queues, 2
// workers, 1 s per source) against its own cluster and the embedded hub:
// every source gives a row, the per-row trigger wakes for every insert and
// misses none, the throttled one wakes less, and the relay (the relay
// package embedded in this binary: `lhbench relay`; LHBENCH_TEST_RELAY_BIN
// names a listenhub binary to use instead) misses none either.
func TestWritersSmoke(t *testing.T) {
	if _, err := pgcluster.BinDir(); err != nil {
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
		WritersQueues: 4, WritersWorkers: 2, WritersSources: []string{"none", "trigger", "throttled", "relay"}, WritersThrottle: 250 * time.Millisecond}
	relayBin := os.Getenv("LHBENCH_TEST_RELAY_BIN")
	if relayBin == "" {
		relayBin = self
	}
	b := &bench{ctx: ctx, p: p, dir: t.TempDir(), logf: t.Logf, res: &Results{}, relayBin: relayBin}
	b.systems = []*system{{name: "hublib", argv: []string{self, "hublib"}, appName: "listenhub"}}
	if err := b.writersScenario(); err != nil {
		t.Fatal(err)
	}
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
	if i := b.res.WritersInfo; i == nil || !strings.Contains(strings.Join(i.Settings, " "), "fsync=on") || !strings.Contains(strings.Join(i.Settings, " "), "wal_level=logical") {
		t.Errorf("set-up: %+v", b.res.WritersInfo)
	}

	// The verdicts: W=64 and W=16 were not run; the misses were.
	ts := evaluate17(b.res)
	if len(ts) != 4 {
		t.Fatalf("%d issue-17 targets, want 4", len(ts))
	}
	for _, x := range ts[:3] {
		if x.Met != "not run" {
			t.Errorf("%s: %q, want not run", x.Name, x.Met)
		}
	}
	if x := ts[3]; x.Met != "met" || !strings.Contains(x.Figure, "W=4: 0 of") {
		t.Errorf("%s: %q (%s), want met with the W=4 count", x.Name, x.Met, x.Figure)
	}
	b.res.Targets17 = ts
	var sb strings.Builder
	printAll(&sb, b.res)
	for _, want := range []string{"## Writers: W writers insert into 4 pgmq queue tables", "## Targets (issue 17)", "throttled"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("tables lack %q:\n%s", want, sb.String())
		}
	}
	if strings.Contains(sb.String(), "Targets (issue 6)") {
		t.Errorf("a writers-only run prints the issue-6 targets:\n%s", sb.String())
	}
}
