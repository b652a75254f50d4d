package hub

import (
	"log/slog"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/channame"
	"github.com/listenhub/listenhub/internal/enum"
	"github.com/listenhub/listenhub/internal/ring"
	"github.com/listenhub/listenhub/loop"
)

// closeReason says why the hub closed a worker connection.
type closeReason uint8

const (
	reasonPeerClosed    closeReason = iota + 1 // EOF from the worker
	reasonReadError                            // read(2) failed
	reasonWriteError                           // write(2) failed (EPIPE, ECONNRESET, ...)
	reasonProtocol                             // malformed frame (rule 9)
	reasonEvicted                              // backlog over the hard limit (rule 3)
	reasonNotAllowed                           // peer uid not in AllowUIDs
	reasonHubStopping                          // Stop
	reasonRegister                             // the loop refused the fd
	reasonFrameTimeout                         // a frame incomplete for FrameTimeout
	reasonInboundBudget                        // a large partial frame past maxPartialBytes
	reasonShed                                 // shed: RLIMIT_NOFILE lowered below what workers hold
)

// closeReasonNames are the String forms, indexed by value.
var closeReasonNames = [...]string{
	reasonPeerClosed: "peer closed", reasonReadError: "read error",
	reasonWriteError: "write error", reasonProtocol: "protocol error",
	reasonEvicted: "evicted", reasonNotAllowed: "uid not allowed",
	reasonHubStopping: "hub stopping", reasonRegister: "register failed",
	reasonFrameTimeout: "frame timeout", reasonInboundBudget: "inbound budget",
	reasonShed: "shed: out of file descriptors",
}

func (r closeReason) String() string { return enum.Name(closeReasonNames[:], int(r), "closeReason") }

// LogValue makes slog print the reason by name in every handler (the JSON
// handler does not use String).
func (r closeReason) LogValue() slog.Value { return slog.StringValue(r.String()) }

// worker is one connected worker process. Loop goroutine only.
type worker struct {
	id uint64
	fd int32 // int32, with waiting: the struct's size class is tight
	// waiting counts this worker's entries in channel waiter lists: subs
	// owed an answer. MaxSubscriptions caps it, so that repeating a sub
	// while its LISTEN is in flight cannot grow a waiter list for ever.
	waiting  int32
	tok      loop.Token
	pid, uid int32

	dec frame.Decoder
	// out holds the frames produced and not yet taken by the kernel, in
	// production order; its Max is HardQueueBytes. Empty, it holds no
	// storage.
	out ring.Buffer
	// armed is true while EPOLLOUT is in the interest set, which is
	// exactly while out is non-empty after a write the kernel cut short.
	armed bool
	// dirty is true while the worker is in Hub.dirty, to be flushed at
	// the end of this iteration.
	dirty  bool
	closed bool
	// active says the worker was touched in the current status interval,
	// wasActive in the one before. A worker active in both keeps its
	// drained ring storage (out.Retain) instead of borrowing and returning
	// it on every iteration; the others give it back at the next tick, so
	// an idle worker holds no buffer. The periodic status, one interval in
	// statusEvery, never makes a worker busy on its own.
	active, wasActive bool
	// hasStatus: see statusAt. (The flags sit together: each alone
	// would take a word with its padding.)
	hasStatus     bool
	unknownLogged bool // an unknown frame type was logged once at warn
	// hold is what the outbound budget did to the worker (outbudget.go):
	// holdPaused, it is not read while its unread answers are past
	// answerPause; holdDoomed, it was evicted in this iteration, its
	// bytes are freed and flush closes it.
	hold holdState

	// subs are this worker's subscriptions.
	subs subSet

	// partialSince is when the incomplete frame in dec started arriving
	// (unix nanoseconds); partialIdx is the worker's index in
	// Hub.partials, -1 when dec holds no partial frame.
	partialSince int64
	partialIdx   int32
	// partialBytes is this worker's share of Hub.partialBytes (at most
	// maxInboundFrame and a header).
	partialBytes int32

	// tr tracks the durable wakes and answers among the frames in out;
	// nil while there are none, which is nearly always for an idle
	// worker (see tracked).
	tr *tracked

	// onEvent is the worker's loop handler, made once per worker struct:
	// a struct is reused for later connections (Hub.freeWorkers), and so
	// is its handler.
	onEvent loop.Handler

	// For Hub.Workers: when it connected, and its share of the hub's
	// counters.
	connectedAt      int64 // unix nanoseconds (a time.Time is 24 bytes)
	framesSent       uint64
	durableCoalesced uint64
	durableDropped   uint64

	idx int32 // in Hub.workers
}

func (w *worker) logAttrs() []any {
	return []any{"worker", w.id, "pid", w.pid, "fd", w.fd}
}

// tracked is the part of a worker's state that only a worker with durable
// wakes or answers not yet written needs. It is taken from the hub's free
// list when the first such frame is queued and given back when out drains:
// an idle worker, which is what a hub holds most of, does without its 136
// bytes (docs/performance.md, idle memory).
type tracked struct {
	// durable maps a subscription name to the ring offset where this
	// worker's latest durable wake for it starts. While out.Written() is
	// not past that offset the wake is wholly unsent, and a new durable
	// wake for the same name merges into it (rule 4).
	durable map[string]uint64
	// exempt are the ring offsets of the frames not fully written that the
	// hard limits do not judge, oldest first from exemptHead: durable
	// wakes (DurableQueueLimit caps their number; rule 4: they never
	// cause an eviction) and answers (ack, nack, status: their number is
	// bounded by the worker's subscriptions, and a worker that subscribes
	// MaxSubscriptions names at once must not be evicted by its own
	// acks). durableN/durableBytes and controlN/controlBytes count them by
	// kind. The hard limits judge the rest of the backlog: ephemeral
	// wakes.
	exempt     []span
	exemptHead int
	// exemptBuf is exempt's storage while it holds no more than this:
	// the status sent on connect and the odd ack need no allocation.
	exemptBuf    [2]span
	durableN     int
	durableBytes int
	controlN     int
	controlBytes int

	// statusAt is the ring offset of the latest status frame (while the
	// worker's hasStatus is set), so a periodic re-send can skip a worker
	// whose last status is still unsent.
	statusAt uint64
}

// freeListMax bounds the hub's free lists of worker and tracked structs:
// enough for the connections that come and go within a few iterations,
// little next to what that many workers hold while connected.
const freeListMax = 1024

// track returns w's tracked state, taking it from the free list first.
func (h *Hub) track(w *worker) *tracked {
	if w.tr != nil {
		return w.tr
	}
	tr := pop(&h.freeTracked)
	if tr == nil {
		tr = new(tracked)
		tr.exempt = tr.exemptBuf[:0]
	}
	w.tr = tr
	return tr
}

// pop takes the last struct off a free list, or returns nil.
func pop[T any](free *[]*T) *T {
	n := len(*free)
	if n == 0 {
		return nil
	}
	x := (*free)[n-1]
	(*free)[n-1] = nil
	*free = (*free)[:n-1]
	return x
}

// untrack gives w's tracked state back, once out holds none of the frames
// it tracks (it drained, or the worker closed).
func (h *Hub) untrack(w *worker) {
	tr := w.tr
	if tr == nil {
		return
	}
	w.tr, w.hasStatus = nil, false
	if len(tr.durable) > smallSubs {
		tr.durable = nil // a worker with many names: do not keep its map
	} else {
		clear(tr.durable)
	}
	exempt := tr.exemptBuf[:0]
	if c := cap(tr.exempt); c > len(tr.exemptBuf) && c <= 64 {
		exempt = tr.exempt[:0]
	}
	*tr = tracked{durable: tr.durable, exempt: exempt}
	if len(h.freeTracked) < freeListMax {
		h.freeTracked = append(h.freeTracked, tr)
	}
}

// newWorker returns a zeroed worker struct, reusing one of a closed
// connection when there is one: connections that come and go then cost the
// hub no garbage (docs/performance.md, churn).
func (h *Hub) newWorker() *worker {
	if w := pop(&h.freeWorkers); w != nil {
		return w
	}
	w := new(worker)
	w.onEvent = func(ev loop.Events) { h.onWorkerEvent(w, ev) }
	return w
}

// recycle makes the workers closed in this iteration reusable. It runs at
// the end of the iteration's flush, when nothing refers to them any more:
// closeWorker took each out of the routing table, the waiter lists, the
// partial list and the workers map, and the flush dropped the dirty list.
// The loop refuses events for their old registrations (a stale token).
func (h *Hub) recycle() {
	for i, w := range h.closedWorkers {
		h.closedWorkers[i] = nil
		h.freeWorker(w)
	}
	h.closedWorkers = h.closedWorkers[:0]
}

// freeWorker zeroes w and keeps it for newWorker, unless the free list is
// full. Only for a worker nothing refers to any more.
func (h *Hub) freeWorker(w *worker) {
	if len(h.freeWorkers) >= freeListMax {
		return
	}
	*w = worker{onEvent: w.onEvent, subs: w.subs} // subs: reset, its storage kept
	h.freeWorkers = append(h.freeWorkers, w)
}

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

func (h *Hub) onWorkerEvent(w *worker, ev loop.Events) {
	if w.closed || w.hold == holdDoomed {
		return
	}
	if h.up != nil {
		h.frozenEvent(w, ev) // a hot upgrade holds the workers (handover.go)
		return
	}
	if ev&loop.Readable != 0 {
		h.read(w)
		if w.closed {
			return
		}
	}
	if ev&loop.Writable != 0 && w.armed {
		h.write(w)
	}
}

// read takes one read's worth of input (level-triggered: more brings the
// handler back) and handles every whole frame in it.
func (h *Hub) read(w *worker) {
	n, err := unix.Read(int(w.fd), h.rbuf)
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		return
	case err != nil:
		h.closeWorker(w, reasonReadError, err) // the reason says read(2)
		return
	case n == 0:
		h.closeWorker(w, reasonPeerClosed, nil)
		return
	}
	// Borrowed: workers send whole frames, which are decoded straight
	// from rbuf; only a frame cut short is copied (and only it costs the
	// worker a buffer).
	w.dec.FeedBorrowed(h.rbuf[:n])
	decoded := false
	for !w.closed {
		m, ok, err := w.dec.Next()
		if err != nil {
			h.stats.protocolErrors.Add(1)
			if h.logOK(logProtocol, slog.LevelWarn) {
				h.logLine(logProtocol, slog.LevelWarn, "worker sent a malformed frame; closing it",
					append(w.logAttrs(), "reason", err)...)
			}
			h.closeWorker(w, reasonProtocol, err)
			return
		}
		if !ok {
			break
		}
		decoded = true
		h.handle(w, &m)
	}
	if w.closed {
		return
	}
	h.checkAnswers(w)
	if w.closed {
		return
	}
	// A frame incomplete for FrameTimeout severs the worker: the clock
	// starts with the read that began the frame.
	switch {
	case w.dec.Buffered() == 0:
		h.frameDone(w)
		return
	case w.hold == holdPaused:
		// Not on the frame clock while the hub does not read it
		// (checkAnswers); its bytes are counted below all the same.
	case decoded || w.partialIdx < 0:
		h.frameStarted(w, h.loop.Now())
	}
	// Every worker may hold a partial frame of up to maxInboundFrame;
	// all of them together may hold maxPartialBytes (maxPartial). Past
	// that, a worker whose partial frame is larger than any frame the
	// protocol needs is severed: what workers send (sub, unsub) is far
	// smaller, so the budget only bites those sending what no worker
	// needs to.
	held := w.dec.Buffered()
	h.partialBytes += held - int(w.partialBytes)
	w.partialBytes = int32(held)
	if held > smallFrame && h.partialBytes > maxPartialBytes {
		h.stats.protocolErrors.Add(1)
		if h.logOK(logProtocol, slog.LevelWarn) {
			h.logLine(logProtocol, slog.LevelWarn, "worker holds a large partial frame while the hub's inbound budget is spent; closing it",
				append(w.logAttrs(), "reason", reasonInboundBudget, "buffered", held, "hub_partial_bytes", h.partialBytes,
					"max_partial_bytes", maxPartialBytes)...)
		}
		h.closeWorker(w, reasonInboundBudget, nil)
	}
}

func (h *Hub) handle(w *worker, m *frame.Message) {
	switch m.T {
	case "sub":
		if m.QNotUTF8 {
			// Decoded with U+FFFD in it, the name is not the one the
			// worker meant: an ack for it would never match. The nack
			// carries the bytes it sent ("q64"), which the worker can.
			h.refuseSubQ64(w, m.Q, m.QRaw, channame.ErrNotUTF8.Error())
			return
		}
		h.subscribe(w, m.Q)
	case "unsub":
		if m.QNotUTF8 {
			return // never subscribed: its sub was refused
		}
		h.unsubscribe(w, m.Q)
	default:
		// Unknown (or hub-to-worker) types are skipped: a newer client
		// may speak an extension this hub does not know.
		level := slog.LevelDebug
		if !w.unknownLogged {
			w.unknownLogged = true
			level = slog.LevelWarn
		}
		// Guarded: this runs per frame, and the arguments allocate even
		// when the level is off.
		if h.logOK(logUnknownType, level) {
			h.logLine(logUnknownType, level, "worker sent an unknown frame type; skipped",
				append(w.logAttrs(), "type", logName(m.T))...)
		}
	}
}

// touch puts w on the list flushed at the end of this iteration.
func (h *Hub) touch(w *worker) {
	w.active = true
	if !w.dirty {
		w.dirty = true
		h.dirty = append(h.dirty, w)
	}
}

// enqueue queues an ephemeral wake, which must not be dropped. Past either
// hard limit the worker is evicted: a wedged worker degrades itself, never
// its siblings, and never the Postgres reader. It reports whether the frame
// was queued.
func (h *Hub) enqueue(w *worker, b []byte) bool {
	if w.closed || w.hold == holdDoomed {
		return false
	}
	if !h.fits(w, len(b)) {
		h.evict(w, h.overLimit(w))
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

// fits reports whether a frame of n bytes can be queued under both hard
// limits. The limits bound what the kernel refused, not what one iteration
// produced: one read of the Postgres socket can carry thousands of
// NOTIFYs, so before saying no, fits writes out what is pending (unless the
// socket is known to be full) and looks again. In the common case nothing
// is near a limit and the single end-of-iteration write stays single.
//
// Durable wakes pending among the frames do not count: DurableQueueLimit
// bounds them, and a durable wake must never be the reason a worker is
// evicted (rule 4), which it would be if a hard limit below the durable one
// filled up with them and the next status evicted.
func (h *Hub) fits(w *worker, n int) bool {
	if h.underHard(w, n) {
		return true
	}
	if w.armed {
		return false
	}
	h.write(w)
	if w.closed {
		return false
	}
	return h.underHard(w, n)
}

func (h *Hub) underHard(w *worker, n int) bool {
	if w.out.Frames() < h.cfg.HardQueueLimit && w.out.Len()+n <= h.cfg.HardQueueBytes {
		return true // well under: no need to tell durable wakes apart
	}
	frames, bytes := w.backlog()
	return frames < h.cfg.HardQueueLimit && bytes+n <= h.cfg.HardQueueBytes
}

func (h *Hub) overLimit(w *worker) string {
	if frames, _ := w.backlog(); frames >= h.cfg.HardQueueLimit {
		return "frames"
	}
	return "bytes"
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

func (h *Hub) evict(w *worker, limit string) {
	h.stats.evictions.Add(1)
	if h.logOK(logEvicted, slog.LevelWarn) {
		h.logLine(logEvicted, slog.LevelWarn, "worker evicted: outbound backlog over the hard limit", append(w.logAttrs(),
			"limit", limit, "frames", w.out.Frames(), "bytes", w.out.Len(),
			"hard_queue_limit", h.cfg.HardQueueLimit, "hard_queue_bytes", h.cfg.HardQueueBytes)...)
	}
	h.closeWorker(w, reasonEvicted, nil)
}

// flush runs at the end of every loop iteration: each worker touched in it
// gets one write carrying everything it has pending. Workers waiting for
// EPOLLOUT are skipped: their socket was full a moment ago, and the
// Writable event flushes them.
func (h *Hub) flush() {
	if len(h.doomedList) > 0 && h.up == nil {
		h.closeDoomed()
	}
	if len(h.dirty) >= parallelMin && h.cfg.WriteThreads > 1 && h.load.idle() {
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
	h.noVictim = false
	if h.outBytes > h.cfg.MaxOutboundBytes && h.up == nil {
		h.enforceBudget()
	}
	if len(h.closedWorkers) > 0 {
		h.recycle()
	}
	h.stats.outBytes.Store(int64(h.outBytes)) // once here, not per frame: an atomic store per subscriber would cost a fanout
	// One clock read per iteration, however many notifications and
	// workers.
	now := time.Now()
	h.load.iteration(h.loop.Now(), now)
	if h.notifs > 0 {
		// Each notification waited from the iteration's start to here.
		h.fanoutLatency.Observe(now.Sub(h.notifAt), h.notifs)
		h.notifs = 0
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
		h.outBytes -= n
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

// closeWorker closes the connection (the worker sees EOF), takes the worker
// out of every channel (UNLISTENing those it was the last subscriber of)
// and frees its buffer. err, if any, is only logged: a system call's errno
// comes bare (an Errno below 256 in an interface allocates nothing, and
// workers that vanish mid-write are routine), next to the reason that names
// the call.
func (h *Hub) closeWorker(w *worker, reason closeReason, err error) {
	if w.closed {
		return
	}
	w.closed = true
	h.frameDone(w)
	for w.subs.len() > 0 {
		h.dropSub(w, w.subs.list[w.subs.len()-1].ch)
	}
	if !h.closed {
		_ = h.loop.Unregister(w.tok)
	}
	// Counted gone before the close: a peer that saw EOF sees the gauge.
	h.workers.remove(w)
	h.stats.workers.Add(-1)
	unix.Close(int(w.fd))
	h.dropOut(w)
	if w.hold == holdPaused {
		h.stats.paused.Add(-1)
	}
	w.dec = frame.Decoder{}
	h.untrack(w)
	w.subs.reset()
	if h.logOK(logDisconnect, slog.LevelInfo) { // as in admit: the arguments would allocate for nothing
		attrs := append(w.logAttrs(), "reason", reason)
		if err != nil {
			attrs = append(attrs, "error", err)
		}
		h.logLine(logDisconnect, slog.LevelInfo, "worker disconnected", attrs...)
	}
	if !h.closed {
		h.closedWorkers = append(h.closedWorkers, w) // reused after this iteration
	}
}
