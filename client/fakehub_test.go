package client

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

// waitLong bounds every wait of a test on something that should happen
// promptly; hitting it is a failure, never part of the expected path.
const waitLong = 10 * time.Second

// fakeHub is a scripted hub: a real Unix socket that speaks frames and
// does what the test tells it, so that the client's side of the protocol
// can be tested without Postgres.
type fakeHub struct {
	t    testing.TB
	path string
	ln   *net.UnixListener

	// auto, when set before a connection is accepted, acks every sub at
	// once and sends status healthy on connect, like a well-behaved hub.
	auto bool

	conns chan *fakeConn
	mu    sync.Mutex
	all   []*fakeConn
}

// shortDir returns a fresh directory whose path is short enough for a Unix
// socket (108 bytes), removed at the end of the test.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lhc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func newFakeHub(t testing.TB, auto bool) *fakeHub {
	t.Helper()
	path := filepath.Join(shortDir(t), "hub.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHub{t: t, path: path, ln: ln, auto: auto, conns: make(chan *fakeConn, 64)}
	go h.acceptLoop(ln)
	t.Cleanup(h.close)
	return h
}

// stop closes the listening socket (and removes it: dials fail with
// ENOENT); the connections stay.
func (h *fakeHub) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ln.Close()
}

// restart listens on the same path again, as a hub restarted there would.
func (h *fakeHub) restart() {
	h.t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: h.path, Net: "unix"})
	if err != nil {
		h.t.Fatal(err)
	}
	h.mu.Lock()
	h.ln = ln
	h.mu.Unlock()
	go h.acceptLoop(ln)
}

func (h *fakeHub) acceptLoop(ln *net.UnixListener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		fc := &fakeConn{c: c, msgs: make(chan frame.Message, 4096), eof: make(chan struct{}), auto: h.auto}
		h.mu.Lock()
		h.all = append(h.all, fc)
		h.mu.Unlock()
		if fc.auto {
			fc.send(frame.AppendStatus(nil, true))
		}
		go fc.readLoop()
		select {
		case h.conns <- fc:
		default: // a test that does not accept() them all
		}
	}
}

// accept returns the next connection the hub accepted.
func (h *fakeHub) accept() *fakeConn {
	h.t.Helper()
	return testutil.Recv(h.t, h.conns, waitLong, "fake hub: no connection")
}

func (h *fakeHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ln.Close()
	for _, fc := range h.all {
		fc.c.Close()
	}
}

// fakeConn is one client connection of a fakeHub.
type fakeConn struct {
	c    net.Conn
	msgs chan frame.Message // frames from the client, in order
	eof  chan struct{}      // closed when the client's side is closed
	auto bool
	wmu  sync.Mutex
}

func (fc *fakeConn) readLoop() {
	defer close(fc.eof)
	var dec frame.Decoder
	buf := make([]byte, 4096)
	for {
		n, err := fc.c.Read(buf)
		dec.Feed(buf[:n])
		for {
			m, ok, derr := dec.Next()
			if derr != nil || !ok {
				break
			}
			if fc.auto && m.Type == frame.TypeSub {
				fc.send(frame.AppendAck(nil, m.Name))
			}
			select {
			case fc.msgs <- m:
			default: // a test that does not look at them
			}
		}
		if err != nil {
			return
		}
	}
}

// send writes raw bytes (one or more frames) to the client.
func (fc *fakeConn) send(b []byte) {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	fc.c.SetWriteDeadline(time.Now().Add(waitLong))
	fc.c.Write(b) // errors show up as the test's expectations failing
}

func (fc *fakeConn) ack(q string)     { fc.send(frame.AppendAck(nil, q)) }
func (fc *fakeConn) status(ok bool)   { fc.send(frame.AppendStatus(nil, ok)) }
func (fc *fakeConn) wake(q, p string) { fc.send(frame.AppendWake(nil, q, []byte(p), true)) }
func (fc *fakeConn) durable(q string) { fc.send(frame.AppendWake(nil, q, nil, false)) }
func (fc *fakeConn) nack(q, reason string) {
	fc.send(frame.AppendNack(nil, q, reason))
}

// next returns the next frame the client sent.
func (fc *fakeConn) next(t testing.TB) frame.Message {
	t.Helper()
	return testutil.Recv(t, fc.msgs, waitLong, "fake hub: no frame from the client")
}

// expect fails unless the next frame from the client is (typ, q).
func (fc *fakeConn) expect(t testing.TB, typ, q string) {
	t.Helper()
	m := fc.next(t)
	if m.Type != typ || m.Name != q {
		t.Fatalf("fake hub: got %s %q from the client, want %s %q", m.Type, m.Name, typ, q)
	}
}

// waitEOF waits for the client to close its side.
func (fc *fakeConn) waitEOF(t testing.TB) {
	t.Helper()
	testutil.WaitClosed(t, fc.eof, waitLong, "fake hub: client did not close the connection")
}

// recorder collects what handlers receive.
type recorder struct {
	mu     sync.Mutex
	events []string // "wake q p", "durable q", "status true"
	wakes  []Wake
}

func (r *recorder) onWake(w Wake) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wakes = append(r.wakes, w)
	if w.Durable {
		r.events = append(r.events, "durable "+w.Name)
	} else {
		r.events = append(r.events, "wake "+w.Name+" "+w.Payload)
	}
}

func (r *recorder) onStatus(ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ok {
		r.events = append(r.events, "status true")
	} else {
		r.events = append(r.events, "status false")
	}
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

func (r *recorder) has(ev string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e == ev {
			return true
		}
	}
	return false
}

// result runs f in a goroutine and returns a channel with its error.
func result(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// await returns the error f produced, failing the test if it takes longer
// than waitLong (a hang is the bug these tests are most about).
func await(t testing.TB, ch <-chan error) error {
	t.Helper()
	return testutil.Recv(t, ch, waitLong, "call did not return")
}

// pending fails if ch already has a result: the call should still wait.
func pending(t testing.TB, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("call returned early: %v", err)
	default:
	}
}

// fakeSession is a fake hub (auto: it acks subs itself), a Client dialed to
// it with rec's handlers and opts, and the hub's end of the connection.
func fakeSession(t testing.TB, auto bool, rec *recorder, opts Options) (*fakeHub, *Conn, *fakeConn) {
	t.Helper()
	h := newFakeHub(t, auto)
	c := dialFake(t, h, rec, opts)
	return h, c, h.accept()
}

// mustSubscribe subscribes c to q, or the test fails.
func mustSubscribe(t testing.TB, c interface {
	Subscribe(context.Context, string) error
}, q string) {
	t.Helper()
	if err := c.Subscribe(context.Background(), q); err != nil {
		t.Fatal(err)
	}
}

// cancelThenAck: cancel ends the first of two waiting Subscribes with
// context.Canceled; the hub's ack of q then answers the second.
func cancelThenAck(t testing.TB, cancel func(), first, second <-chan error, fc *fakeConn, q string) {
	t.Helper()
	cancel()
	if err := await(t, first); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	fc.ack(q)
	if err := await(t, second); err != nil {
		t.Fatal(err)
	}
}

// dialFake dials h with the recorder's handlers; closed at test end.
func dialFake(t testing.TB, h *fakeHub, rec *recorder, opts Options, hs ...Handlers) *Conn {
	t.Helper()
	var handlers Handlers
	if len(hs) > 0 {
		handlers = hs[0]
	}
	if rec != nil {
		handlers = Handlers{OnWake: rec.onWake, OnStatus: rec.onStatus}
	}
	c, err := Dial(context.Background(), withPath(opts, h.path), handlers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); c.wait() })
	return c
}

var errTest = errors.New("test error")
