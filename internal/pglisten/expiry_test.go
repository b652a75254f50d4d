package pglisten

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

// threadCPU is the CPU time the calling OS thread has used. The loop runs
// locked to its thread, so between two of its timer callbacks this is what
// the loop itself spent: unlike wall time, it does not count the time a
// loaded machine (2 cores shared by many test processes) kept the thread
// off the CPU.
func threadCPU(t testing.TB) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		t.Error(err)
	}
	return time.Duration(ts.Nano())
}

// TestFakeMassExpiryNoStall: 100,000 commands waiting for a server that
// stays down all expire after CommandTimeout, every done gets
// ErrCommandTimeout, nothing stays queued, and the loop stays responsive
// meanwhile: between two runs of a 5 ms loop timer the loop never spends
// more than 50 ms (its thread's CPU time; the wall-clock gap is logged).
func TestFakeMassExpiryNoStall(t *testing.T) {
	const n = 100000
	const timeout = 300 * time.Millisecond
	a := &attempts{refuse: errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")}
	h := newStartHarness(t, Config{HealthCheckInterval: time.Hour, CommandTimeout: timeout,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 50 * time.Millisecond}, a.dial)
	var done, wrong atomic.Int64
	var worstWall, worstCPU time.Duration
	var ticker *loop.Timer
	var firstDone, lastDone time.Time
	h.on(func() {
		for i := 0; i < n; i++ {
			h.c.Listen("expiring", func(err error) {
				if !errors.Is(err, ErrCommandTimeout) {
					wrong.Add(1)
				}
				now := time.Now()
				if done.Add(1) == 1 {
					firstDone = now
				}
				lastDone = now
			})
		}
		prev, prevCPU := time.Now(), threadCPU(t)
		ticker = h.l.Every(5*time.Millisecond, func() {
			now, cpu := time.Now(), threadCPU(t)
			if d := done.Load(); d > 0 && d < n {
				worstWall = max(worstWall, now.Sub(prev))
				worstCPU = max(worstCPU, cpu-prevCPU)
			}
			prev, prevCPU = now, cpu
		})
	})
	testutil.WaitFor(t, fakeTimeout, "every command expired", func() bool { return done.Load() == n })
	var took time.Duration
	var queued int
	h.on(func() {
		ticker.Stop()
		took = lastDone.Sub(firstDone)
		queued = len(h.c.pending)
	})
	if wrong.Load() > 0 {
		t.Fatalf("%d commands ended with another error than ErrCommandTimeout", wrong.Load())
	}
	if queued != 0 {
		t.Errorf("%d commands still queued after expiring", queued)
	}
	t.Logf("%d commands expired over %v; the longest gap between two 5 ms loop timer runs meanwhile: %v wall, %v of loop CPU",
		n, took.Round(time.Millisecond), worstWall.Round(time.Millisecond), worstCPU.Round(time.Millisecond))
	if worstCPU > 50*time.Millisecond {
		t.Errorf("the loop was busy %v at a stretch while the commands expired, want <= 50 ms", worstCPU)
	}
}
