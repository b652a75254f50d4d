package hub

import (
	"cmp"
	"context"
	"iter"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/listenhub/listenhub/loop"
)

// The snapshots behind Workers and Channels. A caller joins the snapshot
// that has not started yet (snapper.next) and posts a kick; the loop starts
// it when the rate allows, copies a compact record per worker (channel) in
// slices of at most introspectSlice, one slice per loop iteration, and
// closes its done channel. Every caller waiting at that moment gets the
// same copy; a snapshot whose callers all gave up is dropped at its next
// slice. Sorting and paging happen on the callers' goroutines, from the
// copy: the loop's cost does not depend on the page asked for.

const (
	// introspectSlice is the loop time one iteration gives a snapshot at
	// most: a wake waiting behind it is late by this much at worst.
	introspectSlice = 500 * time.Microsecond
	// snapMinGap is the least time between the end of a snapshot and the
	// start of the next; snapDuty bounds the share of loop time
	// snapshots take under a flood of requests: after a snapshot that
	// took the loop d, the next starts at least snapDuty*d later.
	snapMinGap = 10 * time.Millisecond
	snapDuty   = 9
	// snapCheckEvery is how many records are copied between two looks at
	// the clock.
	snapCheckEvery = 64
)

// snapJob is one snapshot: the callers waiting for it, and its result.
type snapJob struct {
	waiters atomic.Int32
	done    chan struct{}
	// Written on the loop before done closes, read after.
	abandoned bool
	// cancel, when set, releases what a dropped snapshot holds. Loop
	// goroutine.
	cancel   func()
	workers  *workerSnap
	channels *channelSnap
}

func newSnapJob() *snapJob { return &snapJob{done: make(chan struct{})} }

// snapper runs the snapshots of one kind.
type snapper struct {
	// next is the snapshot callers join: not started yet. Never nil once
	// the hub is made.
	next atomic.Pointer[snapJob]
	// kicked: a kick is posted and has not run yet, so callers need not
	// post another.
	kicked atomic.Bool

	// begin starts copying into j on the loop; the returned step copies
	// until the deadline and reports whether it is complete. Set by New.
	begin func(j *snapJob) (step func(until time.Time) bool)

	// The loop goroutine's.
	running   *snapJob
	step      func(until time.Time) bool
	busy      time.Duration // loop time the running snapshot took so far
	notBefore time.Time     // no snapshot starts earlier (the rate bound)
	timer     *loop.Timer   // a start waiting for notBefore
	// built and dropped count the snapshots completed and abandoned;
	// longest is the longest slice. For tests and the debug log.
	built, dropped, slices uint64
	longest                time.Duration
}

// snapshots are the hub's two snappers.
type snapshots struct {
	workers, channels snapper
	// The buffers of the last abandoned snapshot of each kind, reused by
	// the next one. Loop goroutine.
	spareRecs  []workerRec
	spareNames []string
	spareChans []chanRec
}

func (h *Hub) initSnapshots() {
	h.snaps.workers.begin = h.beginWorkers
	h.snaps.channels.begin = h.beginChannels
	h.snaps.workers.next.Store(newSnapJob())
	h.snaps.channels.next.Store(newSnapJob())
}

// wait joins the next snapshot and waits for it. Any goroutine.
func (s *snapper) wait(ctx context.Context, h *Hub) (*snapJob, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Whatever the loop does meanwhile, j had not started when it
		// was loaded: it shows the state after this call began.
		j := s.next.Load()
		j.waiters.Add(1)
		if s.kicked.CompareAndSwap(false, true) {
			if err := h.loop.Post(func() { s.kick(h) }); err != nil {
				j.waiters.Add(-1)
				return nil, ErrNotRunning
			}
		}
		select {
		case <-j.done:
			if j.abandoned {
				// Started and dropped before this caller counted:
				// join the next one.
				continue
			}
			return j, nil
		case <-ctx.Done():
			j.waiters.Add(-1)
			return nil, ctx.Err()
		case <-h.done:
			j.waiters.Add(-1)
			return nil, ErrNotRunning
		}
	}
}

// kick starts the next snapshot if someone waits for it and the rate
// allows, or schedules its start. Loop goroutine.
func (s *snapper) kick(h *Hub) {
	s.kicked.Store(false)
	if s.running != nil || s.timer != nil || h.closed {
		return // its end, or the timer, kicks again
	}
	j := s.next.Load()
	if j.waiters.Load() == 0 {
		return
	}
	if now := time.Now(); now.Before(s.notBefore) {
		s.timer = h.loop.AfterFunc(s.notBefore.Sub(now), func() {
			s.timer = nil
			s.kick(h)
		})
		return
	}
	s.next.Store(newSnapJob())
	s.running, s.busy = j, 0
	s.step = s.begin(j)
	s.slice(h)
}

// slice gives the running snapshot one slice of loop time, and posts the
// next slice (it runs in the next iteration, after the events that came
// meanwhile) until the snapshot is complete. Loop goroutine.
func (s *snapper) slice(h *Hub) {
	j := s.running
	if j == nil {
		return
	}
	complete := false
	if j.waiters.Load() > 0 && !h.closed {
		t0 := time.Now()
		complete = s.step(t0.Add(introspectSlice))
		d := time.Since(t0)
		s.busy += d
		s.longest = max(s.longest, d)
		s.slices++
		if !complete {
			h.loop.Post(func() { s.slice(h) })
			return
		}
	}
	// Complete, or nobody waits any more: drop what was copied, keeping
	// its buffers for the next snapshot (nobody else can hold them), so
	// that a flood of abandoned requests does not turn into garbage.
	if !complete {
		if j.cancel != nil {
			j.cancel()
		}
		if j.workers != nil {
			h.snaps.spareRecs, h.snaps.spareNames = j.workers.recs[:0], j.workers.names[:0]
		}
		if j.channels != nil {
			h.snaps.spareChans = j.channels.recs[:0]
		}
		j.abandoned, j.workers, j.channels = true, nil, nil
		s.dropped++
	} else {
		s.built++
	}
	s.running, s.step = nil, nil
	s.notBefore = time.Now().Add(max(snapMinGap, snapDuty*s.busy))
	close(j.done)
	s.kick(h) // callers that came while it ran
}

// workerRec is the copy of one worker a snapshot holds.
type workerRec struct {
	id, framesSent, durableCoalesced, durableDropped uint64
	connectedAt                                      int64
	pid, uid                                         int32
	subs, backlogFrames, durablePending              int32
	// names are its first MaxWorkerNames subscriptions: snap.names[names:
	// names+min(subs, MaxWorkerNames)], unsorted.
	names        int32
	backlogBytes int
}

// workerSnap is the workers as a snapshot saw them.
type workerSnap struct {
	recs  []workerRec
	names []string
	// byID is recs sorted by id without duplicates (a worker may be
	// copied twice when another leaves under the walk); sorted holds one
	// order per sort but "id", indexes into byID. Computed by the first
	// caller that needs them, off the loop.
	byID   atomic.Pointer[[]workerRec]
	sorted [4]atomic.Pointer[[]int32]
}

// beginWorkers starts a snapshot of the workers. The walk goes from the
// last worker to the first, so that none present throughout is missed:
// a worker that leaves is replaced by the last one, which was copied
// already (and may be copied twice; byID drops the duplicate). Workers
// that connect meanwhile are appended behind the walk and not copied.
func (h *Hub) beginWorkers(j *snapJob) func(time.Time) bool {
	ws := &workerSnap{recs: h.snaps.spareRecs, names: h.snaps.spareNames}
	h.snaps.spareRecs, h.snaps.spareNames = nil, nil
	if ws.recs == nil {
		ws.recs = make([]workerRec, 0, h.workers.len())
	}
	j.workers = ws
	i := h.workers.len() - 1
	return func(until time.Time) bool {
		for n := 1; ; n++ {
			i = min(i, h.workers.len()-1)
			if i < 0 {
				return true
			}
			if n%snapCheckEvery == 0 && time.Now().After(until) {
				return false
			}
			ws.add(h.workers.list[i])
			i--
		}
	}
}

func (ws *workerSnap) add(w *worker) {
	k := min(w.subs.len(), MaxWorkerNames)
	r := workerRec{
		id: w.id, framesSent: w.framesSent, durableCoalesced: w.durableCoalesced, durableDropped: w.durableDropped,
		connectedAt: w.connectedAt, pid: w.pid, uid: w.uid,
		subs: int32(w.subs.len()), backlogFrames: int32(w.out.Frames()), backlogBytes: w.out.Len(),
		durablePending: int32(w.pendingDurable()), names: int32(len(ws.names)),
	}
	for i := range k {
		ws.names = append(ws.names, w.subs.list[i].ch.q)
	}
	ws.recs = append(ws.recs, r)
}

// ids returns the records by id, duplicates dropped. Any goroutine.
func (ws *workerSnap) ids() []workerRec {
	return uniqueOnce(&ws.byID, ws.recs, func(r *workerRec) uint64 { return r.id })
}

// uniqueOnce returns recs sorted by id, duplicates dropped, made by the
// first call and kept in *p. Any goroutine.
func uniqueOnce[R any, K cmp.Ordered](p *atomic.Pointer[[]R], recs []R, id func(*R) K) []R {
	if u := p.Load(); u != nil {
		return *u
	}
	u := slices.Clone(recs)
	slices.SortFunc(u, func(a, b R) int { return cmp.Compare(id(&a), id(&b)) })
	u = slices.CompactFunc(u, func(a, b R) bool { return id(&a) == id(&b) })
	p.CompareAndSwap(nil, &u)
	return *p.Load()
}

// pageAt returns the accessor of the page's records from from on: in id
// order, or, with a key, by key descending then id (the order made once
// into orders[k]).
func pageAt[R any, K cmp.Ordered](recs []R, from int, orders []atomic.Pointer[[]int32], k int, key func(*R) int64, id func(*R) K) func(int) *R {
	if key == nil {
		return func(i int) *R { return &recs[from+i] }
	}
	order := sortedOnce(&orders[k], len(recs), func(a, b int32) int {
		ra, rb := &recs[a], &recs[b]
		return cmp.Or(cmp.Compare(key(rb), key(ra)), cmp.Compare(id(ra), id(rb)))
	})
	return func(i int) *R { return &recs[order[from+i]] }
}

// workerKey is the sort key of the worker orders but SortID.
func workerKey(sort Sort) (int, func(*workerRec) int64) {
	switch sort {
	case SortBacklog:
		return 0, func(r *workerRec) int64 { return int64(r.backlogBytes) }
	case SortSent:
		return 1, func(r *workerRec) int64 { return int64(r.framesSent) }
	case SortSubscriptions:
		return 2, func(r *workerRec) int64 { return int64(r.subs) }
	case SortDropped:
		return 3, func(r *workerRec) int64 { return int64(r.durableDropped) }
	}
	return -1, nil
}

// page returns a page of the snapshot: O(limit) once the snapshot's order
// for the sort is made (once per snapshot and sort, O(n log n), off the
// loop). Any goroutine.
func (ws *workerSnap) page(o ListOptions) WorkerList {
	recs := ws.ids()
	out := WorkerList{Total: len(recs), Offset: o.Offset, Limit: o.Limit, Sort: o.Sort}
	from := min(o.Offset, len(recs))
	n := min(o.Limit, len(recs)-from)
	out.Workers = make([]WorkerInfo, 0, n)
	k, key := workerKey(o.Sort)
	at := pageAt(recs, from, ws.sorted[:], k, key, func(r *workerRec) uint64 { return r.id })
	for i := range n {
		r := at(i)
		names := slices.Clone(ws.names[r.names : int(r.names)+min(int(r.subs), MaxWorkerNames)])
		if names == nil {
			names = []string{}
		}
		slices.Sort(names)
		out.Workers = append(out.Workers, WorkerInfo{
			ID: r.id, PID: int(r.pid), UID: int(r.uid), ConnectedAt: time.Unix(0, r.connectedAt),
			Subscriptions: int(r.subs), Names: names,
			BacklogFrames: int(r.backlogFrames), BacklogBytes: r.backlogBytes, DurablePending: int(r.durablePending),
			FramesSent: r.framesSent, DurableCoalesced: r.durableCoalesced, DurableDropped: r.durableDropped,
		})
	}
	return out
}

// sortedOnce returns the indexes 0..n-1 in cmp order, made by the first
// caller and kept in p.
func sortedOnce(p *atomic.Pointer[[]int32], n int, cmp func(a, b int32) int) []int32 {
	if o := p.Load(); o != nil {
		return *o
	}
	order := make([]int32, n)
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, cmp)
	p.CompareAndSwap(nil, &order)
	return *p.Load()
}

// chanRec is the copy of one channel a snapshot holds.
type chanRec struct {
	q, pg, state        string
	subs, waiting       int32
	received, delivered uint64
}

// channelSnap is the channels as a snapshot saw them.
type channelSnap struct {
	recs   []chanRec
	byName atomic.Pointer[[]chanRec]
	sorted [3]atomic.Pointer[[]int32]
}

// beginChannels starts a snapshot of the channels: a walk over the map
// that resumes where the last slice stopped (iter.Pull). Go's map
// iteration allows changes under it: a channel present throughout is
// seen once, one added or deleted meanwhile may or may not be, and a name
// deleted and added again may be seen twice (names drops the duplicate).
func (h *Hub) beginChannels(j *snapJob) func(time.Time) bool {
	cs := &channelSnap{recs: h.snaps.spareChans}
	h.snaps.spareChans = nil
	if cs.recs == nil {
		cs.recs = make([]chanRec, 0, len(h.channels))
	}
	j.channels = cs
	next, stop := iter.Pull(maps.Values(h.channels))
	j.cancel = stop
	return func(until time.Time) bool {
		for n := 1; ; n++ {
			if n%snapCheckEvery == 0 && time.Now().After(until) {
				return false
			}
			ch, ok := next()
			if !ok {
				stop()
				return true
			}
			state := ch.state.String()
			if ch.unlistenFailed {
				state = "unlisten-failed"
			}
			cs.recs = append(cs.recs, chanRec{q: ch.q, pg: ch.pg, state: state,
				subs: int32(len(ch.subs)), waiting: int32(len(ch.waiters)),
				received: ch.wakesReceived, delivered: ch.wakesDelivered})
		}
	}
}

// names returns the records by name, duplicates dropped. Any goroutine.
func (cs *channelSnap) names() []chanRec {
	return uniqueOnce(&cs.byName, cs.recs, func(r *chanRec) string { return r.q })
}

func channelKey(sort Sort) (int, func(*chanRec) int64) {
	switch sort {
	case SortSubscribers:
		return 0, func(r *chanRec) int64 { return int64(r.subs) }
	case SortReceived:
		return 1, func(r *chanRec) int64 { return int64(r.received) }
	case SortDelivered:
		return 2, func(r *chanRec) int64 { return int64(r.delivered) }
	}
	return -1, nil
}

// page returns a page of the snapshot, as workerSnap.page.
func (cs *channelSnap) page(o ListOptions) ChannelList {
	recs := cs.names()
	out := ChannelList{Total: len(recs), Offset: o.Offset, Limit: o.Limit, Sort: o.Sort}
	from := min(o.Offset, len(recs))
	n := min(o.Limit, len(recs)-from)
	out.Channels = make([]ChannelInfo, 0, n)
	k, key := channelKey(o.Sort)
	at := pageAt(recs, from, cs.sorted[:], k, key, func(r *chanRec) string { return r.q })
	for i := range n {
		r := at(i)
		out.Channels = append(out.Channels, ChannelInfo{
			Name: r.q, Channel: r.pg, Subscribers: int(r.subs), State: r.state, Waiting: int(r.waiting),
			WakesReceived: r.received, WakesDelivered: r.delivered,
		})
	}
	return out
}
