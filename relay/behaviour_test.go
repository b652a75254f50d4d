package relay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

// startAndResync starts a relay on a new slot and waits for its resync
// wakes (one per channel the listener has), so that the counts a test
// checks afterwards start from there.
func (f *fixture) startAndResync(opts Options, l *listener, chans ...string) *Relay {
	f.t.Helper()
	r := f.start(opts)
	waitActive(f.t, r)
	for _, ch := range chans {
		testutil.WaitFor(f.t, 10*time.Second, "resync wake on "+ch, func() bool { return l.count(ch) >= 1 })
	}
	// Counted just after its NOTIFY commits.
	testutil.WaitFor(f.t, 10*time.Second, "the resync counted", func() bool { return r.Stats().Resyncs >= 1 })
	return r
}

// quiet checks that nothing more arrives for a moment: no timing
// assertion, a chance for a wrong extra wake to show.
func (l *listener) quiet(t *testing.T, r *Relay, want map[string]int) {
	t.Helper()
	// Every transaction so far is NOTIFYed once the relay has confirmed
	// past it; one more committed transaction, NOTIFYed on a channel
	// nobody checks, is a fence for everything before it.
	for ch, n := range want {
		if got := l.count(ch); got != n {
			t.Errorf("%s: %d wakes, want %d", ch, got, n)
		}
	}
}

// fence commits a change on a fence table and waits for its wake: every
// change committed before it has been relayed by then (the stream is in
// commit order).
func (f *fixture) fence(l *listener) {
	f.t.Helper()
	ch := f.schema + ".fence.INSERT"
	n := l.count(ch)
	f.exec("INSERT INTO " + f.schema + ".fence (v) VALUES ('f')")
	testutil.WaitFor(f.t, 10*time.Second, "the fence's wake", func() bool { return l.count(ch) > n })
}

func TestRelayAlterTable(t *testing.T) {
	f := newFixture(t, "q_jobs", "fence")
	ch := f.schema + ".q_jobs.INSERT"
	renamed := f.schema + ".q_renamed.INSERT"
	l := listen(t, ch, renamed, f.schema+".fence.INSERT")
	f.startAndResync(f.options(), l, ch)
	f.exec("INSERT INTO " + f.schema + ".q_jobs (v) VALUES ('a')")
	testutil.WaitFor(t, 10*time.Second, "wake", func() bool { return l.count(ch) == 2 })
	// A new column: the next change comes with a new Relation message.
	f.exec("ALTER TABLE " + f.schema + ".q_jobs ADD COLUMN extra int DEFAULT 7, ALTER COLUMN v TYPE varchar(20)")
	f.exec("INSERT INTO " + f.schema + ".q_jobs (v, extra) VALUES ('b', 1)")
	testutil.WaitFor(t, 10*time.Second, "wake after ALTER TABLE", func() bool { return l.count(ch) == 3 })
	// A rename: the channel follows the name.
	f.exec("ALTER TABLE " + f.schema + ".q_jobs RENAME TO q_renamed")
	f.exec("INSERT INTO " + f.schema + ".q_renamed (v) VALUES ('c')")
	testutil.WaitFor(t, 10*time.Second, "wake on the new name", func() bool { return l.count(renamed) == 1 })
	f.fence(l)
	l.quiet(t, nil, map[string]int{ch: 3, renamed: 1})
}

func TestRelayTableCreatedAfterStart(t *testing.T) {
	f := newFixture(t, "q_first")
	ch := f.schema + ".q_late.INSERT"
	l := listen(t, ch)
	r := f.startAndResync(f.options(), l)
	f.exec("CREATE TABLE " + f.schema + ".q_late (id bigserial PRIMARY KEY, v text)")
	f.exec("INSERT INTO " + f.schema + ".q_late (v) VALUES ('a')")
	testutil.WaitFor(t, 10*time.Second, "wake from a table created after start", func() bool { return l.count(ch) == 1 })
	if st := r.Stats(); st.Reconnects != 0 {
		t.Errorf("the relay reconnected %d times; a new table must join without", st.Reconnects)
	}
}

func TestRelayTruncate(t *testing.T) {
	f := newFixture(t, "q_a", "q_b", "fence")
	ins, trA, trB := f.schema+".q_a.INSERT", f.schema+".q_a.TRUNCATE", f.schema+".q_b.TRUNCATE"
	l := listen(t, ins, trA, trB, f.schema+".fence.INSERT", f.schema+".fence.TRUNCATE")
	opts := f.options()
	opts.Ops = OpInsert | OpTruncate
	f.startAndResync(opts, l, ins, trA, trB)
	f.exec("INSERT INTO " + f.schema + ".q_a (v) VALUES ('a')")
	f.exec("TRUNCATE " + f.schema + ".q_a, " + f.schema + ".q_b")
	testutil.WaitFor(t, 10*time.Second, "TRUNCATE wakes", func() bool { return l.count(trA) == 2 && l.count(trB) == 2 })
	f.fence(l)
	l.quiet(t, nil, map[string]int{ins: 2, trA: 2, trB: 2})
}

func TestRelayTruncateNotWatched(t *testing.T) {
	f := newFixture(t, "q_a", "fence")
	tr := f.schema + ".q_a.TRUNCATE"
	l := listen(t, tr, f.schema+".fence.INSERT")
	f.startAndResync(f.options(), l, f.schema+".fence.INSERT")
	f.exec("TRUNCATE " + f.schema + ".q_a")
	f.exec("DELETE FROM " + f.schema + ".fence")
	f.fence(l)
	l.quiet(t, nil, map[string]int{tr: 0})
}

// TestRelayLargeTransaction: one transaction of many rows over two tables
// is one NOTIFY per channel. 10,000 rows in CI; the full 100,000 with
// LISTENHUB_TEST_LARGE_SET.
func TestRelayLargeTransaction(t *testing.T) {
	rows := 10000
	if os.Getenv("LISTENHUB_TEST_LARGE_SET") != "" {
		rows = 100000
	}
	f := newFixture(t, "q_a", "q_b", "fence")
	a, b := f.schema+".q_a.INSERT", f.schema+".q_b.INSERT"
	l := listen(t, a, b, f.schema+".fence.INSERT")
	r := f.startAndResync(f.options(), l, a, b)
	before := r.Stats()
	t0 := time.Now()
	f.exec(fmt.Sprintf(`BEGIN; INSERT INTO %[1]s.q_a (v) SELECT 'x' FROM generate_series(1, %[2]d);
		INSERT INTO %[1]s.q_b (v) SELECT 'y' FROM generate_series(1, %[2]d); COMMIT`, f.schema, rows/2))
	commit := time.Now()
	testutil.WaitFor(t, 60*time.Second, "the wakes", func() bool { return l.count(a) == 2 && l.count(b) == 2 })
	t.Logf("%d rows in one transaction: written in %v, woken %v after the commit", rows, commit.Sub(t0), time.Since(commit))
	f.fence(l)
	l.quiet(t, nil, map[string]int{a: 2, b: 2})
	// The counters move just after the NOTIFY commits, so a moment
	// after its wake.
	testutil.WaitFor(t, 5*time.Second, "the fence counted", func() bool {
		return r.Stats().Changes-before.Changes >= uint64(rows)+1
	})
	st := r.Stats()
	if d := st.Changes - before.Changes; d != uint64(rows)+1 { // and the fence
		t.Errorf("%d changes decoded, want %d", d, rows+1)
	}
	if d := st.Notifies - before.Notifies; d != 3 {
		t.Errorf("%d NOTIFYs, want 3 (two channels and the fence)", d)
	}
}

func TestRelayOutsidePublication(t *testing.T) {
	f := newFixture(t, "q_in", "fence")
	other := fmt.Sprintf("rt_out%d", testSeq.Add(1))
	f.exec("CREATE SCHEMA " + other)
	t.Cleanup(func() { db.Exec(context.Background(), "DROP SCHEMA "+other+" CASCADE") })
	f.exec("CREATE TABLE " + other + ".q_out (id bigserial PRIMARY KEY, v text)")
	out := other + ".q_out.INSERT"
	l := listen(t, out, f.schema+".fence.INSERT")
	r := f.startAndResync(f.options(), l, f.schema+".fence.INSERT")
	before := r.Stats()
	for i := 0; i < 20; i++ {
		f.exec("INSERT INTO " + other + ".q_out (v) VALUES ('x')")
	}
	f.fence(l)
	l.quiet(t, nil, map[string]int{out: 0})
	testutil.WaitFor(t, 5*time.Second, "the fence counted", func() bool { return r.Stats().Transactions > before.Transactions })
	if d := r.Stats().Transactions - before.Transactions; d != 1 {
		t.Errorf("%d transactions relayed, want 1 (the fence)", d)
	}
}

func TestRelayTLS(t *testing.T) {
	if db.TLSURL() == "" {
		t.Skip("no TLS on this server")
	}
	f := newFixture(t, "q_jobs")
	ch := f.schema + ".q_jobs.INSERT"
	l := listen(t, ch)
	opts := f.options()
	cc, err := pgconn.ParseConfig(db.TLSURL())
	if err != nil {
		t.Fatal(err)
	}
	opts.ConnConfig = cc
	f.startAndResync(opts, l, ch)
	f.exec("INSERT INTO " + f.schema + ".q_jobs (v) VALUES ('a')")
	testutil.WaitFor(t, 10*time.Second, "wake over TLS", func() bool { return l.count(ch) == 2 })
	// Both connections are encrypted.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := db.QueryInt(ctx, `SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
		WHERE a.application_name = $1 AND s.ssl`, defaultApplicationName)
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Errorf("%d of the relay's connections use TLS, want 2", n)
	}
}

// TestRelayPostgresRestart restarts PostgreSQL while writers commit: the
// relay reconnects, the slot replays, and no insert misses its wake.
func TestRelayPostgresRestart(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	f := newFixture(t, "q_a", "q_b")
	w := newWorkload(t, f, "q_a", "q_b")
	r := f.start(f.options())
	waitActive(t, r)
	w.burst(20)
	w.settle(10 * time.Second)
	t0, n0 := time.Now(), w.commitCount()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { w.write(1<<30, stop); close(done) }()
	testutil.WaitFor(t, 20*time.Second, "wakes of the burst", func() bool {
		return w.readsSince(t0) >= 1 && w.commitCount() >= n0+20
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pgtesting.Must(t, db.Restart(ctx))
	n1 := w.commitCount()
	testutil.WaitFor(t, 30*time.Second, "commits after the restart", func() bool { return w.commitCount() >= n1+60 })
	close(stop)
	<-done
	w.settle(20 * time.Second)
	testutil.WaitFor(t, 10*time.Second, "relay active again", func() bool {
		st := r.Stats()
		return st.State == StateActive && st.Reconnects >= 1
	})
	w.report()
}

// TestRelayMisconfiguration: each misconfiguration is a ConfigError whose
// one line names the fix.
func TestRelayMisconfiguration(t *testing.T) {
	f := newFixture(t, "q_jobs")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(opts Options) error {
		t.Helper()
		r, err := New(opts)
		if err != nil {
			return err
		}
		return r.Run(ctx)
	}
	check := func(name string, err error, want ...string) {
		t.Helper()
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: %v, want a ConfigError", name, err)
			return
		}
		if strings.Contains(ce.Error(), "\n") {
			t.Errorf("%s: more than one line: %q", name, ce.Error())
		}
		for _, w := range want {
			if !strings.Contains(ce.Error(), w) {
				t.Errorf("%s: %q does not say %q", name, ce.Error(), w)
			}
		}
	}

	opts := f.options()
	opts.Publication = "no_such_pub"
	check("missing publication", run(opts), `CREATE PUBLICATION "no_such_pub" FOR`, "--create-publication")

	role := fmt.Sprintf("rt_norepl%d", testSeq.Add(1))
	f.exec("CREATE ROLE " + role + " LOGIN")
	t.Cleanup(func() { db.Exec(context.Background(), "DROP ROLE "+role) })
	opts = f.options()
	opts.ConnConfig.User = role
	check("no REPLICATION", run(opts), `ALTER ROLE "`+role+`" REPLICATION`)

	// An op NOTIFYed that the publication does not publish would never
	// wake anyone.
	f.exec("ALTER PUBLICATION " + f.pub + " SET (publish = 'insert')")
	opts = f.options()
	opts.Ops = OpInsert | OpDelete
	check("op not published", run(opts), "does not publish delete", `ALTER PUBLICATION "`+f.pub+`" SET (publish = 'insert,delete')`)
	f.exec("ALTER PUBLICATION " + f.pub + " SET (publish = 'insert, update, delete, truncate')")

	long := "q_" + strings.Repeat("x", 56)
	f.exec("CREATE TABLE " + f.schema + "." + long + " (id int)")
	check("channel too long", run(f.options()), "over the 63", long)

	opts = f.options()
	opts.ConnConfig.Database = "no_such_db"
	check("no such database", run(opts), "no_such_db")

	// A template that cannot fit any table is refused by New.
	opts = f.options()
	opts.ChannelTemplate = strings.Repeat("x", 64) + "{table}"
	if _, err := New(opts); err == nil {
		t.Error("New accepted a template whose channels are all too long")
	}
	opts.ChannelTemplate = "{schema}.{tabel}"
	if _, err := New(opts); err == nil || !strings.Contains(err.Error(), "{tabel}") {
		t.Errorf("New with a misspelt placeholder: %v", err)
	}
}

func TestRelayCreatePublication(t *testing.T) {
	f := newFixture(t, "q_jobs")
	f.exec("DROP PUBLICATION " + f.pub)
	ch := f.schema + ".q_jobs.INSERT"
	l := listen(t, ch)
	opts := f.options()
	opts.CreatePublication = "TABLES IN SCHEMA " + f.schema
	f.startAndResync(opts, l, ch)
	f.exec("INSERT INTO " + f.schema + ".q_jobs (v) VALUES ('a')")
	testutil.WaitFor(t, 10*time.Second, "wake", func() bool { return l.count(ch) == 2 })
	// It publishes only what the relay NOTIFYs (insert, the default ops):
	// the walsender sends no update or delete for nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := db.QueryInt(ctx, "SELECT count(*)::int FROM pg_publication WHERE pubname = $1 AND pubinsert AND NOT (pubupdate OR pubdelete OR pubtruncate)", f.pub)
	if err != nil || n != 1 {
		t.Errorf("the publication created publishes more than inserts (%d matching, %v)", n, err)
	}
}

// TestRelayChannelTooLongLater: a table renamed after start to a name
// whose channel is too long is counted and logged, never sent truncated.
func TestRelayChannelTooLongLater(t *testing.T) {
	f := newFixture(t, "q_jobs", "fence")
	long := "q_" + strings.Repeat("y", 55)
	ch := f.schema + ".q_jobs.INSERT"
	full := f.schema + "." + long + ".INSERT"
	l := listen(t, ch, full[:63], f.schema+".fence.INSERT")
	r := f.startAndResync(f.options(), l, ch)
	f.exec("ALTER TABLE " + f.schema + ".q_jobs RENAME TO " + long)
	f.exec("INSERT INTO " + f.schema + "." + long + " (v) VALUES ('a')")
	f.fence(l)
	testutil.WaitFor(t, 5*time.Second, "the rename's change counted", func() bool { return r.Stats().ChannelsTooLong >= 1 })
	if n := r.Stats().ChannelsTooLong; n != 1 {
		t.Errorf("ChannelsTooLong = %d, want 1", n)
	}
	l.quiet(t, nil, map[string]int{full[:63]: 0})
}

// TestRelayTemporarySlot: a temporary slot resyncs every channel at start,
// and a second relay with the same slot name stands by.
func TestRelayTemporarySlot(t *testing.T) {
	f := newFixture(t, "q_a", "q_b")
	a, b := f.schema+".q_a.INSERT", f.schema+".q_b.INSERT"
	l := listen(t, a, b)
	opts := f.options()
	opts.TemporarySlot = true
	opts.StandbyRetry = 50 * time.Millisecond
	r1 := f.startAndResync(opts, l, a, b)
	r2 := f.start(opts)
	testutil.WaitFor(t, 10*time.Second, "the second one standing by", func() bool { return r2.Stats().State == StateStandby })
	f.exec("INSERT INTO " + f.schema + ".q_a (v) VALUES ('a')")
	testutil.WaitFor(t, 10*time.Second, "wake", func() bool { return l.count(a) == 2 })
	if r1.Stats().Resyncs != 1 {
		t.Errorf("resyncs %d, want 1", r1.Stats().Resyncs)
	}
}

// TestRelayLatency measures commit to wake at a LISTENer for one writer
// committing one row at a time (no coalescing to wait for): the relay
// must not add a window's worth of latency when nothing more is waiting.
// It logs the distribution; the assertion is loose (a loaded 2-core
// machine).
func TestRelayLatency(t *testing.T) {
	f := newFixture(t, "q_jobs")
	ch := f.schema + ".q_jobs.INSERT"
	l := listen(t, ch)
	opts := f.options()
	opts.Window = 20 * time.Millisecond // far longer than the wakes must take
	r := f.startAndResync(opts, l, ch)
	n := 200
	if testing.Short() {
		n = 50
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgconn.Connect(ctx, db.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		if _, err := conn.Exec(ctx, "INSERT INTO "+f.schema+".q_jobs (v) VALUES ('a')").ReadAll(); err != nil {
			t.Fatal(err)
		}
		c := time.Now()
		testutil.WaitFor(t, 10*time.Second, "wake", func() bool { return l.count(ch) == i+2 })
		l.mu.Lock()
		lat = append(lat, l.at[ch][i+1].Sub(c))
		l.mu.Unlock()
	}
	slices.Sort(lat)
	p50, p90, p99 := lat[n/2], lat[n*9/10], lat[n*99/100]
	h := r.CommitToNotify()
	t.Logf("commit returned to wake received, %d sequential inserts: p50 %v p90 %v p99 %v max %v; relay's commit-to-NOTIFY histogram p50 <= %v p99 <= %v",
		n, p50, p90, p99, lat[n-1], h.Quantile(0.5), h.Quantile(0.99))
	if p50 > opts.Window {
		t.Errorf("p50 %v: the relay waits for its window although nothing more is coming", p50)
	}
}

// TestRelayConnectionsKilled terminates the relay's walsender, then its
// NOTIFY connection, while writers commit: each time the relay reconnects
// and the slot replays; no insert misses its wake.
func TestRelayConnectionsKilled(t *testing.T) {
	f := newFixture(t, "q_a", "q_b")
	w := newWorkload(t, f, "q_a", "q_b")
	opts := f.options()
	opts.ApplicationName = "relay-" + f.slot
	r := f.start(opts)
	waitActive(t, r)
	w.burst(10)
	w.settle(10 * time.Second)
	for round, kind := range []string{"walsender", "client backend"} {
		t0, n0 := time.Now(), w.commitCount()
		stop, done := make(chan struct{}), make(chan struct{})
		go func() { w.write(1<<30, stop); close(done) }()
		testutil.WaitFor(t, 20*time.Second, "wakes", func() bool { return w.readsSince(t0) >= 1 && w.commitCount() >= n0+20 })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := db.QueryInt(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int FROM pg_stat_activity
			WHERE application_name = $1 AND backend_type = $2`, opts.ApplicationName, kind)
		cancel()
		if err != nil || n != 1 {
			t.Fatalf("terminated %d %s backends (%v), want 1", n, kind, err)
		}
		n1 := w.commitCount()
		testutil.WaitFor(t, 20*time.Second, "commits after the kill", func() bool { return w.commitCount() >= n1+40 })
		// A reader's re-read can cover commits made after its wake, so the
		// wakes alone do not show that the relay came back: wait for it.
		testutil.WaitFor(t, 20*time.Second, "the relay streaming again", func() bool {
			st := r.Stats()
			return st.Reconnects >= uint64(round+1) && st.State == StateActive
		})
		close(stop)
		<-done
		w.settle(15 * time.Second)
	}
	if st := r.Stats(); st.Reconnects < 2 {
		t.Errorf("%d reconnects, want 2", st.Reconnects)
	}
	w.report()
}

// TestRelayBacklogOneBatch: transactions decoded while a NOTIFY is stuck
// (its backend stopped) go out together in one NOTIFY transaction once it
// returns, even with a window far shorter than it takes to gather them:
// they are decoded already, so joining the batch waits for nothing.
func TestRelayBacklogOneBatch(t *testing.T) {
	f, ch, l := newListened(t, "q_a")
	opts := f.options()
	opts.ApplicationName = "relay-" + f.slot
	opts.Window = time.Microsecond
	r := f.start(opts)
	waitActive(t, r)
	f.exec("INSERT INTO " + f.schema + ".q_a (v) VALUES ('first')")
	testutil.WaitFor(t, 10*time.Second, "the first wake", func() bool { return l.count(ch) >= 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pid := pgtesting.FreezeIdleOnly(ctx, t, db, opts.ApplicationName)
	thawed := false
	defer func() {
		if !thawed {
			db.Thaw(pid)
		}
	}()
	// One insert whose NOTIFY gets stuck, then the backlog behind it.
	decoded := r.CommitToDecode().Count
	f.exec("INSERT INTO " + f.schema + ".q_a (v) VALUES ('stuck')")
	testutil.WaitFor(t, 10*time.Second, "the stuck NOTIFY sent", func() bool { return r.CommitToDecode().Count > decoded })
	const backlog = 200
	for i := 0; i < backlog; i++ {
		f.exec("INSERT INTO " + f.schema + ".q_a (v) VALUES ('b')")
	}
	testutil.WaitFor(t, 20*time.Second, "the backlog decoded", func() bool { return r.CommitToDecode().Count >= decoded+1+backlog })
	before := r.Stats()
	thawed = true
	if err := db.Thaw(pid); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "the backlog NOTIFYed", func() bool { return r.Stats().Transactions >= before.Transactions+1+backlog })
	if n := r.Stats().Batches - before.Batches; n > 2 {
		t.Errorf("%d NOTIFY transactions for a backlog of %d decoded behind a stuck one, want 2", n, backlog)
	}
}
