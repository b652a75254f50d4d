package hub

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

// Rule 1: routing table first, LISTEN second, ack only once Postgres
// confirmed.
func TestAckOnlyAfterListenConfirmed(t *testing.T) {
	e := newEnv(t, nil)
	w := e.dial()
	w.sub("a")
	e.sync()
	e.expectPending("LISTEN a")
	w.none() // no ack before the LISTEN completes
	e.complete("LISTEN", "a", nil)
	w.expect(ack("a"))
	if s := e.h.Stats(); s.Channels != 1 {
		t.Fatalf("channels = %d, want 1", s.Channels)
	}
}

// Rule 1: the worker is in the routing table before the ack; wakes that
// arrive before it are delivered (over-delivery is harmless), in order.
func TestRoutingBeforeAck(t *testing.T) {
	e := newEnv(t, nil)
	w := e.dial()
	w.sub("a")
	e.sync()
	e.notify("a", "early")
	e.complete("LISTEN", "a", nil)
	e.notify("a", "late")
	w.expect(wake("a", ptr("early")), ack("a"), wake("a", ptr("late")))
}

// Rule 1: a second sub on a listening channel is acked at once, without a
// new LISTEN; one on an in-flight LISTEN is acked when it completes.
func TestSecondSub(t *testing.T) {
	e := newEnv(t, nil)
	w1, w2, w3 := e.dial(), e.dial(), e.dial()
	w1.sub("a")
	e.sync()
	w2.sub("a") // LISTEN in flight
	e.sync()
	w1.none()
	w2.none()
	e.complete("LISTEN", "a", nil)
	w1.expect(ack("a"))
	w2.expect(ack("a"))
	w3.sub("a") // listening
	w3.expect(ack("a"))
	if got := e.issued(); !slices.Equal(got, []string{"LISTEN a"}) {
		t.Fatalf("issued %v, want one LISTEN", got)
	}
	// A worker subscribing twice is answered twice and counted once.
	w3.subscribe("a")
	e.do(func() {
		if n := len(e.h.channels["a"].subs); n != 3 {
			t.Errorf("refcount = %d, want 3", n)
		}
	})
}

// Rule 2: the last unsubscribe (or disconnect) UNLISTENs; earlier ones do
// not.
func TestRefcountedUnlisten(t *testing.T) {
	e := newEnv(t, func(c *Config) {})
	e.do(func() { e.pg.auto = true })
	w1, w2 := e.dial(), e.dial()
	w1.subscribe("a")
	w2.subscribe("a")
	w1.unsub("a")
	e.sync()
	if got := e.issued(); !slices.Equal(got, []string{"LISTEN a"}) {
		t.Fatalf("after first unsub: issued %v", got)
	}
	w2.c.Close() // last subscriber disconnects
	testutil.WaitFor(t, timeout, "UNLISTEN after the last disconnect", func() bool {
		return slices.Equal(e.issued(), []string{"LISTEN a", "UNLISTEN a"})
	})
	testutil.WaitFor(t, timeout, "channel deleted", func() bool {
		var n int
		e.do(func() { n = len(e.h.channels) })
		return n == 0
	})
	if s := e.h.Stats(); s.Channels != 0 || s.Workers != 1 {
		t.Fatalf("stats = %+v, want 0 channels and 1 worker", s)
	}
	// Unsub of a name never subscribed is ignored, no answer.
	w1.unsub("never")
	e.sync()
	w1.none()
}

// Rule 2: a sub arriving while the UNLISTEN is in flight is answered after a
// fresh LISTEN.
func TestSubDuringUnlisten(t *testing.T) {
	e := newEnv(t, nil)
	w1, w2 := e.dial(), e.dial()
	w1.sub("a")
	e.complete("LISTEN", "a", nil)
	w1.expect(ack("a"))
	w1.unsub("a")
	e.sync()
	w2.sub("a")
	e.sync()
	w2.none()
	e.expectPending("UNLISTEN a")
	e.complete("UNLISTEN", "a", nil)
	e.sync()
	w2.none()
	e.expectPending("LISTEN a")
	e.complete("LISTEN", "a", nil)
	w2.expect(ack("a"))
}

// Everybody leaving while the LISTEN is in flight turns its completion into
// an UNLISTEN, and nobody is acked.
func TestAllLeaveDuringListen(t *testing.T) {
	e := newEnv(t, nil)
	w := e.dial()
	w.sub("a")
	e.sync()
	w.unsub("a")
	e.complete("LISTEN", "a", nil)
	e.sync()
	w.none()
	e.expectPending("UNLISTEN a")
	e.complete("UNLISTEN", "a", nil)
	e.do(func() {
		if len(e.h.channels) != 0 {
			t.Errorf("channels left: %v", e.h.channels)
		}
	})
}

// A failed LISTEN nacks every waiter, takes them out of the routing table
// and UNLISTENs to leave Postgres in a known state.
func TestListenFailureNacks(t *testing.T) {
	e := newEnv(t, nil)
	w1, w2 := e.dial(), e.dial()
	w1.sub("a")
	w2.sub("a")
	e.complete("LISTEN", "a", errors.New("boom"))
	want := `{"t":"nack","q":"a","error":"LISTEN failed: boom"}`
	w1.expect(want)
	w2.expect(want)
	e.notify("a", "x")
	e.sync()
	w1.none()
	e.expectPending("UNLISTEN a")
	// A sub meanwhile gets a fresh LISTEN after the UNLISTEN.
	w1.sub("a")
	e.complete("UNLISTEN", "a", nil)
	e.complete("LISTEN", "a", nil)
	w1.expect(ack("a"))
}

// A failed UNLISTEN (connection down past the command timeout) is retried
// when the connection is back; a sub meanwhile LISTENs afresh.
func TestUnlistenFailureRetried(t *testing.T) {
	e := newEnv(t, nil)
	w := e.dial()
	for _, q := range []string{"a", "b"} {
		w.sub(q)
		e.complete("LISTEN", q, nil)
		w.expect(ack(q))
		w.unsub(q)
		e.complete("UNLISTEN", q, errors.New("no connection"))
	}
	e.do(func() {
		if len(e.h.channels) != 2 || !e.h.channels["a"].unlistenFailed {
			t.Errorf("channels %v: want a and b kept for a retry", e.h.channels)
		}
	})
	w.sub("b")
	e.complete("LISTEN", "b", nil)
	w.expect(ack("b"))
	e.health(false)
	w.expect(statusFalse)
	e.health(true)
	w.expect(statusTrue, wake("b", nil))
	e.expectPending("UNLISTEN a")
	e.complete("UNLISTEN", "a", nil)
	e.do(func() {
		if _, ok := e.h.channels["a"]; ok || len(e.h.channels) != 1 {
			t.Errorf("channels %v, want only b", e.h.channels)
		}
	})
}

// Channel mapping and validation: prefix+Q+suffix, at most 63 bytes, no NUL.
func TestChannelMapping(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ChannelPrefix, c.ChannelSuffix = "pgmq.q_", ".INSERT" })
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	w.subscribe("jobs")
	if got := e.issued(); !slices.Equal(got, []string{"LISTEN pgmq.q_jobs.INSERT"}) {
		t.Fatalf("issued %v", got)
	}
	e.notify("pgmq.q_jobs.INSERT", "")
	e.notify("jobs", "not ours") // a channel nobody mapped to
	w.expect(wake("jobs", nil))

	fits := strings.Repeat("x", 63-len("pgmq.q_.INSERT"))
	w.sub(fits)
	w.expect(ack(fits))
	for _, c := range []struct{ q, reason string }{
		{fits + "y", "invalid channel: 64 bytes, Postgres allows at most 63"},
		{"a\x00b", "invalid channel: contains NUL"},
		{"", "invalid channel: empty name"},
	} {
		w.sub(c.q)
		m, err := w.read(timeout)
		if err != nil {
			t.Fatal(err)
		}
		if m.Type != "nack" || m.Name != c.q || m.Error != c.reason {
			t.Fatalf("sub %q: got %+v, want nack %q", c.q, m, c.reason)
		}
	}
	if n := len(e.issued()); n != 2 {
		t.Fatalf("invalid names reached Postgres: %v", e.issued())
	}
}

// Rule 4: durable wakes for (worker, Q) pending and unsent coalesce; the
// first keeps its position (rule 5).
func TestDurableCoalescing(t *testing.T) {
	e := newEnv(t, nil)
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	for _, q := range []string{"a", "b"} {
		w.sub(q)
		w.expect(ack(q))
	}
	e.do(func() { // one iteration: nothing is written in between
		for _, n := range []struct{ ch, p string }{
			{"a", ""}, {"b", "x"}, {"a", ""}, {"b", ""}, {"a", ""}, {"b", "y"}, {"b", ""},
		} {
			e.h.onNotification([]byte(n.ch), []byte(n.p))
		}
	})
	w.expect(wake("a", nil), wake("b", ptr("x")), wake("b", nil), wake("b", ptr("y")))
	e.sync()
	w.none()
	if s := e.h.Stats(); s.DurableCoalesced != 3 || s.WakesReceived != 7 {
		t.Fatalf("coalesced %d, received %d; want 3 and 7", s.DurableCoalesced, s.WakesReceived)
	}
	// Once sent, the next durable wake is a new frame.
	e.notify("a", "")
	w.expect(wake("a", nil))
}

// Rule 4: beyond DurableQueueLimit pending durable frames a durable wake is
// dropped and counted; the worker is not evicted, and ephemeral wakes still
// queue. "Pending" is what the kernel refused: a reading worker gets a burst
// of any size.
func TestDurableLimit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.DurableQueueLimit = 4 })
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	for i := range 10 {
		w.sub(fmt.Sprint("c", i))
		w.expect(ack(fmt.Sprint("c", i)))
	}
	burst := func() {
		e.do(func() {
			for i := range 10 {
				e.h.onNotification([]byte(fmt.Sprint("c", i)), nil)
			}
			e.h.onNotification([]byte("c9"), []byte("eph"))
		})
	}
	burst() // reading worker: all of it, one iteration or not
	for i := range 10 {
		w.expect(wake(fmt.Sprint("c", i), nil))
	}
	w.expect(wake("c9", ptr("eph")))

	w.subscribe("fill")
	fills := e.fill(1)
	burst()
	if s := e.h.Stats(); s.DurableDropped != 6 || s.Evictions != 0 {
		t.Fatalf("dropped %d evictions %d; want 6 and 0", s.DurableDropped, s.Evictions)
	}
	for range fills {
		if m, err := w.read(timeout); err != nil || m.Name != "fill" {
			t.Fatalf("got %+v %v, want a fill wake", m, err)
		}
	}
	w.expect(wake("c0", nil), wake("c1", nil), wake("c2", nil), wake("c3", nil), wake("c9", ptr("eph")))
	e.sync()
	w.none()
}

// fill makes the hub's socket to w full: ephemeral 4 KiB wakes on "fill"
// until the hub has to keep a backlog (EPOLLOUT armed). w must be
// subscribed to "fill" and not read.
func (e *env) fill(id uint64) int {
	e.t.Helper()
	payload := []byte(strings.Repeat("f", 4000))
	n := 0
	for armed := false; !armed; {
		if n > 1000 {
			e.t.Fatal("socket never filled")
		}
		e.do(func() {
			e.h.onNotification([]byte("fill"), payload)
			armed = e.h.workers.byID(id).armed
		})
		n++
	}
	return n
}

// Rules 3 and 4 for a worker that stops reading: durable wakes coalesce and
// drop but never evict; the backlog is written, in order, when it reads
// again; EPOLLOUT is armed only while something is buffered, and a drained
// worker holds no buffer.
func TestWedgedWorkerDurable(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.DurableQueueLimit = 3 })
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	sib := e.dial()
	for _, q := range []string{"fill", "a", "b", "c", "d"} {
		w.sub(q)
		w.expect(ack(q))
	}
	sib.subscribe("a")
	fills := e.fill(1)
	for range 200 {
		for _, q := range []string{"a", "b", "c", "d"} {
			e.notify(q, "")
		}
		sib.expect(wake("a", nil)) // the sibling is served throughout
	}
	e.workerState(1, func(wk *worker) {
		if !wk.armed || wk.out.Len() == 0 {
			t.Errorf("armed=%v len=%d, want a backlog with EPOLLOUT armed", wk.armed, wk.out.Len())
		}
		if n := wk.pendingDurable(); n != 3 {
			t.Errorf("pending durable = %d, want 3", n)
		}
	})
	s := e.h.Stats()
	if s.Evictions != 0 || s.DurableDropped != 200 || s.DurableCoalesced != 597 {
		t.Fatalf("stats %+v: want 0 evictions, 200 dropped (d), 597 coalesced", s)
	}
	// Read it all: the fill frames first, then one wake each for a, b, c.
	for range fills {
		m, err := w.read(timeout)
		if err != nil || m.Type != "wake" || m.Name != "fill" {
			t.Fatalf("got %+v %v, want a fill wake", m, err)
		}
	}
	w.expect(wake("a", nil), wake("b", nil), wake("c", nil))
	e.sync()
	w.none()
	e.workerState(1, func(wk *worker) {
		if wk.armed || wk.out.Len() != 0 || wk.out.Cap() != 0 {
			t.Errorf("drained: armed=%v len=%d cap=%d, want false 0 0", wk.armed, wk.out.Len(), wk.out.Cap())
		}
	})
}

// Rule 3: ephemeral wakes are never dropped; a worker whose backlog passes
// the frame limit and whose socket then takes nothing for StallTimeout is
// evicted (counted, logged once with worker and pid), and its sibling gets
// every wake, in order.
func TestEvictionByFrames(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.HardQueueLimit = 16; c.StallTimeout = 100 * time.Millisecond })
	e.do(func() { e.pg.auto = true })
	wedged, sib := e.dial(), e.dial()
	for _, w := range []*tw{wedged, sib} {
		w.subscribe("e")
	}
	var read atomic.Int64
	done := make(chan []string)
	go func() { // the sibling reads concurrently
		var got []string
		for {
			m, err := sib.read(timeout)
			if err != nil || m.Payload == "end" {
				done <- got
				return
			}
			got = append(got, m.Payload)
			read.Add(1)
		}
	}()
	payload := strings.Repeat("p", 1000)
	behind := func() (n int) { e.do(func() { n = len(e.h.stall.behind) }); return n }
	sent := 0
	for behind() == 0 {
		if sent > 5000 {
			t.Fatal("never past the frame limit")
		}
		// The sibling keeps up, if a little behind (less than its own
		// limit): a descheduled test goroutine must not look wedged.
		testutil.WaitFor(t, timeout, "sibling within 8 frames", func() bool { return int64(sent-8) <= read.Load() })
		e.notify("e", fmt.Sprintf("%d:%s", sent, payload))
		sent++
	}
	testutil.WaitFor(t, timeout, "the stalled worker evicted", func() bool { return e.h.Stats().Evictions == 1 })
	e.notify("e", "end")
	got := <-done
	if len(got) != sent {
		t.Fatalf("sibling got %d wakes, want %d", len(got), sent)
	}
	for i, p := range got {
		if !strings.HasPrefix(p, fmt.Sprintf("%d:", i)) {
			t.Fatalf("sibling wake %d is %.10q: out of order", i, p)
		}
	}
	wedged.eof()
	s := e.h.Stats()
	if s.Evictions != 1 || s.Workers != 1 {
		t.Fatalf("stats %+v, want 1 eviction, 1 worker left", s)
	}
	if n := e.logs.count("worker evicted"); n != 1 {
		t.Fatalf("eviction logged %d times, want once", n)
	}
	line := e.logs.String()
	line = line[strings.Index(line, "worker evicted"):]
	line = line[:strings.IndexByte(line, '\n')]
	for _, want := range []string{"worker=1", fmt.Sprintf("pid=%d", osPid()), "limit=frames", "hard_queue_limit=16", "stall_timeout=100ms", "stalled="} {
		if !strings.Contains(line, want) {
			t.Fatalf("eviction log %q lacks %q", line, want)
		}
	}
	if n := behind(); n != 0 {
		t.Fatalf("%d workers still behind after the eviction", n)
	}
}

// Rule 3 for a worker that reads: one burst of 20,000 wakes in a single
// loop iteration, far past the frame limit, reaches a worker that keeps
// reading in full and in order, and it is not evicted. (Before the stall
// timeout, the frame limit alone evicted it once its socket was full.)
func TestReadingWorkerKeepsABurst(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.HardQueueLimit = 16 })
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	w.subscribe("e")
	const n = 20000
	e.do(func() {
		for i := range n {
			e.h.onNotification([]byte("e"), []byte(fmt.Sprintf(`{"queue":"q%d"}`, i)))
		}
	})
	for i := range n {
		m, err := w.read(timeout)
		if err != nil {
			t.Fatalf("wake %d of %d: %v (stats %+v)", i, n, err, e.h.Stats())
		}
		if want := fmt.Sprintf(`{"queue":"q%d"}`, i); m.Payload != want {
			t.Fatalf("wake %d is %q, want %q", i, m.Payload, want)
		}
	}
	if s := e.h.Stats(); s.Evictions != 0 || s.Workers != 1 {
		t.Fatalf("a reading worker was evicted: %+v", s)
	}
}

// A loop busy with one long iteration (a read of the Postgres socket with
// thousands of NOTIFYs) writes to nobody meanwhile: the stall timer that
// runs right after it, in the same iteration, must not take a worker that
// read what it had for one that stopped. Here the iteration that queues the
// burst lasts ten stall timeouts; the worker reads throughout, and gets
// every wake.
func TestBusyLoopIsNotAStalledWorker(t *testing.T) {
	const stall = 50 * time.Millisecond
	e := newEnv(t, func(c *Config) { c.HardQueueLimit = 16; c.StallTimeout = stall })
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	w.subscribe("e")
	const n = 20000
	pad := strings.Repeat("p", 100) // 2 MB in all: far past the socket's buffer, under the byte ceiling
	done := make(chan error, 1)
	go func() {
		for i := range n {
			m, err := w.read(timeout)
			if err != nil {
				done <- fmt.Errorf("wake %d of %d: %w", i, n, err)
				return
			}
			if want := fmt.Sprintf("%d:%s", i, pad); m.Payload != want {
				done <- fmt.Errorf("wake %d is %q", i, m.Payload)
				return
			}
		}
		done <- nil
	}()
	e.do(func() {
		for i := range n {
			e.h.onNotification([]byte("e"), []byte(fmt.Sprintf("%d:%s", i, pad)))
		}
		time.Sleep(10 * stall) // the long iteration itself, not a wait for anything
		// Timers run right after the events of an iteration, before the
		// next wait could report the socket writable again.
		e.h.onStallTimer()
	})
	if err := <-done; err != nil {
		t.Fatalf("%v (stats %+v)", err, e.h.Stats())
	}
	if s := e.h.Stats(); s.Evictions != 0 {
		t.Fatalf("a reading worker was evicted after a busy iteration: %+v", s)
	}
}

// The stall timer judges progress, not speed: a worker that reads a
// little at a time, pausing between reads for a thirtieth of the stall
// timeout, stays through a backlog far past the frame limit for two stall
// timeouts. (The timeout is long against a loaded machine's scheduling:
// a reader kept off the CPU for it would be a stalled reader.)
func TestSlowReaderNotEvicted(t *testing.T) {
	const stall = 3 * time.Second
	e := newEnv(t, func(c *Config) { c.HardQueueLimit = 16; c.StallTimeout = stall })
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	w.subscribe("e")
	payload := strings.Repeat("s", 2000)
	const n = 3000 // about 6 MB: under the 8 MiB byte ceiling
	var behindSeen bool
	e.do(func() {
		for i := range n {
			e.h.onNotification([]byte("e"), []byte(fmt.Sprintf("%d:%s", i, payload)))
		}
		behindSeen = len(e.h.stall.behind) == 1
	})
	if !behindSeen {
		t.Fatal("the worker is not past the frame limit: the test proves nothing")
	}
	for i := range n {
		m, err := w.read(timeout)
		if err != nil {
			t.Fatalf("wake %d of %d: %v (stats %+v)", i, n, err, e.h.Stats())
		}
		if !strings.HasPrefix(m.Payload, fmt.Sprintf("%d:", i)) {
			t.Fatalf("wake %d out of order: %.10q", i, m.Payload)
		}
		if i%50 == 49 {
			time.Sleep(stall / 30) // the slow reader's pace, not a wait for anything
		}
	}
	if s := e.h.Stats(); s.Evictions != 0 {
		t.Fatalf("a slow reader was evicted: %+v", s)
	}
}

// Rule 3, byte half: a backlog over HardQueueBytes evicts too.
func TestEvictionByBytes(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.HardQueueBytes = 64 << 10 })
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	w.subscribe("e")
	payload := strings.Repeat("b", 7900)
	for i := 0; e.h.Stats().Evictions == 0; i++ {
		if i > 2000 {
			t.Fatal("never evicted")
		}
		e.notify("e", payload)
	}
	w.eof()
	if !strings.Contains(e.logs.String(), "limit=bytes") {
		t.Fatal("eviction not logged as a byte-limit eviction")
	}
}

// A burst bigger than the hard limit in a single loop iteration (one read
// of the Postgres socket can carry thousands of NOTIFYs) does not evict a
// worker that reads: the limit is on what the kernel refused.
func TestBurstInOneIterationNoEviction(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.HardQueueLimit = 16 })
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	w.subscribe("e")
	e.do(func() {
		for i := range 100 {
			e.h.onNotification([]byte("e"), []byte(fmt.Sprint(i)))
		}
	})
	for i := range 100 {
		w.expect(wake("e", ptr(fmt.Sprint(i))))
	}
	if s := e.h.Stats(); s.Evictions != 0 {
		t.Fatalf("evicted a reading worker: %+v", s)
	}
}

// Write path: the frames one iteration produces for a worker leave in one
// write.
func TestOneWritePerIteration(t *testing.T) {
	e := newEnv(t, nil)
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	w.subscribe("a")
	e.sync()
	writes := countWrites(t)
	e.sync()
	before := writes.Load()
	e.do(func() {
		for i := range 16 {
			e.h.onNotification([]byte("a"), []byte(fmt.Sprint(i)))
		}
	})
	for i := range 16 {
		w.expect(wake("a", ptr(fmt.Sprint(i))))
	}
	e.sync() // the loop has accounted for the write the worker read
	if after := writes.Load(); after-before != 1 {
		t.Fatalf("%d writes for 16 frames of one iteration, want 1", after-before)
	}
	if s := e.h.Stats(); s.FramesSent != 1+1+16 { // status, ack, wakes
		t.Fatalf("frames sent = %d, want 18", s.FramesSent)
	}
}

// Rule 6: status on connect, to all on every change, re-sent every 5
// status intervals (injected clock).
func TestStatusTiming(t *testing.T) {
	e := newEnv(t, nil)
	w1, w2 := e.dial(), e.dial() // each got status on connect
	e.advance(4 * time.Second)
	e.sync()
	w1.none()
	e.advance(time.Second) // 5th interval
	w1.expect(statusTrue)
	w2.expect(statusTrue)
	e.advance(4*time.Second + 999*time.Millisecond)
	e.sync()
	w1.none()
	e.advance(time.Millisecond)
	w1.expect(statusTrue)
	w2.expect(statusTrue)
	e.health(false)
	w1.expect(statusFalse)
	w2.expect(statusFalse)
	w3 := dialRaw(t, e.path)
	w3.expect(statusFalse) // on connect: the current status
	e.advance(5 * time.Second)
	for _, w := range []*tw{w1, w2, w3} {
		w.expect(statusFalse)
	}
	e.health(false) // no change, no frame
	e.sync()
	w1.none()
}

// A periodic re-send is skipped for a worker whose last status is still
// unsent: it would only grow a backlog that says nothing new.
func TestStatusResendSkipsUnsent(t *testing.T) {
	e := newEnv(t, nil)
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	w.subscribe("fill")
	e.fill(1)
	var frames int
	e.do(func() {
		e.h.onStatusTick() // ticks 1..5 in one pass: one re-send
		e.h.onStatusTick()
		e.h.onStatusTick()
		e.h.onStatusTick()
		e.h.onStatusTick()
		frames = e.h.workers.byID(1).out.Frames()
	})
	for range 3 {
		e.advance(5 * time.Second)
	}
	e.workerState(1, func(wk *worker) {
		if got := wk.out.Frames(); got != frames {
			t.Errorf("backlog grew from %d to %d frames on re-sends", frames, got)
		}
	})
}

// Rule 7: on reconnect healthy:false, then healthy:true and one durable
// wake per subscribed channel to every subscriber; subs on listening
// channels while down are acked only when the union is back.
func TestResyncAfterReconnect(t *testing.T) {
	e := newEnv(t, nil)
	e.do(func() { e.pg.auto = true })
	w1, w2 := e.dial(), e.dial()
	w1.subscribe("a")
	w1.subscribe("b")
	w2.subscribe("a")
	e.health(false)
	w1.expect(statusFalse)
	w2.expect(statusFalse)
	w2.sub("b") // listening, but Postgres is down: held back
	e.sync()
	w2.none()
	e.health(true)
	w1.expect(statusTrue)
	w2.expect(statusTrue, ack("b"))
	// One durable wake per channel to every subscriber, any channel order.
	got1 := []string{w1.next(), w1.next()}
	got2 := []string{w2.next(), w2.next()}
	slices.Sort(got1)
	slices.Sort(got2)
	want := []string{wake("a", nil), wake("b", nil)}
	if !slices.Equal(got1, want) || !slices.Equal(got2, want) {
		t.Fatalf("resync wakes: w1 %v, w2 %v; want %v each", got1, got2, want)
	}
	e.sync()
	w1.none()
	if s := e.h.Stats(); s.PostgresReconnects != 1 || !s.PostgresHealthy {
		t.Fatalf("stats %+v", s)
	}
}

// Rule 9: each malformed input severs that one connection, logged with the
// reason and counted; the sibling carries on. Unknown types are skipped.
func TestBadInputSeversOne(t *testing.T) {
	cases := []struct {
		name  string
		input []byte
	}{
		{"length over 4 MiB", []byte{0, 0x40, 0, 1}},
		{"bad JSON", rawFrame(`{"t":"sub","q":"a"`)},
		{"not an object", rawFrame(`["sub","a"]`)},
		{"missing t", rawFrame(`{"q":"a"}`)},
		{"non-string t", rawFrame(`{"t":1,"q":"a"}`)},
		{"sub without q", rawFrame(`{"t":"sub"}`)},
		{"sub with non-string q", rawFrame(`{"t":"sub","q":7}`)},
		{"unsub with null q", rawFrame(`{"t":"unsub","q":null}`)},
		{"empty body", rawFrame(``)},
	}
	e := newEnv(t, nil)
	e.do(func() { e.pg.auto = true })
	sib := e.dial()
	sib.subscribe("a")
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bad := e.dial()
			bad.subscribe("a")
			bad.send(c.input)
			bad.eof()
			e.notify("a", fmt.Sprint(i))
			sib.expect(wake("a", ptr(fmt.Sprint(i))))
			if got := e.h.Stats().ProtocolErrors; got != uint64(i+1) {
				t.Fatalf("protocol errors = %d, want %d", got, i+1)
			}
		})
	}
	if n := e.logs.count("malformed frame"); n != len(cases) {
		t.Fatalf("%d malformed-frame log lines, want %d", n, len(cases))
	}
	if !strings.Contains(e.logs.String(), "reason=") {
		t.Fatal("no reason logged")
	}
	// An unknown type is logged and skipped; the connection stays.
	u := e.dial()
	u.send(rawFrame(`{"t":"hello","q":"x","extra":[1,2]}`))
	u.send(rawFrame(`{"t":"wake","q":"a","p":null}`)) // hub-to-worker type
	u.subscribe("a")
	if n := e.logs.count("unknown frame type"); n != 2 {
		t.Fatalf("unknown type logged %d times, want 2", n)
	}
	// Split frames and extra fields are fine.
	sub := frame.AppendSub(nil, "b")
	u.send(sub[:3])
	e.sync()
	u.send(sub[3:])
	u.expect(ack("b"))
	u.send(rawFrame(`{"q":"c","x":{"y":null},"t":"sub"}`))
	u.expect(ack("c"))
}

func rawFrame(body string) []byte {
	n := len(body)
	return append([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, body...)
}

// Peers whose uid is not allowed are closed on accept, told why first: one
// nack with an empty q (docs/protocol.md).
func TestAllowUIDs(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.AllowUIDs = []int{54321} })
	w := dialRaw(t, e.path)
	expectRefusal(t, w, fmt.Sprintf("uid %d is not allowed (--allow-uid)", os.Geteuid()))
	if !strings.Contains(e.logs.String(), "uid not allowed") {
		t.Fatal("refusal not logged")
	}
	if s := e.h.Stats(); s.Workers != 0 || s.Accepts != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// EMFILE and friends pause accepting for a moment instead of spinning on
// the level-triggered readiness; accepting resumes on its own.
func TestAcceptPause(t *testing.T) {
	e := newEnv(t, nil)
	e.do(func() {
		if !e.h.sock.tok.Valid() {
			t.Error("listening socket has no valid loop token")
		}
		e.h.pauseAccept(unix.EMFILE)
	})
	w := dialRaw(t, e.path) // waits in the backlog until the pause ends
	w.expect(statusTrue)
	if n := e.logs.count("level=ERROR"); n != 0 {
		t.Fatalf("errors logged:\n%s", e.logs.String())
	}
	if n := e.logs.count(`msg="accept paused"`); n != 1 {
		t.Fatalf("accept paused logged %d times", n)
	}
}

// A worker that gets frames interval after interval keeps its drained ring
// storage (no pool round trip per wake); one that goes quiet gives it back
// at the next tick, and the periodic status alone never makes a worker
// keep a buffer: an idle worker holds none.
func TestRingStorageKeptOnlyWhileBusy(t *testing.T) {
	e := newEnv(t, nil)
	e.do(func() { e.pg.auto = true })
	busy, idle := e.dial(), e.dial()
	busy.subscribe("hot")
	idle.subscribe("cold")
	capOf := func(id uint64) (c int) {
		e.workerState(id, func(w *worker) { c = w.out.Cap() })
		return c
	}
	for i := 0; i < 12; i++ { // twelve intervals, two periodic statuses among them
		e.notify("hot", fmt.Sprint(i))
		p := fmt.Sprint(i)
		busy.expect(wake("hot", &p))
		e.advance(time.Second)
		if (i+1)%statusEvery == 0 {
			busy.expect(statusTrue)
			idle.expect(statusTrue)
		}
		e.sync()
		if i >= 2 && capOf(1) == 0 {
			t.Fatalf("interval %d: the busy worker's drained ring gave its storage back", i)
		}
		if got := capOf(2); got != 0 {
			t.Fatalf("interval %d: the idle worker holds %d bytes of ring storage", i, got)
		}
	}
	// The busy worker goes quiet: two ticks later it holds nothing either.
	e.advance(time.Second)
	e.advance(time.Second)
	e.sync()
	if got := capOf(1); got != 0 {
		t.Fatalf("a worker quiet for two intervals still holds %d bytes", got)
	}
}

// The periodic status re-send goes out statusSlice workers per loop
// iteration, so that the events arriving meanwhile are served between two
// slices instead of behind a write to every worker; every worker still gets
// it once per round.
func TestStatusResendIsSliced(t *testing.T) {
	e := newEnv(t, nil)
	n := 2*statusSlice + 10
	ws := make([]*tw, n)
	for i := range ws {
		ws[i] = e.dial()
	}
	for i := 0; i < statusEvery-1; i++ {
		e.advance(time.Second)
	}
	// The tick that re-sends runs the first slice and posts the second;
	// a probe posted right after that runs between the second slice and
	// the third, which the second posts. Posting the probe from the loop
	// keeps the order exact whatever the test goroutine's timing.
	var first, second int
	probed := make(chan struct{})
	e.do(func() {
		e.clk.advance(time.Second)
		first = e.h.status.resendAt
		if err := e.h.loop.Post(func() { second = e.h.status.resendAt; close(probed) }); err != nil {
			t.Error(err)
		}
	})
	testutil.WaitClosed(t, probed, timeout, "loop did not run the probe")
	if first != n-statusSlice {
		t.Fatalf("after the tick %d workers wait for the status, want %d", first, n-statusSlice)
	}
	if second != n-2*statusSlice {
		t.Fatalf("after the second slice %d workers wait for the status, want %d", second, n-2*statusSlice)
	}
	var left int
	for _, w := range ws {
		w.expect(statusTrue)
	}
	e.do(func() { left = e.h.status.resendAt })
	if left != 0 {
		t.Fatalf("the round ended with %d workers left", left)
	}
}
