package hub

import (
	"log/slog"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/channame"
	"github.com/listenhub/listenhub/internal/enum"
	"github.com/listenhub/listenhub/internal/ring"
	"github.com/listenhub/listenhub/internal/wire"
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

	dec wire.Decoder
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
	// Hub.partial.workers, -1 when dec holds no partial frame.
	partialSince int64
	partialIdx   int32
	// partialBytes is this worker's share of Hub.partial.bytes (at most
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

func (h *Hub) onWorkerEvent(w *worker, ev loop.Events) {
	if w.closed || w.hold == holdDoomed {
		return
	}
	if h.up != nil {
		h.frozenEvent(w, ev) // a hot upgrade holds the workers (upgrade_handover.go)
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
		m, ok, err := w.next()
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
	h.partial.bytes += held - int(w.partialBytes)
	w.partialBytes = int32(held)
	if held > smallFrame && h.partial.bytes > maxPartialBytes {
		h.stats.protocolErrors.Add(1)
		if h.logOK(logProtocol, slog.LevelWarn) {
			h.logLine(logProtocol, slog.LevelWarn, "worker holds a large partial frame while the hub's inbound budget is spent; closing it",
				append(w.logAttrs(), "reason", reasonInboundBudget, "buffered", held, "hub_partial_bytes", h.partial.bytes,
					"max_partial_bytes", maxPartialBytes)...)
		}
		h.closeWorker(w, reasonInboundBudget, nil)
	}
}

func (h *Hub) handle(w *worker, m *frame.Message) {
	switch m.Type {
	case "sub":
		if m.NameNotUTF8 {
			// Decoded with U+FFFD in it, the name is not the one the
			// worker meant: an ack for it would never match. The nack
			// carries the bytes it sent ("q64"), which the worker can.
			h.refuseSubQ64(w, m.Name, m.NameRaw, channame.ErrNotUTF8.Error())
			return
		}
		h.subscribe(w, m.Name)
	case "unsub":
		if m.NameNotUTF8 {
			return // never subscribed: its sub was refused
		}
		h.unsubscribe(w, m.Name)
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
				append(w.logAttrs(), "type", logName(m.Type))...)
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
	h.forgetBehind(w)
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
	w.dec = wire.Decoder{}
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

// next decodes the worker's next whole frame from its splitter. The error
// for an oversized header is frame's, so that the log says what a worker in
// Go would be told by frame.Decoder.
func (w *worker) next() (m frame.Message, ok bool, err error) {
	body, ok, err := w.dec.Next()
	le, tooLarge := err.(*wire.LengthError)
	switch {
	case tooLarge:
		return m, false, &frame.Error{Err: frame.ErrTooLarge, Offset: -1, Length: le.Length, Limit: le.Limit}
	case err != nil || !ok:
		return m, false, err
	}
	if m, err = frame.Decode(body); err != nil {
		return m, false, w.dec.Fail(err)
	}
	return m, true, nil
}
