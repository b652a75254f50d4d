package pglisten

// Integration tests against a real PostgreSQL (a throwaway cluster with TLS
// on, or LISTENHUB_TEST_DATABASE_URL), run over every implementation and
// transport: the loop-driven Conn over TCP, a Unix socket and TLS (the
// bridge), and Plain over TCP and TLS.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/pgtest/pgtls"
	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

var db *pgtest.Cluster

func TestMain(m *testing.M) { pgtesting.Main(m, pgtest.Options{TLS: pgtls.Certificate}, &db) }

const pgTimeout = 20 * time.Second

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*pgTimeout)
	t.Cleanup(cancel)
	return ctx
}

// recorder collects what a listener reports. Notifications go to a big
// buffered channel (the loop never blocks on it: a full channel is a test
// failure, recorded).
type recorder struct {
	notes    chan note
	overflow atomic.Bool
	mu       sync.Mutex
	health   []bool
}

func newRecorder() *recorder { return &recorder{notes: make(chan note, 100000)} }

func (r *recorder) note(ch, p string) {
	select {
	case r.notes <- note{ch, p}:
	default:
		r.overflow.Store(true)
	}
}

func (r *recorder) onHealth(h bool) {
	r.mu.Lock()
	r.health = append(r.health, h)
	r.mu.Unlock()
}

func (r *recorder) healthSeq() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bool(nil), r.health...)
}

// waitNote reads notifications until (ch, payload) arrives; forbidden
// channels must not show up on the way.
func (r *recorder) waitNote(t testing.TB, ch, payload string, forbidden ...string) {
	t.Helper()
	deadline := time.After(pgTimeout)
	for {
		select {
		case n := <-r.notes:
			for _, f := range forbidden {
				if n.ch == f {
					t.Fatalf("notification on %q, which is not listened to (payload %.40q)", f, n.payload)
				}
			}
			if n.ch == ch && n.payload == payload {
				return
			}
		case <-deadline:
			t.Fatalf("no notification %q on %q within %v (overflow %v)", truncate(payload), ch, pgTimeout, r.overflow.Load())
		}
	}
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// waitHealth waits for the health reports to go through want, in order,
// from report number from on (transient states such as a brief false
// between two trues are not missed), and returns the index after the last
// one matched.
func (r *recorder) waitHealth(t testing.TB, from int, timeout time.Duration, want ...bool) int {
	t.Helper()
	next := from
	testutil.WaitFor(t, timeout, fmt.Sprintf("health reports %v from #%d", want, from), func() bool {
		h := r.healthSeq()
		i, j := from, 0
		for ; i < len(h) && j < len(want); i++ {
			if h[i] == want[j] {
				j++
			}
		}
		next = i
		return j == len(want)
	})
	return next
}

func (r *recorder) reports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.health)
}

// subject is one listener under test.
type subject interface {
	listen(t testing.TB, ch string) error
	unlisten(t testing.TB, ch string) error
	// listenAll issues every LISTEN at once (one loop iteration; for Plain
	// concurrently) and returns their results.
	listenAll(t testing.TB, chs []string) []error
	healthy() bool
	close(t testing.TB)
}

type variant struct {
	name  string
	url   func() string
	plain bool
	tls   bool
}

func variants(t *testing.T) []variant {
	vs := []variant{
		{name: "loop-tcp", url: db.URL},
		{name: "loop-unix", url: db.SocketURL},
		{name: "loop-tls", url: db.TLSURL, tls: true},
		{name: "plain-tcp", url: db.URL, plain: true},
		{name: "plain-tls", url: db.TLSURL, plain: true, tls: true},
	}
	if db.TLSURL() == "" {
		t.Log("no TLS URL (external server): TLS variants skipped")
		vs = []variant{vs[0], vs[1], vs[3]}
	}
	return vs
}

var appSeq atomic.Int64

// testApp returns a fresh application_name, so that Terminate and
// BackendPIDs reach only this test's listener.
func testApp() string { return fmt.Sprintf("lh-test-%d", appSeq.Add(1)) }

type opts struct {
	app                string
	interval, timeout  time.Duration
	commandTimeout     time.Duration
	reconnectMax       time.Duration
	defaultApplication bool
	logger             *slog.Logger // nil: testLogger()
}

func (v variant) open(t *testing.T, r *recorder, o opts) subject {
	t.Helper()
	if o.app == "" {
		o.app = testApp()
	}
	app := o.app
	if o.defaultApplication {
		app = ""
	}
	cc := mustParseConfig(t, v.url(), app)
	if o.reconnectMax == 0 {
		o.reconnectMax = 200 * time.Millisecond
	}
	if v.plain {
		p, err := NewPlain(ctxT(t), PlainConfig{
			ConnConfig: cc, HealthCheckInterval: o.interval, HealthCheckTimeout: o.timeout,
			ReconnectMin: 10 * time.Millisecond, ReconnectMax: o.reconnectMax,
			OnNotification: r.note, OnHealth: r.onHealth, Logger: testLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		s := &plainSubject{p: p}
		t.Cleanup(func() { s.close(t) })
		return s
	}
	// The helper connection of db is opened lazily: open it before
	// counting descriptors.
	if _, err := db.QueryInt(ctxT(t), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFDs(t, 5*time.Second)
	l, err := loop.New(loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	go l.Run()
	s := &loopSubject{l: l}
	t.Cleanup(func() {
		s.close(t)
		l.Stop()
		<-l.Done()
	})
	c, err := Open(ctxT(t), l, Config{
		ConnConfig: cc, HealthCheckInterval: o.interval, HealthCheckTimeout: o.timeout,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: o.reconnectMax, CommandTimeout: o.commandTimeout,
		OnNotification: func(ch, p []byte) { r.note(string(ch), string(p)) },
		OnHealth:       r.onHealth, Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.c = c
	return s
}

type loopSubject struct {
	l      *loop.Loop
	c      *Conn
	closed bool
}

// on runs f on the loop and waits.
func (s *loopSubject) on(t testing.TB, f func()) { t.Helper(); runOn(t, s.l, f) }

// runOn runs f on l and waits for it.
func runOn(t testing.TB, l *loop.Loop, f func()) {
	t.Helper()
	done := make(chan struct{})
	if err := l.Post(func() { f(); close(done) }); err != nil {
		t.Fatal(err)
	}
	testutil.WaitClosed(t, done, pgTimeout, "loop did not run the post")
}

func (s *loopSubject) cmd(t testing.TB, listen bool, ch string) error {
	t.Helper()
	errc := make(chan error, 1)
	s.on(t, func() {
		if listen {
			s.c.Listen(ch, func(err error) { errc <- err })
		} else {
			s.c.Unlisten(ch, func(err error) { errc <- err })
		}
	})
	select {
	case err := <-errc:
		return err
	case <-time.After(pgTimeout):
		t.Fatalf("no answer to LISTEN/UNLISTEN %q", ch)
		return nil
	}
}

func (s *loopSubject) listen(t testing.TB, ch string) error   { return s.cmd(t, true, ch) }
func (s *loopSubject) unlisten(t testing.TB, ch string) error { return s.cmd(t, false, ch) }

func (s *loopSubject) listenAll(t testing.TB, chs []string) []error {
	t.Helper()
	errs := make([]error, len(chs))
	var n atomic.Int64
	before := 0
	s.on(t, func() {
		before = testOf(s.c).batches
		for i, ch := range chs {
			s.c.Listen(ch, func(err error) { errs[i] = err; n.Add(1) })
		}
	})
	testutil.WaitFor(t, pgTimeout, "every LISTEN answered", func() bool { return n.Load() == int64(len(chs)) })
	var batches int
	s.on(t, func() { batches = testOf(s.c).batches - before })
	if batches != 1 {
		t.Errorf("%d LISTENs went out in %d queries, want 1", len(chs), batches)
	}
	return errs
}

func (s *loopSubject) healthy() bool {
	ch := make(chan bool, 1)
	if s.l.Post(func() { ch <- s.c.Healthy() }) != nil {
		return false
	}
	select {
	case h := <-ch:
		return h
	case <-time.After(pgTimeout):
		return false
	}
}

func (s *loopSubject) close(t testing.TB) {
	if s.closed {
		return
	}
	s.closed = true
	done := make(chan struct{})
	if s.l.Post(func() { s.c.Close(func() { close(done) }) }) != nil {
		return
	}
	select {
	case <-done:
	case <-time.After(pgTimeout):
		t.Error("Close did not finish")
	}
}

type plainSubject struct {
	p      *Plain
	closed bool
}

func (s *plainSubject) listen(t testing.TB, ch string) error {
	ctx, cancel := context.WithTimeout(context.Background(), pgTimeout)
	defer cancel()
	return s.p.Listen(ctx, ch)
}
func (s *plainSubject) unlisten(t testing.TB, ch string) error {
	ctx, cancel := context.WithTimeout(context.Background(), pgTimeout)
	defer cancel()
	return s.p.Unlisten(ctx, ch)
}
func (s *plainSubject) listenAll(t testing.TB, chs []string) []error {
	errs := make([]error, len(chs))
	var wg sync.WaitGroup
	ctx := ctxT(t)
	for i, ch := range chs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.p.Listen(ctx, ch) }()
	}
	wg.Wait()
	return errs
}
func (s *plainSubject) healthy() bool { return s.p.Healthy() }
func (s *plainSubject) close(t testing.TB) {
	if !s.closed {
		s.closed = true
		if err := s.p.Close(); err != nil {
			t.Error(err)
		}
	}
}

func notify(t testing.TB, ch, payload string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pgTimeout)
	defer cancel()
	if err := db.Notify(ctx, ch, payload); err != nil {
		t.Fatalf("NOTIFY %q: %v", ch, err)
	}
}

func mustListen(t testing.TB, s subject, ch string) {
	t.Helper()
	if err := s.listen(t, ch); err != nil {
		t.Fatalf("LISTEN %q: %v", ch, err)
	}
}

// TestAckThenNotify is the hub's guarantee 1: a NOTIFY committed right after
// done (the ack) is received, every time.
func TestAckThenNotify(t *testing.T) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			r := newRecorder()
			s := v.open(t, r, opts{})
			rounds := 1000
			if testing.Short() {
				rounds = 100
			}
			for i := 0; i < rounds; i++ {
				ch := "round_" + strconv.Itoa(i)
				mustListen(t, s, ch)
				notify(t, ch, strconv.Itoa(i))
				r.waitNote(t, ch, strconv.Itoa(i))
				if err := s.unlisten(t, ch); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestPayloads(t *testing.T) {
	payloads := map[string]string{
		"empty":   "",
		"unicode": "héllo wörld ✓ 日本語 🎉",
		"quotes":  `it's "quoted" \ back\slash '' ""; DROP TABLE x; --`,
		"max":     strings.Repeat("0123456789", 799) + "012345678", // 7,999 bytes
		"json":    `{"id":42,"t":"wake"}`,
	}
	if len(payloads["max"]) != 7999 {
		t.Fatal(len(payloads["max"]))
	}
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			r := newRecorder()
			s := v.open(t, r, opts{})
			mustListen(t, s, "payloads")
			for _, p := range payloads {
				notify(t, "payloads", p)
				r.waitNote(t, "payloads", p)
			}
		})
	}
}

// TestManyChannels: 200 LISTENs at once (one query on the loop), then 200
// notifications in one transaction (hundreds in one read).
func TestManyChannels(t *testing.T) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			r := newRecorder()
			s := v.open(t, r, opts{})
			chs := make([]string, 200)
			for i := range chs {
				chs[i] = fmt.Sprintf("many_%03d", i)
			}
			for i, err := range s.listenAll(t, chs) {
				if err != nil {
					t.Fatalf("LISTEN %s: %v", chs[i], err)
				}
			}
			if err := db.Exec(ctxT(t), `SELECT pg_notify(format('many_%s', lpad(i::text, 3, '0')), repeat('x', 100) || i)
				FROM generate_series(0, 199) i`); err != nil {
				t.Fatal(err)
			}
			for i := range chs {
				r.waitNote(t, chs[i], strings.Repeat("x", 100)+strconv.Itoa(i))
			}
		})
	}
}

func TestUnlistenStopsDelivery(t *testing.T) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			r := newRecorder()
			s := v.open(t, r, opts{})
			mustListen(t, s, "keep")
			mustListen(t, s, "drop")
			notify(t, "drop", "1")
			r.waitNote(t, "drop", "1")
			if err := s.unlisten(t, "drop"); err != nil {
				t.Fatal(err)
			}
			// Notifications from one session arrive in commit order: had
			// "drop" been delivered, it would come before "keep".
			notify(t, "drop", "2")
			notify(t, "keep", "3")
			r.waitNote(t, "keep", "3", "drop")
		})
	}
}

// TestHostileChannelNames: quotes and semicolons are part of the name, never
// SQL.
func TestHostileChannelNames(t *testing.T) {
	names := []string{
		`x"; CREATE TABLE pwned(); --`,
		`a;b"c"";NOTIFY "z`,
		`"`,
		`""`,
		`'; DROP TABLE t; --`,
		`Mixed Case.INSERT`,
		`пгмк.q_заказы`,
	}
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			r := newRecorder()
			s := v.open(t, r, opts{})
			for _, ch := range names {
				mustListen(t, s, ch)
			}
			for i, ch := range names {
				notify(t, ch, strconv.Itoa(i))
				r.waitNote(t, ch, strconv.Itoa(i))
			}
			n, err := db.QueryInt(ctxT(t), `SELECT count(*)::int FROM pg_class WHERE relname = 'pwned'`)
			if err != nil || n != 0 {
				t.Fatalf("pwned table: %d, %v", n, err)
			}
			if !s.healthy() {
				t.Error("unhealthy")
			}
		})
	}
}

func TestApplicationName(t *testing.T) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			r := newRecorder()
			app := testApp()
			v.open(t, r, opts{app: app})
			pids, err := db.BackendPIDs(ctxT(t), app)
			if err != nil || len(pids) != 1 {
				t.Fatalf("backends with application_name %q: %v, %v", app, pids, err)
			}
			if v.tls {
				n, err := db.QueryInt(ctxT(t), `SELECT count(*)::int FROM pg_stat_ssl WHERE pid = $1 AND ssl`, pids[0])
				if err != nil || n != 1 {
					t.Fatalf("backend %d not on TLS: %d, %v", pids[0], n, err)
				}
			}
		})
	}
}

// TestDefaultApplicationName: without one in the URL, the backend is
// "listenhub"; Close ends it.
func TestDefaultApplicationName(t *testing.T) {
	if db.External() {
		t.Skip("an external server may run other listenhub backends")
	}
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			r := newRecorder()
			s := v.open(t, r, opts{defaultApplication: true})
			pids, err := db.BackendPIDs(ctxT(t), DefaultApplicationName)
			if err != nil || len(pids) != 1 {
				t.Fatalf("backends named %q: %v, %v", DefaultApplicationName, pids, err)
			}
			s.close(t)
			testutil.WaitFor(t, pgTimeout, "backend gone after Close", func() bool {
				pids, err := db.BackendPIDs(ctxT(t), DefaultApplicationName)
				return err == nil && len(pids) == 0
			})
		})
	}
}

// TestTerminateBackend: pg_terminate_backend → unhealthy → reconnect →
// re-LISTEN → healthy; NOTIFYs after that are delivered, and a command issued
// meanwhile completes.
func TestTerminateBackend(t *testing.T) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			r := newRecorder()
			app := testApp()
			s := v.open(t, r, opts{app: app})
			r.waitHealth(t, 0, pgTimeout, true)
			mustListen(t, s, "term_a")
			mustListen(t, s, "term_b")
			before, _ := db.BackendPIDs(ctxT(t), app)
			base := r.reports()
			if n, err := db.Terminate(ctxT(t), app); err != nil || n != 1 {
				t.Fatalf("terminate: %d, %v", n, err)
			}
			r.waitHealth(t, base, pgTimeout, false, true)
			mustListen(t, s, "term_c")
			after, _ := db.BackendPIDs(ctxT(t), app)
			if len(after) != 1 || len(before) != 1 || after[0] == before[0] {
				t.Fatalf("backends before %v, after %v: want one new one", before, after)
			}
			for _, ch := range []string{"term_a", "term_b", "term_c"} {
				notify(t, ch, "after")
				r.waitNote(t, ch, "after")
			}
			if !s.healthy() {
				t.Error("unhealthy")
			}
		})
	}
}

// TestServerDown: the server stopped for 3 s and started again → unhealthy,
// reconnect, re-LISTEN, healthy; commands issued while down complete after
// the reconnect.
func TestServerDown(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			r := newRecorder()
			s := v.open(t, r, opts{reconnectMax: 500 * time.Millisecond})
			mustListen(t, s, "down_a")
			base := r.reports()
			pgtesting.Must(t, db.Stop(ctxT(t)))
			restarted := false
			t.Cleanup(func() {
				if !restarted {
					db.Start(context.Background())
				}
			})
			base = r.waitHealth(t, base, pgTimeout, false)
			if s.healthy() {
				t.Error("healthy while the server is down")
			}
			errc := make(chan error, 1)
			go func() { errc <- s.listen(t, "down_b") }()
			// The outage itself: the server stays down for 3 s.
			<-time.After(3 * time.Second)
			select {
			case err := <-errc:
				t.Fatalf("LISTEN completed while the server was down: %v", err)
			default:
			}
			pgtesting.Must(t, db.Start(ctxT(t)))
			restarted = true
			r.waitHealth(t, base, pgTimeout, true)
			testutil.WaitErr(t, errc, pgTimeout, "LISTEN issued while down")
			for _, ch := range []string{"down_a", "down_b"} {
				notify(t, ch, "back")
				r.waitNote(t, ch, "back")
			}
		})
	}
}

// TestFrozenBackend: SIGSTOP on the backend (a half-open connection: the
// socket stays up, nothing answers) is detected within interval + deadline,
// and the connection replaced.
func TestFrozenBackend(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	const interval, timeout = 100 * time.Millisecond, time.Second
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			r := newRecorder()
			app := testApp()
			s := v.open(t, r, opts{app: app, interval: interval, timeout: timeout})
			mustListen(t, s, "frozen")
			base := r.waitHealth(t, 0, pgTimeout, true)
			pids, err := db.BackendPIDs(ctxT(t), app)
			if err != nil || len(pids) != 1 {
				t.Fatalf("backends: %v %v", pids, err)
			}
			pgtesting.Must(t, db.FreezeIdle(ctxT(t), pids[0]))
			t.Cleanup(func() { db.Thaw(pids[0]) })
			start := time.Now()
			base = r.waitHealth(t, base, pgTimeout, false)
			took := time.Since(start)
			// Scheduling slack on a shared 2-core machine: 500 ms.
			if limit := interval + timeout + 500*time.Millisecond; took > limit {
				t.Errorf("frozen backend detected after %v, want within %v", took, limit)
			}
			t.Logf("frozen backend detected after %v (interval %v + timeout %v)", took, interval, timeout)
			r.waitHealth(t, base, pgTimeout, true)
			testutil.WaitFor(t, pgTimeout, "a new backend", func() bool {
				now, err := db.BackendPIDs(ctxT(t), app)
				for _, p := range now {
					if p != pids[0] {
						return err == nil
					}
				}
				return false
			})
			notify(t, "frozen", "thawed")
			r.waitNote(t, "frozen", "thawed")
			pgtesting.Must(t, db.Thaw(pids[0]))
		})
	}
}

// TestUnreachable: Open and NewPlain fail fast and clearly when nobody
// listens.
func TestUnreachable(t *testing.T) {
	cc := mustParseConfig(t, "postgres://postgres:sekrit@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5", "")
	l, err := loop.New(loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctxT(t), l, Config{ConnConfig: cc})
	if err == nil || strings.Contains(err.Error(), "sekrit") {
		t.Fatalf("Open: %v", err)
	}
	_, err = NewPlain(ctxT(t), PlainConfig{ConnConfig: cc})
	if err == nil || strings.Contains(err.Error(), "sekrit") {
		t.Fatalf("NewPlain: %v", err)
	}
}

// TestCommandTimeoutWhileDown: a LISTEN issued while the server is down
// fails with ErrCommandTimeout after Config.CommandTimeout (Conn), or when
// its context ends (Plain), instead of waiting; once the server is back the
// same LISTEN works.
func TestCommandTimeoutWhileDown(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	for _, v := range variants(t) {
		if v.name != "loop-tcp" && v.name != "plain-tcp" {
			continue
		}
		t.Run(v.name, func(t *testing.T) {
			r := newRecorder()
			s := v.open(t, r, opts{commandTimeout: 300 * time.Millisecond})
			base := r.waitHealth(t, 0, pgTimeout, true) // the delivery check passed
			pgtesting.Must(t, db.Stop(ctxT(t)))
			t.Cleanup(func() { db.Start(context.Background()) })
			base = r.waitHealth(t, base, pgTimeout, false)
			if ps, ok := s.(*plainSubject); ok {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				if err := ps.p.Listen(ctx, "timeout"); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("LISTEN while down: %v, want DeadlineExceeded", err)
				}
			} else if err := s.listen(t, "timeout"); !errors.Is(err, ErrCommandTimeout) {
				t.Fatalf("LISTEN while down: %v, want ErrCommandTimeout", err)
			}
			pgtesting.Must(t, db.Start(ctxT(t)))
			r.waitHealth(t, base, pgTimeout, true)
			mustListen(t, s, "timeout")
			notify(t, "timeout", "ok")
			r.waitNote(t, "timeout", "ok")
		})
	}
}
