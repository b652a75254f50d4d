package histogram

import (
	"slices"
	"testing"
	"time"
)

// Observations land in the first bucket whose bound they do not exceed
// (a bound is inclusive), over every bound in the +Inf one, negative ones
// in the first; the snapshot is cumulative and sums them.
func TestRecorder(t *testing.T) {
	ms := time.Millisecond
	r := New([]time.Duration{ms, 10 * ms})
	r.Observe(-ms, 1)
	r.Observe(ms, 2)
	r.Observe(5*ms, 1)
	r.Observe(time.Second, 1)
	s := r.Snapshot()
	if !slices.Equal(s.Counts, []uint64{3, 4}) || s.Count != 5 {
		t.Fatalf("counts %v, count %d; want [3 4], 5", s.Counts, s.Count)
	}
	if want := 2*ms + 5*ms + time.Second; s.Sum != want {
		t.Fatalf("sum %v, want %v", s.Sum, want)
	}
	if q := s.Quantile(0.5); q != ms {
		t.Errorf("p50 %v, want %v", q, ms)
	}
	if q := s.Quantile(0.99); q != 10*ms {
		t.Errorf("p99 %v, want the last bound %v (the overflow)", q, 10*ms)
	}
	s.Bounds[0] = 0 // a copy: the recorder's bounds stay
	if r.Snapshot().Bounds[0] != ms {
		t.Error("a snapshot shares the recorder's bounds")
	}
	if (Histogram{}).Quantile(0.5) != 0 {
		t.Error("an empty histogram's quantile is not 0")
	}
}
