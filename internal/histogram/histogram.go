// Package histogram is the latency histogram of package hub and package
// relay: a Recorder written by one goroutine without locks or allocation,
// and its Histogram snapshot, which hub.Histogram and relay.Histogram copy
// field for field (a conversion).
package histogram

import (
	"slices"
	"sync/atomic"
	"time"
)

// Histogram is a snapshot of a latency histogram, in the shape of a
// Prometheus histogram: cumulative bucket counts under ascending upper
// bounds, the +Inf bucket being Count.
type Histogram struct {
	Bounds []time.Duration // upper bounds (inclusive), ascending
	Counts []uint64        // Counts[i]: observations <= Bounds[i]; cumulative
	Count  uint64          // every observation (the +Inf bucket)
	Sum    time.Duration   // of every observation
}

// Quantile estimates the q-quantile (0..1) from the buckets: the upper
// bound of the bucket it falls in (Bounds' last for the overflow).
func (h Histogram) Quantile(q float64) time.Duration {
	if h.Count == 0 {
		return 0
	}
	want := uint64(q * float64(h.Count))
	if want == 0 {
		want = 1
	}
	for i, c := range h.Counts {
		if c >= want {
			return h.Bounds[i]
		}
	}
	return h.Bounds[len(h.Bounds)-1]
}

// Recorder is written by one goroutine (Observe) and read by Snapshot from
// any. Buckets are kept non-cumulative (one atomic add per observation, no
// allocation) and summed up by Snapshot; a snapshot taken during an
// observation may see its bucket without its sum, which a scrape a moment
// later corrects.
type Recorder struct {
	bounds []time.Duration
	counts []atomic.Uint64 // len(bounds)+1: the last one is over every bound
	sum    atomic.Int64    // nanoseconds
}

// New returns a Recorder with the given upper bounds, ascending.
func New(bounds []time.Duration) *Recorder {
	return &Recorder{bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
}

// Observe records n observations of d; a negative d (the clocks of two
// hosts) counts as 0.
func (h *Recorder) Observe(d time.Duration, n uint64) {
	if d < 0 {
		d = 0
	}
	i := 0
	for i < len(h.bounds) && d > h.bounds[i] {
		i++
	}
	h.counts[i].Add(n)
	h.sum.Add(int64(d) * int64(n))
}

// Snapshot returns the histogram so far.
func (h *Recorder) Snapshot() Histogram {
	s := Histogram{Bounds: slices.Clone(h.bounds), Counts: make([]uint64, len(h.bounds))}
	var c uint64
	for i := range h.bounds {
		c += h.counts[i].Load()
		s.Counts[i] = c
	}
	s.Count = c + h.counts[len(h.bounds)].Load()
	s.Sum = time.Duration(h.sum.Load())
	return s
}
