package hub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/fdpass"
	"github.com/listenhub/listenhub/internal/handoff"
	"github.com/listenhub/listenhub/loop"
)

// handover hands this hub to the process at the other end of conn (which
// calls takeover). extra are more descriptors to hand over by name (the
// metrics listener, say); they stay open here. ctx bounds everything up to
// the commit. It returns nil once the new process took over: this hub has
// stopped then (Done is closed) without closing a single connection. Any
// other result means the upgrade was abandoned and this hub serves on as
// before; the caller should kill the new process.
func (h *Hub) handover(ctx context.Context, conn *fdpass.Conn, extra map[string]int) error {
	if !h.started.Load() || h.loop == nil {
		return errors.New("hub: upgrade: not started")
	}
	if h.cfg.Upstream != nil {
		return errors.New("hub: upgrade: a hub fed by an Upstream is not hot-upgraded; restart it (its workers fail over and back)")
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("hub: upgrade: %w", err) // before the deadline above overrode the caller's
	}
	hello, _, err := recvMsg(conn)
	if err != nil {
		return fmt.Errorf("hub: upgrade: waiting for the new process: %w", err)
	}
	if hello.T != "hello" {
		return fmt.Errorf("hub: upgrade: new process said %q, want hello", hello.T)
	}

	h.log.Info("upgrade: the new process said hello; preparing", "new_pid", hello.PID)
	// Before the freeze: the plan (a TLS connection needs a marker,
	// LISTENed here), and the new process prepares what it can (its own
	// connections). A new process that hangs or dies meanwhile costs the
	// workers nothing: nothing is frozen yet.
	planned := make(chan upPlanned, 1)
	if err := h.loop.Post(func() { h.plan(planned) }); err != nil {
		return fmt.Errorf("hub: upgrade: %w", err)
	}
	var pl upPlanned
	select {
	case pl = <-planned:
	case <-ctx.Done():
		pl = upPlanned{err: ctx.Err()}
		go func() {
			if p := <-planned; p.marker != "" { // LISTENed after all
				h.loop.Post(func() { p.pg.UnlistenMarker(p.marker) })
			}
		}()
	}
	unmark := func() {
		if pl.marker != "" {
			h.loop.Post(func() { pl.pg.UnlistenMarker(pl.marker) })
		}
	}
	if pl.err != nil {
		unmark()
		return fmt.Errorf("hub: upgrade: %w", pl.err)
	}
	mapping := &upMapping{Prefix: h.cfg.ChannelPrefix, Suffix: h.cfg.ChannelSuffix}
	if err := sendMsg(conn, upMsg{T: "plan", Marker: pl.marker, Mapping: mapping}, nil); err != nil {
		unmark()
		return err
	}
	if m, _, err := recvMsg(conn); err != nil || m.T != "prepared" {
		unmark()
		if err == nil && m.T == "abort" {
			// It refused (a changed channel mapping, say): its words.
			return fmt.Errorf("hub: upgrade: %w: %s", handoff.ErrRefused, m.Reason)
		}
		if err == nil {
			err = fmt.Errorf("new process said %q, want prepared: %s", m.T, m.Reason)
		}
		return fmt.Errorf("hub: upgrade: preparing: %w", err)
	}
	// The large backlogs go to a file while the workers are still
	// served (upgrade_precopy.go): the freeze then deals with what changed.
	pc, err := h.precopy(ctx)
	if err != nil {
		unmark()
		return fmt.Errorf("hub: upgrade: pre-copy: %w", err)
	}
	defer h.dropPrecopy(pc)
	if f := h.seams.precopied; f != nil {
		f(pc)
	}

	// The freeze: from here to the commit, bounded by freezeLimit (and
	// ctx), after which everything is undone.
	h.log.Info("upgrade: new process is up; freezing", "new_pid", hello.PID)
	fctx, cancel := context.WithTimeout(ctx, freezeLimit)
	defer cancel()
	if dl, ok := fctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stopWait := context.AfterFunc(fctx, func() { conn.SetDeadline(time.Now()) })
	defer stopWait()
	ctx = fctx
	frozen := make(chan error, 1)
	prepared := make(chan upPrepare, 1)
	snap := make(chan snapshotResult, 1)
	if err := h.loop.Post(func() { h.freeze(pl.marker, pc, frozen, prepared, snap, extra) }); err != nil {
		unmark()
		return fmt.Errorf("hub: upgrade: %w", err)
	}
	rollback := func(cause error) error {
		done := make(chan struct{})
		if h.loop.Post(func() { h.thaw(cause); close(done) }) == nil {
			<-done
		}
		return cause
	}
	select {
	case err := <-frozen:
		if err != nil {
			unmark()
			return rollback(err)
		}
	case <-ctx.Done():
		return rollback(fmt.Errorf("hub: upgrade: freezing: %w", ctx.Err()))
	}
	var res snapshotResult
	select {
	case p := <-prepared:
		// TLS: the new process LISTENs the union on its connections and
		// marks the stream; the snapshot comes when the marker arrives.
		if err := sendMsg(conn, upMsg{T: "prepare", Prepare: &p}, nil); err != nil {
			return rollback(err)
		}
		select {
		case res = <-snap:
		case <-ctx.Done():
			return rollback(fmt.Errorf("hub: upgrade: waiting for the marker NOTIFY: %w", ctx.Err()))
		}
	case res = <-snap:
	case <-ctx.Done():
		return rollback(fmt.Errorf("hub: upgrade: waiting for a quiet Postgres connection: %w", ctx.Err()))
	}
	if res.err != nil {
		return rollback(res.err)
	}
	if err := sendMsg(conn, upMsg{T: "state", State: res.state}, res.fds); err != nil {
		return rollback(err)
	}
	if err := sendRaw(conn, res.state.Workers); err != nil {
		return rollback(err)
	}
	ready, _, err := recvMsg(conn)
	if err == nil && ready.T != "ready" {
		err = fmt.Errorf("new process said %q: %s", ready.T, ready.Reason)
	}
	if err != nil {
		return rollback(fmt.Errorf("hub: upgrade: taking over: %w", err))
	}
	if err := ctx.Err(); err != nil {
		return rollback(fmt.Errorf("hub: upgrade: %w", err))
	}
	if err := sendMsg(conn, upMsg{T: "commit"}, nil); err != nil {
		// Whether the new process got it is unknown: it may be serving.
		// Serving on here too could corrupt the workers' streams; stop
		// instead, and let the workers' fallback cover a dead new one.
		h.log.Error("upgrade: commit not delivered; stopping", "reason", err)
	}
	// No way back from here.
	h.loop.Post(h.release)
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if m, _, err := recvMsg(conn); err != nil || m.T != "serving" {
		h.log.Warn("upgrade: the new process did not confirm it serves", "reason", err, "said", m.T)
	} else {
		h.log.Info("upgrade: the new process serves; exiting", "new_pid", hello.PID)
	}
	<-h.done
	return nil
}

type snapshotResult struct {
	state *handedHub
	fds   []int
	err   error
}

// freezeLimit bounds the freeze, from its start to the commit: past it the
// upgrade is undone and the workers go on as before. Well under a client's
// ack timeout (2 s), so that a new process that hangs once it holds the
// state costs a Subscribe a delay, not a failover. The hand-over itself
// takes milliseconds (docs/robustness.md).
const freezeLimit = 1500 * time.Millisecond

// upPlanned is the old process's plan, made on the loop without freezing.
type upPlanned struct {
	pg     pgHandover
	marker string // TLS: LISTENed already on every connection
	err    error
}

// plan checks that an upgrade can start and, when the Postgres side cannot
// be handed over as descriptors, LISTENs a marker channel on it before
// anything is frozen. Loop goroutine.
func (h *Hub) plan(done chan<- upPlanned) {
	pg, ok := h.pg.(pgHandover)
	switch {
	case h.stopping:
		done <- upPlanned{err: errors.New("stopping")}
		return
	case h.up != nil:
		done <- upPlanned{err: errors.New("one is in progress already")}
		return
	case !ok:
		done <- upPlanned{err: errors.New("the Postgres side cannot be handed over")}
		return
	}
	if pg.CanDetach() {
		done <- upPlanned{pg: pg}
		return
	}
	marker := fmt.Sprintf("listenhub_upgrade_%d_%d", os.Getpid(), time.Now().UnixNano())
	pg.ListenMarker(marker, func(err error) {
		if err != nil {
			err = fmt.Errorf("LISTEN marker: %w", err)
		}
		done <- upPlanned{pg: pg, marker: marker, err: err}
	})
}

// freeze stops everything that could change what is handed over: accepts,
// reads from workers, commands to Postgres. Wakes keep flowing to workers
// until the snapshot. marker is the plan's (TLS), LISTENed already; pc is
// the pre-copy (nil: none). Loop goroutine.
func (h *Hub) freeze(marker string, pc *precopy, frozen chan<- error, prepared chan<- upPrepare, snap chan<- snapshotResult, extra map[string]int) {
	pg, ok := h.pg.(pgHandover)
	switch {
	case h.stopping:
		frozen <- errors.New("hub: upgrade: stopping")
		return
	case h.up != nil:
		frozen <- errors.New("hub: upgrade: one is in progress already")
		return
	case !ok || marker == "" && !pg.CanDetach():
		// Planned as descriptors, and the connection went down since. The
		// other way round (not up when planned, so the marker was
		// LISTENed, and up now) the marker hand-over serves as planned.
		frozen <- errors.New("hub: upgrade: the Postgres side changed since the plan")
		return
	}
	h.up = &upgrade{pg: pg, marker: marker, pre: pc}
	if h.accepting.timer != nil {
		h.accepting.timer.Stop()
		h.accepting.timer = nil
	}
	h.accepting.paused = false
	if err := h.loop.Modify(h.sock.tok, 0); err != nil {
		frozen <- fmt.Errorf("hub: upgrade: stop accepting: %w", err)
		return
	}
	for w := range h.workers.all() {
		if err := h.loop.Modify(w.tok, writeInterest(w)); err != nil {
			frozen <- fmt.Errorf("hub: upgrade: stop reading worker %d: %w", w.id, err)
			return
		}
	}
	frozen <- nil
	take := func() {
		st, fds, err := h.snapshot(extra)
		snap <- snapshotResult{st, fds, err}
	}
	if marker == "" {
		pg.WhenIdle(take)
		return
	}
	pg.WhenIdle(func() {
		if h.up == nil || h.up.marker != marker {
			return // rolled back meanwhile
		}
		p := upPrepare{}
		for _, ch := range h.channels {
			p.Channels = append(p.Channels, ch.pg)
		}
		pg.PauseAtMarker(marker, take)
		prepared <- p
	})
}

func writeInterest(w *worker) loop.Events {
	if w.armed {
		return loop.Writable
	}
	return 0
}

// frozenEvent handles a worker's readiness while an upgrade holds the
// workers: only writes go on (until the snapshot). A hang-up is not acted
// on: the worker is handed over as it is, and the new process reads its
// EOF. Its registration goes, so that the level-triggered hang-up does not
// spin the loop meanwhile.
func (h *Hub) frozenEvent(w *worker, ev loop.Events) {
	if ev&loop.Writable != 0 && w.armed && !h.up.handed {
		h.write(w)
		if w.closed {
			return
		}
	}
	if ev&loop.Readable != 0 && w.tok.Valid() {
		_ = h.loop.Unregister(w.tok)
		w.tok = loop.Token{}
	}
}

// snapshot is the hand-over point: Postgres is paused, nothing is read any
// more. It writes what it can to every worker one last time, takes every
// descriptor out of the loop (they stay open) and describes the hub.
func (h *Hub) snapshot(extra map[string]int) (st *handedHub, fds []int, err error) {
	u := h.up
	if u == nil {
		return nil, nil, errors.New("hub: upgrade: rolled back")
	}
	for _, ch := range h.channels {
		if ch.state != stateListening || len(ch.waiters) > 0 {
			return nil, nil, fmt.Errorf("hub: upgrade: channel %q is %s with %d waiters at the quiet point", ch.q, ch.state, len(ch.waiters))
		}
	}
	for w := range h.workers.all() {
		if !w.armed && w.out.Len() > 0 {
			h.write(w)
		}
	}
	st = &handedHub{
		Version: handedVersion,
		Healthy: h.healthy,
		NextID:  h.nextID,
		Stats:   h.stats.snapshot(),
		PGFD:    -1,
		Socket:  handedSocket{FD: 0, Path: h.sock.path, Dev: h.sock.dev, Ino: h.sock.ino, Inherited: h.sock.adopted},
	}
	fds = append(fds, h.sock.fd)
	if u.marker == "" {
		hos, err := u.pg.Detach()
		if err != nil {
			return nil, nil, fmt.Errorf("hub: upgrade: %w", err)
		}
		st.Postgres = &hos[0]
		st.PGFD = len(fds)
		fds = append(fds, hos[0].FD)
		for _, ho := range hos[1:] {
			st.PGMore = append(st.PGMore, ho)
			st.PGMoreFDs = append(st.PGMoreFDs, len(fds))
			fds = append(fds, ho.FD)
		}
	}
	u.handed = true
	for _, ch := range h.channels {
		st.Channels = append(st.Channels, handedChannel{Q: ch.q, PG: ch.pg,
			Received: ch.wakesReceived, Delivered: ch.wakesDelivered})
	}
	ws := slices.SortedFunc(h.workers.all(), func(a, b *worker) int { return cmp.Compare(a.id, b.id) })
	mapped := 0
	for _, w := range ws {
		if w.tok.Valid() {
			_ = h.loop.Unregister(w.tok)
			w.tok = loop.Token{}
		}
		hw := handWorker(w, len(fds))
		if u.pre != nil && u.pre.hand(w, &hw) {
			mapped++
		}
		st.Workers = append(st.Workers, hw)
		fds = append(fds, int(w.fd))
	}
	st.MemFD = -1
	if mapped > 0 {
		st.MemFD = len(fds)
		fds = append(fds, u.pre.fd)
	}
	if len(extra) > 0 {
		st.Extra = make(map[string]int, len(extra))
		for name, fd := range extra {
			st.Extra[name] = len(fds)
			fds = append(fds, fd)
		}
	}
	h.log.Info("upgrade: handing over", "workers", len(st.Workers), "mapped", mapped, "channels", len(st.Channels),
		"postgres", map[bool]string{true: "descriptor", false: "new connection"}[st.Postgres != nil])
	return st, fds, nil
}

// handWorker describes w, its descriptor at index fd.
func handWorker(w *worker, fd int) handedWorker {
	base := w.out.Written()
	hw := handedWorker{ID: w.id, FD: fd, PID: w.pid, UID: w.uid, StatusAt: -1, Unknown: w.unknownLogged,
		Connected: w.connectedAt, Sent: w.framesSent, Coalesced: w.durableCoalesced, Dropped: w.durableDropped}
	for _, sub := range w.subs.list {
		hw.Subs = append(hw.Subs, sub.ch.pg)
	}
	// Views, not copies: nothing touches them until the upgrade ends.
	hw.In = w.dec.Unread()
	a, b := w.out.Peek()
	hw.out = [2][]byte{a, b}
	for _, end := range w.out.FrameEnds(nil) {
		hw.Ends = append(hw.Ends, end-base)
	}
	hw.InLen, hw.OutLen, hw.Frames = len(hw.In), len(a)+len(b), len(hw.Ends)
	if w.partialIdx >= 0 {
		hw.PartialSince = w.partialSince
	}
	tr := w.tr
	if tr == nil {
		return hw // nothing tracked pending
	}
	for q, start := range tr.durable {
		if start >= base && start < w.out.Appended() {
			if hw.Durable == nil {
				hw.Durable = make(map[string]uint64)
			}
			hw.Durable[q] = start - base
		}
	}
	w.advance()
	for _, sp := range tr.exempt[tr.exemptHead:] {
		rel := span{start: max(sp.start, base) - base, end: sp.end - base}
		if sp.durable {
			hw.Spans = append(hw.Spans, rel)
		} else {
			hw.Answers = append(hw.Answers, rel)
		}
	}
	if w.hasStatus && tr.statusAt >= base && tr.statusAt < w.out.Appended() {
		hw.StatusAt = int64(tr.statusAt - base)
	}
	return hw
}

// thaw rolls an upgrade back: everything goes back into the loop and the
// hub serves on as if nothing happened. Loop goroutine.
func (h *Hub) thaw(cause error) {
	u := h.up
	if u == nil || u.taking {
		return
	}
	h.up = nil
	h.log.Error("upgrade failed; serving on", "reason", cause)
	if h.stopping {
		return
	}
	if err := h.loop.Modify(h.sock.tok, loop.Readable); err != nil {
		h.log.Error("upgrade: resume accepting", "reason", err)
	}
	for w := range h.workers.all() {
		ev := h.readable(w)
		if w.armed {
			ev |= loop.Writable
		}
		var err error
		if w.tok.Valid() {
			err = h.loop.Modify(w.tok, ev)
		} else {
			w.tok, err = h.loop.Register(int(w.fd), ev, w.onEvent)
		}
		if err != nil {
			h.closeWorker(w, reasonRegister, err)
		}
	}
	if err := u.pg.Resume(); err != nil {
		h.log.Error("upgrade: resume postgres", "reason", err)
	}
	if u.marker != "" {
		u.pg.UnlistenMarker(u.marker)
	}
	h.dropEmpty()
}

// release ends this process's part after the commit: every descriptor the
// new process has now is closed here without a word on it, and the loop
// stops. A TLS connection of old's own is closed properly (UNLISTEN *,
// Terminate). Loop goroutine.
func (h *Hub) release() {
	u := h.up
	h.stopping = true
	if h.status.timer != nil {
		h.status.timer.Stop()
	}
	if h.sock.fd >= 0 {
		_ = h.loop.Unregister(h.sock.tok)
		unix.Close(h.sock.fd) // the file is the new process's: not removed
		h.sock.fd = -1
	}
	for w := range h.workers.all() {
		if w.tok.Valid() {
			_ = h.loop.Unregister(w.tok)
		}
		unix.Close(int(w.fd))
		w.closed = true
		w.out.Reset()
	}
	clear(h.workers.list)
	h.workers.list = nil
	h.stats.workers.Store(0)
	stop := func() { h.loop.Stop() }
	if u != nil && u.marker == "" {
		u.pg.Abandon()
		stop()
		return
	}
	// Our own TLS connection: end the session and wait for the server
	// to hang up, so that its backend is gone before this process is:
	// whoever watches the count never sees three.
	h.stopTimer = h.loop.AfterFunc(5*time.Second, stop)
	u.pg.Terminate(func() { h.stopTimer.Stop(); stop() })
}
