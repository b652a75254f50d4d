package hub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

func (e *env) workers(o ListOptions) WorkerList {
	e.t.Helper()
	return envPage(e, "Workers", o, e.h.Workers)
}

func (e *env) channelList(o ListOptions) ChannelList {
	e.t.Helper()
	return envPage(e, "Channels", o, e.h.Channels)
}

// envPage asks list (the hub's method name) for the page o.
func envPage[L any](e *env, name string, o ListOptions, list func(context.Context, ListOptions) (L, error)) L {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	l, err := list(ctx, o)
	if err != nil {
		e.t.Fatalf("%s(%+v): %v", name, o, err)
	}
	return l
}

func workerIDs(l WorkerList) []uint64 {
	var ids []uint64
	for _, w := range l.Workers {
		ids = append(ids, w.ID)
	}
	return ids
}

func channelNames(l ChannelList) []string {
	var n []string
	for _, c := range l.Channels {
		n = append(n, c.Name)
	}
	return n
}

// Workers reports every connected worker with its peer credentials, its
// subscriptions (names bounded by MaxWorkerNames) and its own counters, sorted
// and paged as asked, with the total count on every page.
func TestWorkersListing(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.DurableQueueLimit = 2 })
	e.do(func() { e.pg.auto = true })
	before := time.Now()
	ws := []*tw{e.dial(), e.dial(), e.dial(), e.dial(), e.dial()}
	// Worker i subscribes to i+1 names; worker 5 to 12 (beyond MaxWorkerNames).
	for i, w := range ws {
		n := i + 1
		if i == 4 {
			n = 12
		}
		for j := range n {
			q := fmt.Sprintf("q%02d", n-j) // out of order: names come back sorted
			w.sub(q)
			w.expect(ack(q))
		}
	}
	// Worker 3 gets 3 extra ephemeral wakes on q01, read.
	for range 3 {
		e.notify("q01", "x")
	}
	for _, w := range ws {
		for range 3 {
			w.expect(wake("q01", ptr("x")))
		}
	}
	e.notify("q02", "y") // workers 2..5 hold q02
	for _, w := range ws[1:] {
		w.expect(wake("q02", ptr("y")))
	}

	l := e.workers(ListOptions{})
	if l.Total != 5 || l.Limit != DefaultListLimit || l.Offset != 0 || l.Sort != "id" {
		t.Fatalf("list header %+v, want total 5, limit %d, offset 0, sort id", l, DefaultListLimit)
	}
	if got := workerIDs(l); !slices.Equal(got, []uint64{1, 2, 3, 4, 5}) {
		t.Fatalf("ids %v, want 1..5", got)
	}
	for i, w := range l.Workers {
		if w.PID != os.Getpid() || w.UID != os.Getuid() {
			t.Errorf("worker %d: pid %d uid %d, want %d %d", w.ID, w.PID, w.UID, os.Getpid(), os.Getuid())
		}
		if w.ConnectedAt.Before(before.Add(-time.Second)) || w.ConnectedAt.After(time.Now()) {
			t.Errorf("worker %d: connected at %v, test began %v", w.ID, w.ConnectedAt, before)
		}
		subs := i + 1
		if i == 4 {
			subs = 12
		}
		if w.Subscriptions != subs || len(w.Names) != min(subs, MaxWorkerNames) || !slices.IsSorted(w.Names) {
			t.Errorf("worker %d: %d subscriptions %v, want %d, at most %d names, sorted", w.ID, w.Subscriptions, w.Names, subs, MaxWorkerNames)
		}
		// status + acks + 3 wakes on q01 (+1 on q02 from worker 2 on).
		sent := uint64(1 + subs + 3)
		if i > 0 {
			sent++
		}
		if w.FramesSent != sent || w.BacklogFrames != 0 || w.BacklogBytes != 0 {
			t.Errorf("worker %d: sent %d backlog %d/%d, want %d, 0, 0", w.ID, w.FramesSent, w.BacklogFrames, w.BacklogBytes, sent)
		}
	}
	if got := l.Workers[1].Names; !slices.Equal(got, []string{"q01", "q02"}) {
		t.Errorf("worker 2 names %v, want [q01 q02]", got)
	}

	// Paging: offset and limit over the sorted list; past the end, empty
	// with the total still there.
	if got := workerIDs(e.workers(ListOptions{Limit: 2, Offset: 1})); !slices.Equal(got, []uint64{2, 3}) {
		t.Errorf("limit 2 offset 1: %v, want [2 3]", got)
	}
	if p := e.workers(ListOptions{Limit: 2, Offset: 4}); !slices.Equal(workerIDs(p), []uint64{5}) || p.Total != 5 {
		t.Errorf("limit 2 offset 4: %v total %d, want [5] and 5", workerIDs(p), p.Total)
	}
	if p := e.workers(ListOptions{Offset: 9}); len(p.Workers) != 0 || p.Workers == nil || p.Total != 5 {
		t.Errorf("offset 9: %+v, want an empty (non-nil) page and total 5", p)
	}
	if p := e.workers(ListOptions{Offset: math.MaxInt, Limit: MaxListLimit}); len(p.Workers) != 0 || p.Total != 5 {
		t.Errorf("offset MaxInt: %+v, want an empty page and total 5", p)
	}
	if p := e.workers(ListOptions{Offset: 3, Limit: MaxListLimit}); !slices.Equal(workerIDs(p), []uint64{4, 5}) {
		t.Errorf("offset 3, limit max: %v, want [4 5]", workerIDs(p))
	}
	// Sorting: largest first, ties by id.
	if got := workerIDs(e.workers(ListOptions{Sort: "subscriptions", Limit: 3})); !slices.Equal(got, []uint64{5, 4, 3}) {
		t.Errorf("by subscriptions: %v, want [5 4 3]", got)
	}
	if got := workerIDs(e.workers(ListOptions{Sort: "sent"})); !slices.Equal(got, []uint64{5, 4, 3, 2, 1}) {
		t.Errorf("by sent: %v, want [5 4 3 2 1]", got)
	}

	// Per-worker durable counters: worker 1 stops reading (its socket
	// fills), then durable wakes coalesce and drop for it alone.
	ws[0].sub("fill")
	ws[0].expect(ack("fill"))
	e.fill(1)
	for range 3 {
		e.do(func() {
			e.h.onNotification([]byte("q01"), nil)
			e.h.onNotification([]byte("q01"), nil)
		})
	}
	for _, w := range ws[1:] {
		w.expect(wake("q01", nil), wake("q01", nil), wake("q01", nil))
	}
	by := e.workers(ListOptions{Sort: "dropped", Limit: 1})
	w1 := by.Workers[0]
	// Iteration 1 queues a q01 wake for worker 1 and coalesces the
	// second; later iterations coalesce both into it (it is never
	// written). The reading workers get one wake per iteration.
	if w1.ID != 1 || w1.DurableCoalesced != 5 || w1.DurableDropped != 0 || w1.DurablePending != 1 {
		t.Errorf("worker 1: %+v, want coalesced 5, dropped 0, pending 1", w1)
	}
	if w1.BacklogFrames == 0 || w1.BacklogBytes == 0 {
		t.Errorf("worker 1: backlog %d frames %d bytes, want a backlog", w1.BacklogFrames, w1.BacklogBytes)
	}
	if got := workerIDs(e.workers(ListOptions{Sort: "backlog", Limit: 1})); !slices.Equal(got, []uint64{1}) {
		t.Errorf("by backlog: %v, want [1]", got)
	}
	ws[4].sub("q13")
	ws[4].sub("q14")
	ws[4].expect(ack("q13"), ack("q14"))
	// Worker 1 is wedged on a full socket: give it two more durable
	// channels to overflow DurableQueueLimit 2.
	ws[0].sub("q13")
	ws[0].sub("q14")
	e.sync()
	e.do(func() {
		for _, q := range []string{"q13", "q14"} {
			e.h.onNotification([]byte(q), nil)
		}
	})
	ws[4].expect(wake("q13", nil), wake("q14", nil))
	by = e.workers(ListOptions{Sort: "dropped", Limit: 1})
	if w := by.Workers[0]; w.ID != 1 || w.DurableDropped == 0 {
		t.Errorf("by dropped: %+v, want worker 1 with drops", w)
	}
	if s := e.h.Stats(); s.DurableDropped != by.Workers[0].DurableDropped {
		t.Errorf("hub dropped %d, worker 1 %d: only worker 1 drops", s.DurableDropped, by.Workers[0].DurableDropped)
	}
}

// Bad options are refused before the loop is asked; a limit of 0 means the
// default; MaxListLimit is accepted.
func TestListOptionBounds(t *testing.T) {
	e := newEnv(t, nil)
	e.dial()
	ctx := context.Background()
	for _, o := range []ListOptions{
		{Limit: -1}, {Limit: MaxListLimit + 1}, {Offset: -1}, {Sort: "pid"},
	} {
		if _, err := e.h.Workers(ctx, o); err == nil {
			t.Errorf("Workers(%+v): no error", o)
		}
		if _, err := e.h.Channels(ctx, o); err == nil {
			t.Errorf("Channels(%+v): no error", o)
		}
	}
	if _, err := e.h.Channels(ctx, ListOptions{Sort: "id"}); err == nil {
		t.Error(`Channels(sort "id"): no error`)
	}
	if l := e.workers(ListOptions{Limit: MaxListLimit}); l.Limit != MaxListLimit || l.Total != 1 || len(l.Workers) != 1 {
		t.Errorf("limit max: %+v", l)
	}
}

// Channels reports each channel of the union: its Postgres name, its
// subscribers, where its LISTEN stands, the subs waiting for an answer, and
// its NOTIFYs received and wakes delivered.
func TestChannelsListing(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ChannelPrefix = "p." })
	w1, w2, w3 := e.dial(), e.dial(), e.dial()
	for _, w := range []*tw{w1, w2, w3} {
		w.sub("b")
	}
	w1.sub("a")
	w2.sub("c")
	e.sync()
	e.complete("LISTEN", "p.b", nil)
	e.complete("LISTEN", "p.c", nil)
	for _, w := range []*tw{w1, w2, w3} {
		w.expect(ack("b"))
	}
	w2.expect(ack("c"))
	for range 4 {
		e.notify("p.b", "x")
	}
	e.notify("p.c", "")
	e.notify("p.nobody", "") // not in the union: counted nowhere here

	l := e.channelList(ListOptions{})
	if l.Total != 3 || l.Sort != "name" || l.Limit != DefaultListLimit {
		t.Fatalf("header %+v", l)
	}
	want := []ChannelInfo{
		{Name: "a", Channel: "p.a", Subscribers: 1, State: "listen-in-flight", Waiting: 1},
		{Name: "b", Channel: "p.b", Subscribers: 3, State: "listening", WakesReceived: 4, WakesDelivered: 12},
		{Name: "c", Channel: "p.c", Subscribers: 1, State: "listening", WakesReceived: 1, WakesDelivered: 1},
	}
	if !slices.Equal(l.Channels, want) {
		t.Fatalf("channels\n  %+v\nwant\n  %+v", l.Channels, want)
	}
	if got := channelNames(e.channelList(ListOptions{Sort: "subscribers"})); !slices.Equal(got, []string{"b", "a", "c"}) {
		t.Errorf("by subscribers: %v, want [b a c] (ties by name)", got)
	}
	if got := channelNames(e.channelList(ListOptions{Sort: "received", Limit: 1, Offset: 1})); !slices.Equal(got, []string{"c"}) {
		t.Errorf("by received, page 2 of 1: %v, want [c]", got)
	}
	if got := channelNames(e.channelList(ListOptions{Sort: "delivered", Limit: 2})); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("by delivered: %v, want [b c]", got)
	}
	// The last subscriber leaves c: UNLISTEN in flight, no subscriber.
	w2.unsub("c")
	e.sync()
	l = e.channelList(ListOptions{Offset: 2})
	if len(l.Channels) != 1 || l.Channels[0].State != "unlisten-in-flight" || l.Channels[0].Subscribers != 0 {
		t.Fatalf("after unsub: %+v", l.Channels)
	}
	e.complete("UNLISTEN", "p.c", nil)
	if l := e.channelList(ListOptions{}); l.Total != 2 {
		t.Fatalf("after UNLISTEN: total %d, want 2", l.Total)
	}
}

// A page of a snapshot is the page a full sort of it would give, for every
// sort, offset and limit.
func TestSnapshotPageMatchesSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 7, 60} {
		ws := &workerSnap{}
		for i := range n {
			subs := r.IntN(5)
			ws.recs = append(ws.recs, workerRec{id: uint64(n - i), framesSent: uint64(r.IntN(5)),
				subs: int32(subs), backlogBytes: r.IntN(5), durableDropped: uint64(r.IntN(5)), names: int32(len(ws.names))})
			for k := range subs {
				ws.names = append(ws.names, fmt.Sprint(k))
			}
		}
		for _, sort := range workerSorts {
			all := ws.page(ListOptions{Sort: sort, Limit: MaxListLimit}).Workers
			_, key := workerKey(sort)
			want := slices.Clone(ws.recs)
			slices.SortFunc(want, func(a, b workerRec) int {
				if key == nil {
					return cmp.Compare(a.id, b.id)
				}
				return cmp.Or(cmp.Compare(key(&b), key(&a)), cmp.Compare(a.id, b.id))
			})
			if len(all) != n {
				t.Fatalf("n %d sort %s: %d entries", n, sort, len(all))
			}
			for i := range want {
				if all[i].ID != want[i].id {
					t.Fatalf("n %d sort %s: entry %d is %d, want %d", n, sort, i, all[i].ID, want[i].id)
				}
			}
			for off := 0; off <= n+1; off++ {
				for lim := 1; lim <= n+1; lim++ {
					got := ws.page(ListOptions{Sort: sort, Offset: off, Limit: lim}).Workers
					if !slices.EqualFunc(got, all[min(off, n):min(off+lim, n)], func(a, b WorkerInfo) bool { return a.ID == b.ID }) {
						t.Fatalf("n %d sort %s offset %d limit %d: %v", n, sort, off, lim, got)
					}
				}
			}
		}
	}
}

// The walk of a snapshot resumes across slices while workers come and go
// under it: every worker present throughout is copied exactly once (the
// duplicates a departure causes are dropped), and nothing else but
// workers that were there at some point.
func TestSnapshotWalkUnderChurn(t *testing.T) {
	h, err := New(Config{SocketPath: "/nonexistent/x.sock"})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	nextID := uint64(0)
	add := func() {
		nextID++
		h.workers.add(&worker{id: nextID})
	}
	for range 5000 {
		add()
	}
	steady := map[uint64]bool{}
	for _, w := range h.workers.list {
		steady[w.id] = true
	}
	j := newSnapJob()
	step := h.beginWorkers(j)
	past := time.Now().Add(-time.Second) // every slice is as short as can be
	slices := 0
	for !step(past) {
		slices++
		for range 3 {
			w := h.workers.list[r.IntN(h.workers.len())]
			delete(steady, w.id)
			h.workers.remove(w)
			add()
		}
	}
	if slices < 5000/snapCheckEvery-1 {
		t.Fatalf("%d slices for 5,000 workers: a slice did not stop at its deadline", slices)
	}
	seen := map[uint64]bool{}
	for _, r := range j.workers.ids() {
		if seen[r.id] {
			t.Fatalf("worker %d twice", r.id)
		}
		seen[r.id] = true
		if r.id > nextID {
			t.Fatalf("worker %d never existed", r.id)
		}
	}
	for id := range steady {
		if !seen[id] {
			t.Fatalf("worker %d, connected throughout, missing", id)
		}
	}
	t.Logf("%d slices, %d copied, %d connected throughout", slices, len(seen), len(steady))
}

// Introspection costs the loop at most a bounded slice per iteration:
// with 20,000 workers a snapshot takes several slices, none much over
// introspectSlice. Callers at the same moment share snapshots; a caller
// that gives up before its snapshot is done has it dropped.
func TestSnapshotSlicesSharedAndDropped(t *testing.T) {
	e := newEnv(t, nil)
	e.dial()
	e.do(func() {
		for i := range 20000 {
			e.h.workers.add(&worker{id: uint64(1000 + i)})
		}
	})
	t.Cleanup(func() {
		e.do(func() {
			for _, w := range slices.Clone(e.h.workers.list) {
				if w.id >= 1000 {
					e.h.workers.remove(w)
				}
			}
		})
	})
	var s struct {
		built, dropped, slices uint64
		longest                time.Duration
	}
	read := func() {
		e.do(func() {
			sn := &e.h.snaps.workers
			s.built, s.dropped, s.slices, s.longest = sn.built, sn.dropped, sn.slices, sn.longest
		})
	}
	// 50 callers at once.
	errs := make(chan error, 50)
	for range 50 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			l, err := e.h.Workers(ctx, ListOptions{Offset: 20000, Limit: 1})
			if err == nil && (l.Total != 20001 || len(l.Workers) != 1 || l.Workers[0].ID != 20999) {
				err = fmt.Errorf("page %+v", l)
			}
			errs <- err
		}()
	}
	for range 50 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	read()
	t.Logf("50 callers: %d snapshots in %d slices, longest slice %v", s.built, s.slices, s.longest)
	if s.built > 25 {
		t.Errorf("%d snapshots for 50 simultaneous callers: not shared", s.built)
	}
	// What matters is that 20,000 workers are not copied in one go; the
	// slices' wall time on a loaded (or -race) machine includes the
	// thread's preemptions, so it is only logged.
	// (A quick machine copies them within one slice.)
	if s.slices < 2*s.built && s.longest > 2*introspectSlice {
		t.Errorf("%d snapshots of 20,000 workers in %d slices, the longest %v", s.built, s.slices, s.longest)
	}
	// A caller that gives up: its snapshot is dropped, not finished.
	built := s.built
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := e.h.Workers(ctx, ListOptions{})
		done <- err
	}()
	// The next snapshot starts no sooner than snapDuty times the loop time
	// the last ones took (under -race on a loaded machine, seconds): wait
	// that out as well.
	var notBefore time.Time
	e.do(func() { notBefore = e.h.snaps.workers.notBefore })
	testutil.WaitFor(t, timeout+max(0, time.Until(notBefore)), "the snapshot started", func() bool {
		running := false
		e.do(func() { running = e.h.snaps.workers.running != nil })
		return running || len(done) > 0
	})
	cancel()
	if err := <-done; err == nil {
		t.Skip("the snapshot was done before the caller gave up")
	}
	testutil.WaitFor(t, timeout, "the abandoned snapshot dropped", func() bool {
		read()
		return s.dropped >= 1 || s.built != built
	})
	if s.dropped == 0 {
		// The last slice completed it as the caller left: Workers saw
		// its context done first, but nothing was abandoned.
		t.Skip("the snapshot was done as the caller gave up")
	}
	if s.built != built {
		t.Errorf("%d snapshots finished for a caller that left", s.built-built)
	}
}

// Workers and Channels answer ErrNotRunning once the hub stopped, and ctx's
// error when it ends first.
func TestListNotRunning(t *testing.T) {
	h, err := New(Config{SocketPath: "/nonexistent/x.sock"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Workers(context.Background(), ListOptions{}); !errors.Is(err, ErrNotRunning) {
		t.Errorf("before Start: %v, want ErrNotRunning", err)
	}
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Either answer is right for a cancelled ctx when the loop is quick;
	// what must not happen is a hang or a panic.
	if _, err := e.h.Channels(ctx, ListOptions{}); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: %v", err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), timeout)
	defer scancel()
	if err := e.h.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.h.Workers(context.Background(), ListOptions{}); !errors.Is(err, ErrNotRunning) {
		t.Errorf("after Stop: %v, want ErrNotRunning", err)
	}
}

// The fanout latency is one observation per routed notification, recorded
// at the iteration's flush; notifications nobody subscribed to are not
// observed. Acks are observed once each, including the wait for LISTEN.
func TestLatencyHistograms(t *testing.T) {
	e := newEnv(t, nil)
	w := e.dial()
	w.sub("a")
	e.sync()
	time.Sleep(30 * time.Millisecond) // the LISTEN takes a while
	e.complete("LISTEN", "a", nil)
	w.expect(ack("a"))
	w.sub("a") // already LISTENed: acked at once
	w.expect(ack("a"))
	a := e.h.AckLatency()
	if a.Count != 2 || a.Sum < 30*time.Millisecond {
		t.Fatalf("ack latency: count %d sum %v, want 2 and at least 30ms", a.Count, a.Sum)
	}
	if i := slices.Index(a.Bounds, 25*time.Millisecond); a.Counts[i] != 1 {
		t.Errorf("ack latency: %d observations <= 25ms, want 1 (the immediate ack): %+v", a.Counts[i], a)
	}
	e.do(func() {
		for range 5 {
			e.h.onNotification([]byte("a"), []byte("x"))
		}
		e.h.onNotification([]byte("nobody"), []byte("x"))
	})
	for range 5 {
		w.expect(wake("a", ptr("x")))
	}
	e.sync() // the observation follows the write in the same flush
	f := e.h.FanoutLatency()
	if f.Count != 5 || f.Counts[len(f.Counts)-1] != 5 {
		t.Fatalf("fanout latency: %+v, want 5 observations under the last bound", f)
	}
	for i := 1; i < len(f.Counts); i++ {
		if f.Counts[i] < f.Counts[i-1] {
			t.Fatalf("buckets not cumulative: %v", f.Counts)
		}
	}
}

// The fanout with its latency bookkeeping and the end-of-iteration flush
// allocate nothing.
func TestFanoutLatencyNoAllocs(t *testing.T) {
	h := benchHub(t, 8)
	payload := []byte(strings.Repeat("x", 100))
	allocs := testing.AllocsPerRun(200, func() {
		h.onNotification([]byte("bench"), payload)
		h.onNotification([]byte("bench"), payload)
		h.flush()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per notification batch, want 0", allocs)
	}
	if c := h.FanoutLatency().Count; c < 400 {
		t.Fatalf("fanout latency count %d, want at least 400", c)
	}
}
