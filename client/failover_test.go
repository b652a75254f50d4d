package client

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// fakeLocal stands in for the Postgres listener in failover tests.
type fakeLocal struct {
	opts LocalOptions
	h    Handlers

	mu      sync.Mutex
	subs    []string // Subscribe calls, in order
	unsubs  []string
	failSub error // returned by Subscribe when set
	err     error
	done    chan struct{}
}

// fakeLocals builds fakeLocals for a Failover and remembers them.
type fakeLocals struct {
	mu      sync.Mutex
	built   []*fakeLocal
	failNew error // NewLocal fails with it when set
	failSub error // the built fakeLocal's Subscribe fails with it
}

func (fl *fakeLocals) newLocal(ctx context.Context, opts LocalOptions, h Handlers) (Listener, error) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.failNew != nil {
		return nil, fl.failNew
	}
	l := &fakeLocal{opts: opts, h: h, done: make(chan struct{}), failSub: fl.failSub}
	fl.built = append(fl.built, l)
	return l, nil
}

func (fl *fakeLocals) count() int {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return len(fl.built)
}

func (fl *fakeLocals) get(t testing.TB) *fakeLocal {
	t.Helper()
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if len(fl.built) != 1 {
		t.Fatalf("%d local listeners built, want 1", len(fl.built))
	}
	return fl.built[0]
}

func (l *fakeLocal) Subscribe(ctx context.Context, q string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if l.failSub != nil {
		return l.failSub
	}
	l.subs = append(l.subs, q)
	return nil
}

func (l *fakeLocal) Unsubscribe(q string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unsubs = append(l.unsubs, q)
}

func (l *fakeLocal) Healthy() bool { return l.Err() == nil }

func (l *fakeLocal) Close() error {
	l.die(ErrClosed)
	return nil
}

func (l *fakeLocal) die(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
		close(l.done)
	}
}

func (l *fakeLocal) Done() <-chan struct{} { return l.done }

func (l *fakeLocal) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *fakeLocal) subscribed() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := slices.Clone(l.subs)
	sort.Strings(s)
	return s
}

// notify delivers a NOTIFY as the local listener would.
func (l *fakeLocal) notify(q, payload string) {
	l.h.OnWake(Wake{Name: q, Payload: payload, Durable: payload == ""})
}

// foSetup is what a test sets up a Failover with: its options and its
// handlers.
type foSetup struct {
	FailoverOptions
	FailoverHandlers
}

func newTestFailover(t *testing.T, path string, fl *fakeLocals, rec *recorder, o FailoverOptions, hs ...FailoverHandlers) (*Failover, error) {
	t.Helper()
	opts := foSetup{FailoverOptions: o}
	if len(hs) > 0 {
		opts.FailoverHandlers = hs[0]
	}
	opts.Hub.SocketPath = path
	setNewLocal(t, fl.newLocal)
	if rec != nil {
		opts.OnWake = rec.onWake
		opts.OnStatus = rec.onStatus
	}
	f, err := NewFailover(context.Background(), opts.FailoverOptions, opts.FailoverHandlers)
	if err == nil {
		t.Cleanup(func() { f.Close() })
	}
	return f, err
}

// failoverOn starts a Failover on h with fl's local listeners and no
// callbacks, and returns it with its connection to h.
func failoverOn(t *testing.T, h *fakeHub, fl *fakeLocals) (*Failover, *fakeConn) {
	t.Helper()
	f, err := newTestFailover(t, h.path, fl, nil, FailoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return f, h.accept()
}

func TestFailoverHubAbsentAtStart(t *testing.T) {
	fl := &fakeLocals{}
	f, err := newTestFailover(t, filepath.Join(shortDir(t), "absent.sock"), fl, nil, FailoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if f.Mode() != ModeLocal || !errors.Is(f.Reason(), syscall.ENOENT) {
		t.Fatalf("Mode %v, Reason %v", f.Mode(), f.Reason())
	}
	mustSubscribe(t, f, "a")
	if got := fl.get(t).subscribed(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("local subs %v", got)
	}
	if !f.Healthy() {
		t.Fatal("not healthy in local mode")
	}
}

func TestFailoverNeitherReachableAtStart(t *testing.T) {
	fl := &fakeLocals{failNew: errTest}
	_, err := newTestFailover(t, filepath.Join(shortDir(t), "absent.sock"), fl, nil, FailoverOptions{})
	var fe *FailoverError
	if !errors.As(err, &fe) || !errors.Is(err, errTest) || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("err = %v, want a *FailoverError with both causes", err)
	}
}

func TestFailoverOnEOF(t *testing.T) {
	h := newFakeHub(t, true)
	fl := &fakeLocals{}
	rec := &recorder{}
	var reasons []error
	var mu sync.Mutex
	f, err := newTestFailover(t, h.path, fl, rec, FailoverOptions{}, FailoverHandlers{OnFailover: func(err error) {
		mu.Lock()
		reasons = append(reasons, err)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	fc := h.accept()
	for _, q := range []string{"a", "b", "c"} {
		mustSubscribe(t, f, q)
	}
	f.Unsubscribe("c")
	if f.Mode() != ModeHub || f.Reason() != nil {
		t.Fatalf("Mode %v Reason %v", f.Mode(), f.Reason())
	}
	fc.wake("a", "via hub")
	testutil.WaitFor(t, waitLong, "hub wake", func() bool { return rec.has("wake a via hub") })

	fc.c.Close() // the hub is gone (or evicted us: the same EOF)
	testutil.WaitFor(t, waitLong, "local mode", func() bool { return f.Mode() == ModeLocal })
	if !errors.Is(f.Reason(), io.EOF) {
		t.Fatalf("Reason %v", f.Reason())
	}
	local := fl.get(t)
	if got := local.subscribed(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("local subs %v, want the recorded set [a b]", got)
	}
	testutil.WaitFor(t, waitLong, "durable wakes after the swap", func() bool {
		return rec.has("durable a") && rec.has("durable b")
	})
	if rec.has("durable c") {
		t.Fatal("durable wake for an unsubscribed name")
	}
	// Status: the hub's true, false at its failure, true once local.
	var statuses []string
	for _, ev := range rec.snapshot() {
		if strings.HasPrefix(ev, "status") {
			statuses = append(statuses, ev)
		}
	}
	if !slices.Equal(statuses, []string{"status true", "status false", "status true"}) {
		t.Fatalf("statuses %v", statuses)
	}
	local.notify("a", "via local")
	if !rec.has("wake a via local") {
		t.Fatal("local wake not delivered")
	}
	// Subscribe and Unsubscribe go to the local listener now.
	mustSubscribe(t, f, "d")
	f.Unsubscribe("a")
	if got := local.subscribed(); !slices.Equal(got, []string{"a", "b", "d"}) {
		t.Fatalf("local subs %v", got)
	}
	if !slices.Equal(local.unsubs, []string{"a"}) {
		t.Fatalf("local unsubs %v", local.unsubs)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reasons) != 1 || !errors.Is(reasons[0], io.EOF) {
		t.Fatalf("OnFailover calls %v", reasons)
	}
	if fl.count() != 1 {
		t.Fatal("more than one local listener")
	}
}

func TestFailoverOnAckTimeout(t *testing.T) {
	h := newFakeHub(t, false)
	fl := &fakeLocals{}
	rec := &recorder{}
	f, err := newTestFailover(t, h.path, fl, rec, FailoverOptions{Hub: Options{AckTimeout: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	fc := h.accept()
	fc.subscribeVia(t, f, "a")
	// A hub that stops answering: Subscribe still succeeds, locally.
	if err := await(t, result(func() error { return f.Subscribe(context.Background(), "b") })); err != nil {
		t.Fatalf("Subscribe across the failover: %v", err)
	}
	if f.Mode() != ModeLocal || !errors.Is(f.Reason(), ErrAckTimeout) {
		t.Fatalf("Mode %v Reason %v", f.Mode(), f.Reason())
	}
	if got := fl.get(t).subscribed(); !slices.Contains(got, "a") || !slices.Contains(got, "b") {
		t.Fatalf("local subs %v", got)
	}
	testutil.WaitFor(t, waitLong, "durable wakes", func() bool { return rec.has("durable a") && rec.has("durable b") })
}

func TestFailoverOnNack(t *testing.T) {
	h := newFakeHub(t, false)
	fl := &fakeLocals{}
	f, fc := failoverOn(t, h, fl)

	// An invalid name: refused, no failover.
	done := result(func() error { return f.Subscribe(context.Background(), "bad") })
	fc.expect(t, "sub", "bad")
	fc.nack("bad", "invalid channel: 70 bytes, Postgres allows at most 63")
	if err := await(t, done); !errors.Is(err, ErrInvalidName) {
		t.Fatal(err)
	}
	if f.Mode() != ModeHub || fl.count() != 0 {
		t.Fatal("failed over on an invalid-name nack")
	}

	// A cap of the hub: refused, no failover either.
	for _, reason := range []string{"too many subscriptions", "too many channels"} {
		done = result(func() error { return f.Subscribe(context.Background(), "capped") })
		fc.expect(t, "sub", "capped")
		fc.nack("capped", reason)
		if err := await(t, done); !errors.Is(err, ErrLimit) || errors.Is(err, ErrInvalidName) {
			t.Fatalf("%s: Subscribe = %v, want ErrLimit", reason, err)
		}
		if f.Mode() != ModeHub || fl.count() != 0 {
			t.Fatalf("failed over on a %q nack", reason)
		}
	}

	// LISTEN failed at the hub: fail over, subscribe locally.
	done = result(func() error { return f.Subscribe(context.Background(), "a") })
	fc.expect(t, "sub", "a")
	fc.nack("a", "LISTEN failed: listener: no connection within the command timeout")
	if err := await(t, done); err != nil {
		t.Fatalf("Subscribe = %v, want success on the local listener", err)
	}
	var nack *NackError
	if f.Mode() != ModeLocal || !errors.As(f.Reason(), &nack) {
		t.Fatalf("Mode %v Reason %v", f.Mode(), f.Reason())
	}
	if got := slices.Compact(fl.get(t).subscribed()); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("local subs %v (the refused name must not be recorded)", got)
	}
}

func TestFailoverLocalFailsToo(t *testing.T) {
	h := newFakeHub(t, false)
	fl := &fakeLocals{failNew: errTest}
	f, err := newTestFailover(t, h.path, fl, nil, FailoverOptions{Hub: Options{AckTimeout: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	h.accept()
	err = await(t, result(func() error { return f.Subscribe(context.Background(), "a") }))
	var fe *FailoverError
	if !errors.As(err, &fe) || !errors.Is(err, errTest) || !errors.Is(err, ErrAckTimeout) {
		t.Fatalf("Subscribe = %v, want a *FailoverError (ack timeout, then local failure)", err)
	}
	if !isClosed(f.Done()) || f.Err() != err || f.Healthy() {
		t.Fatalf("Done %v Err %v", isClosed(f.Done()), f.Err())
	}
	if err := f.Subscribe(context.Background(), "b"); err != f.Err() {
		t.Fatalf("Subscribe after death = %v", err)
	}
}

func TestFailoverLocalSubscribeFails(t *testing.T) {
	h := newFakeHub(t, true)
	fl := &fakeLocals{failSub: errTest}
	f, fc := failoverOn(t, h, fl)
	mustSubscribe(t, f, "a")
	fc.c.Close()
	select {
	case <-f.Done():
	case <-time.After(waitLong):
		t.Fatal("Failover alive with a local listener that cannot subscribe")
	}
	if !errors.Is(f.Err(), errTest) || !errors.Is(f.Err(), io.EOF) {
		t.Fatalf("Err = %v", f.Err())
	}
	if !isClosed(fl.get(t).Done()) {
		t.Fatal("the failed local listener was not closed")
	}
}

func TestFailoverLocalDiesLater(t *testing.T) {
	fl := &fakeLocals{}
	f, err := newTestFailover(t, filepath.Join(shortDir(t), "absent.sock"), fl, nil, FailoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fl.get(t).die(errTest)
	select {
	case <-f.Done():
	case <-time.After(waitLong):
		t.Fatal("Failover alive after its local listener died")
	}
	if !errors.Is(f.Err(), errTest) {
		t.Fatal(f.Err())
	}
}

func TestFailoverCloseIsNotAFailure(t *testing.T) {
	h := newFakeHub(t, true)
	fl := &fakeLocals{}
	f, fc := failoverOn(t, h, fl)
	mustSubscribe(t, f, "a")
	f.Close()
	fc.waitEOF(t)
	if fl.count() != 0 {
		t.Fatal("Close built a local listener")
	}
	if !errors.Is(f.Err(), ErrClosed) || !errors.Is(f.Subscribe(context.Background(), "a"), ErrClosed) {
		t.Fatal(f.Err())
	}
	f.Close()
}

func TestFailoverCloseInLocalMode(t *testing.T) {
	fl := &fakeLocals{}
	f, err := newTestFailover(t, filepath.Join(shortDir(t), "absent.sock"), fl, nil, FailoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !isClosed(fl.get(t).Done()) || !errors.Is(f.Err(), ErrClosed) {
		t.Fatal("local listener not closed")
	}
}

// Subscribes racing the failover all end up on the local listener.
func TestFailoverConcurrentSubscribes(t *testing.T) {
	h := newFakeHub(t, false)
	fl := &fakeLocals{}
	f, err := newTestFailover(t, h.path, fl, nil, FailoverOptions{Hub: Options{AckTimeout: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	h.accept()
	names := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	var calls []<-chan error
	for _, q := range names {
		calls = append(calls, result(func() error { return f.Subscribe(context.Background(), q) }))
	}
	for _, ch := range calls {
		if err := await(t, ch); err != nil {
			t.Fatal(err)
		}
	}
	got := slices.Compact(fl.get(t).subscribed())
	if !slices.Equal(got, names) {
		t.Fatalf("local subs %v", got)
	}
}

func TestModeString(t *testing.T) {
	if ModeHub.String() != "hub" || ModeLocal.String() != "local" || Mode(7).String() != "Mode(7)" {
		t.Fatal(ModeHub.String(), ModeLocal.String(), Mode(7).String())
	}
}

func TestFailoverCloseDuringSubscribe(t *testing.T) {
	h := newFakeHub(t, false)
	fl := &fakeLocals{}
	f, err := newTestFailover(t, h.path, fl, nil, FailoverOptions{Hub: Options{AckTimeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	fc := h.accept()
	done := result(func() error { return f.Subscribe(context.Background(), "a") })
	fc.expect(t, "sub", "a")
	f.Close()
	if err := await(t, done); !errors.Is(err, ErrClosed) {
		t.Fatalf("Subscribe = %v, want ErrClosed", err)
	}
	if fl.count() != 0 {
		t.Fatal("Close during Subscribe failed over")
	}
}

// A Subscribe whose ctx ends while the failover is building the local
// listener returns at once; the failover carries on.
func TestFailoverSubscribeContextDuringSwap(t *testing.T) {
	h := newFakeHub(t, true)
	gate := make(chan struct{})
	fl := &fakeLocals{}
	f, err := newTestFailover(t, h.path, fl, nil, FailoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setNewLocal(t, func(ctx context.Context, o LocalOptions, h Handlers) (Listener, error) {
		<-gate
		return fl.newLocal(ctx, o, h)
	})
	fc := h.accept()
	mustSubscribe(t, f, "a")
	fc.c.Close()
	testutil.WaitFor(t, waitLong, "swap in progress", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.swapping
	})
	if f.Healthy() {
		t.Fatal("healthy while swapping")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.Subscribe(ctx, "b"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Subscribe = %v", err)
	}
	f.Unsubscribe("a") // dropped while swapping: unsubscribed after the swap
	close(gate)
	testutil.WaitFor(t, waitLong, "local mode", func() bool { return f.Mode() == ModeLocal })
	l := fl.get(t)
	l.mu.Lock()
	defer l.mu.Unlock()
	// "b" was recorded before its ctx ended (a recorded name is harmless
	// over-subscription); "a" was dropped during the swap.
	if subs := slices.Clone(l.subs); slices.Contains(subs, "a") && !slices.Contains(l.unsubs, "a") {
		t.Fatalf("local subs %v unsubs %v", subs, l.unsubs)
	}
}
