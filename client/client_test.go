package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

func TestClientSubscribeWaitsForAck(t *testing.T) {
	_, c, fc := fakeSession(t, false, nil, Options{})

	done := result(func() error { return c.Subscribe(context.Background(), "jobs") })
	fc.expect(t, "sub", "jobs")
	pending(t, done)
	fc.ack("jobs")
	if err := await(t, done); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	if c.Err() != nil {
		t.Fatalf("Err after ack: %v", c.Err())
	}
}

func TestClientWakesAndStatusInOrder(t *testing.T) {
	rec := &recorder{}
	_, c, fc := fakeSession(t, true, rec, Options{})
	mustSubscribe(t, c, "a")
	testutil.WaitFor(t, waitLong, "first status", c.Healthy)

	// One write carrying many frames, as the hub's end-of-iteration flush
	// does, then single frames.
	var burst []byte
	var want []string
	want = append(want, "status true")
	for i := range 100 {
		p := fmt.Sprintf("p%d", i)
		burst = frame.AppendWake(burst, "a", []byte(p), true)
		want = append(want, "wake a "+p)
		if i%10 == 0 {
			burst = frame.AppendWake(burst, "a", nil, false)
			want = append(want, "durable a")
		}
	}
	burst = frame.AppendStatus(burst, false)
	want = append(want, "status false")
	fc.send(burst)
	fc.wake("a", `{"id":1, "quote":"\"", "nl":"`+"\n"+`"}`)
	want = append(want, "wake a "+`{"id":1, "quote":"\"", "nl":"`+"\n"+`"}`)
	fc.status(true)
	want = append(want, "status true")

	testutil.WaitFor(t, waitLong, "all frames delivered", func() bool { return rec.len() >= len(want) })
	if got := rec.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("events:\n got %q\nwant %q", got, want)
	}
	if !c.Healthy() {
		t.Fatal("Healthy false after status true")
	}
}

func TestClientWakeFramesSplitAcrossReads(t *testing.T) {
	rec := &recorder{}
	_, c, fc := fakeSession(t, true, rec, Options{})
	mustSubscribe(t, c, "a")
	b := frame.AppendWake(nil, "a", []byte(strings.Repeat("x", 8000)), true)
	for i := 0; i < len(b); i += 7 {
		fc.send(b[i:min(i+7, len(b))])
	}
	testutil.WaitFor(t, waitLong, "wake delivered", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.wakes) == 1
	})
	if w := rec.wakes[0]; w.Durable || len(w.Payload) != 8000 {
		t.Fatalf("wake %+v", w)
	}
}

func TestClientDurableFlag(t *testing.T) {
	rec := &recorder{}
	_, c, fc := fakeSession(t, true, rec, Options{})
	mustSubscribe(t, c, "a")
	fc.send(rawFrame(`{"t":"wake","q":"a"}`))          // p absent
	fc.send(rawFrame(`{"t":"wake","q":"a","p":null}`)) // p null
	fc.send(rawFrame(`{"t":"wake","q":"a","p":""}`))   // empty payload: nothing to lose
	fc.wake("a", "x")
	testutil.WaitFor(t, waitLong, "4 wakes", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.wakes) == 4
	})
	got := []bool{}
	for _, w := range rec.wakes {
		got = append(got, w.Durable)
	}
	if !slices.Equal(got, []bool{true, true, true, false}) {
		t.Fatalf("durable flags %v", got)
	}
}

func TestClientSubscribeSameNameSequential(t *testing.T) {
	_, c, fc := fakeSession(t, true, nil, Options{})
	ctx := context.Background()
	if err := c.Subscribe(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	fc.expect(t, "sub", "a")
	// Already acked: no second frame, no wait.
	if err := c.Subscribe(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Subscribe(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	fc.expect(t, "sub", "b") // not a second "a"
}

func TestClientSubscribeSameNameConcurrent(t *testing.T) {
	_, c, fc := fakeSession(t, false, nil, Options{})
	var calls []<-chan error
	for range 10 {
		calls = append(calls, result(func() error { return c.Subscribe(context.Background(), "a") }))
	}
	fc.expect(t, "sub", "a")
	// Let the other nine reach their wait, then check that none of them
	// sent a frame of its own.
	testutil.WaitFor(t, waitLong, "all waiting", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		s := c.subs["a"]
		return s != nil && s.call != nil && s.call.waiters == 10
	})
	fc.ack("a")
	for _, ch := range calls {
		if err := await(t, ch); err != nil {
			t.Fatal(err)
		}
	}
	// The next frame is "sub z": no second "sub a" was sent.
	fc.subscribeVia(t, c, "z")
}

// nackedSub subscribes a client of a fake hub to q, which the hub nacks
// with reason; it returns the client, the hub's end and Subscribe's error.
func nackedSub(t *testing.T, q, reason string) (*Conn, *fakeConn, error) {
	t.Helper()
	_, c, fc := fakeSession(t, false, nil, Options{})
	done := result(func() error { return c.Subscribe(context.Background(), q) })
	fc.expect(t, "sub", q)
	fc.nack(q, reason)
	return c, fc, await(t, done)
}

func TestClientNackInvalidNameKeepsClient(t *testing.T) {
	c, fc, err := nackedSub(t, "bad", "invalid channel: 70 bytes, longer than 63")
	var nack *NackError
	if !errors.As(err, &nack) || nack.Kind != NackInvalidName || !errors.Is(err, ErrInvalidName) {
		t.Fatalf("err = %#v, want an invalid-name *NackError", err)
	}
	if nack.Name != "bad" || !strings.Contains(nack.Reason, "63") {
		t.Fatalf("nack %+v", nack)
	}
	if c.Err() != nil || isClosed(c.Done()) {
		t.Fatalf("client died on an invalid-name nack: %v", c.Err())
	}
	// Still usable, and the refused name can be retried (to be refused
	// again) rather than remembered as subscribed.
	fc.subscribeVia(t, c, "bad")
}

// A nack at one of the hub's caps is final for that subscribe and leaves the
// client alive: the hub keeps the connection.
func TestClientNackLimitKeepsClient(t *testing.T) {
	_, c, fc := fakeSession(t, false, nil, Options{})
	for i, reason := range []string{"too many subscriptions", "too many channels"} {
		q := fmt.Sprintf("q%d", i)
		done := result(func() error { return c.Subscribe(context.Background(), q) })
		fc.expect(t, "sub", q)
		fc.nack(q, reason)
		err := await(t, done)
		var nack *NackError
		if !errors.As(err, &nack) || nack.Kind != NackLimit || !errors.Is(err, ErrLimit) {
			t.Fatalf("err = %#v, want a limit *NackError", err)
		}
		if c.Err() != nil || isClosed(c.Done()) {
			t.Fatalf("client died on a %q nack: %v", reason, c.Err())
		}
	}
	fc.subscribeVia(t, c, "ok")
}

func TestClientInvalidNameLocally(t *testing.T) {
	h := newFakeHub(t, false)
	c := dialFake(t, h, nil, Options{})
	for _, q := range []string{strings.Repeat("x", 64), "a\x00b", "a\xffb", "\xed\xa0\x80"} {
		if err := c.Subscribe(context.Background(), q); !errors.Is(err, ErrInvalidName) {
			t.Fatalf("Subscribe(%q) = %v, want ErrInvalidName", q, err)
		}
	}
	if c.Err() != nil {
		t.Fatal(c.Err())
	}
}

func TestClientNackOtherKillsClient(t *testing.T) {
	c, fc, err := nackedSub(t, "a", "LISTEN failed: connection to Postgres is down")
	var nack *NackError
	if !errors.As(err, &nack) || nack.Kind != NackOther || errors.Is(err, ErrInvalidName) {
		t.Fatalf("err = %v, want a non-name *NackError", err)
	}
	if !isClosed(c.Done()) || !errors.As(c.Err(), &nack) {
		t.Fatalf("client alive after a LISTEN-failed nack: Err=%v", c.Err())
	}
	fc.waitEOF(t)
}

func TestClientAckTimeoutKillsClient(t *testing.T) {
	_, c, fc := fakeSession(t, false, nil, Options{AckTimeout: 100 * time.Millisecond})
	start := time.Now()
	err := c.Subscribe(context.Background(), "a")
	var ate *AckTimeoutError
	if !errors.As(err, &ate) || !errors.Is(err, ErrAckTimeout) || ate.Name != "a" {
		t.Fatalf("err = %v, want *AckTimeoutError", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > waitLong {
		t.Fatalf("returned after %v", d)
	}
	if !errors.Is(c.Err(), ErrAckTimeout) {
		t.Fatalf("Err = %v", c.Err())
	}
	fc.waitEOF(t)
	// A late ack changes nothing.
	fc.ack("a")
	if !errors.Is(c.Subscribe(context.Background(), "a"), ErrAckTimeout) {
		t.Fatal("Subscribe after death did not return the death")
	}
}

func TestClientEOFDuringSubscribe(t *testing.T) {
	_, c, fc := fakeSession(t, false, nil, Options{})
	done := result(func() error { return c.Subscribe(context.Background(), "a") })
	fc.expect(t, "sub", "a")
	fc.c.Close()
	err := await(t, done)
	var ce *ConnError
	if !errors.As(err, &ce) || ce.Op != "read" || !errors.Is(err, io.EOF) {
		t.Fatalf("err = %v, want a read *ConnError wrapping EOF", err)
	}
	if !errors.Is(c.Err(), io.EOF) {
		t.Fatalf("Err = %v", c.Err())
	}
}

func TestClientEOFIdle(t *testing.T) {
	rec := &recorder{}
	_, c, fc := fakeSession(t, true, rec, Options{})
	testutil.WaitFor(t, waitLong, "status", c.Healthy)
	fc.c.Close()
	select {
	case <-c.Done():
	case <-time.After(waitLong):
		t.Fatal("Done not closed on EOF")
	}
	if !errors.Is(c.Err(), io.EOF) || c.Healthy() {
		t.Fatalf("Err = %v, Healthy = %v", c.Err(), c.Healthy())
	}
	c.wait()
}

func TestClientTruncatedFrameIsUnexpectedEOF(t *testing.T) {
	_, c, fc := fakeSession(t, false, nil, Options{})
	fc.send(frame.AppendStatus(nil, true)[:6])
	fc.c.Close()
	<-c.Done()
	if !errors.Is(c.Err(), io.ErrUnexpectedEOF) {
		t.Fatalf("Err = %v", c.Err())
	}
}

func TestClientMalformedFrameKillsClient(t *testing.T) {
	for name, b := range map[string][]byte{
		"bad json":  []byte("\x00\x00\x00\x05{\"t\":"),
		"not obj":   []byte("\x00\x00\x00\x02[]"),
		"too large": {0x7f, 0, 0, 0},
	} {
		t.Run(name, func(t *testing.T) {
			_, c, fc := fakeSession(t, false, nil, Options{})
			fc.send(b)
			select {
			case <-c.Done():
			case <-time.After(waitLong):
				t.Fatal("client survived a malformed frame")
			}
			var fe *frame.Error
			if !errors.As(c.Err(), &fe) {
				t.Fatalf("Err = %v, want a *frame.Error", c.Err())
			}
			fc.waitEOF(t)
		})
	}
}

func TestClientUnknownFrameSkipped(t *testing.T) {
	rec := &recorder{}
	_, c, fc := fakeSession(t, true, rec, Options{})
	body := `{"t":"hello","q":"a","extra":[1,{"x":2}]}`
	fc.send(append([]byte{0, 0, 0, byte(len(body))}, body...))
	body = `{"extra":true,"q":"a","p":"x","t":"wake"}` // unknown field, any order
	fc.send(append([]byte{0, 0, 0, byte(len(body))}, body...))
	testutil.WaitFor(t, waitLong, "wake after unknown frame", func() bool { return rec.has("wake a x") })
	if c.Err() != nil {
		t.Fatal(c.Err())
	}
}

// A write the hub never reads must not hang Subscribe: the write deadline
// kills the client. net.Pipe has no buffer, so its first write stalls.
func TestClientStalledWriteKillsClient(t *testing.T) {
	ours, theirs := net.Pipe()
	defer theirs.Close()
	opts, err := Options{AckTimeout: time.Minute, WriteTimeout: 100 * time.Millisecond}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(ours, "pipe", opts, Handlers{})
	defer c.Close()
	err = await(t, result(func() error { return c.Subscribe(context.Background(), "a") }))
	var ce *ConnError
	if !errors.As(err, &ce) || ce.Op != "write" || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err = %v, want a write *ConnError past its deadline", err)
	}
	if c.Err() != err {
		t.Fatalf("Err = %v", c.Err())
	}
}

func TestClientSubscribeAfterClose(t *testing.T) {
	_, c, fc := fakeSession(t, true, nil, Options{})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Subscribe(context.Background(), "a"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Subscribe after Close = %v", err)
	}
	c.Unsubscribe("a") // no-op, no panic
	if !errors.Is(c.Err(), ErrClosed) || c.Healthy() || !isClosed(c.Done()) {
		t.Fatalf("Err=%v Healthy=%v", c.Err(), c.Healthy())
	}
	c.Close() // idempotent
	fc.waitEOF(t)
}

func TestClientCloseDuringSubscribe(t *testing.T) {
	_, c, fc := fakeSession(t, false, nil, Options{AckTimeout: time.Minute})
	a := result(func() error { return c.Subscribe(context.Background(), "a") })
	b := result(func() error { return c.Subscribe(context.Background(), "a") })
	fc.expect(t, "sub", "a")
	c.Close()
	for _, ch := range []<-chan error{a, b} {
		if err := await(t, ch); !errors.Is(err, ErrClosed) {
			t.Fatalf("Subscribe = %v, want ErrClosed", err)
		}
	}
}

func TestClientSubscribeContextCancelAbandons(t *testing.T) {
	_, c, fc := fakeSession(t, false, nil, Options{AckTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := result(func() error { return c.Subscribe(ctx, "a") })
	fc.expect(t, "sub", "a")
	cancel()
	if err := await(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Subscribe = %v", err)
	}
	if c.Err() != nil {
		t.Fatalf("ctx cancel killed the client: %v", c.Err())
	}
	// The ack still comes; the abandoned subscription is dropped.
	fc.ack("a")
	fc.expect(t, "unsub", "a")

	// A cancelled wait that another Subscribe of the name outlives keeps
	// the subscription.
	ctx, cancel = context.WithCancel(context.Background())
	first := result(func() error { return c.Subscribe(ctx, "b") })
	fc.expect(t, "sub", "b")
	second := result(func() error { return c.Subscribe(context.Background(), "b") })
	testutil.WaitFor(t, waitLong, "second waiter", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.subs["b"].call.waiters == 2
	})
	cancelThenAck(t, cancel, first, second, fc, "b")
	// The next frame is "sub c": no "unsub b" before it.
	fc.subscribeVia(t, c, "c")
}

func TestClientUnsubscribe(t *testing.T) {
	_, c, fc := fakeSession(t, false, nil, Options{})
	ctx := context.Background()

	fc.subscribeVia(t, c, "a")
	c.Unsubscribe("a")
	fc.expect(t, "unsub", "a")
	c.Unsubscribe("a") // unknown now: nothing sent
	c.Unsubscribe("never")

	// Unsubscribe while the sub is pending: Subscribe returns on the ack,
	// then the unsub goes out.
	done := result(func() error { return c.Subscribe(ctx, "b") })
	fc.expect(t, "sub", "b")
	testutil.WaitFor(t, waitLong, "b pending", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.subs["b"] != nil && c.subs["b"].call != nil
	})
	c.Unsubscribe("b")
	fc.ack("b")
	if err := await(t, done); err != nil {
		t.Fatal(err)
	}
	fc.expect(t, "unsub", "b")

	// Unsubscribe then Subscribe: the frames keep that order.
	fc.subscribeVia(t, c, "b")
	c.Unsubscribe("b")
	done = result(func() error { return c.Subscribe(ctx, "b") })
	fc.expect(t, "unsub", "b")
	fc.expect(t, "sub", "b")
	fc.ack("b")
	if err := await(t, done); err != nil {
		t.Fatal(err)
	}
}

func TestClientStrayAckIgnored(t *testing.T) {
	_, c, fc := fakeSession(t, false, nil, Options{})
	fc.ack("nobody")
	fc.nack("nobody", "LISTEN failed")
	fc.subscribeVia(t, c, "a")
}

func TestClientCloseFromHandler(t *testing.T) {
	h := newFakeHub(t, true)
	var c *Conn
	var mu sync.Mutex
	calls := 0
	ready := make(chan struct{})
	c = dialFake(t, h, nil, Options{}, Handlers{OnWake: func(w Wake) {
		<-ready
		mu.Lock()
		calls++
		mu.Unlock()
		c.Close() // must not deadlock
	}})
	close(ready)
	fc := h.accept()
	mustSubscribe(t, c, "a")
	fc.wake("a", "1")
	fc.wake("a", "2")
	fc.wake("a", "3")
	<-c.Done()
	c.wait()
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 {
		t.Fatalf("%d handler calls after Close, want 1", calls)
	}
}

// After Close, no new handler call starts, even with frames queued: at
// most the one call that had already begun when Close was called may still
// run its body after Close returns (Close does not wait for it, see
// TestCloseWhileHandlerStartsNeverDeadlocks).
func TestClientNoHandlerAfterClose(t *testing.T) {
	h := newFakeHub(t, true)
	var mu sync.Mutex
	closed := false
	late, calls := 0, 0
	c := dialFake(t, h, nil, Options{}, Handlers{OnWake: func(w Wake) {
		mu.Lock()
		calls++
		if closed {
			late++
		}
		mu.Unlock()
	}})
	fc := h.accept()
	mustSubscribe(t, c, "a")
	var burst []byte
	for range 2000 {
		burst = frame.AppendWake(burst, "a", []byte("x"), true)
	}
	go fc.send(burst)
	testutil.WaitFor(t, waitLong, "wakes flowing", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return calls > 0
	})
	c.Close()
	mu.Lock()
	closed = true
	mu.Unlock()
	c.wait()
	mu.Lock()
	defer mu.Unlock()
	if late > 1 {
		t.Fatalf("%d handler calls ran after Close returned, want at most the 1 already begun", late)
	}
}

func TestDialMissingSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "absent.sock")
	_, err := Dial(context.Background(), Options{SocketPath: path}, Handlers{})
	var ce *ConnError
	if !errors.As(err, &ce) || ce.Op != "dial" || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("err = %v, want a dial *ConnError with ENOENT", err)
	}
}

func TestDialStaleSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	_, err = Dial(context.Background(), Options{SocketPath: path}, Handlers{})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("err = %v, want ECONNREFUSED", err)
	}
}

func TestDialContextDone(t *testing.T) {
	h := newFakeHub(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Dial(ctx, Options{SocketPath: h.path}, Handlers{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

func TestClientGoroutinesExit(t *testing.T) {
	testutil.CheckFDs(t, waitLong)
	h := newFakeHub(t, true)
	for range 20 {
		c, err := Dial(context.Background(), Options{SocketPath: h.path}, Handlers{})
		if err != nil {
			t.Fatal(err)
		}
		mustSubscribe(t, c, "a")
		c.Close()
		c.wait()
	}
}

func TestInvalidNameReason(t *testing.T) {
	for reason, want := range map[string]bool{
		"listener: invalid channel: 70 bytes, longer than 63":       true,
		"listener: invalid channel: contains NUL":                   true,
		"invalid channel: empty name":                               true,
		"invalid channel: 70 bytes, Postgres allows at most 63":     true,
		"LISTEN failed: listener: invalid channel: not valid UTF-8": true,
		"LISTEN failed: null value":                                 false,
		"channel name too long":                                     true,
		"LISTEN failed: ERROR: out of shared memory":                false,
		"listener: no connection within the command timeout":        false,
		"": false,
	} {
		if got := invalidNameReason(reason); got != want {
			t.Errorf("invalidNameReason(%q) = %v, want %v", reason, got, want)
		}
	}
}

// rawFrame prefixes body with its length header.
func rawFrame(body string) []byte {
	n := len(body)
	return append([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, body...)
}

// closeBlockedOnDispatch reports whether some goroutine is in Client.Close
// (or, with typ "Local", Local.Close) waiting for the dispatch lock.
func closeBlockedOnDispatch(typ string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("client.(*"+typ+").Close(")) && bytes.Contains(g, []byte("sync.(*Mutex).Lock")) {
			return true
		}
	}
	return false
}

// A Close called while holding a lock that the handler about to start needs
// (Failover.Close from a Failover handler, whose dispatch lock the hub
// client's handler takes) must not wait for that handler: whatever the
// interleaving with the reader entering it, Close returns and the handler
// does not run.
func TestCloseWhileHandlerStartsNeverDeadlocks(t *testing.T) {
	h := newFakeHub(t, true)
	var xmu sync.Mutex // held by Close's caller, needed by the handler
	var ran atomic.Bool
	closed := make(chan struct{})
	var c atomic.Pointer[Conn]
	var once sync.Once
	handlers := Handlers{
		OnWake: func(Wake) {
			xmu.Lock()
			ran.Store(true)
			xmu.Unlock()
		},
	}
	setEnterHook(t, func() {
		once.Do(func() {
			go func() {
				xmu.Lock()
				c.Load().Close()
				xmu.Unlock()
				close(closed)
			}()
			testutil.WaitFor(t, waitLong, "Close to return or to wait for the handler", func() bool {
				return isClosed(closed) || closeBlockedOnDispatch("Client")
			})
		})
	})
	cl, err := Dial(context.Background(), withPath(Options{}, h.path), handlers)
	if err != nil {
		t.Fatal(err)
	}
	c.Store(cl)
	fc := h.accept()
	fc.wake("a", "x")
	testutil.WaitClosed(t, closed, waitLong, "Close deadlocked with the handler it let start")
	cl.wait()
	if ran.Load() {
		t.Fatal("a handler ran after Close returned")
	}
}

// nopPlain is a Postgres connection that accepts everything.
type nopPlain struct{}

func (nopPlain) Listen(context.Context, string) error         { return nil }
func (nopPlain) Unlisten(context.Context, string) error       { return nil }
func (nopPlain) Close() error                                 { return nil }
func (nopPlain) Notify(context.Context, string, string) error { return nil }

// The same race as TestCloseWhileHandlerStartsNeverDeadlocks, for Local.
func TestLocalCloseWhileHandlerStartsNeverDeadlocks(t *testing.T) {
	var xmu sync.Mutex
	var ran atomic.Bool
	closed := make(chan struct{})
	var l *Local
	handlers := Handlers{
		OnWake: func(Wake) {
			xmu.Lock()
			ran.Store(true)
			xmu.Unlock()
		},
	}
	setEnterHook(t, func() {
		go func() {
			xmu.Lock()
			l.Close()
			xmu.Unlock()
			close(closed)
		}()
		testutil.WaitFor(t, waitLong, "Close to return or to wait for the handler", func() bool {
			return isClosed(closed) || closeBlockedOnDispatch("Local")
		})
	})
	l = newLocalWith(LocalOptions{}, handlers)
	l.start(nopPlain{})
	go l.onNotification("a", "x") // as the connection's goroutine does
	testutil.WaitClosed(t, closed, waitLong, "Close deadlocked with the handler it let start")
	if ran.Load() {
		t.Fatal("a handler ran after Close returned")
	}
}

// inAckTimeout reports whether an ack timer's function is still running.
func inAckTimeout() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Contains(buf, []byte("client.(*Conn).ackTimeout("))
}

// An ack that lands as the ack timer fires answers the Subscribe: the
// client must not then die of the timeout that Subscribe was told did not
// happen.
func TestAckAtTimeoutDoesNotKillAnsweredClient(t *testing.T) {
	h := newFakeHub(t, false)
	var fc atomic.Pointer[fakeConn]
	returned := make(chan struct{}) // closed when Subscribe returned, with subErr set
	var subErr error
	opts := Options{AckTimeout: 50 * time.Millisecond}
	setAckTimeoutHook(t, func() {
		fc.Load().ack("a")
		select {
		case <-returned:
		case <-time.After(waitLong):
			t.Error("Subscribe did not return on the ack")
		}
	})
	c := dialFake(t, h, nil, opts)
	fc.Store(h.accept())
	go func() {
		subErr = c.Subscribe(context.Background(), "a")
		close(returned)
	}()
	fc.Load().expect(t, "sub", "a")
	testutil.WaitClosed(t, returned, waitLong, "Subscribe did not return")
	if subErr != nil {
		t.Fatalf("Subscribe = %v, want the ack", subErr)
	}
	testutil.WaitFor(t, waitLong, "the ack timer's function to finish", func() bool { return !inAckTimeout() })
	if err := c.Err(); err != nil {
		t.Fatalf("client dead after Subscribe was acked: %v", err)
	}
}
