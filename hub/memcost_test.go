//go:build !race

package hub

import (
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

// What a worker costs the hub in memory, measured in-process on the Go heap
// (the race detector's allocations would swamp it, hence the build tag).
// The clients are raw blocking sockets driven with system calls, so that
// the test itself allocates next to nothing while it measures.

// rawDial connects to the hub with a blocking socket.
func rawDial(t testing.TB, sa *unix.SockaddrUnix) int {
	fd, err := testutil.Socket(unix.AF_UNIX, unix.SOCK_STREAM)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	return fd
}

func rawSend(t testing.TB, fd int, b []byte) {
	if _, err := unix.Write(fd, b); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
}

// rawRead reads exactly len(buf) bytes.
func rawRead(t testing.TB, fd int, buf []byte) {
	for got := 0; got < len(buf); {
		n, err := unix.Read(fd, buf[got:])
		if err != nil || n == 0 {
			unix.Close(fd)
			t.Fatalf("read: %d of %d bytes, %v", got, len(buf), err)
		}
		got += n
	}
}

// rawWorker connects to the hub, subscribes to q and reads the status and
// the ack, with buf sized to exactly those two frames.
func rawWorker(t testing.TB, sa *unix.SockaddrUnix, sub, buf []byte) int {
	fd := rawDial(t, sa)
	rawSend(t, fd, sub)
	rawRead(t, fd, buf)
	return fd
}

// pauseGC turns the collector off until the test ends, so that what a
// measurement counts cannot depend on when collections happen: a GC in the
// middle empties the sync.Pools, and the buffers allocated again would
// count as the connections' garbage (on a loaded machine, where the
// collector's timing moves, that once doubled the figure).
func pauseGC(t *testing.T) {
	old := debug.SetGCPercent(-1)
	t.Cleanup(func() { debug.SetGCPercent(old) })
}

// quietLogs logs warnings only. The hub's info lines ("worker connected")
// are rate-limited by the wall clock, so how many of them a connection
// pays for depends on how fast the machine runs the test: on a loaded one
// more got through and counted as the connections' garbage.
func quietLogs(c *Config) {
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func heapStats() (live, allocated, objects uint64) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.TotalAlloc, ms.Mallocs
}

// An idle subscribed worker costs the hub a few hundred bytes of live heap
// and leaves next to no garbage behind its connection: garbage is what the
// GC lets the heap grow by (up to twice the live heap at GOGC 100), so it
// counts in the hub's RSS as much as live memory does (docs/performance.md,
// idle memory).
func TestIdleWorkerMemory(t *testing.T) {
	e := newEnv(t, quietLogs)
	e.do(func() { e.pg.auto = true })
	sa := &unix.SockaddrUnix{Name: e.path}
	sub := frame.AppendSub(nil, "idle")
	buf := make([]byte, len(frame.AppendStatus(nil, true))+len(frame.AppendAck(nil, "idle")))

	// The channel exists and the pools are warm before measuring.
	first := rawWorker(t, sa, sub, buf)
	defer unix.Close(first)

	const n = 4000
	fds := make([]int, 0, n)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	runtime.GC()
	pauseGC(t)
	live0, alloc0, obj0 := heapStats()
	for range n {
		fds = append(fds, rawWorker(t, sa, sub, buf))
	}
	e.sync()
	_, alloc1, obj1 := heapStats()
	runtime.GC()
	live1, _, _ := heapStats()

	perLive := float64(live1-live0) / n
	perAlloc := float64(alloc1-alloc0) / n
	perObj := float64(obj1-obj0) / n
	t.Logf("per idle worker: %.0f B live, %.0f B allocated in %.1f objects while connecting", perLive, perAlloc, perObj)
	const liveBudget, garbageBudget = 400, 160
	if perLive > liveBudget {
		t.Errorf("%.0f B of live heap per idle worker; budget %d", perLive, liveBudget)
	}
	if perAlloc-perLive > garbageBudget {
		t.Errorf("%.0f B of garbage per connection (%.0f allocated, %.0f live); budget %d", perAlloc-perLive, perAlloc, perLive, garbageBudget)
	}
}

// A connection that comes and goes leaves next to nothing on the heap, in
// the benchmark's churn mix (docs/performance.md, churn): of ten cycles,
// four subscribe, read the ack and close; three subscribe and close at
// once, answers unread; two send 7 bytes of a sub frame and close mid-frame;
// one subscribes, reads the ack, unsubscribes and closes. 20,000 cycles;
// what they allocate is what the churn scenario's RSS step is made of.
func TestChurnAllocations(t *testing.T) {
	e := newEnv(t, quietLogs)
	e.do(func() { e.pg.auto = true })
	sa := &unix.SockaddrUnix{Name: e.path}
	sub := frame.AppendSub(nil, "churn")
	unsub := frame.AppendUnsub(nil, "churn")
	buf := make([]byte, len(frame.AppendStatus(nil, true))+len(frame.AppendAck(nil, "churn")))

	// A steady subscriber keeps the channel (and its LISTEN) alive, as in
	// the benchmark; a first round warms the pools.
	steady := rawWorker(t, sa, sub, buf)
	defer unix.Close(steady)
	cycle := func(k int) {
		for i := range k {
			switch i % 10 {
			case 0, 1, 2, 3:
				unix.Close(rawWorker(t, sa, sub, buf))
			case 4, 5, 6:
				fd := rawDial(t, sa)
				rawSend(t, fd, sub)
				unix.Close(fd)
			case 7, 8:
				fd := rawDial(t, sa)
				rawSend(t, fd, sub[:7])
				unix.Close(fd)
			case 9:
				fd := rawWorker(t, sa, sub, buf)
				rawSend(t, fd, unsub)
				unix.Close(fd)
			}
		}
		e.sync()
	}
	cycle(1000)

	const n = 20000
	pauseGC(t)
	_, alloc0, obj0 := heapStats()
	cycle(n)
	_, alloc1, obj1 := heapStats()
	perAlloc := float64(alloc1-alloc0) / n
	perObj := float64(obj1-obj0) / n
	t.Logf("per connect/subscribe/close cycle: %.0f B in %.1f objects", perAlloc, perObj)
	// 100,000 cycles at this rate must stay well under the runtime's 4 MB
	// minimum heap target, or the heap grows to it.
	const budget = 24
	if perAlloc > budget {
		t.Errorf("%.0f B allocated per cycle; budget %d (100,000 cycles: %.1f MB)", perAlloc, budget, perAlloc*1e5/1e6)
	}
}
