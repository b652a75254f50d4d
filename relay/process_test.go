package relay

import (
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// readsSince counts the re-reads caused by wakes received after t0.
func (w *workload) readsSince(t0 time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, rs := range w.reads {
		for _, r := range rs {
			if r.wake.After(t0) {
				n++
			}
		}
	}
	return n
}

// TestRelayProcessKilledMidStream SIGKILLs the real binary while writers
// commit, restarts it on the same slot, and checks that every insert still
// gets its wake: the slot replays what the killed relay had not confirmed.
func TestRelayProcessKilledMidStream(t *testing.T) {
	f := newFixture(t, "q_a", "q_b", "q_c")
	w := newWorkload(t, f, "q_a", "q_b", "q_c")
	p := startRelayProc(t, f.procArgs()...)
	testutil.WaitFor(t, 20*time.Second, "the relay's slot active", func() bool { return f.slotActivePID() != 0 })
	w.burst(20)
	w.settle(10 * time.Second)
	for round := 0; round < 3; round++ {
		t0 := time.Now()
		done := make(chan struct{})
		go func() { w.burst(150); close(done) }()
		// Kill it once it has NOTIFYed part of the burst.
		testutil.WaitFor(t, 10*time.Second, "wakes of the burst", func() bool { return w.readsSince(t0) >= 5*(round+1) })
		p.kill()
		restart := time.Now()
		p = startRelayProc(t, f.procArgs()...)
		<-done
		w.settle(15 * time.Second)
		t.Logf("round %d: first wake %v after the restart", round, firstWakeAfter(w, restart))
	}
	w.report()
}

func firstWakeAfter(w *workload, t0 time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	for _, rs := range w.reads {
		for _, r := range rs {
			if r.wake.After(t0) && (first.IsZero() || r.wake.Before(first)) {
				first = r.wake
			}
		}
	}
	if first.IsZero() {
		return -1
	}
	return first.Sub(t0)
}
