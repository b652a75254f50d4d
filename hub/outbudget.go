package hub

import (
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/listenhub/listenhub/loop"
)

// What the hub holds for workers is bounded twice (docs/design.md, "Side
// doors"):
//
//   - per worker, the answers (ack, nack, status) it has not read: past
//     answerPause bytes of them the hub stops reading that worker (its
//     input waits in the kernel, and its writes block once the socket
//     buffer is full) until they drain to answerResume. A sub is the only
//     frame that makes the hub answer, so a worker that never reads its
//     answers holds at most answerPause, one read's answers and the acks
//     owed for the LISTENs it already started (MaxSubscriptions at most);
//     it is not evicted for it: backpressure, not a penalty.
//   - all workers together, every byte queued (wakes, answers, status):
//     Config.MaxOutboundBytes. Past it the worker holding the most unsent
//     bytes is evicted (a durable wake is dropped instead when that worker
//     is the one it is for), again and again until the frame at hand fits,
//     so a worker with a small backlog never pays for a large one.

// holdState is what the budget did to a worker: nothing, paused its reads,
// or doomed it.
type holdState uint8

const (
	holdNone holdState = iota
	holdPaused
	holdDoomed
)

const (
	// answerPause is the unsent answer bytes past which a worker is no
	// longer read. 64 KiB is over 1,000 acks of a typical name: a worker
	// subscribing its whole set at once is paused only while it does
	// not read, and nothing is lost by pausing (its subs wait in the
	// kernel).
	answerPause = 64 << 10
	// answerResume is where reading starts again: well below the pause,
	// so that a worker reading slowly is not paused and resumed on every
	// frame.
	answerResume = answerPause / 4

	// Bounds of the default MaxOutboundBytes, an eighth of the memory
	// the process may use: at least 64 MiB (eight workers at the default
	// hard byte cap), at most 4 GiB (a host with 32 GiB and more does
	// not need the hub to hold more than that for workers that are
	// behind).
	minDefaultOutbound = 64 << 20
	maxDefaultOutbound = 4 << 30
)

// defaultMaxOutboundBytes is the default of Config.MaxOutboundBytes: an
// eighth of the memory available to the process (physical memory, or the
// cgroup's memory.max when that is lower), at least 64 MiB and at most 4 GiB.
func defaultMaxOutboundBytes() int {
	mem := physicalMemory()
	if cg := cgroupMemoryMax(); cg > 0 && (mem == 0 || cg < mem) {
		mem = cg
	}
	return outboundFor(mem)
}

// outboundFor is the default budget for mem bytes of memory (0: unknown).
func outboundFor(mem uint64) int {
	if mem == 0 {
		return minDefaultOutbound
	}
	return int(min(max(mem/8, minDefaultOutbound), maxDefaultOutbound))
}

// cgroupMemoryMax reads the cgroup v2 memory limit of the process, 0 when
// there is none (or no cgroup v2).
func cgroupMemoryMax() uint64 {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		path, ok := strings.CutPrefix(line, "0::")
		if !ok {
			continue
		}
		v, err := os.ReadFile("/sys/fs/cgroup" + strings.TrimSpace(path) + "/memory.max")
		if err != nil {
			return 0
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(v)), 10, 64)
		if err != nil {
			return 0 // "max"
		}
		return n
	}
	return 0
}

// appendOut queues b on w's ring, counted in the hub's outbound total.
func (h *Hub) appendOut(w *worker, b []byte) error {
	err := w.out.Append(b)
	if err == nil {
		h.out.bytes += len(b) // published once per iteration, by flush
	}
	return err
}

// dropOut forgets everything w has queued (it is closing or evicted).
func (h *Hub) dropOut(w *worker) {
	h.out.bytes -= w.out.Len()
	w.out.Reset()
}

// countOut recounts the outbound total from the rings: for a new process
// that adopted workers with their unsent bytes.
func (h *Hub) countOut() {
	h.out.bytes = 0
	for _, w := range h.workers.list {
		h.out.bytes += w.out.Len()
	}
	h.stats.outBytes.Store(int64(h.out.bytes))
}

// readable is the read half of w's interest: none while an upgrade holds
// the workers or while w's unread answers paused it.
func (h *Hub) readable(w *worker) loop.Events {
	if w.hold != holdNone {
		return 0
	}
	return h.readInterest()
}

// answersOwed returns the answer bytes queued for w and not yet written.
func (w *worker) answersOwed() int {
	if w.tr == nil {
		return 0
	}
	w.advance()
	return w.tr.controlBytes
}

// checkAnswers pauses reading w once its unread answers pass answerPause.
// Called after a read's frames were handled.
func (h *Hub) checkAnswers(w *worker) {
	if w.hold != holdNone || w.tr == nil || w.tr.controlBytes <= answerPause || w.answersOwed() <= answerPause {
		return
	}
	w.hold = holdPaused
	h.stats.readPauses.Add(1)
	h.stats.paused.Add(1)
	if w.partialIdx >= 0 {
		// Its frame is incomplete because the hub stopped reading,
		// not because the worker is slow: its clock stops (its bytes
		// stay counted toward maxPartialBytes), and starts afresh
		// when reading does.
		held := w.partialBytes
		h.frameDone(w)
		w.partialBytes = held
		h.partial.bytes += int(held)
	}
	ev := loop.Events(0)
	if w.armed {
		ev = loop.Writable
	}
	if err := h.loop.Modify(w.tok, ev); err != nil {
		h.closeWorker(w, reasonRegister, err)
		return
	}
	if h.logOK(logPaused, slog.LevelInfo) {
		h.logLine(logPaused, slog.LevelInfo, "worker not read until it reads its answers",
			append(w.logAttrs(), "answers_bytes", w.tr.controlBytes, "pause_at", answerPause)...)
	}
}

// maybeResume reads w again once its unread answers drained to
// answerResume. Called after a write took some of them.
func (h *Hub) maybeResume(w *worker) {
	if w.hold != holdPaused || w.answersOwed() > answerResume {
		return
	}
	w.hold = holdNone
	h.stats.paused.Add(-1)
	if w.dec.Buffered() > 0 {
		h.frameStarted(w, h.loop.Now())
	}
	ev := h.readable(w)
	if w.armed {
		ev |= loop.Writable
	}
	if err := h.loop.Modify(w.tok, ev); err != nil {
		h.closeWorker(w, reasonRegister, err)
	}
}

// roomFor makes room in the outbound budget for n more bytes to w. It
// reports false when w itself holds the most and must pay: the caller
// evicts it (a wake it must not drop, an answer) or drops the frame (a
// durable wake). Other workers are never closed here, in the middle of a
// walk of a routing table: the one that pays is doomed (its bytes freed at
// once, its frames refused) and closed at the end of the iteration.
func (h *Hub) roomFor(w *worker, n int) bool {
	if h.out.bytes+n <= h.cfg.MaxOutboundBytes {
		return true
	}
	if !w.armed {
		// Bytes produced in this iteration are nobody's fault yet:
		// w's go now (w is the worker at hand, which a routing walk
		// may lose), the others' at the flush.
		h.write(w)
		if w.closed {
			return false
		}
	}
	for h.out.bytes+n > h.cfg.MaxOutboundBytes && !h.out.noVictim {
		v := h.largestBehind()
		if v == nil {
			// Only unflushed bytes: the flush writes them, and
			// enforceBudget judges what is left.
			h.out.noVictim = true
			break
		}
		if v == w {
			return false
		}
		h.doom(v)
	}
	return true
}

// largestBehind returns the worker holding the most unsent bytes among
// those the kernel refused (armed), or nil. It walks every worker: it runs
// only past the budget, and each call ends with a worker's whole backlog
// freed.
func (h *Hub) largestBehind() *worker {
	var big *worker
	most := 0
	for _, v := range h.workers.list {
		if v.armed && v.hold != holdDoomed && !v.closed && v.out.Len() > most {
			big, most = v, v.out.Len()
		}
	}
	return big
}

// doom evicts v for the outbound budget without closing it yet: its bytes
// are freed now, it gets no more frames, and flush closes it.
func (h *Hub) doom(v *worker) {
	h.stats.evictions.Add(1)
	if h.logOK(logEvicted, slog.LevelWarn) {
		h.logLine(logEvicted, slog.LevelWarn, "worker evicted: it holds the most of the hub's outbound budget",
			append(v.logAttrs(), "limit", "max-outbound-bytes", "bytes", v.out.Len(), "frames", v.out.Frames(),
				"hub_outbound_bytes", h.out.bytes, "max_outbound_bytes", h.cfg.MaxOutboundBytes)...)
	}
	if v.hold == holdPaused {
		h.stats.paused.Add(-1)
	}
	v.hold = holdDoomed
	h.dropOut(v)
	h.untrack(v)
	h.out.doomed = append(h.out.doomed, v)
}

// closeDoomed closes the workers doomed in this iteration.
func (h *Hub) closeDoomed() {
	for i, v := range h.out.doomed {
		h.out.doomed[i] = nil
		h.closeWorker(v, reasonEvicted, nil)
	}
	h.out.doomed = h.out.doomed[:0]
}

// enforceBudget runs at the end of an iteration's flush, when every byte
// still queued is one the kernel refused: while the hub holds more than
// the budget, the worker holding the most is evicted.
func (h *Hub) enforceBudget() {
	for h.out.bytes > h.cfg.MaxOutboundBytes {
		v := h.largestBehind()
		if v == nil {
			return
		}
		h.doom(v)
		h.closeDoomed()
	}
}

// outbound is the hub's account of what it queued for workers.
type outbound struct {
	// bytes is the bytes queued on every worker's ring, which
	// MaxOutboundBytes bounds.
	bytes int
	// doomed are the workers evicted for it in this iteration, closed by
	// flush; noVictim says a look for one to evict found none in this
	// iteration.
	doomed   []*worker
	noVictim bool
}
