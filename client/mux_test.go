package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

// muxOverFake is a Mux over a real Client over a scripted hub.
func muxOverFake(t *testing.T, auto bool, opts MuxOptions) (*Mux, *Conn, *fakeConn) {
	t.Helper()
	h := newFakeHub(t, auto)
	m, err := NewMux(opts)
	if err != nil {
		t.Fatal(err)
	}
	c := dialFake(t, h, nil, Options{}, Handlers{OnWake: m.OnWake})
	if err := m.Attach(c); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, c, h.accept()
}

func next(t testing.TB, s *Subscription) Wake {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	w, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return w
}

func TestMuxFirstSubscribesLastUnsubscribes(t *testing.T) {
	m, _, fc := muxOverFake(t, true, MuxOptions{})
	ctx := context.Background()
	var subs []*Subscription
	for range 3 {
		s, err := m.Subscribe(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	fc.expect(t, "sub", "a")
	if n := m.Subscribers("a"); n != 3 {
		t.Fatalf("Subscribers = %d", n)
	}
	subs[0].Close()
	subs[1].Close()
	subs[1].Close() // idempotent
	// Still one subscriber: no unsub. A sub of another name is the next
	// frame.
	if _, err := m.Subscribe(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	fc.expect(t, "sub", "b")
	subs[2].Close()
	fc.expect(t, "unsub", "a")
	if n := m.Subscribers("a"); n != 0 {
		t.Fatalf("Subscribers = %d", n)
	}
	// And a new first subscriber subscribes again.
	s, err := m.Subscribe(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	fc.expect(t, "sub", "a")
	fc.wake("a", "hello")
	if w := next(t, s); w.Payload != "hello" || w.Name != "a" || w.Durable {
		t.Fatalf("wake %+v", w)
	}
	if _, err := subs[0].Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next on a closed subscription: %v", err)
	}
}

func TestMuxFanout1000(t *testing.T) {
	m, _, fc := muxOverFake(t, true, MuxOptions{})
	ctx := context.Background()
	const n, wakes = 1000, 20
	subs := make([]*Subscription, n)
	for i := range subs {
		s, err := m.Subscribe(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		subs[i] = s
	}
	fc.expect(t, "sub", "a") // one sub for the thousand
	var burst []byte
	for i := range wakes {
		burst = frame.AppendWake(burst, "a", []byte(fmt.Sprint(i)), true)
	}
	fc.send(burst)
	eachReadsInOrder(t, subs, wakes)
}

func TestMuxDurableCoalescesForSlowSubscriber(t *testing.T) {
	m, _, fc := muxOverFake(t, true, MuxOptions{Buffer: 4})
	slow, fast := subscribeTwo(t, m, "a")
	var burst []byte
	burst = frame.AppendWake(burst, "a", []byte("e1"), true)
	for range 100 {
		burst = frame.AppendWake(burst, "a", nil, false)
	}
	burst = frame.AppendWake(burst, "a", []byte("e2"), true)
	burst = frame.AppendWake(burst, "a", nil, false)
	fc.send(burst)
	fc.wake("a", "end")
	// The fast one reads everything as it comes (its durables may or may
	// not coalesce, depending on timing); the slow one has not read yet.
	for {
		if w := next(t, fast); w.Payload == "end" {
			break
		}
	}
	testutil.WaitFor(t, waitLong, "slow subscriber's buffer", func() bool { return slow.Pending() == 4 })
	// e1, one durable (the first's position), e2, end: the 101 durables
	// merged into one pending wake.
	var got []string
	for range 4 {
		w := next(t, slow)
		if w.Durable {
			got = append(got, "D")
		} else {
			got = append(got, w.Payload)
		}
	}
	if fmt.Sprint(got) != "[e1 D e2 end]" {
		t.Fatalf("slow subscriber got %v", got)
	}
	if slow.Err() != nil {
		t.Fatal(slow.Err())
	}
	// After reading, a new durable is queued again.
	fc.durable("a")
	if w := next(t, slow); !w.Durable {
		t.Fatalf("%+v", w)
	}
}

func TestMuxEphemeralOverflowClosesOnlyTheSlowOne(t *testing.T) {
	m, _, fc := muxOverFake(t, true, MuxOptions{Buffer: 4})
	slow, fast := subscribeTwo(t, m, "a")
	fc.expect(t, "sub", "a")
	for i := range 6 {
		fc.wake("a", fmt.Sprint(i))
		if w := next(t, fast); w.Payload != fmt.Sprint(i) {
			t.Fatalf("fast got %+v", w)
		}
	}
	select {
	case <-slow.Done():
	case <-time.After(waitLong):
		t.Fatal("slow subscriber not closed")
	}
	var se *SlowSubscriberError
	if _, err := slow.Next(context.Background()); !errors.As(err, &se) || !errors.Is(err, ErrSlowSubscriber) || se.Buffer != 4 {
		t.Fatalf("Next = %v, want a *SlowSubscriberError", err)
	}
	if !errors.Is(slow.Err(), ErrSlowSubscriber) {
		t.Fatal(slow.Err())
	}
	if n := m.Subscribers("a"); n != 1 {
		t.Fatalf("Subscribers = %d", n)
	}
	// The fast one carries on; the hub subscription stays.
	fc.wake("a", "more")
	if w := next(t, fast); w.Payload != "more" {
		t.Fatal(w)
	}
	// The last one closing unsubscribes.
	fast.Close()
	fc.expect(t, "unsub", "a")
}

func TestMuxSlowLastSubscriberUnsubscribes(t *testing.T) {
	m, _, fc := muxOverFake(t, true, MuxOptions{Buffer: 1})
	s, err := m.Subscribe(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	fc.expect(t, "sub", "a")
	fc.wake("a", "1")
	fc.wake("a", "2")
	fc.expect(t, "unsub", "a")
	if !errors.Is(s.Err(), ErrSlowSubscriber) {
		t.Fatal(s.Err())
	}
}

func TestMuxSubscribeErrorReachesEveryWaiter(t *testing.T) {
	m, c, fc := muxOverFake(t, false, MuxOptions{})
	var calls []<-chan error
	for range 3 {
		calls = append(calls, result(func() error {
			_, err := m.Subscribe(context.Background(), "bad")
			return err
		}))
	}
	fc.expect(t, "sub", "bad")
	testutil.WaitFor(t, waitLong, "3 waiting", func() bool { return m.Subscribers("bad") == 3 })
	fc.nack("bad", "invalid channel: 70 bytes, Postgres allows at most 63")
	for _, ch := range calls {
		if err := await(t, ch); !errors.Is(err, ErrInvalidName) {
			t.Fatalf("Subscribe = %v", err)
		}
	}
	if m.Subscribers("bad") != 0 || c.Err() != nil {
		t.Fatalf("Subscribers %d, client %v", m.Subscribers("bad"), c.Err())
	}
}

func TestMuxSubscribeContextCancel(t *testing.T) {
	m, _, fc := muxOverFake(t, false, MuxOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	first := result(func() error { _, err := m.Subscribe(ctx, "a"); return err })
	fc.expect(t, "sub", "a")
	var second *Subscription
	secondDone := result(func() (err error) { second, err = m.Subscribe(context.Background(), "a"); return err })
	testutil.WaitFor(t, waitLong, "2 waiting", func() bool { return m.Subscribers("a") == 2 })
	cancelThenAck(t, cancel, first, secondDone, fc, "a")
	fc.wake("a", "x")
	if w := next(t, second); w.Payload != "x" {
		t.Fatal(w)
	}
	// Sole waiter cancelled: unsubscribed once the ack is in.
	ctx, cancel = context.WithCancel(context.Background())
	only := result(func() error { _, err := m.Subscribe(ctx, "b"); return err })
	fc.expect(t, "sub", "b")
	testutil.WaitFor(t, waitLong, "b waiting", func() bool { return m.Subscribers("b") == 1 })
	cancel()
	if err := await(t, only); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	fc.ack("b")
	fc.expect(t, "unsub", "b")
}

func TestMuxListenerDeathClosesSubscribers(t *testing.T) {
	m, _, fc := muxOverFake(t, true, MuxOptions{})
	s1, _ := m.Subscribe(context.Background(), "a")
	s2, _ := m.Subscribe(context.Background(), "b")
	fc.c.Close()
	for _, s := range []*Subscription{s1, s2} {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		_, err := s.Next(ctx)
		cancel()
		if !errors.Is(err, io.EOF) {
			t.Fatalf("Next = %v, want the client's EOF", err)
		}
	}
	if _, err := m.Subscribe(context.Background(), "a"); !errors.Is(err, io.EOF) {
		t.Fatalf("Subscribe after death = %v", err)
	}
}

func TestMuxClose(t *testing.T) {
	m, c, fc := muxOverFake(t, true, MuxOptions{})
	s, _ := m.Subscribe(context.Background(), "a")
	fc.expect(t, "sub", "a")
	m.Close()
	if _, err := s.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if _, err := m.Subscribe(context.Background(), "a"); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if !errors.Is(c.Err(), ErrClosed) {
		t.Fatalf("after Mux.Close the listener's Err is %v, want ErrClosed", c.Err())
	}
	s.Close() // after Mux.Close: harmless
}

// A Mux takes one Listener: Subscribe before Attach is an error, a wake
// before it reaches nobody, a second Attach is refused, and Attach to a
// closed Mux closes the Listener.
func TestMuxAttach(t *testing.T) {
	m, err := NewMux(MuxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.OnWake(Wake{Name: "a"}) // a wake before any subscriber: no panic
	if _, err := m.Subscribe(context.Background(), "a"); !errors.Is(err, errMuxUnattached) {
		t.Fatalf("Subscribe before Attach: %v", err)
	}
	first := &fakeLocal{done: make(chan struct{})}
	if err := m.Attach(first); err != nil {
		t.Fatal(err)
	}
	second := &fakeLocal{done: make(chan struct{})}
	if err := m.Attach(second); !errors.Is(err, errMuxAttached) || m.Listener() != Listener(first) {
		t.Fatalf("second Attach: %v, listener %v", err, m.Listener())
	}
	if _, err := m.Subscribe(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	m.Close()
	late := &fakeLocal{done: make(chan struct{})}
	if err := m.Attach(late); !errors.Is(err, ErrClosed) || !isClosed(late.done) {
		t.Fatalf("Attach after Close: %v, closed %v", err, isClosed(late.done))
	}
}

func TestMuxNextContext(t *testing.T) {
	m, _, _ := muxOverFake(t, true, MuxOptions{})
	s, err := m.Subscribe(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if s.Err() != nil {
		t.Fatal("a Next deadline closed the subscription")
	}
}

// Subscribe and Close racing on one name from many goroutines must leave
// the hub subscribed exactly when somebody is subscribed.
func TestMuxChurn(t *testing.T) {
	m, c, fc := muxOverFake(t, true, MuxOptions{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				s, err := m.Subscribe(context.Background(), "a")
				if err != nil {
					t.Error(err)
					return
				}
				s.Close()
			}
		}()
	}
	wg.Wait()
	testutil.WaitFor(t, waitLong, "mux idle", func() bool {
		m.mu.RLock()
		defer m.mu.RUnlock()
		return len(m.chans) == 0
	})
	c.mu.Lock()
	_, subscribed := c.subs["a"]
	c.mu.Unlock()
	if subscribed {
		t.Fatal("client still subscribed to a with no subscriber")
	}
	// The last frame about "a" is an unsub. A sub of "z" marks the end of
	// what was sent before.
	if _, err := m.Subscribe(context.Background(), "z"); err != nil {
		t.Fatal(err)
	}
	last := ""
	for {
		msg := fc.next(t)
		if msg.Name == "z" {
			break
		}
		last = msg.Type
	}
	if last != "unsub" {
		t.Fatalf("last frame for a: %q", last)
	}
}

func TestMuxCloseDuringSubscribe(t *testing.T) {
	m, _, fc := muxOverFake(t, false, MuxOptions{})
	done := result(func() error { _, err := m.Subscribe(context.Background(), "a"); return err })
	fc.expect(t, "sub", "a")
	m.Close()
	if err := await(t, done); !errors.Is(err, ErrClosed) {
		t.Fatalf("Subscribe = %v, want ErrClosed", err)
	}
}

// muxWatchers counts the goroutines NewMux started that are still waiting.
func muxWatchers() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Count(buf, []byte("client.NewMux.func1"))
}

// Close closes the Listener and ends the goroutine that watches it.
func TestMuxCloseEndsWatcher(t *testing.T) {
	before := muxWatchers()
	l := &fakeLocal{done: make(chan struct{})}
	m, err := NewMux(MuxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Attach(l); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if !isClosed(l.done) {
		t.Fatal("Mux.Close did not close its Listener")
	}
	testutil.WaitFor(t, waitLong, "the watcher to end after Mux.Close", func() bool {
		return muxWatchers() <= before
	})
}

// subscribeTwo subscribes two subscribers of m to q.
func subscribeTwo(t *testing.T, m *Mux, q string) (a, b *Subscription) {
	t.Helper()
	var err error
	if a, err = m.Subscribe(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	if b, err = m.Subscribe(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// eachReadsInOrder has every one of subs read n wakes at once, the payload
// of the i-th being i, within waitLong.
func eachReadsInOrder(t *testing.T, subs []*Subscription, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(subs))
	for _, s := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			defer cancel()
			for i := range n {
				w, err := s.Next(ctx)
				if err != nil {
					errs <- err
					return
				}
				if w.Payload != fmt.Sprint(i) {
					errs <- fmt.Errorf("wake %d: %+v", i, w)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Wakes ranges over the wakes in order, ends with the subscription's error
// once, and a break leaves the subscription open.
func TestSubscriptionWakes(t *testing.T) {
	m, _, fc := muxOverFake(t, true, MuxOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	s, err := m.Subscribe(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	fc.expect(t, "sub", "a")
	for _, p := range []string{"1", "2", "3", "4"} {
		fc.wake("a", p)
	}
	var got []string
	for w, err := range s.Wakes(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if got = append(got, w.Payload); len(got) == 2 {
			break
		}
	}
	testutil.WaitFor(t, waitLong, "wakes 3 and 4 pending", func() bool { return s.Pending() == 2 })
	var errs []error
	go func() {
		testutil.WaitFor(t, waitLong, "the last two wakes", func() bool { return s.Pending() == 0 })
		s.Close()
	}()
	for w, err := range s.Wakes(ctx) {
		if err != nil {
			errs = append(errs, err)
			continue
		}
		got = append(got, w.Payload)
	}
	if !slices.Equal(got, []string{"1", "2", "3", "4"}) || len(errs) != 1 || !errors.Is(errs[0], ErrClosed) {
		t.Fatalf("wakes %v, errors %v; want 1 2 3 4 then ErrClosed once", got, errs)
	}
}
