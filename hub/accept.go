package hub

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/peercred"
	"github.com/listenhub/listenhub/loop"
)

// onAcceptable accepts up to AcceptBatch connections. Level-triggered: more
// waiting connections bring the handler back next iteration, after the
// other fds had their turn.
func (h *Hub) onAcceptable(ev loop.Events) {
	if h.stopping || h.accepting.paused {
		return
	}
	for i := 0; i < h.cfg.AcceptBatch; i++ {
		fd, err := accept(h.sock.fd)
		switch err {
		case nil:
			h.admit(fd)
		case unix.EAGAIN:
			return
		case unix.EINTR, unix.ECONNABORTED:
			// The peer gave up before we got to it; next one.
		case unix.EMFILE, unix.ENFILE:
			// Out of descriptors, though workers are capped below the
			// limit: something else holds them. Refuse what waits
			// (with the spare descriptor) rather than leave it hanging
			// in the backlog; without the spare, pause. The limit may
			// have been lowered under the hub: read it again, and shed
			// the newest workers past it.
			h.rebudgetFDs()
			h.shedNewest()
			if !h.shedWithSpare() {
				h.pauseAccept(err)
			}
			return
		case unix.ENOBUFS, unix.ENOMEM:
			// Level-triggered readiness would bring us straight back:
			// stop listening for a moment instead of spinning.
			h.pauseAccept(err)
			return
		default:
			if h.logOK(logAccept, slog.LevelError) {
				h.logLine(logAccept, slog.LevelError, "accept failed", "reason", os.NewSyscallError(acceptCall, err))
			}
			h.onSocketCheck() // the socket's directory may have changed
			h.pauseAccept(err)
			return
		}
	}
}

func (h *Hub) pauseAccept(err error) {
	if h.logOK(logAccept, slog.LevelWarn) {
		h.logLine(logAccept, slog.LevelWarn, "accept paused", "reason", os.NewSyscallError(acceptCall, err),
			"pause", acceptPause, "workers", h.workers.len())
	}
	h.accepting.paused = true
	if err := h.loop.Modify(h.sock.tok, 0); err != nil {
		h.log.Error("pause accept", "reason", err)
	}
	h.accepting.timer = h.loop.AfterFunc(acceptPause, func() {
		h.accepting.timer = nil
		if h.stopping {
			return
		}
		h.accepting.paused = false
		if err := h.loop.Modify(h.sock.tok, loop.Readable); err != nil {
			h.log.Error("resume accept", "reason", err)
		}
	})
}

// admit takes an accepted connection: checks the worker cap and the peer,
// registers it, and queues the current status (rule 6: sent on connect).
func (h *Hub) admit(fd int) {
	h.stats.accepts.Add(1)
	if h.workers.len() >= h.fds.maxWorkers {
		// Closed at once: the worker sees EOF and falls back to its own
		// LISTEN, which beats waiting for an answer that cannot come.
		why := "--max-workers"
		if h.fds.maxWorkers < h.cfg.MaxWorkers {
			// The cap RLIMIT_NOFILE left: --max-workers would not help.
			why = "what its RLIMIT_NOFILE leaves; raise LimitNOFILE= or ulimit -n"
		}
		h.refuse(fd, "too many workers", fmt.Sprintf("too many workers: this hub serves at most %d (%s)", h.fds.maxWorkers, why),
			"workers", h.workers.len(), "max_workers", h.fds.maxWorkers)
		return
	}
	h.nextID++
	id := h.nextID
	cred, err := peercred.Get(fd)
	if err != nil {
		h.refuse(fd, "no peer credentials", "no peer credentials", "worker", id, "fd", fd,
			"error", os.NewSyscallError(peercred.Call, err))
		return
	}
	if _, ok := h.allow[cred.UID]; !ok {
		h.refuse(fd, reasonNotAllowed.String(), fmt.Sprintf("uid %d is not allowed (--allow-uid)", cred.UID),
			"worker", id, "pid", cred.PID, "uid", cred.UID)
		return
	}
	w := h.newWorker()
	w.id, w.fd, w.pid, w.uid, w.partialIdx = id, int32(fd), cred.PID, int32(cred.UID), -1
	w.connectedAt = h.loop.Now().UnixNano()
	w.out.Max = h.bufferMax()
	w.dec.Max = maxInboundFrame
	w.tok, err = h.loop.Register(fd, loop.Readable, w.onEvent)
	if err != nil {
		h.freeWorker(w) // never seen by anyone
		h.refuse(fd, "register failed", "hub error: register failed", "worker", id, "pid", cred.PID, "error", err)
		return
	}
	h.workers.add(w)
	h.stats.workers.Add(1)
	// Guarded (logOK allocates nothing): a log call's arguments allocate
	// even when the level is off, and this line runs on every connect.
	if h.logOK(logConnect, slog.LevelInfo) {
		h.logLine(logConnect, slog.LevelInfo, "worker connected", "worker", w.id, "pid", w.pid, "uid", w.uid, "fd", fd)
	}
	h.sendStatus(w)
}

// acceptPause is how long accepting stops after EMFILE and friends: long
// enough not to spin on a readiness that cannot be served, short enough that
// workers barely notice once descriptors free up.
const acceptPause = 100 * time.Millisecond

// accepting is whether accepting is paused (descriptors or the worker cap
// exhausted), and the timer that resumes it.
type accepting struct {
	paused bool
	timer  *loop.Timer
}
