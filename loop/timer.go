package loop

import (
	"container/heap"
	"time"
)

// Timer is a one-shot or repeating timer run by a Loop. All its methods are
// loop goroutine only.
type Timer struct {
	l      *Loop
	when   time.Time
	period time.Duration // 0 for one-shot
	seq    uint64        // tie-break: equal deadlines fire in creation order
	f      func()
	index  int // position in the heap; -1 when not scheduled
}

// AfterFunc runs f on the loop goroutine once, d from now. Loop goroutine
// only.
func (l *Loop) AfterFunc(d time.Duration, f func()) *Timer {
	return l.schedule(d, 0, f)
}

// Every runs f on the loop goroutine every d, first d from now. A repeating
// timer that falls behind (a long iteration, a stopped process) skips the
// missed runs instead of firing them back to back. Loop goroutine only.
func (l *Loop) Every(d time.Duration, f func()) *Timer {
	if d <= 0 {
		d = time.Millisecond
	}
	return l.schedule(d, d, f)
}

func (l *Loop) schedule(d, period time.Duration, f func()) *Timer {
	l.timerSeq++
	t := &Timer{l: l, when: time.Now().Add(d), period: period, seq: l.timerSeq, f: f}
	heap.Push(&l.timers, t)
	return t
}

// Stop cancels the timer. It reports whether the timer was scheduled; a
// stopped timer never fires again, even if it was due in the current
// iteration. Loop goroutine only.
func (t *Timer) Stop() bool {
	if t == nil || t.index < 0 {
		return false
	}
	heap.Remove(&t.l.timers, t.index)
	return true
}

// Reset reschedules the timer to fire d from now (and, for a repeating
// timer, every period after that). Loop goroutine only.
func (t *Timer) Reset(d time.Duration) {
	t.Stop()
	t.l.timerSeq++
	t.seq = t.l.timerSeq
	t.when = time.Now().Add(d)
	heap.Push(&t.l.timers, t)
}

// runTimers fires, in deadline order, every timer that was due when the
// pass began. Timers that callbacks start or reschedule wait for the next
// pass, so a repeating timer slower than its period cannot hold the loop.
func (l *Loop) runTimers() {
	now := time.Now()
	for len(l.timers) > 0 {
		t := l.timers[0]
		if t.when.After(now) {
			return
		}
		if t.period > 0 {
			t.when = t.when.Add(t.period)
			if !t.when.After(now) {
				t.when = now.Add(t.period)
			}
			l.timerSeq++
			t.seq = l.timerSeq
			heap.Fix(&l.timers, 0)
		} else {
			heap.Pop(&l.timers)
		}
		t.f()
	}
}

type timerHeap []*Timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].when.Equal(h[j].when) {
		return h[i].seq < h[j].seq
	}
	return h[i].when.Before(h[j].when)
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *timerHeap) Push(x any) {
	t := x.(*Timer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	n := len(old)
	t := old[n-1]
	old[n-1] = nil
	t.index = -1
	*h = old[:n-1]
	return t
}
