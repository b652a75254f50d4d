package hub

import (
	"cmp"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/fdreserve"
)

// fdBudget is what the hub knows of its descriptors: the worker cap that
// RLIMIT_NOFILE leaves, and the spare one. Loop goroutine.
type fdBudget struct {
	// heldBack is what ReserveFDs holds back, from any goroutine.
	heldBack atomic.Int64
	// maxWorkers is the worker cap in force: Config.MaxWorkers, lowered
	// at Start to what RLIMIT_NOFILE leaves after the descriptors open
	// then and fdReserve.
	maxWorkers int
	// fdWorkers is what RLIMIT_NOFILE leaves for workers (budgetFDs);
	// SetLive's MaxWorkers is capped by it.
	fdWorkers int
	// fdBase is the descriptors open at Start other than workers, and
	// fdLimit RLIMIT_NOFILE when the cap was last set (rebudgetFDs).
	fdBase  int
	fdLimit uint64
	// spareFD is a descriptor held (on /dev/null) for the moment accept
	// fails with EMFILE anyway (descriptors taken by something else than
	// workers): closed, it lets the hub accept and close the waiting
	// connections, so that they are refused at once instead of hanging
	// in the backlog; then it is taken again. -1 when not held.
	spareFD int
	// reserved: this hub keeps the process's descriptor reserve (package
	// fdreserve) and drops it when its loop closes.
	reserved bool
}

// budgetFDs sets the worker cap in force and takes the spare descriptor.
// Called by Start once the hub's own descriptors (loop, socket, Postgres)
// are open (and by an upgrade's new process once it has taken over):
// every descriptor open now stays open, fdReserve more (and
// ReserveFDs, and one per Postgres connection) are kept for the
// Postgres reconnect, the metrics server and the like, and workers get at
// most what is left of RLIMIT_NOFILE (the soft limit, which the Go runtime
// raises to the hard one at start).
func (h *Hub) budgetFDs() {
	// The reserve the Postgres reconnect and the metrics server fall
	// back on when descriptors run out (package fdreserve): open before
	// the count, so that it is part of the hub's own. Dropped when the
	// loop closes.
	if !h.fds.reserved {
		fdreserve.Keep()
		h.fds.reserved = true
	}
	// Workers handed over by an upgrade are open already, and are what
	// the budget is for.
	h.fds.fdBase = openFDs() - h.workers.len()
	h.fds.maxWorkers = h.cfg.MaxWorkers
	h.rebudgetFDs()
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		h.fds.spareFD = fd
	}
}

// backlogFileClosed gives the workers the descriptor of an upgrade's
// backlog file once its last part is sent: it was open when the budget
// was counted, and would otherwise keep the cap one lower until a
// restart. (fdBase is 0 until budgetFDs counted it: a file closed before
// that is not in the count.)
func (h *Hub) backlogFileClosed() {
	if h.fds.fdBase > 0 && !h.stopping {
		h.fds.fdBase--
		h.rebudgetFDs()
	}
}

const maxInt = int(^uint(0) >> 1)

// rebudgetFDs sets the worker cap from RLIMIT_NOFILE as it is now: at
// start, on every status tick, when accept fails with EMFILE and when the
// Postgres connection is lost, so that a limit lowered on the running hub
// (prlimit, a container runtime) lowers the cap instead of letting new
// workers take the reserve, and a limit raised again raises it. When the
// workers connected already hold more than the new limit leaves them, the
// callers shed the newest down to it (shedNewest): the Postgres connection
// and /healthz come first, since without them no worker gets a wake anyway.
// One getrlimit(2), no /proc walk: the descriptors other than workers are
// those counted at start (fdBase), the rest of what the hub may open being
// the reserve.
func (h *Hub) rebudgetFDs() {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return
	}
	capped := h.cfg.MaxWorkers // SetLive changes it
	h.fds.fdWorkers = maxInt
	// Each Postgres connection may need a descriptor of its own to
	// reconnect, all K at once after a network blip, and they may not
	// be open yet (Start does not wait for Postgres).
	reserve := h.reservedFDs()
	if rl.Cur < 1<<31 {
		left := int(rl.Cur) - h.fds.fdBase - reserve - 1 // 1: the spare
		h.fds.fdWorkers = max(left, 1)
		capped = min(capped, h.fds.fdWorkers)
	}
	if capped == h.fds.maxWorkers && h.fds.fdLimit == uint64(rl.Cur) {
		return
	}
	was, wasLimit := h.fds.maxWorkers, h.fds.fdLimit
	h.fds.maxWorkers, h.fds.fdLimit = capped, uint64(rl.Cur)
	switch {
	case capped < h.cfg.MaxWorkers:
		h.log.Warn("worker cap lowered by RLIMIT_NOFILE", "max_workers", capped, "was", was,
			"configured", h.cfg.MaxWorkers, "rlimit_nofile", rl.Cur, "open_fds", h.fds.fdBase, "fd_reserve", reserve,
			"workers", h.workers.len())
	case wasLimit != 0 && capped != was:
		h.log.Info("worker cap back to the configured one", "max_workers", capped, "rlimit_nofile", rl.Cur)
	}
}

// shedNewest closes the newest workers while more are connected than
// RLIMIT_NOFILE leaves for them (fdWorkers, as rebudgetFDs last set it):
// they fall back to their own LISTEN, counted in Stats.WorkersShed and
// logged. The oldest stay, and no one is shed while an upgrade holds the
// workers (the next status tick looks again) or while the hub stops. It
// closes workers: called where no worker is in use (the status tick, the
// accept handler, a lost Postgres connection), never from a write.
// The descriptors given up meanwhile (the spare, the reserve) are taken
// again here too.
func (h *Hub) shedNewest() {
	defer h.retakeSpares()
	n := h.workers.len() - h.fds.fdWorkers
	if n <= 0 || h.up != nil || h.stopping {
		return
	}
	newest := slices.Clone(h.workers.list)
	slices.SortFunc(newest, func(a, b *worker) int { return cmp.Compare(b.id, a.id) })
	for _, w := range newest[:n] {
		h.stats.shed.Add(1)
		if w.framesSent == 0 {
			// Admitted in this iteration, before the limit was read:
			// nothing reached it yet, so it is refused as a connection
			// past the descriptors is (docs/protocol.md), told why.
			_, _ = unix.Write(int(w.fd), nackNoFDs)
		}
		h.closeWorker(w, reasonShed, nil)
	}
	h.log.Warn("workers shed: RLIMIT_NOFILE leaves fewer descriptors than they hold; the newest fall back to their own LISTEN",
		"shed", n, "workers", h.workers.len(), "rlimit_nofile", h.fds.fdLimit, "open_fds", h.fds.fdBase,
		"fd_reserve", h.reservedFDs(), "newest_kept", newest[n:][0].id)
}

// retakeSpares takes the spare descriptor and the reserve again where an
// earlier shortage left them given up.
func (h *Hub) retakeSpares() {
	if h.stopping {
		return
	}
	if h.fds.spareFD < 0 {
		if fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			h.fds.spareFD = fd
		}
	}
	fdreserve.Refill()
}

// refuse closes a connection the hub will not serve, counting and logging
// it (rate-limited). The peer is told why first, in one frame, nack with an
// empty "q" and tell as its error (docs/protocol.md: a nack before any
// status is the refusal of the connection); a client that does not know it
// sees a nack without a pending sub, which it ignores, and then EOF.
func (h *Hub) refuse(fd int, why, tell string, attrs ...any) {
	// Count and log before the close: a peer that sees EOF sees both.
	h.stats.refused.Add(1)
	if h.logOK(logRefusedConn, slog.LevelWarn) {
		h.logLine(logRefusedConn, slog.LevelWarn, "worker connection refused", append(attrs, "reason", why)...)
	}
	// One write on a fresh non-blocking socket: a frame this small always
	// fits its buffer, and one that does not is not waited for.
	h.scratch = frame.AppendNack(h.scratch[:0], "", tell)
	_, _ = unix.Write(fd, h.scratch)
	unix.Close(fd)
}

// nackNoFDs is the refusal shedWithSpare sends each connection it sheds.
var nackNoFDs = frame.AppendNack(nil, "", "the hub is out of file descriptors (RLIMIT_NOFILE)")

// shedWithSpare is accept under EMFILE/ENFILE: it gives the spare
// descriptor back, accepts and closes up to a batch of waiting connections
// with it (each counted as refused), and takes the spare again. It reports
// whether the spare was there to do it; without it the caller pauses
// accepting instead.
func (h *Hub) shedWithSpare() bool {
	if h.fds.spareFD < 0 {
		return false
	}
	unix.Close(h.fds.spareFD)
	h.fds.spareFD = -1
	shed := 0
	for ; shed < h.cfg.AcceptBatch; shed++ {
		fd, err := accept(h.sock.fd)
		if err != nil {
			break
		}
		h.stats.accepts.Add(1)
		h.stats.refused.Add(1)
		_, _ = unix.Write(fd, nackNoFDs)
		unix.Close(fd)
	}
	if fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		h.fds.spareFD = fd
	}
	if h.logOK(logRefusedConn, slog.LevelWarn) {
		h.logLine(logRefusedConn, slog.LevelWarn, "worker connections refused: out of file descriptors",
			"refused", shed, "workers", h.workers.len(), "max_workers", h.fds.maxWorkers)
	}
	return shed > 0
}

// reservedFDs is how many descriptors are kept out of the worker budget: the
// hub's own reserve, one per Postgres connection, and what the program
// embedding the hub holds beside it (ReserveFDs: the metrics server's).
func (h *Hub) reservedFDs() int {
	return fdReserve + h.cfg.PostgresConnections + int(h.fds.heldBack.Load())
}

// ReserveFDs keeps n more descriptors out of the worker budget until
// release is called: for a server beside the hub that may hold that many
// at once (monitor's Server calls it for its capped connections), so that a
// flood of its connections can take neither the workers' descriptors nor
// the Postgres reconnect's. Safe from any goroutine, before or after Start;
// release is safe to call more than once.
func (h *Hub) ReserveFDs(n int) (release func()) {
	h.fds.heldBack.Add(int64(n))
	h.rebudgetSoon()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.fds.heldBack.Add(-int64(n))
			h.rebudgetSoon()
		})
	}
}

// rebudgetSoon has a running hub's loop recompute the worker budget.
func (h *Hub) rebudgetSoon() {
	if h.started.Load() && h.loop != nil {
		_ = h.loop.Post(h.rebudgetFDs)
	}
}
