package pglisten

// Start: a Conn that connects in the background, retries an unreachable
// server forever (at most 500 ms apart while a command waits) and gives up
// only on a configuration error before its first connection.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

// attempts records when each connection attempt was made and makes it fail
// while refuse holds an error.
type attempts struct {
	mu     sync.Mutex
	at     []time.Time
	refuse error
}

func (a *attempts) dial() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.at = append(a.at, time.Now())
	return a.refuse
}

func (a *attempts) set(err error) {
	a.mu.Lock()
	a.refuse = err
	a.mu.Unlock()
}

func (a *attempts) times() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.at...)
}

func (h *harness) fatalList() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]error(nil), h.fatals...)
}

// TestFakeStartRetryWhileWaiting: with nothing waiting, attempts follow the
// backoff (here 1-2 s apart); once a Listen waits, the next attempt comes
// within 500 ms and so does every one after it; when the server accepts, the
// Listen is sent and done(nil) runs, then OnHealth(true).
func TestFakeStartRetryWhileWaiting(t *testing.T) {
	a := &attempts{refuse: errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")}
	h := newStartHarness(t, Config{HealthCheckInterval: time.Hour,
		ReconnectMin: 2 * time.Second, ReconnectMax: 2 * time.Second}, a.dial)
	testutil.WaitFor(t, fakeTimeout, "two attempts", func() bool { return len(a.times()) >= 2 })
	at := a.times()
	if gap := at[1].Sub(at[0]); gap < time.Second {
		t.Fatalf("attempts %v apart with nothing waiting, want the backoff (>= 1 s)", gap)
	}
	var healthy bool
	h.on(func() { healthy = h.c.Healthy() })
	if healthy || h.healthSeq() != "[]" {
		t.Fatalf("healthy %v, reports %s before any connection", healthy, h.healthSeq())
	}

	r := newResults()
	var listenAt time.Time
	h.on(func() { listenAt = time.Now(); h.c.Listen("waits", r.done("waits")) })
	n := len(a.times())
	testutil.WaitFor(t, fakeTimeout, "six more attempts", func() bool { return len(a.times()) >= n+6 })
	at = a.times()
	// Slack for a loaded 2-core machine: the timer, the dial goroutine and
	// its post back to the loop.
	const limit = maxRetryWhileWaiting + 300*time.Millisecond
	prev := listenAt
	var worst time.Duration
	for _, ts := range at[n:] {
		gap := ts.Sub(prev)
		worst = max(worst, gap)
		if gap > limit {
			t.Errorf("attempt %v after the previous one (or the Listen) while a command waits, want <= %v", gap, limit)
		}
		prev = ts
	}
	t.Logf("while waiting: %d attempts, the longest gap %v", len(at)-n, worst)
	if r.count() != 0 {
		t.Fatal("the Listen finished without a connection")
	}

	a.set(nil)
	s := h.server()
	s.serveQuery(`LISTEN "waits"`)
	testutil.WaitFor(t, fakeTimeout, "done", func() bool { return r.count() == 1 })
	if err, _ := r.has("waits"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, fakeTimeout, "healthy", func() bool { return h.healthSeq() == "[true]" })
	if f := h.fatalList(); len(f) != 0 {
		t.Fatalf("OnFatal %v", f)
	}
}

// TestFakeStartConfigErrorFatal: a configuration error on the first attempt
// is reported once through OnFatal, never retried; the waiting command and
// every later one fail with it.
func TestFakeStartConfigErrorFatal(t *testing.T) {
	for _, code := range []string{"28P01", "28000", "3D000"} {
		t.Run(code, func(t *testing.T) {
			pe := &pgconn.PgError{Severity: "FATAL", Code: code, Message: "refused (" + code + ")"}
			a := &attempts{refuse: fmt.Errorf("listener: connect: %w", pe)}
			r := newResults()
			h := newStartHarness(t, Config{HealthCheckInterval: time.Hour,
				ReconnectMin: time.Millisecond, ReconnectMax: 10 * time.Millisecond}, a.dial)
			h.on(func() { h.c.Listen("early", r.done("early")) })
			testutil.WaitFor(t, fakeTimeout, "OnFatal", func() bool { return len(h.fatalList()) > 0 })
			testutil.WaitFor(t, fakeTimeout, "the waiting command failed", func() bool { return r.count() == 1 })
			if err, _ := r.has("early"); !IsConfigError(err) {
				t.Fatalf("waiting command: %v, want the configuration error", err)
			}
			h.on(func() { h.c.Listen("late", r.done("late")) })
			testutil.WaitFor(t, fakeTimeout, "the later command failed", func() bool { return r.count() == 2 })
			if err, _ := r.has("late"); !errors.Is(err, pe) {
				t.Fatalf("later command: %v, want the configuration error", err)
			}
			// With a 1-10 ms backoff, a retry would have happened many
			// times over in this half second.
			time.Sleep(500 * time.Millisecond)
			if n := len(a.times()); n != 1 {
				t.Fatalf("%d attempts after a configuration error, want 1", n)
			}
			if f := h.fatalList(); len(f) != 1 || !errors.Is(f[0], pe) {
				t.Fatalf("OnFatal reports %v, want one with the error", f)
			}
			closed := make(chan struct{})
			h.on(func() { h.c.Close(func() { close(closed) }) })
			testutil.WaitClosed(t, closed, fakeTimeout, "Close after OnFatal did not finish")
		})
	}
}

// TestFakeConfigErrorAfterUpRetried: once connected, the same errors during
// a reconnect are retried (the database may come back), not fatal.
func TestFakeConfigErrorAfterUpRetried(t *testing.T) {
	a := &attempts{}
	h := newHarnessMode(t, Config{HealthCheckInterval: time.Hour,
		ReconnectMin: time.Millisecond, ReconnectMax: 10 * time.Millisecond}, false, a.dial)
	s := h.server()
	testutil.WaitFor(t, fakeTimeout, "healthy", func() bool { return h.healthSeq() == "[true]" })
	a.set(fmt.Errorf("listener: connect: %w", &pgconn.PgError{Severity: "FATAL", Code: "3D000", Message: `database "x" does not exist`}))
	n := len(a.times())
	s.conn.Close()
	testutil.WaitFor(t, fakeTimeout, "five refused reconnects", func() bool { return len(a.times()) >= n+5 })
	if f := h.fatalList(); len(f) != 0 {
		t.Fatalf("OnFatal after a first success: %v", f)
	}
	a.set(nil)
	h.server()
	testutil.WaitFor(t, fakeTimeout, "healthy again", func() bool { return h.healthSeq() == "[true false true]" })
}

func TestIsConfigError(t *testing.T) {
	_, perr := ParseConfig("postgres://u:sekrit@host:notaport/db", "")
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("connection refused"), false},
		{fmt.Errorf("x: %w", &pgconn.PgError{Code: "28P01"}), true},
		{&pgconn.PgError{Code: "28000"}, true},
		{&pgconn.PgError{Code: "3D000"}, true},
		{&pgconn.PgError{Code: "57P03"}, false}, // the database system is starting up
		{&pgconn.PgError{Code: "53300"}, false}, // too many connections
		{perr, true},
		{errNoConnConfig, true},
	} {
		if got := IsConfigError(c.err); got != c.want {
			t.Errorf("IsConfigError(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// startSubject runs a loop and a Conn made by Start, with a dial counter
// (pgconn's DialFunc: one count per TCP or Unix connect).
type startSubject struct {
	loopSubject
	dials atomic.Int64
	fatal chan error
}

// waitFatal returns the error OnFatal reported, failing t if none comes
// within pgTimeout.
func (s *startSubject) waitFatal(t *testing.T) error {
	t.Helper()
	return testutil.Recv(t, s.fatal, pgTimeout, "no OnFatal")
}

func startConn(t *testing.T, r *recorder, url string, o opts) *startSubject {
	t.Helper()
	if o.app == "" {
		o.app = testApp()
	}
	if o.logger == nil {
		o.logger = testLogger()
	}
	cc := mustParseConfig(t, url, o.app)
	s := &startSubject{fatal: make(chan error, 10)}
	d := &net.Dialer{KeepAlive: 5 * time.Minute}
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		s.dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}
	l, err := loop.New(loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	go l.Run()
	s.l = l
	t.Cleanup(func() {
		s.close(t)
		l.Stop()
		<-l.Done()
	})
	if o.reconnectMax == 0 {
		o.reconnectMax = 5 * time.Second
	}
	s.c = Start(l, Config{
		ConnConfig: cc, HealthCheckInterval: o.interval, HealthCheckTimeout: o.timeout,
		ReconnectMin: 100 * time.Millisecond, ReconnectMax: o.reconnectMax, CommandTimeout: o.commandTimeout,
		OnNotification: func(ch, p []byte) { r.note(string(ch), string(p)) },
		OnHealth:       r.onHealth,
		OnFatal:        func(err error) { s.fatal <- err },
		Logger:         o.logger,
	})
	return s
}

// TestStartServerDown: Start with the server stopped returns at once; a
// Listen waits (unhealthy, not done); once the server is started the Listen
// completes within the 500 ms retry bound plus the connect, OnHealth(true)
// follows and a NOTIFY is delivered.
func TestStartServerDown(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	pgtesting.Must(t, db.Stop(ctxT(t)))
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			db.Start(context.Background())
		}
	})
	r := newRecorder()
	begin := time.Now()
	s := startConn(t, r, db.URL(), opts{})
	if took := time.Since(begin); took > time.Second {
		t.Fatalf("Start took %v with the server down, want at once", took)
	}
	errc := make(chan error, 1)
	s.on(t, func() { s.c.Listen("start_down", func(err error) { errc <- err }) })
	// Long enough for the backoff to pass 500 ms (100, 200, 400, 800 ms…).
	<-time.After(2 * time.Second)
	select {
	case err := <-errc:
		t.Fatalf("Listen finished while the server was down: %v", err)
	default:
	}
	if s.healthy() || r.reports() != 0 {
		t.Fatalf("healthy %v, reports %v while the server was down", s.healthy(), r.healthSeq())
	}
	if n := s.dials.Load(); n < 3 {
		t.Errorf("%d connection attempts in 2 s while a command waits, want >= 3", n)
	}
	pgtesting.Must(t, db.Start(ctxT(t)))
	restarted = true
	up := time.Now()
	testutil.WaitErr(t, errc, pgTimeout, "Listen")
	took := time.Since(up)
	t.Logf("Listen done %v after the server accepted connections (%d dial attempts)", took, s.dials.Load())
	// 500 ms retry bound + connect + LISTEN, with slack for a loaded machine.
	if took > 3*time.Second {
		t.Errorf("Listen done %v after the server came up, want within ~500 ms + connect", took)
	}
	r.waitHealth(t, 0, pgTimeout, true)
	notify(t, "start_down", "up")
	r.waitNote(t, "start_down", "up")
	select {
	case err := <-s.fatal:
		t.Fatalf("OnFatal: %v", err)
	default:
	}
}

// TestStartConfigErrorReal: against the real server, an unknown database and
// an unknown role are fatal at once: one OnFatal, no second attempt, the
// message without the password, the waiting Listen failed with it.
func TestStartConfigErrorReal(t *testing.T) {
	for _, c := range []struct{ name, db, user, code string }{
		{"unknown-database", "no_such_db", "postgres", "3D000"},
		{"unknown-role", "postgres", "no_such_role", "28000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cc, err := pgconn.ParseConfig(db.URL())
			if err != nil {
				t.Fatal(err)
			}
			url := fmt.Sprintf("postgres://%s:sekrit@%s:%d/%s?sslmode=disable", c.user, cc.Host, cc.Port, c.db)
			r := newRecorder()
			s := startConn(t, r, url, opts{reconnectMax: 20 * time.Millisecond})
			errc := make(chan error, 1)
			s.on(t, func() { s.c.Listen("cfg", func(err error) { errc <- err }) })
			fatal := s.waitFatal(t)
			var pe *pgconn.PgError
			if !errors.As(fatal, &pe) || pe.Code != c.code || !IsConfigError(fatal) {
				t.Fatalf("OnFatal(%v), want SQLSTATE %s", fatal, c.code)
			}
			if strings.Contains(fatal.Error(), "sekrit") {
				t.Fatalf("the fatal error shows the password: %v", fatal)
			}
			select {
			case err := <-errc:
				if !errors.Is(err, pe) {
					t.Fatalf("waiting Listen: %v", err)
				}
			case <-time.After(pgTimeout):
				t.Fatal("the waiting Listen never failed")
			}
			dials := s.dials.Load()
			time.Sleep(500 * time.Millisecond) // dozens of retries at a 20 ms backoff
			if n := s.dials.Load(); n != dials {
				t.Fatalf("%d more dials after OnFatal", n-dials)
			}
			select {
			case err := <-s.fatal:
				t.Fatalf("a second OnFatal: %v", err)
			default:
			}
			t.Logf("OnFatal after %d dial(s): %v", dials, fatal)
		})
	}
}

// TestStartWrongPassword: a server that refuses the password (SQLSTATE
// 28P01; the test cluster trusts everyone, so a scripted server on TCP says
// it) is fatal: one OnFatal, one connection, no password in the message.
func TestStartWrongPassword(t *testing.T) {
	ln := testutil.ListenTCP(t)
	defer ln.Close()
	var accepts atomic.Int64
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			go func() {
				defer conn.Close()
				var hdr [4]byte
				if _, err := io.ReadFull(conn, hdr[:]); err != nil {
					return
				}
				if _, err := io.CopyN(io.Discard, conn, int64(binary.BigEndian.Uint32(hdr[:]))-4); err != nil {
					return
				}
				conn.Write(errorMsg("FATAL", "28P01", `password authentication failed for user "app"`))
			}()
		}
	}()
	r := newRecorder()
	s := startConn(t, r, "postgres://app:sekrit@"+ln.Addr().String()+"/app?sslmode=disable", opts{reconnectMax: 20 * time.Millisecond})
	fatal := s.waitFatal(t)
	var pe *pgconn.PgError
	if !errors.As(fatal, &pe) || pe.Code != "28P01" {
		t.Fatalf("OnFatal(%v), want SQLSTATE 28P01", fatal)
	}
	if strings.Contains(fatal.Error(), "sekrit") {
		t.Fatalf("the fatal error shows the password: %v", fatal)
	}
	time.Sleep(500 * time.Millisecond)
	if n := accepts.Load(); n != 1 {
		t.Fatalf("%d connections, want 1 (no retry)", n)
	}
	t.Logf("OnFatal: %v", fatal)
}
