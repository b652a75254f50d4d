package hub

import (
	"time"

	"github.com/listenhub/listenhub/loop"
)

// Rule 3 for a worker that reads: a backlog past HardQueueLimit frames is
// not enough to evict. One transaction of 20,000 NOTIFYs arrives in a few
// reads of the Postgres socket, far faster than any worker takes them, and
// the worker's own LISTEN connection would have delivered every one; what
// tells a wedged worker from a busy one is whether the kernel takes its
// bytes. So a worker past the frame limit joins behind, and the stall
// timer evicts it only when its socket took nothing for StallTimeout.
// HardQueueBytes stays a ceiling that evicts at once: it is what bounds
// the hub's memory for one worker, reading or not.

// stallMark is where a worker past the frame limit last made progress.
type stallMark struct {
	written uint64 // w.out.Written() then
	at      int64  // unix nanoseconds
}

// overFrames notes that w's backlog is past HardQueueLimit: from now on it
// must keep taking bytes to stay.
func (h *Hub) overFrames(w *worker) {
	if _, ok := h.stall.behind[w]; ok {
		return
	}
	if h.stall.behind == nil {
		h.stall.behind = make(map[*worker]stallMark)
	}
	h.stall.behind[w] = stallMark{written: w.out.Written(), at: time.Now().UnixNano()}
	if h.stall.timer == nil && !h.stopping {
		h.stall.timer = h.loop.AfterFunc(h.stallSweep(), h.onStallTimer)
	}
}

// stallSweep is how often the workers behind are looked at: a quarter of
// StallTimeout, so that a stalled one goes at most 25% late.
func (h *Hub) stallSweep() time.Duration {
	return max(h.cfg.StallTimeout/4, time.Millisecond)
}

// onStallTimer evicts the workers behind whose socket took nothing for
// StallTimeout, forgets those back under the frame limit, and runs again
// while any is left.
func (h *Hub) onStallTimer() {
	h.stall.timer = nil
	if h.stopping {
		return
	}
	if h.up != nil {
		// An upgrade is handing the workers over: none may be closed
		// under it.
		h.stall.timer = h.loop.AfterFunc(h.stallSweep(), h.onStallTimer)
		return
	}
	// The clock, not the loop's iteration time: an iteration may have
	// run long, and progress seen at its end is progress now.
	now := time.Now().UnixNano()
	for w, m := range h.stall.behind {
		if w.closed {
			delete(h.stall.behind, w)
			continue
		}
		if frames, _ := w.backlog(); frames < h.cfg.HardQueueLimit {
			delete(h.stall.behind, w)
			continue
		}
		if w.out.Written() == m.written {
			// Offer the socket what is pending before judging: a loop
			// busy with a long burst wrote nothing to anyone meanwhile,
			// and a worker that read in that time takes bytes now.
			h.write(w)
			if w.closed {
				delete(h.stall.behind, w)
				continue
			}
		}
		if wr := w.out.Written(); wr != m.written {
			h.stall.behind[w] = stallMark{written: wr, at: now}
			continue
		}
		if stalled := time.Duration(now - m.at); stalled >= h.cfg.StallTimeout {
			delete(h.stall.behind, w)
			h.evict(w, "frames", "stalled", stalled.Round(time.Millisecond), "stall_timeout", h.cfg.StallTimeout)
		}
	}
	if len(h.stall.behind) > 0 {
		h.stall.timer = h.loop.AfterFunc(h.stallSweep(), h.onStallTimer)
	} else {
		h.stall.behind = nil // a burst's worth of entries is not kept
	}
}

// forgetBehind drops w from behind (it is closing).
func (h *Hub) forgetBehind(w *worker) {
	if h.stall.behind != nil {
		delete(h.stall.behind, w)
	}
}

// stalls are the workers whose backlog is past HardQueueLimit frames, with
// where each last made progress; the timer evicts those whose socket took
// nothing for StallTimeout. behind is nil while nobody is behind.
type stalls struct {
	behind map[*worker]stallMark
	timer  *loop.Timer
}
