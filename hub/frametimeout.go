package hub

import (
	"log/slog"
	"time"
)

// frameStarted and frameDone track the workers with an incomplete inbound
// frame (see Hub.partials).
func (h *Hub) frameStarted(w *worker, now time.Time) {
	w.partialSince = now.UnixNano()
	if w.partialIdx >= 0 {
		return
	}
	w.partialIdx = int32(len(h.partials))
	h.partials = append(h.partials, w)
	if h.frameTimer == nil && !h.stopping {
		h.frameTimer = h.loop.AfterFunc(h.frameSweep(), h.onFrameTimer)
	}
}

func (h *Hub) frameDone(w *worker) {
	h.partialBytes -= int(w.partialBytes) // held by a paused worker too
	w.partialBytes = 0
	i := w.partialIdx
	if i < 0 {
		return
	}
	last := len(h.partials) - 1
	h.partials[i] = h.partials[last]
	h.partials[i].partialIdx = i
	h.partials[last] = nil
	h.partials = h.partials[:last]
	w.partialIdx = -1
	if len(h.partials) == 0 && cap(h.partials) > 1024 {
		h.partials = nil // a flood's worth of slots is not kept
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
	h.frameTimer = nil
	if h.stopping {
		return
	}
	if h.up != nil {
		// An upgrade is handing the workers over: none may be closed
		// under it. Look again later (the new process starts afresh).
		h.frameTimer = h.loop.AfterFunc(h.frameSweep(), h.onFrameTimer)
		return
	}
	now := h.loop.Now()
	for i := 0; i < len(h.partials); {
		w := h.partials[i]
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
	if len(h.partials) > 0 {
		h.frameTimer = h.loop.AfterFunc(h.frameSweep(), h.onFrameTimer)
	}
}
