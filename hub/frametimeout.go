package hub

import (
	"log/slog"
	"time"

	"github.com/listenhub/listenhub/loop"
)

// frameStarted and frameDone track the workers with an incomplete inbound
// frame (see Hub.partial.workers).
func (h *Hub) frameStarted(w *worker, now time.Time) {
	w.partialSince = now.UnixNano()
	if w.partialIdx >= 0 {
		return
	}
	w.partialIdx = int32(len(h.partial.workers))
	h.partial.workers = append(h.partial.workers, w)
	if h.partial.timer == nil && !h.stopping {
		h.partial.timer = h.loop.AfterFunc(h.frameSweep(), h.onFrameTimer)
	}
}

func (h *Hub) frameDone(w *worker) {
	h.partial.bytes -= int(w.partialBytes) // held by a paused worker too
	w.partialBytes = 0
	i := w.partialIdx
	if i < 0 {
		return
	}
	last := len(h.partial.workers) - 1
	h.partial.workers[i] = h.partial.workers[last]
	h.partial.workers[i].partialIdx = i
	h.partial.workers[last] = nil
	h.partial.workers = h.partial.workers[:last]
	w.partialIdx = -1
	if len(h.partial.workers) == 0 && cap(h.partial.workers) > 1024 {
		h.partial.workers = nil // a flood's worth of slots is not kept
	}
}

// frameSweep is how often partial frames are checked: a tenth of
// FrameTimeout, so that one is severed at most 10% late, and at most a
// second.
func (h *Hub) frameSweep() time.Duration {
	return min(max(h.cfg.FrameTimeout/10, time.Millisecond), time.Second)
}

// onFrameTimer severs the workers whose incomplete frame is older than
// FrameTimeout, and runs again while any partial frame is left.
func (h *Hub) onFrameTimer() {
	h.partial.timer = nil
	if h.stopping {
		return
	}
	if h.up != nil {
		// An upgrade is handing the workers over: none may be closed
		// under it. Look again later (the new process starts afresh).
		h.partial.timer = h.loop.AfterFunc(h.frameSweep(), h.onFrameTimer)
		return
	}
	now := h.loop.Now()
	for i := 0; i < len(h.partial.workers); {
		w := h.partial.workers[i]
		if time.Duration(now.UnixNano()-w.partialSince) < h.cfg.FrameTimeout {
			i++
			continue
		}
		h.stats.protocolErrors.Add(1)
		if h.logOK(logProtocol, slog.LevelWarn) {
			h.logLine(logProtocol, slog.LevelWarn, "worker sent an incomplete frame for too long; closing it",
				append(w.logAttrs(), "reason", reasonFrameTimeout, "buffered", w.dec.Buffered(),
					"frame_timeout", h.cfg.FrameTimeout)...)
		}
		h.closeWorker(w, reasonFrameTimeout, nil) // takes it out of partials
	}
	if len(h.partial.workers) > 0 {
		h.partial.timer = h.loop.AfterFunc(h.frameSweep(), h.onFrameTimer)
	}
}

// partialFrames are the workers holding an incomplete inbound frame, each
// at its partialIdx; the timer severs those whose frame started more than
// FrameTimeout ago. Only they are looked at, so the timer costs nothing
// while nobody is sending.
type partialFrames struct {
	workers []*worker
	timer   *loop.Timer
	// bytes is the sum of the partial frames' bytes the workers hold (as
	// of their last read), which maxPartialBytes bounds.
	bytes int
}
