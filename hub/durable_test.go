package hub

import (
	"fmt"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// Rule 4 ("durable wakes never cause eviction") against rule 3 when the hard
// limit is below the durable one: the durable wakes pending for a worker
// whose socket is full do not count against its hard limit, so that the
// status, ack or ephemeral wake that follows them does not evict it.
// (Counted together, the durable wakes used up the hard limit and the next
// status change evicted a worker that had received nothing but durable
// wakes since its socket filled.)
func TestDurableWakesDoNotUseTheHardLimit(t *testing.T) {
	const hard, channels = 8, 20
	e := newEnv(t, func(c *Config) {
		c.HardQueueLimit, c.HardQueueBytes, c.StallTimeout = hard, 64<<10, 50*time.Millisecond
	})
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	for i := range channels {
		w.sub(fmt.Sprint("c", i))
		w.expect(ack(fmt.Sprint("c", i)))
	}
	w.subscribe("fill")
	// The socket is full and one partly written fill frame is pending.
	fills := e.fill(1)
	e.do(func() {
		for i := range channels {
			e.h.onNotification([]byte(fmt.Sprint("c", i)), nil)
		}
	})
	e.workerState(1, func(wk *worker) {
		if n := wk.pendingDurable(); n != channels {
			t.Errorf("pending durable = %d, want %d (all under the durable limit)", n, channels)
		}
	})
	// An ack, a status change and an ephemeral wake: 3 frames more, with
	// the fill frames left over still under the hard limit of 8, however
	// many durable wakes wait.
	w.sub("c0")
	e.sync()
	e.health(false)
	e.notify("c1", "eph")
	if s := e.h.Stats(); s.Evictions != 0 || s.DurableDropped != 0 {
		t.Fatalf("stats %+v: want no eviction and nothing dropped", s)
	}
	// It reads: everything in production order.
	for range fills {
		if m, err := w.read(timeout); err != nil || m.Name != "fill" {
			t.Fatalf("got %+v %v, want a fill wake", m, err)
		}
	}
	for i := range channels {
		w.expect(wake(fmt.Sprint("c", i), nil))
	}
	w.expect(ack("c0"), statusFalse, wake("c1", ptr("eph")))
	e.sync()
	w.none()
	// Full again, durable wakes again: past the hard limit in other
	// frames, and not reading, it is evicted, as ever.
	e.fill(1)
	e.do(func() {
		for i := range channels {
			e.h.onNotification([]byte(fmt.Sprint("c", i)), nil)
		}
	})
	for range hard {
		e.notify("c1", "eph")
	}
	var behind bool
	e.do(func() { _, behind = e.h.stall.behind[e.h.workers.byID(1)] })
	if !behind {
		t.Fatalf("not past the hard limit of %d after %d more frames", hard, hard)
	}
	testutil.WaitFor(t, timeout, "the stalled worker evicted", func() bool { return e.h.Stats().Evictions == 1 })
	w.eof()
}

// The byte half: durable wakes pending beyond what the kernel took do not
// use up HardQueueBytes either, and the worker's buffer still has a bound:
// HardQueueBytes plus DurableQueueLimit of the largest durable frames.
func TestDurableWakesDoNotUseTheHardBytes(t *testing.T) {
	const durable = 2000
	e := newEnv(t, func(c *Config) { c.HardQueueBytes = 64 << 10; c.DurableQueueLimit = durable })
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	q := func(i int) string { return fmt.Sprintf("%060d", i) } // 60-byte names
	for i := range durable {
		w.sub(q(i))
		w.expect(ack(q(i)))
	}
	w.subscribe("fill")
	e.fill(1)
	e.do(func() {
		for i := range durable { // ~180 KB of durable wakes
			e.h.onNotification([]byte(q(i)), nil)
		}
	})
	e.notify("fill", "eph")
	e.health(false)
	s := e.h.Stats()
	if s.Evictions != 0 || s.DurableDropped != 0 {
		t.Fatalf("stats %+v: want no eviction and nothing dropped", s)
	}
	e.workerState(1, func(wk *worker) {
		if wk.out.Max < 64<<10+durable*maxDurableFrame {
			t.Errorf("buffer cap %d below HardQueueBytes + %d durable frames", wk.out.Max, durable)
		}
		if wk.out.Len() > wk.out.Max {
			t.Errorf("buffer %d over its cap %d", wk.out.Len(), wk.out.Max)
		}
	})
}
