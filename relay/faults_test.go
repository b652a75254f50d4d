package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/relayfix"
	"github.com/listenhub/listenhub/internal/testutil"
)

// running is a relay run by a test that may end on its own.
type running struct {
	r    *Relay
	log  *testutil.SyncBuffer
	done chan error
	stop context.CancelFunc
}

// newListened is newFixture with one table and a listener on the
// channel of its inserts.
func newListened(t *testing.T, table string) (f *fixture, ch string, l *listener) {
	t.Helper()
	f = newFixture(t, table)
	ch = f.schema + "." + table + ".INSERT"
	return f, ch, listen(t, ch)
}

// runToWakes is run, then the waits until the relay streams and ch has had
// n wakes (what names that wait).
func (f *fixture) runToWakes(opts Options, l *listener, ch string, n int, what string) *running {
	f.t.Helper()
	rn := f.run(opts)
	waitActive(f.t, rn.r)
	testutil.WaitFor(f.t, 10*time.Second, what, func() bool { return l.count(ch) == n })
	return rn
}

// checkRunning fails the test if the relay has ended (and leaves the
// end for others to see).
func (rn *running) checkRunning(t *testing.T) {
	t.Helper()
	select {
	case err := <-rn.done:
		rn.done <- err
		t.Fatalf("the relay ended: %v", err)
	default:
	}
}

// beginBlocker opens a connection of its own and begins a transaction on
// it, for a test to hold open.
func beginBlocker(t *testing.T, ctx context.Context) *pgx.Conn {
	t.Helper()
	blocker := pgtesting.Connect(t, db.URL())
	if _, err := blocker.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	return blocker
}

// run runs a relay whose log the test reads; the test ends it (or it ends
// on a permanent error).
func (f *fixture) run(opts Options) *running {
	f.t.Helper()
	buf := &testutil.SyncBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(buf, testWriter{f.t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := New(opts)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rn := &running{r: r, log: buf, done: make(chan error, 1), stop: cancel}
	go func() { rn.done <- r.Run(ctx) }()
	f.t.Cleanup(func() {
		cancel()
		select {
		case <-rn.done:
		case <-time.After(15 * time.Second):
			f.t.Error("the relay did not stop")
		}
	})
	return rn
}

// ended waits for Run to return on its own and returns its ConfigError.
func (rn *running) ended(t *testing.T, timeout time.Duration, want ...string) *ConfigError {
	t.Helper()
	select {
	case err := <-rn.done:
		rn.done <- err // for the cleanup
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Fatalf("Run: %v, want a ConfigError", err)
		}
		if strings.Contains(ce.Error(), "\n") {
			t.Errorf("more than one line: %q", ce.Error())
		}
		for _, w := range want {
			if !strings.Contains(ce.Error(), w) {
				t.Errorf("%q does not say %q", ce.Error(), w)
			}
		}
		return ce
	case <-time.After(timeout):
		t.Fatalf("Run still running after %v, want a ConfigError naming the fix; log:\n%s", timeout, rn.log.String())
	}
	return nil
}

func (f *fixture) insert(table string) {
	f.exec("INSERT INTO " + f.schema + "." + table + " (v) VALUES ('x')")
}

// TestRelayPublicationDroppedAndCreated: a publication dropped while the
// relay runs ends it with the fix; after CREATE PUBLICATION, the slot's
// position predates the new publication, which the relay names (once, no
// loop) with its fix; applying that fix (--recreate-invalid-slot) streams
// again with a resync wake covering what was never decoded.
func TestRelayPublicationDroppedAndCreated(t *testing.T) {
	f, ch, l := newListened(t, "q_a")
	rn := f.runToWakes(f.options(), l, ch, 1, "resync")
	f.exec("DROP PUBLICATION " + f.pub)
	f.insert("q_a")
	rn.ended(t, 10*time.Second, "was dropped while the relay ran", `CREATE PUBLICATION "`+f.pub+`"`, "pg_drop_replication_slot", "--recreate-invalid-slot")

	// The first half of the fix alone: the relay says what is left.
	f.exec("CREATE PUBLICATION " + f.pub + " FOR TABLES IN SCHEMA " + f.schema)
	f.insert("q_a")
	rn = f.run(f.options())
	t0 := time.Now()
	rn.ended(t, 10*time.Second, "predates", "pg_drop_replication_slot('"+f.slot+"')", "--recreate-invalid-slot")
	t.Logf("the slot's position predating the publication named after %v", time.Since(t0))
	if n := strings.Count(rn.log.String(), "streaming again"); n > 0 {
		t.Errorf("%d times streaming again: a deterministic error retried", n)
	}

	// The named fix, applied: a new slot, and its resync.
	opts := f.options()
	opts.RecreateInvalidSlot = true
	rn = f.run(opts)
	waitActive(t, rn.r)
	testutil.WaitFor(t, 10*time.Second, "the new slot's resync", func() bool { return l.count(ch) == 2 })
	f.insert("q_a")
	testutil.WaitFor(t, 10*time.Second, "a wake after the fix", func() bool { return l.count(ch) == 3 })
	if !strings.Contains(rn.log.String(), "dropped the replication slot to create it again") {
		t.Error("the recreation was not logged")
	}
}

// TestRelayPublicationDroppedSelfHeals: a relay started with both
// --create-publication and --recreate-invalid-slot already has the fix for
// a publication dropped while it runs. It applies it instead of exiting
// with advice to start it with the flags it has: the publication created
// again, a new slot, and its resync covering what was committed meanwhile.
func TestRelayPublicationDroppedSelfHeals(t *testing.T) {
	f, ch, l := newListened(t, "q_a")
	opts := f.options()
	opts.CreatePublication = "TABLES IN SCHEMA " + f.schema
	opts.RecreateInvalidSlot = true
	rn := f.runToWakes(opts, l, ch, 1, "resync")
	f.exec("DROP PUBLICATION " + f.pub)
	f.insert("q_a") // committed while there is no publication
	testutil.WaitFor(t, 15*time.Second, "the resync of a new slot", func() bool {
		rn.checkRunning(t)
		return l.count(ch) >= 2
	})
	waitActive(t, rn.r)
	n := l.count(ch)
	f.insert("q_a")
	testutil.WaitFor(t, 10*time.Second, "a wake after", func() bool { return l.count(ch) > n })
}

// TestRelayPublicationDroppedTemporarySlot: with --temporary-slot there is
// no slot left to drop once the relay stops, so the fix named for a
// dropped publication is the publication alone; with --create-publication
// the relay makes it again itself, on a new temporary slot and its resync.
func TestRelayPublicationDroppedTemporarySlot(t *testing.T) {
	f, ch, l := newListened(t, "q_a")
	opts := f.options()
	opts.TemporarySlot = true
	rn := f.runToWakes(opts, l, ch, 1, "resync")
	f.exec("DROP PUBLICATION " + f.pub)
	f.insert("q_a")
	ce := rn.ended(t, 10*time.Second, "was dropped while the relay ran", `CREATE PUBLICATION "`+f.pub+`"`)
	if strings.Contains(ce.Error(), "pg_drop_replication_slot") || strings.Contains(ce.Error(), "--recreate-invalid-slot") {
		t.Errorf("a temporary slot's fix names dropping the slot: %v", ce)
	}

	f.exec("CREATE PUBLICATION " + f.pub + " FOR TABLES IN SCHEMA " + f.schema)
	opts.CreatePublication = "TABLES IN SCHEMA " + f.schema
	rn = f.runToWakes(opts, l, ch, 2, "resync")
	n := l.count(ch)
	f.exec("DROP PUBLICATION " + f.pub)
	f.insert("q_a")
	testutil.WaitFor(t, 15*time.Second, "the resync of a new temporary slot", func() bool {
		rn.checkRunning(t)
		return l.count(ch) > n
	})

	// Dropped and created again within one session: the changes between
	// cannot be decoded, and the next session's slot is new anyway.
	waitActive(t, rn.r)
	n = l.count(ch)
	f.exec("DROP PUBLICATION " + f.pub)
	f.insert("q_a")
	f.exec("CREATE PUBLICATION " + f.pub + " FOR TABLES IN SCHEMA " + f.schema)
	f.insert("q_a")
	testutil.WaitFor(t, 15*time.Second, "a wake after the publication came back", func() bool {
		rn.checkRunning(t)
		return l.count(ch) > n
	})
}

// TestRelayPublishChanged: ALTER PUBLICATION ... SET (publish = 'update')
// while the relay runs ends it with the fix; the inserts committed
// meanwhile got no wake, so after the fix the relay NOTIFYs every channel
// once.
func TestRelayPublishChanged(t *testing.T) {
	f := newFixture(t, "q_a", "fence")
	ch := f.schema + ".q_a.INSERT"
	l := listen(t, ch, f.schema+".fence.INSERT")
	rn := f.runToWakes(f.options(), l, ch, 1, "resync")
	f.exec("ALTER PUBLICATION " + f.pub + " SET (publish = 'update')")
	t0 := time.Now()
	f.insert("q_a")
	rn.ended(t, 10*time.Second, "does not publish insert", `ALTER PUBLICATION "`+f.pub+`" SET (publish = 'insert,update')`, "changed while the relay ran")
	t.Logf("the publish change named after %v", time.Since(t0))
	f.insert("q_a")
	if n := l.count(ch); n != 1 {
		t.Fatalf("%d wakes, want the resync's 1 (the inserts were not published)", n)
	}
	// The named fix, applied.
	f.exec("ALTER PUBLICATION " + f.pub + " SET (publish = 'insert,update')")
	rn = f.run(f.options())
	waitActive(t, rn.r)
	testutil.WaitFor(t, 10*time.Second, "the resync covering the unpublished inserts", func() bool { return l.count(ch) >= 2 })
	// The start's own resync may come as a wake of its own: once it is
	// recorded, the fence's wake says it has been relayed too.
	testutil.WaitFor(t, 10*time.Second, "the start's resync recorded", func() bool { return !rn.r.resyncOwed.Load() })
	f.fence(l)
	n := l.count(ch)
	f.insert("q_a")
	testutil.WaitFor(t, 10*time.Second, "a wake after the fix", func() bool { return l.count(ch) > n })
}

// TestRelayResyncOwed: the session that created the slot is lost before
// its resync (its NOTIFY connection ended while the creation waited on an
// open transaction); the next session owes and sends it. The wait is
// logged with the blocking transaction's pid.
func TestRelayResyncOwed(t *testing.T) {
	defer func(d time.Duration) { slotWaitLog = d }(slotWaitLog)
	slotWaitLog = 200 * time.Millisecond
	f, ch, l := newListened(t, "q_a")
	f.insert("q_a") // committed before the slot: only the resync covers it
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	blocker := beginBlocker(t, ctx)
	var pid int
	// An xid: the slot's snapshot waits for it.
	if _, err := blocker.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}
	if err := blocker.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	rn := f.run(f.options())
	testutil.WaitFor(t, 10*time.Second, "the wait logged with the blocker's pid", func() bool {
		return strings.Contains(rn.log.String(), "waits for the transactions running when it began") &&
			strings.Contains(rn.log.String(), "pid="+itoa(pid))
	})
	if st := rn.r.Stats(); !strings.Contains(st.LastError, "pid "+itoa(pid)) {
		t.Errorf("LastError %q does not name the blocker", st.LastError)
	}
	// The NOTIFY connection dies during the wait.
	if n, err := db.Terminate(ctx, defaultApplicationName); err != nil || n != 1 {
		t.Fatalf("terminated %d NOTIFY backends (%v), want 1", n, err)
	}
	if _, err := blocker.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "the owed resync", func() bool { return l.count(ch) >= 1 })
	testutil.WaitFor(t, 5*time.Second, "counted", func() bool { return rn.r.Stats().Resyncs == 1 })
	f.insert("q_a")
	testutil.WaitFor(t, 10*time.Second, "a wake", func() bool { return l.count(ch) == 2 })
	if st := rn.r.Stats(); st.Resyncs != 1 || st.Reconnects < 1 {
		t.Errorf("resyncs %d, reconnects %d; want 1 resync after a reconnect", st.Resyncs, st.Reconnects)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestRelaySlotWaitLoggedWithoutNotifyConn: the NOTIFY connection ends
// (idle_session_timeout, a terminated backend) before the first look at
// what a slot creation waits on: the wait is still logged, with the
// blocker's pid, every slotWaitLog, for as long as it lasts.
func TestRelaySlotWaitLoggedWithoutNotifyConn(t *testing.T) {
	defer func(d time.Duration) { slotWaitLog = d }(slotWaitLog)
	slotWaitLog = time.Second
	f := newFixture(t, "q_a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	blocker := beginBlocker(t, ctx)
	var pid int
	// An xid: the slot's snapshot waits for it.
	if err := blocker.QueryRow(ctx, "SELECT pg_backend_pid(), pg_current_xact_id()::text").Scan(&pid, new(string)); err != nil {
		t.Fatal(err)
	}
	rn := f.run(f.options())
	testutil.WaitFor(t, 10*time.Second, "the slot creation waiting on a lock", func() bool {
		n, err := db.QueryInt(ctx, `SELECT count(*)::int FROM pg_stat_activity
			WHERE application_name = $1 AND backend_type = 'walsender' AND wait_event_type = 'Lock'`, defaultApplicationName)
		return err == nil && n == 1
	})
	if strings.Contains(rn.log.String(), "waits for the transactions running") {
		t.Skip("the wait was logged before the NOTIFY connection could be ended")
	}
	if n, err := db.Terminate(ctx, defaultApplicationName); err != nil || n != 1 {
		t.Fatalf("terminated %d NOTIFY backends (%v), want 1", n, err)
	}
	testutil.WaitFor(t, 5*time.Second, "the wait logged with the blocker's pid", func() bool {
		return strings.Count(rn.log.String(), "waits for the transactions running when it began") >= 2 &&
			strings.Contains(rn.log.String(), "pid="+itoa(pid))
	})
	if st := rn.r.Stats(); !strings.Contains(st.LastError, "pid "+itoa(pid)) {
		t.Errorf("LastError %q does not name the blocker", st.LastError)
	}
	if _, err := blocker.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "streaming", func() bool { return rn.r.Stats().State == StateActive })
}

// TestRelayInvalidatedSlot: a slot invalidated past max_slot_wal_keep_size
// is named with the fix at once; --recreate-invalid-slot, the fix applied,
// streams again on a new slot with a resync.
func TestRelayInvalidatedSlot(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	f, ch, l := newListened(t, "q_a")
	rn := f.runToWakes(f.options(), l, ch, 1, "resync")
	rn.stop()
	<-rn.done
	rn.done <- nil
	f.exec("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
	f.exec("SELECT pg_reload_conf()")
	t.Cleanup(func() {
		db.Exec(context.Background(), "ALTER SYSTEM RESET max_slot_wal_keep_size")
		db.Exec(context.Background(), "SELECT pg_reload_conf()")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testutil.WaitFor(t, 20*time.Second, "the slot invalidated", func() bool {
		f.insert("q_a")
		f.exec("SELECT pg_switch_wal()")
		f.exec("CHECKPOINT")
		n, err := db.QueryInt(ctx, "SELECT count(*)::int FROM pg_replication_slots WHERE slot_name = $1 AND wal_status = 'lost'", f.slot)
		return err == nil && n == 1
	})
	f.exec("ALTER SYSTEM RESET max_slot_wal_keep_size")
	f.exec("SELECT pg_reload_conf()")
	rn = f.run(f.options())
	rn.ended(t, 10*time.Second, "invalidated", "max_slot_wal_keep_size", "pg_drop_replication_slot('"+f.slot+"')", "--recreate-invalid-slot")
	// The fix named first, applied: drop the slot, start again.
	f.exec("SELECT pg_drop_replication_slot($1)", f.slot)
	rn = f.runToWakes(f.options(), l, ch, 2, "the new slot's resync")
	f.insert("q_a")
	testutil.WaitFor(t, 10*time.Second, "a wake", func() bool { return l.count(ch) == 3 })
}

// TestRelayPermanentErrorsAtStart: a pooler, a slot name PostgreSQL
// refuses, a template byte that is not UTF-8 and TLS the server does not
// offer are refused at once with the fix, never retried.
func TestRelayPermanentErrorsAtStart(t *testing.T) {
	f := newFixture(t, "q_a")
	opts := f.options()
	opts.Slot = "My-Slot"
	if _, err := New(opts); err == nil || !strings.Contains(err.Error(), "--slot my_slot") {
		t.Errorf("New with --slot My-Slot: %v", err)
	}
	opts = f.options()
	opts.ChannelTemplate = "{schema}.{table}\xff"
	if _, err := New(opts); err == nil || !strings.Contains(err.Error(), "not UTF-8") {
		t.Errorf("New with a 0xff template: %v", err)
	}
	pgtesting.RequireLocal(t, db)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := db.StartPgBouncer(ctx, "transaction")
	if err != nil {
		t.Skipf("no PgBouncer: %v", err)
	}
	defer b.Close()
	cc, err := pgconn.ParseConfig(b.URL())
	if err != nil {
		t.Fatal(err)
	}
	opts = f.options()
	opts.ConnConfig = cc
	rn := f.run(opts)
	rn.ended(t, 10*time.Second, relayfix.Pooler)
	cc, err = pgconn.ParseConfig(b.URL() + "&sslmode=require")
	if strings.Contains(b.URL(), "?") == false {
		cc, err = pgconn.ParseConfig(b.URL() + "?sslmode=require")
	}
	if err != nil {
		t.Fatal(err)
	}
	opts.ConnConfig = cc
	rn = f.run(opts)
	rn.ended(t, 10*time.Second, "does not accept TLS", "sslmode")
}

// TestRelayGuestBackSoonAfterTheFix: a guest relay down for a dropped
// publication streams again within seconds of the fix with the default
// ConfigRetry (it was 30 s), and its state says active only once it is.
func TestRelayGuestBackSoonAfterTheFix(t *testing.T) {
	f, ch, l := newListened(t, "q_a")
	f.exec("DROP PUBLICATION " + f.pub)
	opts := f.options()
	opts.RetryConfigErrors = true
	rn := f.run(opts)
	testutil.WaitFor(t, 10*time.Second, "down", func() bool { return rn.r.Stats().State == StateDown })
	f.exec("CREATE PUBLICATION " + f.pub + " FOR TABLES IN SCHEMA " + f.schema)
	fixed := time.Now()
	testutil.WaitFor(t, 5*time.Second, "active again (the old retry was 30 s)", func() bool { return rn.r.Stats().State == StateActive })
	t.Logf("active %v after the fix", time.Since(fixed).Round(time.Millisecond))
	testutil.WaitFor(t, 10*time.Second, "resync", func() bool { return l.count(ch) == 1 })
}

// TestRelayGuestStaysDown: with RetryConfigErrors a permanent error never ends Run:
// the relay is down, says why with the fix, and streams once fixed.
func TestRelayGuestStaysDown(t *testing.T) {
	f, ch, l := newListened(t, "q_a")
	f.exec("DROP PUBLICATION " + f.pub)
	opts := f.options()
	opts.RetryConfigErrors = true
	opts.ConfigRetry = 300 * time.Millisecond
	rn := f.run(opts)
	testutil.WaitFor(t, 10*time.Second, "down with the fix", func() bool {
		st := rn.r.Stats()
		return st.State == StateDown && strings.Contains(st.LastError, "CREATE PUBLICATION")
	})
	f.exec("CREATE PUBLICATION " + f.pub + " FOR TABLES IN SCHEMA " + f.schema)
	waitActive(t, rn.r)
	testutil.WaitFor(t, 10*time.Second, "resync", func() bool { return l.count(ch) == 1 })
	if st := rn.r.Stats(); st.LastError != "" {
		t.Errorf("LastError %q while active", st.LastError)
	}
	select {
	case err := <-rn.done:
		t.Fatalf("Run returned %v", err)
	default:
	}
}

// TestRelayLongSilence: a walsender that sends nothing for many read
// deadlines (as while it decodes a huge transaction of unpublished
// tables; here it is frozen) is not a failure while it still holds the
// slot: no reconnect, no phantom takeover, and wakes go on after it.
func TestRelayLongSilence(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	f, ch, l := newListened(t, "q_a")
	opts := f.options()
	opts.StatusInterval = 200 * time.Millisecond // a read deadline of 600 ms
	rn := f.run(opts)
	waitActive(t, rn.r)
	testutil.WaitFor(t, 10*time.Second, "resync", func() bool { return l.count(ch) == 1 })
	pid := f.slotActivePID()
	if pid == 0 {
		t.Fatal("no walsender")
	}
	pgtesting.Must(t, db.Freeze(pid))
	testutil.WaitFor(t, 20*time.Second, "three silent read deadlines", func() bool {
		return strings.Count(rn.log.String(), "silent but still holds the slot") >= 3
	})
	pgtesting.Must(t, db.Thaw(pid))
	f.insert("q_a")
	testutil.WaitFor(t, 10*time.Second, "a wake after the silence", func() bool { return l.count(ch) == 2 })
	if st := rn.r.Stats(); st.Reconnects != 0 || st.Takeovers != 0 {
		t.Errorf("reconnects %d, takeovers %d after a silent walsender; want 0", st.Reconnects, st.Takeovers)
	}
	if strings.Contains(rn.log.String(), "standing by") {
		t.Error("the relay stood by for its own walsender")
	}
}

// TestRelayStandbySeesStuckActive: an active relay frozen with SIGSTOP
// stalls every wake until the server ends its walsender
// (wal_sender_timeout, 2 s here); the standby warns meanwhile, its lag
// shows the stall, and it takes over.
func TestRelayStandbySeesStuckActive(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	f, ch, l := newListened(t, "q_a")
	sep := "?"
	if strings.Contains(db.URL(), "?") {
		sep = "&"
	}
	url := db.URL() + sep + "options=-c%20wal_sender_timeout%3D2s"
	p := startRelayProc(t, "--database-url", url, "--publication", f.pub, "--slot", f.slot, "--log-level", "debug")
	testutil.WaitFor(t, 20*time.Second, "resync", func() bool { return l.count(ch) == 1 })
	opts := f.options()
	opts.StatusInterval = 200 * time.Millisecond
	opts.MaxLag = 500 * time.Millisecond
	opts.StandbyRetry = 100 * time.Millisecond
	rn := f.run(opts)
	testutil.WaitFor(t, 10*time.Second, "standing by", func() bool { return rn.r.Stats().State == StateStandby })
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	t.Cleanup(func() { p.cmd.Process.Signal(syscall.SIGCONT) })
	f.insert("q_a")
	var sawLag float64
	var warning string
	testutil.WaitFor(t, 20*time.Second, "the take-over", func() bool {
		st := rn.r.Stats()
		sawLag = max(sawLag, st.LagSeconds)
		if st.State == StateStandby && st.Warning != "" {
			warning = st.Warning
		}
		return st.State == StateActive
	})
	took := time.Since(frozen)
	// The stalled wake, and the taking relay's own start resync (one
	// batch, or two).
	testutil.WaitFor(t, 10*time.Second, "the stalled wake", func() bool { return l.count(ch) >= 2 })
	t.Logf("frozen active relay: standby took over after %v (wal_sender_timeout 2s), its lag reached %.2fs", took, sawLag)
	if !strings.Contains(rn.log.String(), "the active relay is not confirming") {
		t.Error("the standby did not warn of the stuck active relay")
	}
	if sawLag == 0 {
		t.Error("the standby's lag never showed the stall")
	}
	// Its status says it too, with the SQL that bounds the stall.
	if !strings.Contains(warning, "has not confirmed") || !strings.Contains(warning, "ALTER ROLE") || !strings.Contains(warning, "wal_sender_timeout = '1s'") {
		t.Errorf("the standby's warning %q does not name the stall and the ALTER ROLE that shortens it", warning)
	}
	if !strings.Contains(rn.log.String(), "ALTER ROLE") {
		t.Error("the standby's WARN does not give the ALTER ROLE line")
	}
	if w := rn.r.Stats().Warning; w != "" {
		t.Errorf("the warning outlived the take-over: %q", w)
	}
}

// TestRelayLongDecodeShowsAsLag: a transaction of many rows is decoded for
// seconds before its commit reaches the relay, and no NOTIFY measures that
// time; the relay's lag counts from its last progress, and a warning says
// it is lagging, until the wake goes out. With the default status interval
// (10 s): the lag is said within --max-lag's floor, not three intervals.
func TestRelayLongDecodeShowsAsLag(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	f, ch, l := newListened(t, "q_a")
	opts := f.options()
	opts.MaxLag = time.Second
	rn := f.runToWakes(opts, l, ch, 1, "resync")
	f.exec("INSERT INTO " + f.schema + ".q_a (v) SELECT 'x' FROM generate_series(1, 2000000)") // about 90 MB of WAL
	var lag float64
	var warning string
	testutil.WaitFor(t, 120*time.Second, "the wake of the big transaction", func() bool {
		st := rn.r.Stats()
		lag = max(lag, st.LagSeconds)
		if st.Warning != "" {
			warning = st.Warning
		}
		return l.count(ch) >= 2
	})
	t.Logf("2,000,000 rows in one transaction: the lag reached %.1fs before the wake; warning %q", lag, warning)
	if lag <= opts.MaxLag.Seconds() {
		t.Errorf("the lag reached %.2fs during the decode, want above --max-lag (%v)", lag, opts.MaxLag)
	}
	if !strings.Contains(warning, "lagging") {
		t.Errorf("no lagging warning during the decode: %q", warning)
	}
	testutil.WaitFor(t, 20*time.Second, "the warning to clear once caught up", func() bool { return rn.r.Stats().Warning == "" })
}

// TestRelayStopDuringNotifyConfirmsIt: a stop that arrives as a batch's
// NOTIFY goes out lets it finish and confirms it, so the next start
// decodes nothing of it. A NOTIFY cut short by the stop may have committed
// all the same, unconfirmed: the next start NOTIFYed it again.
func TestRelayStopDuringNotifyConfirmsIt(t *testing.T) {
	f, ch, l := newListened(t, "q_a")
	var cut atomic.Pointer[context.CancelFunc]
	beforeNotify = func() {
		if stop := cut.Swap(nil); stop != nil {
			(*stop)()
		}
	}
	t.Cleanup(func() { beforeNotify = nil }) // after the relays' own cleanups
	a := f.runToWakes(f.options(), l, ch, 1, "the resync")
	cut.Store(&a.stop)
	f.insert("q_a")
	select {
	case err := <-a.done:
		a.done <- err
	case <-time.After(15 * time.Second):
		t.Fatal("the relay did not stop")
	}
	if cut.Load() != nil {
		t.Fatal("the relay stopped before it NOTIFYed the insert")
	}
	testutil.WaitFor(t, 5*time.Second, "the insert's wake, sent during the stop", func() bool { return l.count(ch) == 2 })

	b := f.runToWakes(f.options(), l, ch, 3, "the restart's resync")
	f.insert("q_a")
	testutil.WaitFor(t, 10*time.Second, "the second insert's wake", func() bool { return l.count(ch) == 4 })
	if n := b.r.Stats().Transactions; n != 1 {
		t.Errorf("the restart decoded %d transactions, want 1 (the second insert): the stop did not confirm the NOTIFY it let finish", n)
	}
}

// TestRelayDemotedClearsLag: a relay that loses the slot to another and
// stands by no longer reports the lag it measured while it streamed.
func TestRelayDemotedClearsLag(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	f, ch, l := newListened(t, "q_a")
	opts := f.options()
	opts.StatusInterval = 100 * time.Millisecond
	opts.MaxLag = 300 * time.Millisecond
	a := f.run(opts)
	waitActive(t, a.r)
	testutil.WaitFor(t, 10*time.Second, "resync", func() bool { return l.count(ch) == 1 })
	// A walsender frozen with a commit to send: the relay's position
	// stops while WAL waits, and it reports the stall as its lag for as
	// long as it lasts (a lag measured at a NOTIFY would be cleared by
	// the next keepalive, whenever the server sends one).
	pid := f.slotActivePID()
	pgtesting.Must(t, db.Freeze(pid))
	thawed := false
	defer func() {
		if !thawed {
			db.Thaw(pid)
		}
	}()
	f.insert("q_a")
	testutil.WaitFor(t, 15*time.Second, "the stall reported as lag", func() bool {
		return a.r.Stats().LagSeconds >= opts.MaxLag.Seconds()
	})
	bopts := f.options()
	bopts.StandbyRetry = 10 * time.Millisecond
	b := f.run(bopts)
	testutil.WaitFor(t, 10*time.Second, "b standing by", func() bool { return b.r.Stats().State == StateStandby })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	pgtesting.Must(t, db.Thaw(pid)) // the frozen walsender gets its SIGTERM
	thawed = true
	testutil.WaitFor(t, 10*time.Second, "b active, a standing by", func() bool {
		return b.r.Stats().State == StateActive && a.r.Stats().State == StateStandby
	})
	if lag := a.r.Stats().LagSeconds; lag != 0 {
		t.Errorf("the demoted relay reports a lag of %.2fs, want 0", lag)
	}
	testutil.WaitFor(t, 10*time.Second, "the commit woken by b", func() bool { return l.count(ch) >= 2 })
}

// TestRelayUnitNoStartLimit: the shipped relay unit restarts a relay that
// exited on a misconfiguration for as long as it takes, at a pace that is
// no crash loop, and never stops at systemd's start limit (5 starts in
// 10 s by default), which would leave it down after the fix.
func TestRelayUnitNoStartLimit(t *testing.T) {
	b := testutil.ReadFile(t, "../deploy/systemd/listenhub-relay.service")
	unit := string(b)
	for _, want := range []string{"\nStartLimitIntervalSec=0\n", "\nRestart=always\n"} {
		if !strings.Contains(unit, want) {
			t.Errorf("listenhub-relay.service lacks %q", strings.TrimSpace(want))
		}
	}
	for _, line := range strings.Split(unit, "\n") {
		if v, ok := strings.CutPrefix(line, "RestartSec="); ok {
			if d, err := time.ParseDuration(v + "s"); err != nil || d < 5*time.Second {
				t.Errorf("RestartSec=%s: a misconfigured relay restarts more than every 5 s", v)
			}
		}
	}
}

// TestRelayOwnWalsenderNotAnotherRelay: after a session is lost while its
// walsender lives on (frozen here), the relay's next session finds the
// slot held by that walsender: its own, ended and waited for, never a
// standby and never a takeover.
func TestRelayOwnWalsenderNotAnotherRelay(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	defer func() { probeSilence = true }()
	probeSilence = false
	f, ch, l := newListened(t, "q_a")
	opts := f.options()
	opts.StatusInterval = 200 * time.Millisecond
	rn := f.run(opts)
	waitActive(t, rn.r)
	testutil.WaitFor(t, 10*time.Second, "resync", func() bool { return l.count(ch) == 1 })
	pid := f.slotActivePID()
	pgtesting.Must(t, db.Freeze(pid))
	testutil.WaitFor(t, 10*time.Second, "the old walsender asked to end", func() bool {
		return strings.Contains(rn.log.String(), "ended its own previous walsender")
	})
	pgtesting.Must(t, db.Thaw(pid))
	testutil.WaitFor(t, 10*time.Second, "streaming again", func() bool {
		st := rn.r.Stats()
		return st.State == StateActive && st.Reconnects >= 1
	})
	f.insert("q_a")
	testutil.WaitFor(t, 10*time.Second, "a wake", func() bool { return l.count(ch) == 2 })
	if st := rn.r.Stats(); st.Takeovers != 0 || strings.Contains(rn.log.String(), "standing by") {
		t.Errorf("takeovers %d, or stood by: its own walsender counted as another relay", st.Takeovers)
	}
}

// TestRelayRoleIdleSessionTimeout: idle_session_timeout set on the relay's
// role (a common guard against leaked sessions) would end its NOTIFY
// connection whenever no wake was due for that long, and with it the
// session: a reconnect, a walsender restarted and a replay every few
// seconds. The relay's own connections opt out, and it streams on.
func TestRelayRoleIdleSessionTimeout(t *testing.T) {
	f := newFixture(t, "q_a")
	ch := f.schema + ".q_a.INSERT"
	l := listen(t, ch)
	role := fmt.Sprintf("rt_idle%d", testSeq.Add(1))
	f.exec("CREATE ROLE " + role + " LOGIN REPLICATION")
	t.Cleanup(func() { db.Exec(context.Background(), "DROP ROLE "+role) })
	f.exec("GRANT USAGE ON SCHEMA " + f.schema + " TO " + role)
	f.exec("GRANT SELECT ON ALL TABLES IN SCHEMA " + f.schema + " TO " + role)
	f.exec("ALTER ROLE " + role + " SET idle_session_timeout = '300ms'")
	t.Cleanup(func() {
		db.Exec(context.Background(), "DROP OWNED BY "+role)
		db.Exec(context.Background(), "SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", f.slot)
	})
	opts := f.options()
	opts.ConnConfig.User = role
	rn := f.run(opts)
	testutil.WaitFor(t, 15*time.Second, "streaming", func() bool { return rn.r.Stats().State == StateActive })
	// Idle for ten timeouts (and past the publication's 2 s watch): the
	// session must outlive them.
	time.Sleep(3 * time.Second)
	f.insert("q_a")
	testutil.WaitFor(t, 10*time.Second, "a wake", func() bool { return l.count(ch) >= 1 })
	if log := rn.log.String(); strings.Contains(log, "not streaming") {
		t.Fatalf("the session ended while idle under idle_session_timeout 300ms:\n%s", log)
	}
	if st := rn.r.Stats(); st.Reconnects != 0 || st.State != StateActive {
		t.Fatalf("%d reconnects, state %v (last error %q)", st.Reconnects, st.State, st.LastError)
	}
}

// TestRelayTablesLeavingThePublicationSaid: a table dropped from the
// publication, or a row filter added, while the relay streams stops
// changes from waking with nothing in the stream to say so. The relay
// logs each change once, naming the tables, and Stats count what the
// publication covers now.
func TestRelayTablesLeavingThePublicationSaid(t *testing.T) {
	f := newFixture(t, "q_a", "q_b", "q_c")
	f.exec("DROP PUBLICATION " + f.pub)
	f.exec(fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s.q_a, %s.q_b, %s.q_c", f.pub, f.schema, f.schema, f.schema))
	rn := f.run(f.options())
	waitActive(t, rn.r)
	testutil.WaitFor(t, 10*time.Second, "3 tables counted", func() bool { return rn.r.Stats().Tables == 3 })
	f.exec(fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s.q_b", f.pub, f.schema))
	testutil.WaitFor(t, 10*time.Second, "the table that left, logged", func() bool {
		return strings.Contains(rn.log.String(), "tables left the publication") && rn.r.Stats().Tables == 2
	})
	if !strings.Contains(rn.log.String(), f.schema+".q_b") || strings.Count(rn.log.String(), "tables left the publication") != 1 {
		t.Errorf("want one line naming %s.q_b:\n%s", f.schema, rn.log.String())
	}
	f.exec(fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s.q_a WHERE (id > 10), %s.q_c", f.pub, f.schema, f.schema))
	testutil.WaitFor(t, 10*time.Second, "the row filter, logged", func() bool {
		return strings.Contains(rn.log.String(), "row filters on published tables") && rn.r.Stats().TablesFiltered == 1
	})
	if !strings.Contains(rn.log.String(), f.schema+".q_a WHERE") {
		t.Errorf("the filter's line does not name %s.q_a:\n%s", f.schema, rn.log.String())
	}
	if n := strings.Count(rn.log.String(), "row filters on published tables"); n != 1 {
		t.Errorf("the row filter logged %d times, want once", n)
	}
}

// TestRelayDroppedAndRenamedTablesSaidAsSuch: a table dropped or renamed
// did not leave the publication: the relay says it was dropped or renamed
// (naming the new tables, whose channels a renamed table's changes now
// wake), at INFO, and never asks for ALTER PUBLICATION ... ADD TABLE.
func TestRelayDroppedAndRenamedTablesSaidAsSuch(t *testing.T) {
	f := newFixture(t, "q_a", "q_b", "q_c")
	rn := f.run(f.options())
	waitActive(t, rn.r)
	testutil.WaitFor(t, 10*time.Second, "3 tables counted", func() bool { return rn.r.Stats().Tables == 3 })
	f.exec(fmt.Sprintf("DROP TABLE %s.q_b", f.schema))
	f.exec(fmt.Sprintf("ALTER TABLE %s.q_c RENAME TO q_renamed", f.schema))
	testutil.WaitFor(t, 10*time.Second, "the dropped and renamed tables, logged", func() bool {
		log := rn.log.String()
		return strings.Contains(log, "published tables were dropped or renamed") && strings.Contains(log, f.schema+".q_c") &&
			strings.Contains(log, f.schema+".q_renamed")
	})
	log := rn.log.String()
	if strings.Contains(log, "tables left the publication") || strings.Contains(log, "ADD TABLE") {
		t.Fatalf("a dropped or renamed table taken for one that left the publication:\n%s", log)
	}
	if !strings.Contains(log, f.schema+".q_b") {
		t.Fatalf("the dropped table is not named:\n%s", log)
	}
}

// TestRelayKilledAtEachStartStepLosesNoWake: a relay SIGKILLed at any step
// of its start (connected; waiting on the slot's creation, with a row
// committed meanwhile; the slot just created; streaming) leaves no row
// unwoken: the next start owes a resync, whatever the slot says.
func TestRelayKilledAtEachStartStepLosesNoWake(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	var blocker *pgx.Conn
	steps := []struct {
		name string
		// before runs before the relay starts (nil: nothing).
		before func(t *testing.T, f *fixture)
		// reach brings the relay process p to the step; it may commit
		// rows (f.insert) that the next start must wake.
		reach func(t *testing.T, f *fixture, p *relayProc)
	}{
		{"connected", nil, func(t *testing.T, f *fixture, p *relayProc) {
			testutil.WaitFor(t, 20*time.Second, "the relay's walsender", func() bool { return walsenders(t, f) > 0 })
			f.insert("q_a")
		}},
		{"creating the slot", func(t *testing.T, f *fixture) {
			// A transaction left open keeps CREATE_REPLICATION_SLOT
			// waiting.
			blocker = openTx(t)
		}, func(t *testing.T, f *fixture, p *relayProc) {
			// The relay is stopped there, and a row committed while
			// the slot is made is in no slot's stream.
			testutil.WaitFor(t, 20*time.Second, "the slot's creation to wait", func() bool { return creatingSlot(t) })
			pgtesting.Must(t, p.cmd.Process.Signal(syscall.SIGSTOP))
			f.insert("q_a")
			blocker.Close(context.Background())
			// The slot is in the view from the start of its creation
			// (ephemeral); made when the walsender's command is done.
			testutil.WaitFor(t, 20*time.Second, "the slot's creation to end", func() bool { return !creatingSlot(t) && slotExists(t, f) })
		}},
		{"slot created", nil, func(t *testing.T, f *fixture, p *relayProc) {
			testutil.WaitFor(t, 20*time.Second, "the slot", func() bool { return slotExists(t, f) })
			f.insert("q_a")
		}},
		{"streaming", nil, func(t *testing.T, f *fixture, p *relayProc) {
			testutil.WaitFor(t, 20*time.Second, "streaming", func() bool { return strings.Contains(p.out.String(), "relay streaming") })
			f.insert("q_a")
		}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			f, ch, l := newListened(t, "q_a")
			if st.before != nil {
				st.before(t, f)
			}
			p := startRelayProc(t, f.procArgs()...)
			st.reach(t, f, p)
			before := l.count(ch)
			inserted := time.Now()
			p.kill()
			next := startRelayProc(t, f.procArgs()...)
			testutil.WaitFor(t, 30*time.Second, "a wake after the row killed with the relay", func() bool { return l.lastAt(ch).After(inserted) })
			t.Logf("killed %s: %d wakes before, %d after the next start", st.name, before, l.count(ch))
			next.kill()
		})
	}
}

// TestRelaySlotAdvancedWhileDownIsCovered: an operator advances the slot
// past rows committed while no relay ran (pg_replication_slot_advance):
// the next start NOTIFYs every channel once, so those rows are woken.
func TestRelaySlotAdvancedWhileDownIsCovered(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	f, ch, l := newListened(t, "q_a")
	p := startRelayProc(t, f.procArgs()...)
	testutil.WaitFor(t, 20*time.Second, "the first resync", func() bool { return l.count(ch) >= 1 })
	p.kill()
	testutil.WaitFor(t, 20*time.Second, "the slot released", func() bool { return f.slotActivePID() == 0 })
	f.insert("q_a")
	f.insert("q_a")
	inserted := time.Now()
	f.exec("SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", f.slot)
	startRelayProc(t, f.procArgs()...)
	testutil.WaitFor(t, 30*time.Second, "a wake covering the rows the slot skipped", func() bool { return l.lastAt(ch).After(inserted) })
}

// walsenders counts the walsenders of the fixture's relay (by its
// default application_name).
func walsenders(t *testing.T, f *fixture) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := db.QueryInt(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// creatingSlot reports whether a walsender is running CREATE_REPLICATION_SLOT.
func creatingSlot(t *testing.T) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := db.QueryInt(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender' AND state = 'active' AND query LIKE 'CREATE_REPLICATION_SLOT%'")
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

func slotExists(t *testing.T, f *fixture) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := db.QueryInt(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.slot)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// openTx opens a transaction with an xid on a connection of its own, left
// open until the returned connection is closed.
func openTx(t *testing.T) *pgx.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, db.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	if _, err := c.Exec(ctx, "BEGIN; SELECT txid_current()"); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRelayReplicationRevokedSaid: REPLICATION revoked from the relay's
// role while it streams changes nothing until the next connection, which
// will be refused: the relay says so at once (an ERROR line and its
// warning, with the fix), not only at that next connection.
func TestRelayReplicationRevokedSaid(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	f := newFixture(t, "q_a")
	role := fmt.Sprintf("lh_repl_%d", testSeq.Add(1))
	f.exec("CREATE ROLE " + role + " LOGIN REPLICATION")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		db.Exec(ctx, "DROP OWNED BY "+role)
		db.Exec(ctx, "DROP ROLE IF EXISTS "+role)
	})
	f.exec(fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", f.schema, role))
	f.exec(fmt.Sprintf("GRANT SELECT ON ALL TABLES IN SCHEMA %s TO %s", f.schema, role))
	opts := f.options()
	opts.ConnConfig.User = role
	rn := f.run(opts)
	testutil.WaitFor(t, 20*time.Second, "streaming as "+role, func() bool { return rn.r.Stats().State == StateActive })
	f.exec("ALTER ROLE " + role + " NOREPLICATION")
	testutil.WaitFor(t, 20*time.Second, "the loss said", func() bool {
		return strings.Contains(rn.r.Stats().Warning, "lost its REPLICATION attribute")
	})
	if !strings.Contains(rn.log.String(), "ALTER ROLE") || !strings.Contains(rn.log.String(), "level=ERROR") {
		t.Fatalf("no ERROR line with the fix:\n%s", rn.log.String())
	}
	if st := rn.r.Stats(); st.State != StateActive {
		t.Fatalf("state %v: the stream should go on", st.State)
	}
}
