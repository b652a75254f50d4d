package hub

// A worker's outbound queue: the frames the hub holds for it in its ring,
// the caps that judge it (the hard limits, the durable queue), the
// end-of-iteration flush and the write path. Loop goroutine only, except
// the writes a fanout hands to its threads (fanout.go).

import (
	"log/slog"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/loop"
)

// span is one frame's place in the ring, as absolute offsets.
type span struct {
	start, end uint64
	durable    bool // a durable wake; else an answer (ack, nack, status)
}

// advance forgets the exempt frames written in full.
func (w *worker) advance() {
	tr := w.tr
	if tr == nil {
		return
	}
	written := w.out.Written()
	for tr.exemptHead < len(tr.exempt) && tr.exempt[tr.exemptHead].end <= written {
		sp := tr.exempt[tr.exemptHead]
		if sp.durable {
			tr.durableN--
			tr.durableBytes -= int(sp.end - sp.start)
		} else {
			tr.controlN--
			tr.controlBytes -= int(sp.end - sp.start)
		}
		tr.exemptHead++
	}
	if tr.exemptHead == len(tr.exempt) {
		// Drained: reuse the storage, or give back a large one.
		if cap(tr.exempt) > 64 {
			tr.exempt = tr.exemptBuf[:0]
		} else {
			tr.exempt = tr.exempt[:0]
		}
		tr.exemptHead = 0
	} else if tr.exemptHead > len(tr.exempt)/2 && tr.exemptHead > 16 {
		n := copy(tr.exempt, tr.exempt[tr.exemptHead:])
		tr.exempt = tr.exempt[:n]
		tr.exemptHead = 0
	}
}

// pendingDurable returns the number of durable wakes not fully written.
func (w *worker) pendingDurable() int {
	if w.tr == nil {
		return 0
	}
	w.advance()
	return w.tr.durableN
}

// backlog returns the frames and bytes pending for w other than durable
// wakes and answers: what the hard limits judge.
func (w *worker) backlog() (frames, bytes int) {
	tr := w.tr
	if tr == nil {
		return w.out.Frames(), w.out.Len()
	}
	w.advance()
	n := tr.durableN + tr.controlN
	eb := tr.durableBytes + tr.controlBytes
	if n > 0 {
		// The oldest one may be partly written already.
		if s, wr := tr.exempt[tr.exemptHead].start, w.out.Written(); s < wr {
			eb -= int(wr - s)
		}
	}
	return w.out.Frames() - n, w.out.Len() - eb
}

// enqueue queues an ephemeral wake, which must not be dropped. Past the
// byte limit the worker is evicted at once: a wedged worker degrades
// itself, never its siblings, and never the Postgres reader. Past the frame
// limit it stays as long as it keeps reading (stall.go): a burst a direct
// LISTEN would deliver must not cost a reading worker its connection. It
// reports whether the frame was queued.
func (h *Hub) enqueue(w *worker, b []byte) bool {
	if w.closed || w.hold == holdDoomed {
		return false
	}
	switch h.fits(w, len(b)) {
	case pastFrames:
		if w.closed {
			return false
		}
		h.overFrames(w)
	case pastBytes:
		if !w.closed {
			h.evict(w, "bytes")
		}
		return false
	}
	if !h.roomFor(w, len(b)) {
		if !w.closed {
			h.evict(w, "max-outbound-bytes")
		}
		return false
	}
	if err := h.appendOut(w, b); err != nil {
		h.evict(w, "bytes")
		return false
	}
	h.touch(w)
	return true
}

// hardLimit says which hard limit a frame would pass.
type hardLimit uint8

const (
	withinHard hardLimit = iota
	pastFrames           // HardQueueLimit: the worker must keep reading (stall.go)
	pastBytes            // HardQueueBytes: the ceiling, evicts at once
)

// fits says which hard limit a frame of n bytes would pass. The limits
// bound what the kernel refused, not what one iteration produced: one read
// of the Postgres socket can carry thousands of NOTIFYs, so before saying
// no, fits writes out what is pending (unless the socket is known to be
// full) and looks again. In the common case nothing is near a limit and
// the single end-of-iteration write stays single. The write may close w;
// the caller checks.
//
// Durable wakes pending among the frames do not count: DurableQueueLimit
// bounds them, and a durable wake must never be the reason a worker is
// evicted (rule 4), which it would be if a hard limit below the durable one
// filled up with them and the next status evicted.
func (h *Hub) fits(w *worker, n int) hardLimit {
	if l := h.underHard(w, n); l == withinHard || w.armed {
		return l
	}
	h.write(w)
	if w.closed {
		return pastBytes
	}
	return h.underHard(w, n)
}

func (h *Hub) underHard(w *worker, n int) hardLimit {
	if w.out.Frames() < h.cfg.HardQueueLimit && w.out.Len()+n <= h.cfg.HardQueueBytes {
		return withinHard // well under: no need to tell durable wakes apart
	}
	frames, bytes := w.backlog()
	switch {
	case bytes+n > h.cfg.HardQueueBytes:
		return pastBytes
	case frames >= h.cfg.HardQueueLimit:
		return pastFrames
	}
	return withinHard
}

// bufferMax is the byte cap of a worker's ring: the hard byte limit for
// the frames it judges, plus room for DurableQueueLimit durable wakes of
// the largest size and for an ack to MaxSubscriptions subscriptions (and
// as many more answers again), which it does not judge. Nothing is
// allocated up front: the ring grows on demand.
func (h *Hub) bufferMax() int { return bufferMaxOf(&h.cfg) }

func bufferMaxOf(c *Config) int {
	return c.HardQueueBytes + c.DurableQueueLimit*maxDurableFrame + 2*c.MaxSubscriptions*maxAckFrame
}

// enqueueControl queues an answer (ack, nack, status). Answers do not count
// against the hard limits: a worker that subscribes MaxSubscriptions names
// at once gets as many acks in one iteration, and must not be evicted by
// them. What bounds them is the ring's cap (bufferMax), which has room for
// twice that many acks: only a worker that keeps sending subs without
// reading a single answer fills it, and is evicted then. It reports whether
// the frame was queued.
func (h *Hub) enqueueControl(w *worker, b []byte) bool {
	if w.closed || w.hold == holdDoomed {
		return false
	}
	if !h.roomFor(w, len(b)) {
		if !w.closed {
			h.evict(w, "max-outbound-bytes")
		}
		return false
	}
	start := w.out.Appended()
	err := h.appendOut(w, b)
	if err != nil && !w.armed {
		h.write(w) // as in fits: judged on what the kernel refused
		if w.closed {
			return false
		}
		start = w.out.Appended()
		err = h.appendOut(w, b)
	}
	if err != nil {
		h.evict(w, "answers")
		return false
	}
	tr := h.track(w)
	tr.exempt = append(tr.exempt, span{start: start, end: w.out.Appended()})
	tr.controlN++
	tr.controlBytes += len(b)
	h.touch(w)
	return true
}

// enqueueDurable queues a durable wake for subscription q, coalescing it
// into a pending unsent one for the same q, and dropping it (counted) past
// DurableQueueLimit. It never evicts, and it does not count against the
// hard limits (see fits). It reports whether a new frame was queued.
func (h *Hub) enqueueDurable(w *worker, q string, b []byte) bool {
	if w.closed || w.hold == holdDoomed {
		return false
	}
	if w.tr != nil {
		if start, ok := w.tr.durable[q]; ok && w.out.Written() <= start && start < w.out.Appended() {
			h.stats.durableCoalesced.Add(1)
			w.durableCoalesced++
			return false
		}
	}
	if w.pendingDurable() >= h.cfg.DurableQueueLimit && !w.armed {
		h.write(w) // as in fits: the limit is on what the kernel refused
		if w.closed {
			return false
		}
	}
	if w.pendingDurable() >= h.cfg.DurableQueueLimit {
		return h.dropDurable(w)
	}
	if !h.roomFor(w, len(b)) {
		// w holds the most of the outbound budget: a durable wake
		// never evicts (rule 4), so it is the one that goes.
		return h.dropDurable(w)
	}
	start := w.out.Appended()
	if err := h.appendOut(w, b); err != nil {
		// Not with bufferMax's room for durable wakes; kept as a guard.
		return h.dropDurable(w)
	}
	tr := h.track(w)
	if tr.durable == nil {
		tr.durable = make(map[string]uint64)
	}
	tr.durable[q] = start
	tr.exempt = append(tr.exempt, span{start: start, end: w.out.Appended(), durable: true})
	tr.durableN++
	tr.durableBytes += len(b)
	h.touch(w)
	return true
}

// dropDurable counts a durable wake for w dropped; it returns false, what
// enqueueDurable then reports.
func (h *Hub) dropDurable(w *worker) bool {
	h.stats.durableDropped.Add(1)
	w.durableDropped++
	return false
}

func (h *Hub) sendStatus(w *worker) {
	if w.closed {
		return
	}
	at := w.out.Appended()
	h.scratch = frame.AppendStatus(h.scratch[:0], h.healthy)
	if h.enqueueControl(w, h.scratch) {
		w.tr.statusAt, w.hasStatus = at, true
	}
}

// evict closes w for its backlog; limit names the limit it passed, more
// adds log attributes (how long a stalled worker took nothing).
func (h *Hub) evict(w *worker, limit string, more ...any) {
	h.stats.evictions.Add(1)
	if h.logOK(logEvicted, slog.LevelWarn) {
		attrs := append(w.logAttrs(),
			"limit", limit, "frames", w.out.Frames(), "bytes", w.out.Len(),
			"hard_queue_limit", h.cfg.HardQueueLimit, "hard_queue_bytes", h.cfg.HardQueueBytes)
		h.logLine(logEvicted, slog.LevelWarn, "worker evicted: outbound backlog over the hard limit", append(attrs, more...)...)
	}
	h.closeWorker(w, reasonEvicted, nil)
}

// flush runs at the end of every loop iteration: each worker touched in it
// gets one write carrying everything it has pending. Workers waiting for
// EPOLLOUT are skipped: their socket was full a moment ago, and the
// Writable event flushes them.
func (h *Hub) flush() {
	if len(h.out.doomed) > 0 && h.up == nil {
		h.closeDoomed()
	}
	if len(h.dirty) >= parallelMin && h.cfg.WriteThreads > 1 && h.writers.load.idle() {
		h.flushParallel()
	}
	for i, w := range h.dirty {
		h.dirty[i] = nil
		w.dirty = false
		if !w.closed && !w.armed {
			h.write(w)
		}
	}
	h.dirty = h.dirty[:0]
	h.out.noVictim = false
	if h.out.bytes > h.cfg.MaxOutboundBytes && h.up == nil {
		h.enforceBudget()
	}
	if len(h.closedWorkers) > 0 {
		h.recycle()
	}
	h.stats.outBytes.Store(int64(h.out.bytes)) // once here, not per frame: an atomic store per subscriber would cost a fanout
	// One clock read per iteration, however many notifications and
	// workers.
	now := time.Now()
	h.writers.load.iteration(h.loop.Now(), now)
	if h.iter.notifs > 0 {
		// Each notification waited from the iteration's start to here.
		h.fanoutLatency.Observe(now.Sub(h.iter.notifAt), h.iter.notifs)
		h.iter.notifs = 0
	}
}

// write makes one write (or writev, when the ring wraps) of everything
// pending, keeps what the kernel refused, and arms EPOLLOUT for exactly
// that remainder.
func (h *Hub) write(w *worker) {
	if a, _ := w.out.Peek(); len(a) == 0 {
		h.disarm(w)
		return
	}
	n, err := rawWrite(w, h.iov)
	h.wrote(w, n, err)
}

// wrote applies the result of w's write: n bytes taken, or err.
func (h *Hub) wrote(w *worker, n int, err error) {
	switch {
	case err == unix.EAGAIN:
		n = 0
	case err != nil:
		h.closeWorker(w, reasonWriteError, err) // the reason says write(2)
		return
	}
	if n > 0 {
		frames := w.out.Frames()
		w.out.Discard(n)
		h.out.bytes -= n
		sent := uint64(frames - w.out.Frames())
		w.framesSent += sent
		h.stats.framesSent.Add(sent)
		if w.hold == holdPaused {
			h.maybeResume(w)
			if w.closed {
				return
			}
		}
	}
	if w.out.Len() == 0 {
		h.untrack(w) // every tracked frame is written
		h.disarm(w)
		return
	}
	if !w.armed {
		if err := h.loop.Modify(w.tok, h.readable(w)|loop.Writable); err != nil {
			h.closeWorker(w, reasonWriteError, err)
			return
		}
		w.armed = true
	}
}

func (h *Hub) disarm(w *worker) {
	if !w.armed {
		return
	}
	w.armed = false
	if err := h.loop.Modify(w.tok, h.readable(w)); err != nil {
		h.closeWorker(w, reasonWriteError, err)
	}
}
