package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

// fastFailback makes fail-back attempts frequent, for the scripted tests.
func fastFailback(o *FailoverOptions) {
	o.FailbackDelay = 20 * time.Millisecond
	o.ProbeInterval = 10 * time.Millisecond
	o.ProbeMaxInterval = 40 * time.Millisecond
}

// newFailbackTest is the scripted fail-back tests' Failover on h, with
// frequent attempts (fastFailback) unless opts sets FailbackDelay, counting its
// swaps.
func newFailbackTest(t *testing.T, h *fakeHub, rec *recorder, opts FailoverOptions) (*Failover, *fakeLocals, *swaps) {
	t.Helper()
	if opts.FailbackDelay == 0 {
		fastFailback(&opts)
	}
	fl, sw := &fakeLocals{}, &swaps{}
	setup := foSetup{FailoverOptions: opts}
	sw.options(&setup)
	f, err := newTestFailover(t, h.path, fl, rec, setup.FailoverOptions, setup.FailoverHandlers)
	if err != nil {
		t.Fatal(err)
	}
	return f, fl, sw
}

// failOverFrom has fc report healthy, subscribes f to names through it,
// drops it and waits until f is on its local listener.
func (sw *swaps) failOverFrom(t *testing.T, fc *fakeConn, f *Failover, names ...string) {
	t.Helper()
	fc.status(true)
	for _, q := range names {
		fc.subscribeVia(t, f, q)
	}
	fc.c.Close()
	sw.waitLocal(t)
}

// waitLocal waits for the first failover.
func (sw *swaps) waitLocal(t *testing.T) {
	t.Helper()
	testutil.WaitFor(t, waitLong, "local mode", func() bool { return sw.failovers.Load() == 1 })
}

// subscribeVia subscribes f to q through fc, a connection of a hub that
// does not ack by itself: the sub must arrive, and fc acks it.
func (fc *fakeConn) subscribeVia(t testing.TB, f interface {
	Subscribe(context.Context, string) error
}, q string) {
	t.Helper()
	done := result(func() error { return f.Subscribe(context.Background(), q) })
	fc.expect(t, "sub", q)
	fc.ack(q)
	if err := await(t, done); err != nil {
		t.Fatal(err)
	}
}

// swaps counts a Failover's OnFailover and OnFailback calls.
type swaps struct{ failovers, failbacks atomic.Int32 }

func (s *swaps) options(o *foSetup) {
	o.OnFailover = func(error) { s.failovers.Add(1) }
	o.OnFailback = func() { s.failbacks.Add(1) }
}

// expectSubs reads n frames from the client, which must all be subs, and
// returns their names sorted.
func (fc *fakeConn) expectSubs(t testing.TB, n int) []string {
	t.Helper()
	var names []string
	for range n {
		m := fc.next(t)
		if m.Type != frame.TypeSub {
			t.Fatalf("fake hub: got %s %q from the client, want a sub", m.Type, m.Name)
		}
		names = append(names, m.Name)
	}
	sort.Strings(names)
	return names
}

// nextOrEOF returns the next frame the client sent, or false if the client
// closed its side without sending one.
func (fc *fakeConn) nextOrEOF(t testing.TB) (frame.Message, bool) {
	t.Helper()
	select {
	case m := <-fc.msgs:
		return m, true
	case <-fc.eof:
		select { // sent just before the close
		case m := <-fc.msgs:
			return m, true
		default:
			return frame.Message{}, false
		}
	case <-time.After(waitLong):
		t.Fatal("fake hub: no frame from the client, and no EOF")
		return frame.Message{}, false
	}
}

// quiet fails if the client sent a frame (one already read by the hub).
func (fc *fakeConn) quiet(t testing.TB) {
	t.Helper()
	select {
	case m := <-fc.msgs:
		t.Fatalf("fake hub: unexpected %s %q from the client", m.Type, m.Name)
	default:
	}
}

func (r *recorder) count(ev string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e == ev {
			n++
		}
	}
	return n
}

// After a failover the Failover returns to a hub that accepts and is
// healthy: the whole set is subscribed there, the local listener is closed
// once the hub has acked it, OnFailback fires, a durable wake per name
// follows, and the statuses say hub, local, hub.
func TestFailbackToHub(t *testing.T) {
	h := newFakeHub(t, true)
	rec := &recorder{}
	f, fl, sw := newFailbackTest(t, h, rec, FailoverOptions{})
	fc := h.accept()
	for _, q := range []string{"a", "b"} {
		mustSubscribe(t, f, q)
	}
	fc.expectSubs(t, 2)
	fc.c.Close()
	sw.waitLocal(t)
	local := fl.get(t)

	back := h.accept() // the fail-back's connection
	if got := back.expectSubs(t, 2); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("fail-back subscribed %v, want [a b]", got)
	}
	testutil.WaitFor(t, waitLong, "back on the hub", func() bool { return sw.failbacks.Load() == 1 })
	if f.Mode() != ModeHub || f.Reason() != nil || !f.Healthy() {
		t.Fatalf("Mode %v Reason %v Healthy %v", f.Mode(), f.Reason(), f.Healthy())
	}
	if !isClosed(local.Done()) {
		t.Fatal("local listener still open after the fail-back")
	}
	testutil.WaitFor(t, waitLong, "the durable wakes of the fail-back", func() bool {
		return rec.count("durable a") == 2 && rec.count("durable b") == 2
	})
	var statuses []string
	for _, ev := range rec.snapshot() {
		if strings.HasPrefix(ev, "status") {
			statuses = append(statuses, ev)
		}
	}
	if !slices.Equal(statuses, []string{"status true", "status false", "status true", "status true"}) {
		t.Fatalf("statuses %v, want hub true, false, local true, hub true", statuses)
	}

	// The new hub client is the one in use now.
	back.wake("a", "via the new hub")
	testutil.WaitFor(t, waitLong, "a wake from the new hub", func() bool { return rec.has("wake a via the new hub") })
	mustSubscribe(t, f, "c")
	back.expect(t, "sub", "c")
	f.Unsubscribe("a")
	back.expect(t, "unsub", "a")
	if fl.count() != 1 || sw.failovers.Load() != 1 {
		t.Fatalf("%d local listeners, %d failovers", fl.count(), sw.failovers.Load())
	}
}

// Hub → local → hub, three times over: the hub client after a fail-back
// fails over like the first one.
func TestFailbackCycles(t *testing.T) {
	h := newFakeHub(t, true)
	rec := &recorder{}
	f, fl, sw := newFailbackTest(t, h, rec, FailoverOptions{})
	fc := h.accept()
	mustSubscribe(t, f, "a")
	fc.expect(t, "sub", "a")
	for i := 1; i <= 3; i++ {
		fc.c.Close()
		testutil.WaitFor(t, waitLong, "local mode", func() bool { return sw.failovers.Load() == int32(i) })
		fc = h.accept()
		fc.expect(t, "sub", "a")
		testutil.WaitFor(t, waitLong, "back on the hub", func() bool { return sw.failbacks.Load() == int32(i) })
		if f.Mode() != ModeHub {
			t.Fatalf("cycle %d: Mode %v after the fail-back", i, f.Mode())
		}
		fc.wake("a", "cycle")
		testutil.WaitFor(t, waitLong, "a wake from the hub", func() bool { return rec.count("wake a cycle") == i })
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if len(fl.built) != 3 {
		t.Fatalf("%d local listeners built, want 3", len(fl.built))
	}
	for i, l := range fl.built {
		if !isClosed(l.Done()) {
			t.Fatalf("local listener %d still open", i)
		}
	}
}

// DisableFailback keeps pgbus's rule: a hub that is back is never dialed again.
func TestFailbackOneWay(t *testing.T) {
	h := newFakeHub(t, true)
	f, fl, sw := newFailbackTest(t, h, nil, FailoverOptions{DisableFailback: true, FailbackDelay: time.Millisecond, ProbeInterval: time.Millisecond, ProbeMaxInterval: time.Millisecond})
	fc := h.accept()
	mustSubscribe(t, f, "a")
	fc.c.Close()
	sw.waitLocal(t)
	// The hub accepts all along; without DisableFailback these timings fail back
	// within milliseconds (TestFailbackToHub).
	select {
	case <-h.conns:
		t.Fatal("a DisableFailback Failover dialed the hub again")
	case <-time.After(500 * time.Millisecond):
	}
	if f.Mode() != ModeLocal || sw.failbacks.Load() != 0 || isClosed(fl.get(t).Done()) {
		t.Fatalf("Mode %v, %d fail-backs", f.Mode(), sw.failbacks.Load())
	}
}

// No fail-back attempt before FailbackDelay has passed in local mode, however
// short the probe interval.
func TestFailbackMinLocal(t *testing.T) {
	const minLocal = 400 * time.Millisecond
	h := newFakeHub(t, true)
	f, _, sw := newFailbackTest(t, h, nil, FailoverOptions{FailbackDelay: minLocal, ProbeInterval: time.Millisecond, ProbeMaxInterval: time.Millisecond})
	fc := h.accept()
	mustSubscribe(t, f, "a")
	lost := time.Now() // before the swap to local mode, so a lower bound
	fc.c.Close()
	h.accept()
	dialed := time.Since(lost)
	testutil.WaitFor(t, waitLong, "back on the hub", func() bool { return sw.failbacks.Load() == 1 })
	if dialed < minLocal {
		t.Fatalf("the hub was dialed %v after the failure, before FailbackDelay (%v)", dialed, minLocal)
	}
	if f.Mode() != ModeHub {
		t.Fatal(f.Mode())
	}
	t.Logf("dialed again %v after the hub failure (FailbackDelay %v)", dialed, minLocal)
}

// A hub that accepts but reports healthy:false is not returned to: the
// attempt subscribes nothing there and closes the connection. A hub that
// turns healthy within the wait is.
func TestFailbackWaitsForHealthy(t *testing.T) {
	h := newFakeHub(t, false)
	f, fl, sw := newFailbackTest(t, h, nil, FailoverOptions{Hub: Options{AckTimeout: 300 * time.Millisecond}})
	fc := h.accept()
	sw.failOverFrom(t, fc, f, "a")

	for range 2 {
		sick := h.accept()
		sick.status(false)
		sick.waitEOF(t) // given up after the wait for a healthy status
		sick.quiet(t)
		if f.Mode() != ModeLocal || isClosed(fl.get(t).Done()) {
			t.Fatalf("Mode %v with an unhealthy hub", f.Mode())
		}
	}

	// Healthy within the wait: good enough. On a loaded machine this test
	// may answer after the 300 ms wait; that attempt is given up like a
	// sick one (EOF, no sub) and the next one gets the same answers.
	deadline := time.Now().Add(waitLong)
	for {
		late := h.accept()
		late.status(false)
		late.status(true)
		m, ok := late.nextOrEOF(t)
		if ok {
			if m.Type != frame.TypeSub || m.Name != "a" {
				t.Fatalf("fake hub: got %s %q from the client, want sub \"a\"", m.Type, m.Name)
			}
			late.ack("a")
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a hub healthy within the wait was never subscribed")
		}
	}
	testutil.WaitFor(t, waitLong, "back on the hub", func() bool { return sw.failbacks.Load() == 1 })
	if f.Mode() != ModeHub || !f.Healthy() {
		t.Fatal(f.Mode(), f.Healthy())
	}
}

// A hub that fails during the fail-back attempt (EOF before the ack, or a
// nack) leaves the Failover local, its local listener untouched, and it
// tries again; what the abandoned hub sent is not delivered (the local
// listener, still current, delivers the same notifications).
func TestFailbackHubFailsDuringAttempt(t *testing.T) {
	h := newFakeHub(t, false)
	rec := &recorder{}
	f, fl, sw := newFailbackTest(t, h, rec, FailoverOptions{})
	fc := h.accept()
	sw.failOverFrom(t, fc, f, "a")
	local := fl.get(t)

	dies := h.accept()
	dies.status(true)
	dies.expect(t, "sub", "a")
	dies.wake("a", "overlap") // not delivered: the local listener delivers what a candidate hears
	dies.c.Close()
	refuses := h.accept()
	refuses.status(true)
	refuses.expect(t, "sub", "a")
	refuses.nack("a", "LISTEN failed: listener: no connection within the command timeout")
	refuses.waitEOF(t)
	if f.Mode() != ModeLocal || isClosed(local.Done()) || sw.failovers.Load() != 1 {
		t.Fatalf("Mode %v after failed attempts", f.Mode())
	}
	local.notify("a", "still local")
	if !rec.has("wake a still local") {
		t.Fatal("local listener no longer delivers")
	}

	ok := h.accept()
	ok.status(true)
	ok.expect(t, "sub", "a")
	ok.ack("a")
	testutil.WaitFor(t, waitLong, "back on the hub", func() bool { return sw.failbacks.Load() == 1 })
	if !isClosed(local.Done()) || fl.count() != 1 || f.Err() != nil {
		t.Fatalf("local closed %v, %d built, Err %v", isClosed(local.Done()), fl.count(), f.Err())
	}
	if rec.has("wake a overlap") {
		t.Fatal("a wake from an abandoned attempt's hub was delivered (the local listener had it: a duplicate)")
	}
}

// Subscribe and Unsubscribe racing a fail-back: a name subscribed while the
// hub's acks are pending goes to the local listener at once and is acked by
// the hub before the local listener closes; a name dropped meanwhile is
// dropped by the local listener and unsubscribed from the hub as it swaps.
func TestFailbackSubscribeDuring(t *testing.T) {
	h := newFakeHub(t, false)
	rec := &recorder{}
	f, fl, sw := newFailbackTest(t, h, rec, FailoverOptions{})
	fc := h.accept()
	sw.failOverFrom(t, fc, f, "a", "c")
	local := fl.get(t)

	back := h.accept()
	back.status(true)
	if got := back.expectSubs(t, 2); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("fail-back subscribed %v", got)
	}
	// Acks held back: the fail-back waits, the Failover is local.
	if err := f.Subscribe(context.Background(), "b"); err != nil {
		t.Fatalf("Subscribe during the fail-back: %v", err)
	}
	f.Unsubscribe("c")
	local.mu.Lock()
	lsubs, lunsubs := slices.Clone(local.subs), slices.Clone(local.unsubs)
	local.mu.Unlock()
	if !slices.Contains(lsubs, "b") || !slices.Equal(lunsubs, []string{"c"}) {
		t.Fatalf("local subs %v unsubs %v: the local listener must serve the set until the swap", lsubs, lunsubs)
	}
	back.ack("a")
	back.ack("c")
	back.expect(t, "sub", "b") // recorded meanwhile: subscribed before the swap
	if f.Mode() != ModeLocal || isClosed(local.Done()) {
		t.Fatal("swapped before every recorded name was acked by the hub")
	}
	back.ack("b")
	back.expect(t, "unsub", "c") // dropped meanwhile: not lost
	testutil.WaitFor(t, waitLong, "back on the hub", func() bool { return sw.failbacks.Load() == 1 })
	if !isClosed(local.Done()) || f.Mode() != ModeHub {
		t.Fatal("not swapped")
	}
	testutil.WaitFor(t, waitLong, "durable wakes", func() bool {
		return rec.count("durable a") == 2 && rec.count("durable b") == 1
	})
	if rec.count("durable c") != 1 { // the failover's only
		t.Fatalf("%d durable wakes for the dropped name", rec.count("durable c"))
	}
	// The set is consistent on the hub: b is acked there (no round trip),
	// c is not subscribed.
	mustSubscribe(t, f, "b")
	back.quiet(t)
}

// Many Subscribes racing the swap itself all end up on the hub.
func TestFailbackConcurrentSubscribes(t *testing.T) {
	h := newFakeHub(t, true)
	f, _, sw := newFailbackTest(t, h, nil, FailoverOptions{})
	fc := h.accept()
	mustSubscribe(t, f, "x")
	fc.c.Close()
	sw.waitLocal(t)
	var names []string
	var calls []<-chan error
	for i := range 40 {
		q := string(rune('a'+i%26)) + strings.Repeat("z", i/26)
		names = append(names, q)
		calls = append(calls, result(func() error { return f.Subscribe(context.Background(), q) }))
	}
	for _, ch := range calls {
		if err := await(t, ch); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, waitLong, "back on the hub", func() bool { return sw.failbacks.Load() == 1 })
	// Every name is acked on the hub client now: Subscribe returns
	// without a frame.
	f.mu.Lock()
	c := f.hub.c
	f.mu.Unlock()
	c.mu.Lock()
	for _, q := range append(names, "x") {
		if s := c.subs[q]; s == nil || !s.active {
			t.Errorf("%q not acked on the hub client after the fail-back", q)
		}
	}
	c.mu.Unlock()
}

// Close during a fail-back closes the attempt's hub connection and the
// local listener.
func TestFailbackClose(t *testing.T) {
	h := newFakeHub(t, false)
	f, fl, sw := newFailbackTest(t, h, nil, FailoverOptions{Hub: Options{AckTimeout: time.Minute}})
	fc := h.accept()
	sw.failOverFrom(t, fc, f, "a")
	back := h.accept()
	back.status(true)
	back.expect(t, "sub", "a")
	f.Close()
	back.waitEOF(t)
	if !isClosed(fl.get(t).Done()) || !errors.Is(f.Err(), ErrClosed) || sw.failbacks.Load() != 0 {
		t.Fatalf("Err %v, %d fail-backs", f.Err(), sw.failbacks.Load())
	}
}

// A Failover that started local (no hub) goes to the hub once one is
// listening on the socket.
func TestFailbackHubStartedLater(t *testing.T) {
	h := newFakeHub(t, true)
	h.stop()
	f, fl, sw := newFailbackTest(t, h, nil, FailoverOptions{})
	if f.Mode() != ModeLocal {
		t.Fatal(f.Mode())
	}
	mustSubscribe(t, f, "a")
	h.restart()
	fc := h.accept()
	fc.expect(t, "sub", "a")
	testutil.WaitFor(t, waitLong, "on the hub", func() bool { return sw.failbacks.Load() == 1 })
	if f.Mode() != ModeHub || !isClosed(fl.get(t).Done()) || sw.failovers.Load() != 0 {
		t.Fatal(f.Mode())
	}
}

// jitter stays within ±20% of the nominal wait and spreads over that range
// (the growth of the waits: TestFailbackBackoffGrows).
func TestFailbackJitter(t *testing.T) {
	const d = time.Second
	var lo, hi bool
	for range 1000 {
		j := jitter(d)
		if j < 800*time.Millisecond || j > 1200*time.Millisecond {
			t.Fatalf("jitter(%v) = %v", d, j)
		}
		lo = lo || j < 900*time.Millisecond
		hi = hi || j > 1100*time.Millisecond
	}
	if !lo || !hi {
		t.Fatal("jitter does not spread")
	}
}

// attemptTimes is a slog.Handler that keeps when each failed fail-back
// attempt was logged.
type attemptTimes struct {
	mu sync.Mutex
	at []time.Time
}

func (a *attemptTimes) Enabled(context.Context, slog.Level) bool { return true }
func (a *attemptTimes) WithAttrs([]slog.Attr) slog.Handler       { return a }
func (a *attemptTimes) WithGroup(string) slog.Handler            { return a }
func (a *attemptTimes) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "fail-back attempt failed") {
		a.mu.Lock()
		a.at = append(a.at, r.Time)
		a.mu.Unlock()
	}
	return nil
}

func (a *attemptTimes) get() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.at)
}

// The waits between failed attempts double from ProbeInterval up to
// ProbeMaxInterval, none shorter than 80% of its nominal (jitter). Lower
// bounds only: a loaded machine makes the waits longer, never shorter
// (TestFailbackJitter checks the upper bound of the jitter).
func TestFailbackBackoffGrows(t *testing.T) {
	h := newFakeHub(t, true)
	at := &attemptTimes{}
	f, _, sw := newFailbackTest(t, h, nil, FailoverOptions{FailbackDelay: 20 * time.Millisecond,
		ProbeInterval: 50 * time.Millisecond, ProbeMaxInterval: 200 * time.Millisecond, Logger: slog.New(at)})
	fc := h.accept()
	mustSubscribe(t, f, "a")
	h.stop() // every attempt fails at connect, at once
	fc.c.Close()
	sw.waitLocal(t)
	const ms = time.Millisecond
	nominal := []time.Duration{50 * ms, 100 * ms, 200 * ms, 200 * ms, 200 * ms}
	testutil.WaitFor(t, waitLong, "six failed attempts", func() bool { return len(at.get()) > len(nominal) })
	times := at.get()
	var gaps []time.Duration
	for i, d := range nominal {
		gap := times[i+1].Sub(times[i])
		gaps = append(gaps, gap.Round(time.Millisecond))
		if least := d * 8 / 10; gap < least {
			t.Fatalf("wait %d: %v, want at least %v (nominal %v)", i+1, gap, least, d)
		}
	}
	t.Logf("waits between attempts: %v (nominal %v, ±20%%)", gaps, nominal)
}

// A hub that stays away: attempts fail at connect (the socket is gone) and
// go on, with backoff, until a hub listens on the same path again.
func TestFailbackAfterHubAbsence(t *testing.T) {
	h := newFakeHub(t, true)
	logs := &logBuf{}
	f, _, sw := newFailbackTest(t, h, nil, FailoverOptions{Logger: logs.logger()})
	fc := h.accept()
	mustSubscribe(t, f, "a")
	h.stop()
	fc.c.Close()
	sw.waitLocal(t)
	testutil.WaitFor(t, waitLong, "three failed attempts", func() bool {
		return strings.Count(logs.String(), "fail-back attempt failed") >= 3
	})
	if f.Mode() != ModeLocal || !strings.Contains(logs.String(), "why=connect") {
		t.Fatalf("Mode %v; logs:\n%s", f.Mode(), logs.String())
	}
	h.restart()
	h.accept().expect(t, "sub", "a")
	testutil.WaitFor(t, waitLong, "back on the hub", func() bool { return sw.failbacks.Load() == 1 })
}

// recPlain records the LISTENs it is asked for and, like the connection,
// dispatches the notifications that arrive before a command's answer
// (queued by the test) before returning it.
type recPlain struct {
	l       *Local
	mu      sync.Mutex
	listens []string
	inbound []string // payloads on channel "a", delivered at the next command
}

func (p *recPlain) Listen(_ context.Context, ch string) error {
	p.mu.Lock()
	p.listens = append(p.listens, ch)
	in := p.inbound
	p.inbound = nil
	p.mu.Unlock()
	for _, payload := range in {
		p.l.onNotification("a", payload)
	}
	return nil
}
func (p *recPlain) Unlisten(context.Context, string) error       { return nil }
func (p *recPlain) Close() error                                 { return nil }
func (p *recPlain) Notify(context.Context, string, string) error { return nil }

// Local.sync is a round trip on the connection (a LISTEN of a channel
// already listened to) and returns only after what arrived before its
// answer was handed to OnWake: what a fail-back waits for before closing
// the local listener.
func TestLocalSync(t *testing.T) {
	rec := &recorder{}
	l := newLocalWith(LocalOptions{}, Handlers{OnWake: rec.onWake})
	p := &recPlain{l: l}
	l.start(p)
	defer l.Close()
	ctx := context.Background()
	if err := l.sync(ctx); err != nil { // nothing listened: nothing to wait for
		t.Fatal(err)
	}
	if len(p.listens) != 0 {
		t.Fatalf("sync with nothing listened sent %v", p.listens)
	}
	if err := l.Subscribe(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.inbound = []string{"in flight"}
	p.mu.Unlock()
	if err := l.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if !rec.has("wake a in flight") {
		t.Fatal("sync returned before the notification that preceded its answer was delivered")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.Equal(p.listens, []string{"a", "a"}) {
		t.Fatalf("LISTENs %v, want the subscribe's and the sync's", p.listens)
	}
}

// seqHandlers records every handler call of a Failover in one sequence,
// and whether two ever ran at once.
type seqHandlers struct {
	mu       sync.Mutex
	seq      []string
	inFlight atomic.Int32
	overlap  atomic.Bool
}

func (s *seqHandlers) add(ev string) {
	if s.inFlight.Add(1) > 1 {
		s.overlap.Store(true)
	}
	s.mu.Lock()
	s.seq = append(s.seq, ev)
	s.mu.Unlock()
	time.Sleep(time.Millisecond) // widen the window a second call would overlap in
	s.inFlight.Add(-1)
}

func (s *seqHandlers) handlers() FailoverHandlers {
	return FailoverHandlers{
		OnWake: func(w Wake) {
			if w.Durable {
				s.add("durable " + w.Name)
			} else {
				s.add("wake " + w.Name + " " + w.Payload)
			}
		},
		OnStatus:   func(ok bool) { s.add(fmt.Sprint("status ", ok)) },
		OnFailover: func(error) { s.add("failover") },
		OnFailback: func() { s.add("failback") },
	}
}

func (s *seqHandlers) snapshot() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seq)
}

// The order FailoverHandlers promises, through a failover and a fail-back:
// never two calls at once; the hub's wakes, then OnFailover, the local
// listener's health and a durable wake per name; then OnFailback, the hub's
// health and a durable wake per name, with no local wake after OnFailback.
func TestFailoverHandlerOrder(t *testing.T) {
	h := newFakeHub(t, true)
	fl := &fakeLocals{}
	s := &seqHandlers{}
	var opts FailoverOptions
	fastFailback(&opts)
	f, err := newTestFailover(t, h.path, fl, nil, opts, s.handlers())
	if err != nil {
		t.Fatal(err)
	}
	fc := h.accept()
	fc.status(true)
	for _, q := range []string{"a", "b"} {
		mustSubscribe(t, f, q)
	}
	fc.expectSubs(t, 2)
	fc.wake("a", "from the hub")
	testutil.WaitFor(t, waitLong, "the hub's wake", func() bool { return slices.Contains(s.snapshot(), "wake a from the hub") })
	fc.c.Close()
	testutil.WaitFor(t, waitLong, "local mode", func() bool { return slices.Contains(s.snapshot(), "failover") })
	fl.get(t).notify("a", "from the local listener")
	back := h.accept()
	back.expectSubs(t, 2)
	testutil.WaitFor(t, waitLong, "back on the hub", func() bool { return slices.Contains(s.snapshot(), "failback") })
	back.wake("a", "from the hub again")
	testutil.WaitFor(t, waitLong, "the new hub's wake and the fail-back's durable wakes", func() bool {
		seq := s.snapshot()
		count := func(ev string) (n int) {
			for _, e := range seq {
				if e == ev {
					n++
				}
			}
			return n
		}
		return slices.Contains(seq, "wake a from the hub again") && count("durable a") == 2 && count("durable b") == 2
	})

	seq := s.snapshot()
	at := func(ev string, from int) int {
		i := slices.Index(seq[from:], ev)
		if i < 0 {
			t.Fatalf("no %q after position %d in %v", ev, from, seq)
		}
		return from + i
	}
	hubWake := at("wake a from the hub", 0)
	failover := at("failover", hubWake)
	localStatus := at("status true", failover)
	at("durable a", localStatus)
	at("durable b", localStatus)
	failback := at("failback", at("wake a from the local listener", 0))
	hubStatus := at("status true", failback)
	at("durable a", hubStatus)
	at("durable b", hubStatus)
	at("wake a from the hub again", hubStatus)
	if i := slices.Index(seq, "failover"); i != failover {
		t.Fatalf("OnFailover twice: %v", seq)
	}
	for _, ev := range seq[failback:] {
		if ev == "wake a from the local listener" {
			t.Fatalf("a local wake after OnFailback: %v", seq)
		}
	}
	if s.overlap.Load() {
		t.Fatalf("two handler calls ran at once: %v", seq)
	}
}

// A wake the local listener hands over as the fail-back closes it (a
// notification already read when Close was called) is not delivered: the
// hub delivers from the swap on, so it would arrive twice.
func TestFailbackDropsTheClosedLocalsStraggler(t *testing.T) {
	h := newFakeHub(t, true)
	rec := &recorder{}
	f, fl, sw := newFailbackTest(t, h, rec, FailoverOptions{})
	fc := h.accept()
	mustSubscribe(t, f, "a")
	fc.expectSubs(t, 1)
	fc.c.Close()
	sw.waitLocal(t)
	local := fl.get(t)
	local.notify("a", "while local")
	back := h.accept()
	back.expectSubs(t, 1)
	testutil.WaitFor(t, waitLong, "back on the hub", func() bool { return sw.failbacks.Load() == 1 })
	local.notify("a", "straggler") // what a closing listener may still hand over
	back.wake("a", "from the hub")
	testutil.WaitFor(t, waitLong, "the hub's wake", func() bool { return rec.has("wake a from the hub") })
	if rec.has("wake a straggler") {
		t.Fatalf("the closed local listener's wake was delivered: %v", rec.snapshot())
	}
	if !rec.has("wake a while local") {
		t.Fatalf("the local listener's wake before the fail-back is missing: %v", rec.snapshot())
	}
}
