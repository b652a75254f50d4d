package hub

import (
	"slices"
	"sync/atomic"
	"time"
)

// Histogram is a snapshot of one of the hub's latency histograms, in the
// shape of a Prometheus histogram: cumulative bucket counts under ascending
// upper bounds, the +Inf bucket being Count.
type Histogram struct {
	Bounds []time.Duration // upper bounds (inclusive), ascending
	Counts []uint64        // Counts[i]: observations <= Bounds[i]; cumulative
	Count  uint64          // every observation (the +Inf bucket)
	Sum    time.Duration   // of every observation
}

// FanoutLatencyBounds returns the buckets of Hub.FanoutLatency (a copy):
// the hub's own work is microseconds; tens of milliseconds mean a loop
// iteration that carried a very large burst.
func FanoutLatencyBounds() []time.Duration { return slices.Clone(fanoutBounds) }

// AckLatencyBounds returns the buckets of Hub.AckLatency (a copy): an ack
// for a channel already LISTENed takes microseconds, one that waits for a
// LISTEN a Postgres round trip, one that waits for a reconnect seconds.
func AckLatencyBounds() []time.Duration { return slices.Clone(ackBounds) }

var fanoutBounds = []time.Duration{
	10 * time.Microsecond, 25 * time.Microsecond, 50 * time.Microsecond,
	100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, time.Second,
}

var ackBounds = []time.Duration{
	100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// histogram is written by the loop goroutine and read by snapshot from any
// goroutine. Buckets are kept non-cumulative (one atomic add per
// observation, no allocation) and summed up by snapshot; a snapshot taken
// during an observation may see its bucket without its sum, which a scrape
// a moment later corrects.
type histogram struct {
	bounds []time.Duration
	counts []atomic.Uint64 // len(bounds)+1: the last one is over every bound
	sum    atomic.Int64    // nanoseconds
}

func newHistogram(bounds []time.Duration) *histogram {
	return &histogram{bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
}

// observe records n observations of d. Loop goroutine only.
func (h *histogram) observe(d time.Duration, n uint64) {
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

func (h *histogram) snapshot() Histogram {
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
