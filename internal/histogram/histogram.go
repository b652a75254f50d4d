// Package histogram records the latency histograms of package hub and
// package relay: a Recorder written by one goroutine without locks or
// allocation, whose snapshot is a latency.Histogram.
package histogram

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/listenhub/listenhub/latency"
)

// Histogram is the snapshot type, the public one.
type Histogram = latency.Histogram

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
