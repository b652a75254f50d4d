package hub

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// backlogWorker is a worker subscribed to "big" that has not read: the hub
// holds a backlog of numbered wakes for it, over precopyMin.
type backlogWorker struct {
	*tw
	h    *Hub
	next int // the seq the next wake read must carry
	sent int // wakes NOTIFYed so far
}

// newBacklogWorker subscribes a worker and NOTIFYs n wakes of ~8 KB it does
// not read, until the hub's ring for it holds at least precopyMin.
func newBacklogWorker(t *testing.T, env *pgEnv, n int) *backlogWorker {
	t.Helper()
	b := &backlogWorker{tw: env.dial(), h: env.h, next: 1}
	b.subscribe("big")
	b.notify(t, env, n)
	testutil.WaitFor(t, timeout, "the backlog in the hub's ring", func() bool {
		_, _, pending := b.ring(t)
		return pending >= precopyMin+64<<10
	})
	return b
}

// notify NOTIFYs n more numbered wakes and waits until the hub queued them.
func (b *backlogWorker) notify(t *testing.T, env *pgEnv, n int) {
	t.Helper()
	from := b.sent + 1
	b.sent += n
	env.exec(fmt.Sprintf(`SELECT pg_notify('big', g || ':' || repeat('x', 7900)) FROM generate_series(%d, %d) g`, from, b.sent))
	testutil.WaitFor(t, timeout, "the wakes queued", func() bool { return b.delivered(t) >= uint64(b.sent) })
}

// delivered is the hub's count of wakes of "big" delivered (queued).
func (b *backlogWorker) delivered(t *testing.T) uint64 {
	t.Helper()
	got := make(chan uint64, 1)
	if err := b.h.loop.Post(func() {
		for _, ch := range b.h.channels {
			if ch.q == "big" {
				got <- ch.wakesDelivered
				return
			}
		}
		got <- 0
	}); err != nil {
		t.Fatal(err)
	}
	return <-got
}

// ring is the hub's ring for the worker: Written, Appended, Len.
func (b *backlogWorker) ring(t *testing.T) (written, appended uint64, pending int) {
	t.Helper()
	type r struct {
		w, a uint64
		n    int
	}
	got := make(chan r, 1)
	if err := b.h.loop.Post(func() {
		for w := range b.h.workers.all() {
			if w.subs.get("big") != nil {
				got <- r{w.out.Written(), w.out.Appended(), w.out.Len()}
				return
			}
		}
		got <- r{}
	}); err != nil {
		t.Fatal(err)
	}
	x := <-got
	return x.w, x.a, x.n
}

// read reads n wakes and checks that they carry the next seqs in order
// (status frames in between are skipped).
func (b *backlogWorker) read(t *testing.T, n int) {
	t.Helper()
	for n > 0 {
		m, err := b.tw.read(timeout)
		if err != nil {
			t.Fatalf("worker read, expecting wake %d: %v", b.next, err)
		}
		if m.Type == "status" {
			continue
		}
		seq, _, _ := strings.Cut(m.Payload, ":")
		if m.Type != "wake" || m.Name != "big" || seq != strconv.Itoa(b.next) || len(m.Payload) != len(seq)+1+7900 {
			t.Fatalf("worker got %s %q %q... (%d bytes), want wake %d: lost, duplicated or torn", m.Type, m.Name, seq, len(m.Payload), b.next)
		}
		b.next++
		n--
	}
}

// memfds counts this process's descriptors on an upgrade's backlog file.
// memfdAllocated is the space the upgrade's memfds open in this process
// hold (allocated blocks, not their sparse size).
func memfdAllocated(t *testing.T) uint64 {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.HasPrefix(l, "/memfd:listenhub-upgrade") {
			fi, err := os.Stat("/proc/self/fd/" + e.Name())
			if err != nil {
				continue // closed meanwhile
			}
			n += uint64(fi.Sys().(*syscall.Stat_t).Blocks) * 512
		}
	}
	return n
}

func memfds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.HasPrefix(l, "/memfd:listenhub-upgrade") {
			n++
		}
	}
	return n
}

// holdAfterPrecopy makes h's next upgrade stop between the pre-copy and the
// freeze: the pre-copy comes on the returned channel, and the upgrade goes
// on when the test calls goOn (or ends).
func holdAfterPrecopy(t *testing.T, h *Hub) (copied <-chan *precopy, goOn func()) {
	c, release := make(chan *precopy, 1), make(chan struct{})
	var once sync.Once
	goOn = func() { once.Do(func() { close(release) }) }
	t.Cleanup(goOn)
	setHooks(t, h, hooks{precopied: func(pc *precopy) {
		c <- pc
		<-release
	}})
	return c, goOn
}

// drainAndGrow is what happens to the pre-copied worker between the pre-copy
// and the freeze: it reads some wakes (the hub writes on from its ring, past
// the copy's start) and more wakes are queued (past its end).
func drainAndGrow(t *testing.T, env *pgEnv, b *backlogWorker, pc *precopy) {
	t.Helper()
	if pc == nil || len(pc.order) != 1 || !pc.order[0].ok || pc.order[0].next != pc.order[0].p1 {
		t.Fatalf("pre-copy %+v: want the worker's backlog copied", pc)
	}
	p := pc.order[0]
	// The hub hears that the socket has room once the worker has read
	// most of what it holds: read until then.
	testutil.WaitFor(t, timeout, "the hub writing past the copy's start", func() bool {
		if written, _, _ := b.ring(t); written > p.p0 {
			return true
		}
		b.read(t, 2)
		return false
	})
	b.notify(t, env, 15)
	written, appended, _ := b.ring(t)
	if written >= p.p1 || appended <= p.p1 {
		t.Fatalf("ring [%d, %d) against the copy [%d, %d): want it partly sent and grown", written, appended, p.p0, p.p1)
	}
}

// TestHandoverPrecopied: a worker whose backlog was pre-copied, and which
// then read part of it and got more wakes before the freeze, receives every
// wake exactly once and in order across a whole upgrade between two hubs
// of one process: the part sent by the old hub, the pre-copied rest and
// the part queued after the copy from the new one, then wakes the new hub
// queued behind the mapping without copying it out. The backlog file is
// closed in both once the worker has read everything.
func TestHandoverPrecopied(t *testing.T) {
	env := newPGEnv(t, nil)
	b := newBacklogWorker(t, env, 160)
	copied, goOn := holdAfterPrecopy(t, env.h)

	nh, handed, took := upgradeInProcess(t, env.h)

	pc := <-copied
	drainAndGrow(t, env, b, pc)
	// What the worker read since the copy (from p0 to written) is in the
	// file but not handed over: the old hub frees those pages.
	written, appended, _ := b.ring(t)
	page := uint64(os.Getpagesize())
	if written-pc.order[0].p0 < 2*page {
		t.Fatalf("the worker read %d bytes of the copy: too few to tell freed pages apart", written-pc.order[0].p0)
	}
	goOn()
	if err := <-handed; err != nil {
		t.Fatalf("handover: %v", err)
	}
	if err := <-took; err != nil {
		t.Fatalf("takeover: %v", err)
	}
	if !strings.Contains(env.logs.String(), "mapped=1") {
		t.Fatal("the worker's backlog was not handed over in the file")
	}
	if got, most := memfdAllocated(t), appended-written+2*page; got > most {
		t.Errorf("the backlog file holds %d bytes after the hand-over; the handed part is at most %d", got, most)
	}
	b.h = nh
	var base0 int
	doOn(t, nh, func() { base0 = nh.fds.fdBase })
	// Wakes queued while the worker is still behind go behind the mapping
	// in the new hub's ring, which does not copy the mapping for them: its
	// pages stay in the file until the worker read them.
	_, a0, _ := b.ring(t)
	from := b.sent + 1
	b.sent += 3
	env.exec(fmt.Sprintf(`SELECT pg_notify('big', g || ':' || repeat('x', 7900)) FROM generate_series(%d, %d) g`, from, b.sent))
	testutil.WaitFor(t, timeout, "the wakes queued behind the mapping", func() bool {
		_, a, _ := b.ring(t)
		return a >= a0+3*7900
	})
	if got := memfdAllocated(t); got == 0 {
		t.Fatal("queuing a wake let go of the mapping: the pre-copied backlog was copied")
	}
	b.read(t, b.sent-b.next+1)
	env.exec(`NOTIFY big, 'after:` + strings.Repeat("x", 7900) + `'`)
	if m, err := b.tw.read(timeout); err != nil || m.Type != "wake" || !strings.HasPrefix(m.Payload, "after:") {
		t.Fatalf("after the backlog: %+v, %v; want the new wake", m, err)
	}
	b.none()
	testutil.WaitFor(t, timeout, "the backlog file closed", func() bool { return memfds(t) == 0 })
	// Its descriptor, counted in the budget at the takeover, is the
	// workers' again.
	var base int
	doOn(t, nh, func() { base = nh.fds.fdBase })
	if base != base0-1 {
		t.Fatalf("descriptors outside the workers: %d after the backlog file closed, %d before; want one fewer", base, base0)
	}
}

// TestHandoverPrecopyRollback: an upgrade abandoned after the pre-copy (the
// new process took the state, file and all, and died) leaves the old hub
// as it was: the worker, which read part of its backlog and got more
// wakes between the pre-copy and the freeze, receives every wake exactly
// once and in order from the old hub, and the file is closed.
func TestHandoverPrecopyRollback(t *testing.T) {
	env := newPGEnv(t, nil)
	b := newBacklogWorker(t, env, 160)
	copied, goOn := holdAfterPrecopy(t, env.h)

	old, fake := connPair(t)
	fakeErr := make(chan error, 1)
	go func() {
		fakeErr <- func() error {
			if _, err := helloPrepared(fake); err != nil {
				return err
			}
			m, fds, err := recvMsg(fake)
			if err != nil {
				return err
			}
			closeAll(fds)
			if m.T != "state" || m.State == nil {
				return fmt.Errorf("got %+v, want state", m)
			}
			if err := recvRaw(fake, m.State.Workers); err != nil {
				return err
			}
			mapped := 0
			for _, hw := range m.State.Workers {
				if hw.Mapped {
					mapped++
				}
			}
			if mapped != 1 || m.State.MemFD < 0 || m.State.MemFD >= len(fds) {
				return fmt.Errorf("%d workers mapped, file at %d of %d descriptors; want 1 in a file handed over", mapped, m.State.MemFD, len(fds))
			}
			return fake.Close() // dies holding everything
		}()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	handed := make(chan error, 1)
	go func() { handed <- env.h.handover(ctx, old, nil) }()

	drainAndGrow(t, env, b, <-copied)
	goOn()
	if err := <-handed; err == nil {
		t.Fatal("handover succeeded without a new process")
	}
	if err := <-fakeErr; err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, timeout, "the backlog file closed", func() bool { return memfds(t) == 0 })
	b.read(t, b.sent-b.next+1)
	b.notify(t, env, 1)
	b.read(t, 1)
	b.none()
	if _, _, pending := b.ring(t); pending != 0 {
		t.Errorf("the old hub holds %d bytes for a worker that read everything", pending)
	}
}
