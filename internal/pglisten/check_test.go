package pglisten

// The delivery check (check.go) against a real server, directly and through
// a real PgBouncer in transaction and session mode.

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/pgquote"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

// checkSubject is a Conn made by Start (as the hub makes it) on its own
// loop, with its log captured.
type checkSubject struct {
	l   *loop.Loop
	c   *Conn
	r   *recorder
	log *testutil.SyncBuffer
}

// mustParseConfig is ParseConfig, or the test fails.
func mustParseConfig(tb testing.TB, url, app string) *pgconn.Config {
	tb.Helper()
	cc, err := ParseConfig(url, app)
	if err != nil {
		tb.Fatal(err)
	}
	return cc
}

func startChecked(t *testing.T, url string, cfg Config) *checkSubject {
	t.Helper()
	cc := mustParseConfig(t, url, testApp())
	l, err := loop.New(loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	go l.Run()
	s := &checkSubject{l: l, r: newRecorder(), log: &testutil.SyncBuffer{}}
	cfg.ConnConfig = cc
	cfg.ReconnectMin, cfg.ReconnectMax = 10*time.Millisecond, 200*time.Millisecond
	cfg.OnNotification = func(ch, p []byte) { s.r.note(string(ch), string(p)) }
	cfg.OnHealth = s.r.onHealth
	cfg.Logger = slog.New(slog.NewTextHandler(s.log, nil))
	s.c = Start(l, cfg)
	t.Cleanup(func() {
		done := make(chan struct{})
		if l.Post(func() { s.c.Close(func() { close(done) }) }) == nil {
			select {
			case <-done:
			case <-time.After(pgTimeout):
				t.Error("close did not finish")
			}
		}
		l.Stop()
		<-l.Done()
		if t.Failed() {
			t.Logf("listener log:\n%s", s.log.String())
		}
	})
	return s
}

// on runs f on the loop and waits for it.
func (s *checkSubject) on(t testing.TB, f func()) { t.Helper(); runOn(t, s.l, f) }

// listen issues a Listen and returns a channel that gets its outcome.
func (s *checkSubject) listen(t testing.TB, ch string) chan error {
	errc := make(chan error, 1)
	s.on(t, func() { s.c.Listen(ch, func(err error) { errc <- err }) })
	return errc
}

func wantOutcome(t testing.TB, errc chan error) error {
	t.Helper()
	return testutil.Recv(t, errc, pgTimeout, "no answer to Listen")
}

// checkTimeout is the health-check timeout of the tests of a connection
// that delivers.
const checkTimeout = 5 * time.Second

// TestCheckDirect: a direct connection passes the check with matching
// pids, keeps checking end to end while idle (a NOTIFY every few
// intervals, not only empty queries), never hands the private channel to
// OnNotification and refuses to Listen to it.
func TestCheckDirect(t *testing.T) {
	for _, v := range variants(t) {
		if v.plain {
			continue
		}
		t.Run(v.name, func(t *testing.T) {
			// A timeout well above a check's round trip: what is tested
			// is that a direct connection passes, and a check that a
			// loaded machine (race build, TLS) answers in 2 s now and
			// then would read as a lost connection.
			s := startChecked(t, v.url(), Config{HealthCheckInterval: 10 * time.Millisecond, HealthCheckTimeout: checkTimeout})
			s.r.waitHealth(t, 0, pgTimeout, true)
			var key, server uint32
			var check string
			s.on(t, func() { key, server = s.c.backendPIDs(); check = s.c.checkChannel() })
			if key == 0 || key != server {
				t.Fatalf("BackendKeyData pid %d, pg_backend_pid() %d: want equal", key, server)
			}
			t0 := time.Now()
			testutil.WaitFor(t, pgTimeout, "three end-to-end checks", func() bool {
				var n int
				s.on(t, func() { n = s.c.chk.checks })
				return n >= 3
			})
			// The probes keep the interval's pace, not the timeout's.
			if d := time.Since(t0); d >= checkTimeout {
				t.Errorf("three checks took %v: the next probe waited for the timeout (%v), not the interval", d, checkTimeout)
			}
			if err := wantOutcome(t, s.listen(t, check)); err == nil || !strings.Contains(err.Error(), "reserved") {
				t.Fatalf("Listen(%q): %v, want refused as reserved", check, err)
			}
			if err := wantOutcome(t, s.listen(t, "direct")); err != nil {
				t.Fatal(err)
			}
			notify(t, "direct", "one")
			s.r.waitNote(t, "direct", "one", check)
			if h := s.r.healthSeq(); len(h) != 1 {
				t.Fatalf("health reports %v, want [true]", h)
			}
			if strings.Contains(s.log.String(), "do not arrive") {
				t.Fatalf("log:\n%s", s.log.String())
			}
		})
	}
}

// TestCheckLost: a connection whose notifications stop arriving (here its
// private LISTEN is taken away behind its back) is found out by the
// periodic end-to-end check, reported unhealthy and replaced, although the
// server still answers every query.
func TestCheckLost(t *testing.T) {
	s := startChecked(t, db.URL(), Config{HealthCheckInterval: 10 * time.Millisecond, HealthCheckTimeout: 500 * time.Millisecond})
	base := s.r.waitHealth(t, 0, pgTimeout, true)
	if err := wantOutcome(t, s.listen(t, "lost")); err != nil {
		t.Fatal(err)
	}
	s.on(t, func() {
		s.c.send(&query{kind: queryProbe}, appendQuery(nil, pgquote.AppendIdent([]byte("UNLISTEN "), s.c.chk.channel)))
	})
	s.r.waitHealth(t, base, pgTimeout, false, true)
	if log := s.log.String(); !strings.Contains(log, "notifications do not arrive on this connection any more") {
		t.Fatalf("log does not say why:\n%s", log)
	}
	notify(t, "lost", "after")
	s.r.waitNote(t, "lost", "after")
}

// TestCheckTransactionPooler: through a transaction-pooling PgBouncer the
// connection never becomes healthy, nothing is acked, and one log line
// says what it most likely is, however often the check is retried.
func TestCheckTransactionPooler(t *testing.T) {
	b := pgtesting.PgBouncer(t, db, "transaction")
	s := startChecked(t, b.URL(), Config{HealthCheckTimeout: 300 * time.Millisecond})
	errc := s.listen(t, "pooled")
	testutil.WaitFor(t, pgTimeout, "three failed checks", func() bool {
		var n int
		s.on(t, func() { n = s.c.chk.failed })
		return n >= 3
	})
	select {
	case err := <-errc:
		t.Fatalf("Listen answered (%v) through a transaction pooler", err)
	default:
	}
	if h := s.r.healthSeq(); len(h) != 0 {
		t.Fatalf("health reports %v, want none", h)
	}
	want := "listener: notifications do not arrive on this connection: a transaction-pooling PgBouncer? use a direct URL"
	log := s.log.String()
	if n := strings.Count(log, want); n != 1 {
		t.Fatalf("%d log lines with %q, want 1:\n%s", n, want, log)
	}
	if strings.Count(log, "level=ERROR") != 1 {
		t.Fatalf("want exactly one error line:\n%s", log)
	}
}

// TestCheckSessionPooler: a session-pooling PgBouncer delivers: the pids
// differ, a second session's NOTIFY arrives, and the connection is healthy
// and works.
func TestCheckSessionPooler(t *testing.T) {
	b := pgtesting.PgBouncer(t, db, "session")
	s := startChecked(t, b.URL(), Config{HealthCheckInterval: 10 * time.Millisecond, HealthCheckTimeout: checkTimeout})
	errc := s.listen(t, "session")
	s.r.waitHealth(t, 0, pgTimeout, true)
	if err := wantOutcome(t, errc); err != nil {
		t.Fatal(err)
	}
	var key, server uint32
	s.on(t, func() { key, server = s.c.backendPIDs() })
	if key == server || server == 0 {
		t.Fatalf("BackendKeyData pid %d, pg_backend_pid() %d: PgBouncer makes up its own", key, server)
	}
	notify(t, "session", "through")
	s.r.waitNote(t, "session", "through")
	testutil.WaitFor(t, pgTimeout, "two end-to-end checks", func() bool {
		var n int
		s.on(t, func() { n = s.c.chk.checks })
		return n >= 2
	})
	if h := s.r.healthSeq(); len(h) != 1 {
		t.Fatalf("health reports %v, want [true]", h)
	}
	if log := s.log.String(); !strings.Contains(log, "pooler that delivers notifications") {
		t.Fatalf("log does not mention the pooler:\n%s", log)
	}
}

// TestCheckPlain: Plain (a worker's own listener) makes the same check:
// NewPlain fails with the reason through a transaction pooler, and works
// directly and through a session pooler, where it keeps checking end to
// end.
func TestCheckPlain(t *testing.T) {
	tx := pgtesting.PgBouncer(t, db, "transaction")
	sess := pgtesting.PgBouncer(t, db, "session")
	for _, c := range []struct {
		name, url string
		ok        bool
	}{{"direct", db.URL(), true}, {"session", sess.URL(), true}, {"transaction", tx.URL(), false}} {
		t.Run(c.name, func(t *testing.T) {
			cc := mustParseConfig(t, c.url, testApp())
			r := newRecorder()
			p, err := NewPlain(ctxT(t), PlainConfig{ConnConfig: cc, HealthCheckInterval: 10 * time.Millisecond,
				HealthCheckTimeout: 500 * time.Millisecond, OnNotification: r.note, OnHealth: r.onHealth, Logger: testLogger()})
			if !c.ok {
				want := "listener: notifications do not arrive on this connection: a transaction-pooling PgBouncer? use a direct URL"
				if err == nil || !strings.HasPrefix(err.Error(), want) {
					t.Fatalf("NewPlain: %v, want %q", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if err := p.Listen(ctxT(t), "plain"); err != nil {
				t.Fatal(err)
			}
			if err := p.Listen(ctxT(t), p.check); err == nil {
				t.Fatal("Listen on the private channel was accepted")
			}
			notify(t, "plain", "x")
			r.waitNote(t, "plain", "x", p.check)
			// Idle through several end-to-end checks: still
			// healthy, never a notification on the private channel.
			testutil.WaitFor(t, pgTimeout, "three end-to-end checks", func() bool { return p.checks.Load() >= 3 })
			notify(t, "plain", "y")
			r.waitNote(t, "plain", "y", p.check)
			if h := r.healthSeq(); len(h) != 1 || !h[0] {
				t.Fatalf("health reports %v, want [true]", h)
			}
		})
	}
}
