package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

const timeout = 10 * time.Second

// pgCall is one Listen or Unlisten the hub issued to the fake.
type pgCall struct {
	op   string // "LISTEN" or "UNLISTEN"
	ch   string
	done func(error)
}

// fakePG stands in for pglisten.Conn. It records commands; the test
// completes them (on the loop) with complete, or they complete on their own
// in the next loop pass when auto is set. Loop goroutine only, like the
// real one; tests reach it through env.do.
type fakePG struct {
	l       *loop.Loop
	auto    bool
	calls   []pgCall // not completed yet
	log     []string // every command ever issued, "LISTEN ch"
	healthy bool
	closed  bool
}

func (f *fakePG) Listen(ch string, done func(error))   { f.issue("LISTEN", ch, done) }
func (f *fakePG) Unlisten(ch string, done func(error)) { f.issue("UNLISTEN", ch, done) }
func (f *fakePG) Healthy() bool                        { return f.healthy }
func (f *fakePG) Close(done func()) {
	f.closed = true
	f.l.Post(done)
}

func (f *fakePG) issue(op, ch string, done func(error)) {
	f.log = append(f.log, op+" "+ch)
	if f.auto {
		f.l.Post(func() { done(nil) }) // never inside the call, as the real one
		return
	}
	f.calls = append(f.calls, pgCall{op, ch, done})
}

// fakeClock is the injected clock: its tickers fire only when the test
// advances it.
type fakeClock struct {
	tickers []*fakeTicker
}

type fakeTicker struct {
	d       time.Duration
	f       func()
	elapsed time.Duration
	stopped bool
}

func (t *fakeTicker) Stop() bool { was := !t.stopped; t.stopped = true; return was }

func (c *fakeClock) Every(d time.Duration, f func()) stopper {
	t := &fakeTicker{d: d, f: f}
	c.tickers = append(c.tickers, t)
	return t
}

// advance runs, on the loop, every tick that d of time would bring.
func (c *fakeClock) advance(d time.Duration) {
	for _, t := range c.tickers {
		t.elapsed += d
		for !t.stopped && t.elapsed >= t.d {
			t.elapsed -= t.d
			t.f()
		}
	}
}

// logBuf collects the hub's log lines; dumped when a test fails.
type logBuf struct{ testutil.SyncBuffer }

func (b *logBuf) count(substr string) int { return strings.Count(b.String(), substr) }

// env is one hub under test with a fake Postgres side.
type env struct {
	t    *testing.T
	h    *Hub
	pg   *fakePG
	clk  *fakeClock
	logs *logBuf
	path string
}

func newEnv(t *testing.T, mutate func(*Config)) *env {
	t.Helper()
	return newEnvPG(t, mutate, true)
}

// newEnvPG is newEnv with the fake Postgres side healthy or not at Start.
func newEnvPG(t *testing.T, mutate func(*Config), healthy bool) *env {
	t.Helper()
	testutil.CheckFDs(t, 5*time.Second)
	logs := &logBuf{}
	cfg := Config{
		SocketPath: filepath.Join(t.TempDir(), "hub.sock"),
		Logger:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, h: h, clk: &fakeClock{}, logs: logs, path: cfg.SocketPath}
	setHooks(t, h, hooks{
		openPG: func(ctx context.Context, l *loop.Loop, h *Hub) (postgres, error) {
			e.pg = &fakePG{l: l, healthy: healthy}
			return e.pg, nil
		},
		clock: e.clk,
	})
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, h, logs)
	return e
}

// stopAtEnd stops h when the test ends, showing logs (when not nil) if
// the test failed.
func stopAtEnd(t testing.TB, h *Hub, logs *logBuf) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := h.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
		if t.Failed() && logs != nil {
			t.Logf("hub log:\n%s", logs.String())
		}
	})
}

// do runs f on the loop and waits for it.
func (e *env) do(f func()) {
	e.t.Helper()
	doOn(e.t, e.h, f)
}

// doOn runs f on h's loop and waits for it.
func doOn(t testing.TB, h *Hub, f func()) {
	t.Helper()
	ran := make(chan struct{})
	if err := h.loop.Post(func() { f(); close(ran) }); err != nil {
		t.Fatal(err)
	}
	testutil.WaitClosed(t, ran, timeout, "loop did not run a post")
}

// sync returns once the hub has handled whatever workers wrote before the
// call and has flushed what that produced: input written before a post is
// readable when the loop wakes for the post, reads come before posts in an
// iteration, and the flush ends it; the second post runs in a later
// iteration, after that flush.
// expectPending fails the test unless the commands in flight are want.
func (e *env) expectPending(want ...string) {
	e.t.Helper()
	if got := e.pending(); !slices.Equal(got, want) {
		e.t.Fatalf("pending = %v, want %v", got, want)
	}
}

func (e *env) sync() {
	e.t.Helper()
	e.do(func() {})
	e.do(func() {})
}

func (e *env) notify(ch, payload string) {
	e.do(func() { e.h.onNotification([]byte(ch), []byte(payload)) })
}

func (e *env) health(ok bool) {
	e.do(func() { e.pg.healthy = ok; e.h.onHealth(ok) })
}

func (e *env) advance(d time.Duration) { e.do(func() { e.clk.advance(d) }) }

// pending returns the commands not completed yet, as "LISTEN ch".
func (e *env) pending() []string {
	var out []string
	e.do(func() {
		for _, c := range e.pg.calls {
			out = append(out, c.op+" "+c.ch)
		}
	})
	return out
}

// issued returns every command ever issued.
func (e *env) issued() []string {
	var out []string
	e.do(func() { out = append(out, e.pg.log...) })
	return out
}

// complete finishes the oldest pending op on ch with err.
func (e *env) complete(op, ch string, err error) {
	e.t.Helper()
	e.sync()
	found := false
	e.do(func() {
		for i, c := range e.pg.calls {
			if c.op == op && c.ch == ch {
				e.pg.calls = append(e.pg.calls[:i], e.pg.calls[i+1:]...)
				c.done(err)
				found = true
				return
			}
		}
	})
	if !found {
		e.t.Fatalf("no pending %s %s (pending: %v)", op, ch, e.pending())
	}
}

// worker returns the hub's state for the n-th connected worker (1-based
// ids), evaluated on the loop.
func (e *env) workerState(id uint64, f func(w *worker)) {
	e.do(func() {
		w := e.h.workers.byID(id)
		if w == nil {
			e.t.Errorf("no worker %d", id)
			return
		}
		f(w)
	})
}

// tw is a test worker speaking raw frames.
type tw struct {
	t   testing.TB
	c   *net.UnixConn
	dec frame.Decoder
	buf []byte
}

// dial connects a worker and reads the status sent on connect.
func (e *env) dial() *tw {
	e.t.Helper()
	w := dialRaw(e.t, e.path)
	w.expect(`{"t":"status","healthy":true}`)
	return w
}

func dialRaw(t testing.TB, path string) *tw {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &tw{t: t, c: c, buf: make([]byte, 64<<10)}
}

func (w *tw) send(b []byte) {
	w.t.Helper()
	if _, err := w.c.Write(b); err != nil {
		w.t.Fatalf("worker write: %v", err)
	}
}

func (w *tw) sub(q string) { w.t.Helper(); w.send(frame.AppendSub(nil, q)) }

// subscribe sends a sub and expects its ack.
func (w *tw) subscribe(q string) { w.t.Helper(); w.sub(q); w.expect(ack(q)) }
func (w *tw) unsub(q string)     { w.t.Helper(); w.send(frame.AppendUnsub(nil, q)) }

// read returns the next frame, or err (io.EOF when the hub closed us).
// readUntilLast reads frames until the one whose payload is "last",
// calling each (if set) with every frame before it.
func (w *tw) readUntilLast(each func(frame.Message)) {
	w.t.Helper()
	for {
		m, err := w.read(timeout)
		if err != nil {
			w.t.Fatalf("worker: %v", err)
		}
		if m.Payload == "last" {
			return
		}
		if each != nil {
			each(m)
		}
	}
}

func (w *tw) read(d time.Duration) (frame.Message, error) {
	for {
		m, ok, err := w.dec.Next()
		if err != nil {
			return m, err
		}
		if ok {
			return m, nil
		}
		w.c.SetReadDeadline(time.Now().Add(d))
		n, err := w.c.Read(w.buf)
		if n > 0 {
			w.dec.Feed(w.buf[:n])
			continue
		}
		if err != nil {
			return m, err
		}
	}
}

// rawBody reads the next frame's body as the hub wrote it, bytes for bytes
// (for fields the decoder does not keep). Nothing may be buffered in w.dec.
func (w *tw) rawBody() string {
	w.t.Helper()
	if w.dec.Buffered() != 0 {
		w.t.Fatal("rawBody with frames buffered")
	}
	w.c.SetReadDeadline(time.Now().Add(timeout))
	var hdr [4]byte
	if _, err := io.ReadFull(w.c, hdr[:]); err != nil {
		w.t.Fatalf("worker read: %v", err)
	}
	body := make([]byte, int(hdr[0])<<24|int(hdr[1])<<16|int(hdr[2])<<8|int(hdr[3]))
	if _, err := io.ReadFull(w.c, body); err != nil {
		w.t.Fatalf("worker read: %v", err)
	}
	return string(body)
}

// next returns the next frame, compactly encoded.
func (w *tw) next() string {
	w.t.Helper()
	m, err := w.read(timeout)
	if err != nil {
		w.t.Fatalf("worker read: %v", err)
	}
	return encode(m)
}

func encode(m frame.Message) string {
	b := frame.Append(nil, m)
	return string(b[4:])
}

func (w *tw) expect(want ...string) {
	w.t.Helper()
	for _, s := range want {
		if got := w.next(); got != s {
			w.t.Fatalf("worker got %s, want %s", got, s)
		}
	}
}

// none checks that nothing is waiting for the worker. Call after env.sync,
// so that whatever the hub would send has been written already.
func (w *tw) none() {
	w.t.Helper()
	m, err := w.read(20 * time.Millisecond)
	if err == nil {
		w.t.Fatalf("worker got unexpected %s", encode(m))
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		w.t.Fatalf("worker read: %v", err)
	}
}

// eof waits for the hub to close the connection, skipping frames queued
// before the close.
// expectRefusal reads the hub's refusal of w's connection: one nack with an
// empty q and the reason, then EOF.
func expectRefusal(t testing.TB, w *tw, reason string) {
	t.Helper()
	m, err := w.read(timeout)
	if err != nil || m.Type != "nack" || m.Name != "" || m.Error != reason {
		t.Fatalf("refused worker read %+v, %v; want nack with q \"\" and error %q", m, err, reason)
	}
	w.eof()
}

func (w *tw) eof() {
	w.t.Helper()
	for {
		_, err := w.read(timeout)
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.t.Fatalf("worker: no EOF within %v", timeout)
		}
		return // io.EOF, or ECONNRESET: closed either way
	}
}

func wake(q string, p *string) string {
	if p == nil {
		return fmt.Sprintf(`{"t":"wake","q":%q,"p":null}`, q)
	}
	return fmt.Sprintf(`{"t":"wake","q":%q,"p":%q}`, q, *p)
}

func ptr(s string) *string { return &s }

func ack(q string) string { return fmt.Sprintf(`{"t":"ack","q":%q}`, q) }

const (
	statusTrue  = `{"t":"status","healthy":true}`
	statusFalse = `{"t":"status","healthy":false}`
)

func osPid() int { return os.Getpid() }

// byID returns the worker with that id, or nil.
func (s *workerSet) byID(id uint64) *worker {
	for _, w := range s.list {
		if w.id == id {
			return w
		}
	}
	return nil
}
