package relay

import (
	"slices"
	"sync/atomic"
	"time"
)

// Histogram is a snapshot of the commit-to-NOTIFY histogram, in the shape
// of a Prometheus histogram: cumulative counts under ascending upper bounds,
// the +Inf bucket being Count.
type Histogram struct {
	Bounds []time.Duration
	Counts []uint64 // Counts[i]: observations <= Bounds[i]; cumulative
	Count  uint64
	Sum    time.Duration
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

// CommitToNotifyBounds returns (a copy of) the buckets of
// Relay.CommitToNotify: an idle relay NOTIFYs a few hundred microseconds
// after the commit; a window, a visibility wait or a busy server add
// milliseconds; seconds mean a backlog (a replay after a restart).
func CommitToNotifyBounds() []time.Duration { return slices.Clone(commitToNotifyBounds) }

var commitToNotifyBounds = []time.Duration{
	250 * time.Microsecond, 500 * time.Microsecond, time.Millisecond,
	2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
	250 * time.Millisecond, 500 * time.Millisecond, time.Second,
	2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
	// A relay that was down or stalled (a frozen active relay holds
	// every wake until wal_sender_timeout, 60 s by default) replays
	// minutes: the buckets reach an hour, the overflow is past it.
	30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
	10 * time.Minute, 30 * time.Minute, time.Hour,
}

type histogram struct {
	bounds []time.Duration
	counts []atomic.Uint64 // len(bounds)+1, not cumulative
	sum    atomic.Int64
}

func newHistogram(bounds []time.Duration) *histogram {
	return &histogram{bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
}

func (h *histogram) observe(d time.Duration) {
	if d < 0 {
		d = 0 // clocks of two hosts
	}
	i := 0
	for i < len(h.bounds) && d > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

func (h *histogram) snapshot() Histogram {
	s := Histogram{Bounds: h.bounds, Counts: make([]uint64, len(h.bounds))}
	var c uint64
	for i := range h.bounds {
		c += h.counts[i].Load()
		s.Counts[i] = c
	}
	s.Count = c + h.counts[len(h.bounds)].Load()
	s.Sum = time.Duration(h.sum.Load())
	return s
}
