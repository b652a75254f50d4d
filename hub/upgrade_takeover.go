package hub

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/listenhub/listenhub/internal/fdpass"
	"github.com/listenhub/listenhub/internal/handoff"
	"github.com/listenhub/listenhub/internal/pglisten"
	"github.com/listenhub/listenhub/loop"
)

// takeover starts the hub from the state another hub hands over (handover,
// at the other end of conn) instead of binding and connecting: Start's
// alternative for the new process of a hot upgrade. ctx bounds it. Once it
// returns nil the hub serves; onLive runs just before the old process is
// told so (write the pid file there). The returned map holds the extra
// descriptors the old process handed over, by name; the caller owns them.
func (h *Hub) takeover(ctx context.Context, conn *fdpass.Conn, onLive func()) (extra map[string]int, err error) {
	if !h.started.CompareAndSwap(false, true) {
		return nil, errors.New("hub: Start or takeover called twice")
	}
	// running: the loop goroutine runs (it closes done when it ends).
	running := false
	abort := func(err error) (map[string]int, error) {
		_ = sendMsg(conn, upMsg{T: "abort", Reason: err.Error()}, nil)
		if h.loop != nil {
			h.loop.Stop()
			if !running {
				_ = h.loop.Run()
				close(h.done)
			}
			<-h.done
		} else {
			close(h.done)
		}
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	l, err := loop.New(loop.Options{Logger: h.log})
	if err != nil {
		return abort(fmt.Errorf("hub: %w", err))
	}
	h.loop = l
	h.clk = h.newClock(l)
	h.up = &upgrade{taking: true, listening: make(chan struct{})}
	if err := sendMsg(conn, upMsg{T: "hello", PID: os.Getpid()}, nil); err != nil {
		return abort(err)
	}
	m, _, err := recvMsg(conn)
	if err == nil && m.T != "plan" {
		err = fmt.Errorf("hub: upgrade: old process said %q, want plan: %s", m.T, m.Reason)
	}
	if err == nil && m.Mapping != nil {
		err = h.checkMapping(*m.Mapping)
	}
	if err != nil {
		return abort(err)
	}
	// Everything that can be prepared is, before the old process
	// freezes: under TLS, connections of our own that LISTEN the marker.
	var tlsPG *pgSet
	marker := m.Marker
	if marker != "" {
		u := h.up
		tlsPG, err = openSetForTakeover(ctx, l, h.cfg.PostgresConnections, h.listenerConfig(), nil, marker, func() {
			// Everything before the marker was the old process's.
			u.markerSeen = true
			if u.live {
				l.Post(func() { u.startDelivery() })
			}
		})
		if err != nil {
			return abort(fmt.Errorf("hub: upgrade: connect to postgres: %w", err))
		}
		h.pg = tlsPG
		h.up.marker = marker
		running = true
		go h.run()
		select {
		case <-h.up.listening:
		case <-ctx.Done():
			return abort(fmt.Errorf("hub: upgrade: LISTEN the marker: %w", ctx.Err()))
		}
	}
	if err := sendMsg(conn, upMsg{T: "prepared"}, nil); err != nil {
		return abort(err)
	}
	m, fds, err := recvMsg(conn)
	if err != nil {
		return abort(err)
	}
	if marker != "" {
		if m.T != "prepare" || m.Prepare == nil {
			closeAll(fds)
			return abort(fmt.Errorf("hub: upgrade: old process said %q, want prepare: %s", m.T, m.Reason))
		}
		// The union, on the connections already open (the old process
		// is frozen: one round trip each), then the marker.
		listened := make(chan error, 1)
		chans := m.Prepare.Channels
		l.Post(func() {
			if len(chans) == 0 {
				listened <- tlsPG.SendMarker(marker)
				return
			}
			var first error
			f := all(len(chans), func() {
				if first == nil {
					first = tlsPG.SendMarker(marker)
				}
				listened <- first
			})
			for _, ch := range chans {
				tlsPG.Listen(ch, func(err error) {
					if err != nil && first == nil {
						first = fmt.Errorf("hub: upgrade: LISTEN the union: %w", err)
					}
					f()
				})
			}
		})
		select {
		case err = <-listened:
		case <-ctx.Done():
			err = fmt.Errorf("hub: upgrade: LISTEN the union: %w", ctx.Err())
		}
		if err != nil {
			return abort(err)
		}
		if m, fds, err = recvMsg(conn); err != nil {
			return abort(err)
		}
	}
	if m.T == "state" && m.State != nil {
		if err := recvRaw(conn, m.State.Workers); err != nil {
			closeAll(fds)
			return abort(err)
		}
	}
	if m.T != "state" || m.State == nil {
		closeAll(fds)
		return abort(fmt.Errorf("hub: upgrade: old process said %q, want state: %s", m.T, m.Reason))
	}
	adopted := make(chan error, 1)
	adopt := func() { adopted <- h.adopt(m.State, fds) }
	if running {
		l.Post(adopt)
	} else {
		adopt()
	}
	if err := <-adopted; err != nil {
		return abort(err) // adopt closed the descriptors
	}
	extra = make(map[string]int, len(m.State.Extra))
	for name, i := range m.State.Extra {
		extra[name] = fds[i]
	}
	// From here on the descriptors belong to the hub's structures; on
	// an abort the process exits, which closes them.
	if err := sendMsg(conn, upMsg{T: "ready"}, nil); err != nil {
		return abort(err)
	}
	if m, _, err = recvMsg(conn); err != nil || m.T != "commit" {
		if err == nil {
			err = fmt.Errorf("old process said %q: %s", m.T, m.Reason)
		}
		// The old process serves on with its copies of everything.
		return abort(fmt.Errorf("hub: upgrade: waiting for commit: %w", err))
	}
	live := make(chan struct{})
	goLive := func() { h.goLive(); close(live) }
	if running {
		l.Post(goLive)
	} else {
		goLive()
		running = true
		go h.run()
	}
	<-live
	if onLive != nil {
		onLive()
	}
	if err := sendMsg(conn, upMsg{T: "serving"}, nil); err != nil {
		h.log.Warn("upgrade: could not tell the old process", "reason", err)
	}
	return extra, nil
}

// adopt rebuilds the handed state: the descriptors are ours, nothing is in
// the loop yet but a paused Postgres connection. Loop goroutine (or before
// the loop runs).
func (h *Hub) adopt(st *handedHub, fds []int) error {
	if err := st.fromVersion(); err != nil {
		closeAll(fds)
		return err
	}
	if err := h.checkHandedMapping(st.Channels); err != nil {
		closeAll(fds)
		return err
	}
	idx := []int{st.Socket.FD}
	if st.Postgres != nil {
		idx = append(idx, st.PGFD)
		idx = append(idx, st.PGMoreFDs...)
	}
	if len(st.PGMore) != len(st.PGMoreFDs) {
		closeAll(fds)
		return fmt.Errorf("hub: upgrade: %d more Postgres connections with %d descriptors", len(st.PGMore), len(st.PGMoreFDs))
	}
	for _, hw := range st.Workers {
		idx = append(idx, hw.FD)
	}
	for _, i := range st.Extra {
		idx = append(idx, i)
	}
	if st.MemFD >= 0 {
		idx = append(idx, st.MemFD)
	}
	seen := make(map[int]bool, len(idx))
	for _, i := range idx {
		if i < 0 || i >= len(fds) {
			closeAll(fds)
			return fmt.Errorf("hub: upgrade: descriptor %d of %d missing", i, len(fds))
		}
		if seen[i] {
			// Two roles for one descriptor (say the backlog file and
			// the socket): closing one would close the other.
			closeAll(fds)
			return fmt.Errorf("hub: upgrade: descriptor %d handed over twice", i)
		}
		seen[i] = true
	}
	if st.Postgres == nil && h.pg == nil {
		closeAll(fds)
		return errors.New("hub: upgrade: no Postgres connection handed over")
	}
	// The pre-copied backlogs: mapped, the file kept by the mappings
	// (backlogFile), no longer one of fds to close on an error.
	for _, hw := range st.Workers {
		if hw.Mapped && st.MemFD < 0 {
			closeAll(fds)
			return fmt.Errorf("hub: upgrade: worker %d's bytes are in a file not handed over", hw.ID)
		}
	}
	if st.MemFD >= 0 {
		f, err := openBacklogFile(fds[st.MemFD])
		if err == nil {
			fds = slices.Clone(fds)
			fds[st.MemFD] = -1
			f.closed = h.backlogFileClosed
			err = mapWorkers(f, st.Workers)
		}
		if err != nil {
			closeAll(fds)
			return err
		}
	}
	if st.Postgres != nil {
		cfg := h.listenerConfig()
		hos := append([]handoff.PG{*st.Postgres}, st.PGMore...)
		pgFDs := append([]int{st.PGFD}, st.PGMoreFDs...)
		// The channels stay where the old process put them: as many
		// connections as it handed over, whatever this one's
		// configuration says (a new count takes effect on a restart).
		if len(hos) != h.cfg.PostgresConnections {
			h.log.Warn("upgrade: keeping the handed-over number of Postgres connections",
				"handed", len(hos), "configured", h.cfg.PostgresConnections)
		}
		adopted := 0
		set, err := newPGSet(len(hos), cfg, true, func(i int, c pglisten.Config) (*pglisten.Conn, error) {
			ho := hos[i]
			ho.FD = fds[pgFDs[i]]
			adopted = i + 1
			return pgUp.Adopt(h.loop, c, ho) // closes ho.FD on an error
		})
		if err != nil {
			// The old process serves on with these backends: this
			// process's copies go without a word to the server.
			set.Abandon()
			rest := slices.Clone(fds)
			for _, i := range pgFDs[:adopted] {
				rest[i] = -1 // closed by Adopt or by Abandon
			}
			closeAll(rest)
			unmapWorkers(st.Workers)
			return err
		}
		h.pg = set
	}
	pg := h.pg.(pgHandover) // a *pgSet either way
	sock := fds[st.Socket.FD]
	h.up.pg = pg
	h.sock = listenSocket{path: st.Socket.Path, fd: sock, dev: st.Socket.Dev, ino: st.Socket.Ino, adopted: st.Socket.Inherited}
	h.healthy = st.Healthy
	h.connected = true // a connection was handed over: this is no first connect
	h.nextID = st.NextID
	for _, c := range st.Channels {
		h.channels[c.PG] = &channel{q: c.Q, pg: c.PG, state: stateListening,
			wakesReceived: c.Received, wakesDelivered: c.Delivered}
	}
	for i := range st.Workers {
		hw := &st.Workers[i]
		w := h.adoptWorker(hw, fds[hw.FD])
		h.workers.add(w)
	}
	h.stats.load(st.Stats)
	h.stats.workers.Store(int64(h.workers.len()))
	h.stats.channels.Store(int64(len(h.channels)))
	h.stats.healthy.Store(h.healthy)
	return nil
}

// adoptWorker rebuilds one worker from hw on descriptor fd.
func (h *Hub) adoptWorker(hw *handedWorker, fd int) *worker {
	w := h.newWorker()
	w.id, w.fd, w.pid, w.uid, w.unknownLogged, w.partialIdx = hw.ID, int32(fd), hw.PID, hw.UID, hw.Unknown, -1
	w.partialSince = hw.PartialSince
	w.connectedAt, w.framesSent, w.durableCoalesced, w.durableDropped = time.Now().UnixNano(), hw.Sent, hw.Coalesced, hw.Dropped
	if hw.Connected != 0 {
		w.connectedAt = hw.Connected
	}
	w.dec.Max = maxInboundFrame
	// The received bytes become the ring's storage as they are: no
	// copy, no growth by doubling; the pre-copied ones are sent from
	// their mapping, which the ring lets go of once they are written
	// (40 workers at the caps hold hundreds of megabytes). Ends that do
	// not describe Out (a confused old process) keep the whole frames,
	// copied.
	var err error
	if hw.free != nil {
		err = w.out.AdoptForeign(hw.Out, hw.Ends, hw.free)
	} else {
		err = w.out.Adopt(hw.Out, hw.Ends)
	}
	if err != nil {
		prev := uint64(0)
		for _, end := range hw.Ends {
			if end > uint64(len(hw.Out)) || end <= prev {
				break
			}
			_ = w.out.Append(hw.Out[prev:end]) // no cap yet: cannot fail
			prev = end
		}
		if hw.free != nil {
			hw.free()
		}
	}
	hw.Out, hw.free = nil, nil // the ring's now
	w.out.Max = h.bufferMax()
	if len(hw.Durable) > 0 || len(hw.Spans) > 0 || len(hw.Answers) > 0 || hw.StatusAt >= 0 {
		tr := h.track(w)
		if len(hw.Durable) > 0 {
			tr.durable = hw.Durable
		}
		// Durable wakes and answers, merged back into one list in ring order.
		ds, as := hw.Spans, hw.Answers
		for len(ds) > 0 || len(as) > 0 {
			if len(as) == 0 || len(ds) > 0 && ds[0].start < as[0].start {
				sp := ds[0]
				ds = ds[1:]
				sp.durable = true
				tr.exempt = append(tr.exempt, sp)
				tr.durableN++
				tr.durableBytes += int(sp.end - sp.start)
				continue
			}
			sp := as[0]
			as = as[1:]
			tr.exempt = append(tr.exempt, sp)
			tr.controlN++
			tr.controlBytes += int(sp.end - sp.start)
		}
		if hw.StatusAt >= 0 {
			tr.statusAt, w.hasStatus = uint64(hw.StatusAt), true
		}
	}
	// Only a partial frame: the old process decoded every whole one.
	w.dec.Feed(hw.In)
	for _, pg := range hw.Subs {
		if ch := h.channels[pg]; ch != nil {
			h.addSub(w, ch)
		}
	}
	return w
}

// goLive is the commit on the new side: everything goes into the loop, the
// bytes the old process could not send go first, and Postgres is read from
// where the old process stopped. Loop goroutine (or before it runs).
func (h *Hub) goLive() {
	u := h.up
	h.up = nil
	h.rbuf = make([]byte, readSize)
	h.loop.AfterIteration(h.flush)
	h.loop.OnClose(h.onLoopClose)
	h.stats.upgrades.Add(1)
	var err error
	if h.sock.tok, err = h.loop.Register(h.sock.fd, loop.Readable, h.onAcceptable); err != nil {
		h.log.Error("upgrade: accept on the socket", "reason", err)
	}
	for w := range h.workers.all() {
		w.tok, err = h.loop.Register(int(w.fd), loop.Readable, w.onEvent)
		if err != nil {
			h.closeWorker(w, reasonRegister, err)
			continue
		}
		if w.out.Len() > 0 {
			h.touch(w)
		}
		if n := w.dec.Buffered(); n > 0 {
			// The frame timeout goes on from when the frame started
			// (in the old process), it does not restart.
			since := h.loop.Now()
			if w.partialSince != 0 {
				since = time.Unix(0, w.partialSince)
			}
			h.frameStarted(w, since)
			// Counted toward maxPartialBytes as read's would count it.
			w.partialBytes = int32(n)
			h.partial.bytes += n
		}
	}
	h.budgetFDs()
	h.countOut()
	if h.cfg.ReleaseMemory {
		go h.returnMemory(memCheckEvery)
	}
	h.status.timer = h.clk.Every(h.cfg.StatusInterval, h.onStatusTick)
	h.startReports()
	h.dropEmpty()
	u.live = true
	if u.marker == "" || u.markerSeen {
		u.startDelivery()
	} // else: the marker is still on its way; its arrival starts it
	h.loop.Post(func() {}) // an iteration soon: its end flushes the workers
	h.log.Info("upgrade: took over", "workers", h.workers.len(), "channels", len(h.channels),
		"healthy", h.healthy, "upgrades", h.stats.upgrades.Load())
}

// startDelivery lets the new process's Postgres connection deliver: from
// the point the old one stopped at (plaintext) or from the marker (TLS).
func (u *upgrade) startDelivery() {
	_ = u.pg.Resume() // an error there is a lost connection: it reconnects
	if u.marker != "" {
		u.pg.UnlistenMarker(u.marker)
	}
}
