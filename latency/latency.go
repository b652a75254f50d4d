// Package latency holds the one histogram type the hub and the relay report
// their latencies in (Hub.FanoutLatency, Hub.AckLatency,
// Relay.CommitToNotify, Relay.CommitToDecode). It is a package of its own
// because the relay builds where the hub does not (Windows), and both must
// return the same type, which monitor turns into Prometheus histograms.
package latency

import "time"

// Histogram is a snapshot of a latency histogram, in the shape of a
// Prometheus histogram: cumulative bucket counts under ascending upper
// bounds, the +Inf bucket being Count. The bounds are the same in every
// snapshot of one histogram, so a snapshot taken before any observation
// already says them.
type Histogram struct {
	// Bounds are the buckets' upper bounds (inclusive), ascending.
	Bounds []time.Duration
	// Counts[i] is the number of observations <= Bounds[i] (cumulative).
	Counts []uint64
	// Count is the number of every observation (the +Inf bucket).
	Count uint64
	// Sum is the sum of every observation.
	Sum time.Duration
}

// Quantile estimates the q-quantile (0..1) from the buckets: the upper
// bound of the bucket it falls in (the last bound for the overflow), 0
// with no observation.
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
