package hub

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/fdpass"
	"github.com/listenhub/listenhub/internal/handoff"
	"github.com/listenhub/listenhub/listener"
	"github.com/listenhub/listenhub/loop"
)

// The two ends are not part of the package's API: command listenhub
// reaches them through internal/handoff.
func init() {
	handoff.RegisterHub(handoff.Hub[*Hub]{Handover: (*Hub).handover, Takeover: (*Hub).takeover})
}

// Hot upgrade (docs/design.md, "Lifecycle"): the running hub (old) hands the
// listening socket, every worker connection with its state, and the
// Postgres connection to a new process (new) over an fdpass connection.
// Workers see no EOF and no wake is lost or duplicated.
//
// The conversation, one JSON message each way at a time:
//
//	new → old  hello    {pid}
//	old → new  plan     {marker}               (TLS: LISTENed already)
//	new → old  prepared                        (TLS: its own connections)
//	           old copies the large backlogs into a memfd, serving on
//	           (precopy.go)
//	           old freezes: stops accepting and reading workers (their
//	           input waits in the kernel), waits for Postgres to be quiet
//	           (no command in flight, the union LISTENed)
//	old → new  prepare  {channels, marker}    (TLS only, see below)
//	new → old  —        new LISTENs channels+marker on its own connection
//	                    and NOTIFYs the marker; old delivers up to it
//	old → new  state    {workers, channels, counters, …} + descriptors
//	                    (the memfd among them), then the bytes not in it
//	new → old  ready    new holds everything, has touched nothing
//	old → new  commit   old will never touch any of it again
//	new → old  serving  new reads, writes and accepts
//
// Until commit, old can take everything back (new is killed by its parent
// and has written nothing): any failure or the deadline there means old
// serves on. A plaintext Postgres connection moves as its descriptor, at the
// quiet point, with the bytes read and not parsed yet. A TLS one cannot (the
// record layer's state lives in old's memory): new opens its own, LISTENs
// the union and a marker channel, and one NOTIFY on the marker splits the
// notification stream between the two, so that at most two backends exist
// and old's is closed at commit. See package listener, handover.go.

// pgHandover is what the Postgres side must offer for an upgrade (*pgSet
// does, for all its connections at once: each is handed over, or each
// splits its stream at the marker).
type pgHandover interface {
	postgres
	CanDetach() bool
	WhenIdle(done func())
	CancelHold()
	Detach() ([]handoff.PG, error)
	Resume() error
	Abandon()
	Terminate(done func())
	ListenMarker(marker string, done func(error))
	UnlistenMarker(marker string)
	PauseAtMarker(marker string, done func())
	SendMarker(marker string) error
}

// upgrade is the state of a hot upgrade on either side. Loop goroutine.
type upgrade struct {
	taking bool // this process is the new one
	pg     pgHandover
	marker string
	pre    *precopy // old: the pre-copy, nil when none
	// handed: old took the snapshot; workers, socket and Postgres are the
	// new process's unless the upgrade is rolled back.
	handed bool
	// listening is closed (new, TLS) once the union and the marker are
	// LISTENed on new's own connection.
	listening chan struct{}
	listened  bool
	// live (new, TLS): the commit came; markerSeen: the marker arrived on
	// new's connection. Delivery starts when both hold.
	live, markerSeen bool
}

// readInterest is the interest in a worker's input: none while an upgrade
// holds the workers (their input waits in the kernel for whoever serves
// next).
func (h *Hub) readInterest() loop.Events {
	if h.up != nil {
		return 0
	}
	return loop.Readable
}

// dropEmpty UNLISTENs the channels an upgrade left without subscribers.
func (h *Hub) dropEmpty() {
	for _, ch := range h.channels {
		if len(ch.subs) == 0 && ch.state == stateListening {
			h.unlisten(ch)
		}
	}
}

// onHealth sees the Postgres side's health reports during an upgrade and
// reports whether it swallowed one. The new process has no worker to tell
// until it is live.
func (u *upgrade) onHealth(h *Hub, healthy bool) bool {
	if !u.taking {
		return false
	}
	if healthy && !u.listened {
		u.listened = true
		close(u.listening)
	}
	return true
}

// upMsg is one message of the conversation.
type upMsg struct {
	T       string     `json:"t"` // hello, plan, prepared, prepare, state, ready, commit, serving, abort
	PID     int        `json:"pid,omitempty"`
	Marker  string     `json:"marker,omitempty"` // plan: the TLS hand-over's marker; empty: descriptors
	Reason  string     `json:"reason,omitempty"`
	Prepare *upPrepare `json:"prepare,omitempty"`
	State   *handedHub `json:"state,omitempty"`
}

type upPrepare struct {
	Channels []string `json:"channels"` // Postgres channel names
}

// handedHub is the hub's state as it moves. Descriptors travel beside it as
// SCM_RIGHTS; the FD fields index that list.
type handedHub struct {
	Version  int             `json:"version"`
	Socket   handedSocket    `json:"socket"`
	Postgres *handoff.PG     `json:"postgres,omitempty"` // plaintext only
	PGFD     int             `json:"pg_fd"`
	Healthy  bool            `json:"healthy"`
	NextID   uint64          `json:"next_id"`
	Stats    Stats           `json:"stats"`
	Channels []handedChannel `json:"channels"`
	Workers  []handedWorker  `json:"workers"`
	Extra    map[string]int  `json:"extra,omitempty"`

	// MemFD is the pre-copy's file (precopy.go), holding the Out of the
	// workers marked Mapped; -1: none.
	MemFD int `json:"mem_fd"`

	// PGMore are the Postgres connections after the first
	// (Config.PostgresConnections), in order, their descriptors at
	// PGMoreFDs; absent from a hub with one connection.
	PGMore    []handoff.PG `json:"pg_more,omitempty"`
	PGMoreFDs []int        `json:"pg_more_fds,omitempty"`
}

// handedVersion 2: the conversation has plan and prepared before the
// freeze, and the workers' bytes travel raw after the state. 3: the large
// backlogs are in a memfd (MemFD, handedWorker.Mapped), not raw.
const handedVersion = 3

// fromVersion accepts the state of this version and of version 2 (0.1.0,
// whose hub sends every worker's bytes raw and has no memfd), so that the
// release before this one upgrades to it in place.
func (st *handedHub) fromVersion() error {
	switch st.Version {
	case handedVersion:
		return nil
	case 2:
		st.MemFD = -1 // absent from its JSON, which reads as 0
		for _, hw := range st.Workers {
			if hw.Mapped {
				return fmt.Errorf("hub: upgrade: a version 2 state with a mapped worker (%d)", hw.ID)
			}
		}
		return nil
	}
	return fmt.Errorf("hub: upgrade: state version %d, this binary speaks 2 and %d", st.Version, handedVersion)
}

type handedSocket struct {
	FD       int    `json:"fd"`
	Path     string `json:"path"`
	Dev, Ino uint64
	// Inherited: systemd's socket (Config.Listener); its file is never
	// removed, by either process.
	Inherited bool `json:"inherited,omitempty"`
}

type handedChannel struct {
	Q  string `json:"q"`
	PG string `json:"pg"`
	// Introspection counters (Hub.Channels); absent from an older hub.
	Received  uint64 `json:"received,omitempty"`
	Delivered uint64 `json:"delivered,omitempty"`
}

// handedWorker is one worker. Offsets are relative to the first unsent byte
// of Out; the first frame of Out may be partly written already.
type handedWorker struct {
	ID   uint64   `json:"id"`
	FD   int      `json:"fd"`
	PID  int32    `json:"pid"`
	UID  int32    `json:"uid"`
	Subs []string `json:"subs,omitempty"` // Postgres channel names
	// In (received, not decoded), Out (produced, not sent) and Ends
	// (frame ends in Out) are not part of the JSON: they follow the
	// state as one raw message per worker with any (sendRaw), whose
	// lengths these are.
	InLen  int      `json:"in_len,omitempty"`
	OutLen int      `json:"out_len,omitempty"`
	Frames int      `json:"frames,omitempty"`
	In     []byte   `json:"-"`
	Out    []byte   `json:"-"`
	Ends   []uint64 `json:"-"`
	// Mapped: Out is not in the raw message but in the state's memfd,
	// OutLen bytes at MapAt (pre-copied before the freeze). In the new
	// process Out is then a mapping, which free lets go of.
	Mapped bool   `json:"mapped,omitempty"`
	MapAt  int64  `json:"map_at,omitempty"`
	free   func() // the new process's, until a ring adopts Out
	// out are Out's two parts in the old process's ring (not copied);
	// none when Mapped.
	out [2][]byte
	// PartialSince: when the partial frame in In started (unix
	// nanoseconds): its frame timeout goes on, it does not restart.
	PartialSince int64             `json:"partial_since,omitempty"`
	Durable      map[string]uint64 `json:"durable,omitempty"`
	Spans        []span            `json:"spans,omitempty"`   // durable wakes in Out
	Answers      []span            `json:"answers,omitempty"` // acks, nacks, status in Out
	StatusAt     int64             `json:"status_at"`         // -1: no unsent status
	Unknown      bool              `json:"unknown,omitempty"`
	// Introspection (Hub.Workers): when it connected to the first hub,
	// and its counters; absent from an older hub.
	Connected int64  `json:"connected_ns,omitempty"` // unix nanoseconds
	Sent      uint64 `json:"sent,omitempty"`
	Coalesced uint64 `json:"coalesced,omitempty"`
	Dropped   uint64 `json:"dropped,omitempty"`
}

// MarshalJSON and UnmarshalJSON keep span's fields unexported elsewhere.
func (s span) MarshalJSON() ([]byte, error) { return json.Marshal([2]uint64{s.start, s.end}) }

func (s *span) UnmarshalJSON(b []byte) error {
	var a [2]uint64
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	s.start, s.end = a[0], a[1]
	return nil
}

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
	if err := sendMsg(conn, upMsg{T: "plan", Marker: pl.marker}, nil); err != nil {
		unmark()
		return err
	}
	if m, _, err := recvMsg(conn); err != nil || m.T != "prepared" {
		unmark()
		if err == nil {
			err = fmt.Errorf("new process said %q, want prepared: %s", m.T, m.Reason)
		}
		return fmt.Errorf("hub: upgrade: preparing: %w", err)
	}
	// The large backlogs go to a file while the workers are still
	// served (precopy.go): the freeze then deals with what changed.
	pc, err := h.precopy(ctx)
	if err != nil {
		unmark()
		return fmt.Errorf("hub: upgrade: pre-copy: %w", err)
	}
	defer h.dropPrecopy(pc)
	if h.testPrecopied != nil {
		h.testPrecopied(pc)
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
	if h.acceptTimer != nil {
		h.acceptTimer.Stop()
		h.acceptTimer = nil
	}
	h.acceptPaused = false
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

// sendRaw sends the workers' bytes after the state: one message per
// worker with any, straight from its buffers: In, Out (unless Mapped),
// then the length of each frame in Out (4 bytes, little-endian).
func sendRaw(conn *fdpass.Conn, ws []handedWorker) error {
	var ends []byte // reused: SendParts has sent it when it returns
	for i := range ws {
		hw := &ws[i]
		if hw.InLen+hw.OutLen+hw.Frames == 0 {
			continue
		}
		ends = ends[:0]
		prev := uint64(0)
		for _, e := range hw.Ends {
			ends = binary.LittleEndian.AppendUint32(ends, uint32(e-prev))
			prev = e
		}
		if err := conn.SendParts(hw.In, hw.out[0], hw.out[1], ends); err != nil {
			return fmt.Errorf("hub: upgrade: send worker %d's bytes: %w", hw.ID, err)
		}
	}
	return nil
}

// recvRaw receives what sendRaw sent into ws's In, Out and Ends.
func recvRaw(conn *fdpass.Conn, ws []handedWorker) error {
	for i := range ws {
		hw := &ws[i]
		if hw.InLen+hw.OutLen+hw.Frames == 0 {
			continue
		}
		if hw.InLen < 0 || hw.OutLen < 0 || hw.Frames < 0 {
			return fmt.Errorf("hub: upgrade: worker %d: negative lengths", hw.ID)
		}
		outLen := hw.OutLen // in the memfd when Mapped
		if hw.Mapped {
			outLen = 0
		}
		n := hw.InLen + outLen + 4*hw.Frames
		b, fds, err := conn.RecvSized(n)
		closeAll(fds)
		if err != nil {
			return fmt.Errorf("hub: upgrade: worker %d's bytes: %w", hw.ID, err)
		}
		if len(b) != n {
			return fmt.Errorf("hub: upgrade: worker %d's bytes: %d, want %d", hw.ID, len(b), n)
		}
		hw.In, hw.Out = b[:hw.InLen:hw.InLen], b[hw.InLen:hw.InLen+outLen]
		ends := b[hw.InLen+outLen:]
		hw.Ends = make([]uint64, hw.Frames)
		end := uint64(0)
		for j := range hw.Ends {
			end += uint64(binary.LittleEndian.Uint32(ends[4*j:]))
			hw.Ends[j] = end
		}
	}
	return nil
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
	if h.statusTimer != nil {
		h.statusTimer.Stop()
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

// run runs the loop and closes done when it stops.
func (h *Hub) run() {
	err := h.loop.Run()
	h.err = err
	close(h.done)
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// listenerConfig is the listener configuration Start's opener uses. New
// has parsed DatabaseURL into ConnConfig, so it cannot fail.
func (h *Hub) listenerConfig() listener.Config {
	return listener.Config{
		ConnConfig:          h.cfg.ConnConfig,
		HealthCheckInterval: h.cfg.HealthCheckInterval,
		HealthCheckTimeout:  h.cfg.HealthCheckTimeout,
		ReconnectMin:        h.cfg.ReconnectMin,
		ReconnectMax:        h.cfg.ReconnectMax,
		CommandTimeout:      h.cfg.CommandTimeout,
		OnNotification:      h.onNotification,
		OnHealth:            h.onHealth,
		OnNotDelivered:      h.onNotDelivered,
		Logger:              h.log,
	}
}

// adopt rebuilds the handed state: the descriptors are ours, nothing is in
// the loop yet but a paused Postgres connection. Loop goroutine (or before
// the loop runs).
func (h *Hub) adopt(st *handedHub, fds []int) error {
	if err := st.fromVersion(); err != nil {
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
		set, err := newPGSet(len(hos), cfg, true, func(i int, c listener.Config) (*listener.Conn, error) {
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
	w.dec.Max = MaxInboundFrame
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
			// Counted toward MaxPartialBytes as read's would count it.
			w.partialBytes = int32(n)
			h.partialBytes += n
		}
	}
	h.budgetFDs()
	h.countOut()
	if h.cfg.ReleaseMemory {
		go h.returnMemory(memCheckEvery)
	}
	h.statusTimer = h.clk.Every(h.cfg.StatusInterval, h.onStatusTick)
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

func sendMsg(conn *fdpass.Conn, m upMsg, fds []int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("hub: upgrade: encode %s: %w", m.T, err)
	}
	if err := conn.Send(b, fds); err != nil {
		return fmt.Errorf("hub: upgrade: send %s: %w", m.T, err)
	}
	return nil
}

func recvMsg(conn *fdpass.Conn) (upMsg, []int, error) {
	b, fds, err := conn.Recv()
	if err != nil {
		return upMsg{}, nil, fmt.Errorf("hub: upgrade: %w", err)
	}
	var m upMsg
	if err := json.Unmarshal(b, &m); err != nil {
		closeAll(fds)
		return upMsg{}, nil, fmt.Errorf("hub: upgrade: decode: %w", err)
	}
	return m, fds, nil
}
