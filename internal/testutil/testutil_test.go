package testutil

import (
	"os"
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitForSucceeds(t *testing.T) {
	var n atomic.Int32
	go func() {
		for i := 0; i < 5; i++ {
			n.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	WaitFor(t, 5*time.Second, "five increments", func() bool { return n.Load() == 5 })
}

// recorder is a testing.TB that records Fatalf instead of stopping the test.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
	panic(r)
}

func TestWaitForTimesOut(t *testing.T) {
	r := &recorder{TB: t}
	start := time.Now()
	func() {
		defer func() {
			if p := recover(); p != r {
				panic(p)
			}
		}()
		WaitFor(r, 30*time.Millisecond, "never", func() bool { return false })
	}()
	if r.failed == "" {
		t.Fatal("WaitFor did not fail on a condition that never holds")
	}
	if d := time.Since(start); d < 30*time.Millisecond || d > 2*time.Second {
		t.Fatalf("WaitFor gave up after %v, want about 30ms", d)
	}
}

func TestFDCount(t *testing.T) {
	CheckFDs(t, time.Second)
	before := FDCount()
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	if got := FDCount(); got != before+1 {
		t.Fatalf("FDCount %d after opening a file, want %d", got, before+1)
	}
	f.Close()
	if got := FDCount(); got != before {
		t.Fatalf("FDCount %d after closing it, want %d", got, before)
	}
}
