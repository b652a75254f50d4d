package hub

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// A fanout to 33 workers with WriteThreads 4 goes through the helper
// threads, and every worker gets every wake in order, including one that
// stopped reading until its socket buffer filled (its writes are cut short,
// EPOLLOUT takes over, and it gets the rest once it reads). With
// WriteThreads 1 no helper is started. The loop is made to count as idle,
// which is when the helpers write.
func TestParallelFanout(t *testing.T) {
	for _, threads := range []int{4, 1} {
		t.Run(fmt.Sprint("threads=", threads), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.WriteThreads = threads })
			ws := make([]*tw, 33)
			for i := range ws {
				ws[i] = e.dial()
				ws[i].sub("fan")
				if i == 0 {
					e.complete("LISTEN", "fan", nil)
				}
				ws[i].expect(ack("fan"))
			}
			payload := strings.Repeat("x", 5000)
			const n = 120 // 600 KB: more than worker 0's socket takes
			for i := range n {
				// As if the loop had been waiting: whether it has is
				// the machine's business (TestLoopLoad covers the rule).
				ch, p := []byte("fan"), []byte(fmt.Sprint(i, ":", payload))
				e.do(func() {
					e.h.writers.load.wait = math.MaxInt64 / 2
					e.h.onNotification(ch, p)
				})
			}
			for _, w := range ws[1:] {
				for i := range n {
					w.expect(wake("fan", ptr(fmt.Sprint(i, ":", payload))))
				}
			}
			var armed bool
			e.workerState(1, func(w *worker) { armed = w.armed })
			if !armed {
				t.Error("worker 0's writes were never cut short: the test does not cover EPOLLOUT")
			}
			for i := range n {
				ws[0].expect(wake("fan", ptr(fmt.Sprint(i, ":", payload))))
			}
			var used bool
			e.do(func() { used = e.h.writers.fan != nil })
			if used != (threads > 1) {
				t.Fatalf("helper threads started: %v, want %v", used, threads > 1)
			}
			if s := e.h.Stats(); s.Evictions != 0 || s.Workers != 33 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

// The helpers write while the loop has been idle more than busy: a loop
// woken every 10 ms for 1 ms of work is; one whose iterations follow each
// other with no wait is not, however long they are; and it changes its
// mind within a few dozen iterations either way.
func TestLoopLoad(t *testing.T) {
	var l loopLoad
	at := time.Unix(1000, 0)
	run := func(n int, busy, wait time.Duration) {
		for range n {
			at = at.Add(wait)
			start := at
			at = at.Add(busy)
			l.iteration(start, at)
		}
	}
	if l.idle() {
		t.Fatal("idle before any iteration")
	}
	run(50, time.Millisecond, 9*time.Millisecond) // paced
	if !l.idle() {
		t.Fatalf("paced (1 ms busy, 9 ms waiting): not idle (busy %d, wait %d)", l.busy, l.wait)
	}
	run(60, 200*time.Microsecond, 0) // a flood: back to back, 12 ms of it
	if l.idle() {
		t.Fatalf("flood (no wait): idle (busy %d, wait %d)", l.busy, l.wait)
	}
	run(20, time.Millisecond, 9*time.Millisecond)
	if !l.idle() {
		t.Fatalf("paced again: not idle (busy %d, wait %d)", l.busy, l.wait)
	}
}
