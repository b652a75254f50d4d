package monitor

import (
	"math"
	"testing"
	"time"
)

// TestRusageCPUMatchesProc: the CPU time off Linux (getrusage) says what
// /proc/self/stat says here, once the process has used some, to within
// the latter's tick.
func TestRusageCPUMatchesProc(t *testing.T) {
	x := 1.0
	var st procStat
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		if st, err = readProcStat(); err != nil {
			t.Fatal(err)
		}
		if st.cpuSeconds >= 0.2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/proc says %.3fs of CPU after 10 s of work", st.cpuSeconds)
		}
		for range 1_000_000 {
			x = math.Sqrt(x + 1)
		}
	}
	ru, err := rusageCPU()
	if err != nil {
		t.Fatal(err)
	}
	// /proc counts in ticks (10 ms) and was read first; other goroutines
	// (the race detector's, the GC) may run meanwhile.
	if d := ru - st.cpuSeconds; d < -0.02 || d > 0.1 {
		t.Fatalf("getrusage %.3fs, /proc %.3fs (x %v)", ru, st.cpuSeconds, x)
	}
}
