package hub

import (
	"slices"
	"time"

	"github.com/listenhub/listenhub/internal/histogram"
)

// Histogram is a snapshot of one of the hub's latency histograms, in the
// shape of a Prometheus histogram (relay.Histogram is its twin).
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
func (h Histogram) Quantile(q float64) time.Duration { return histogram.Histogram(h).Quantile(q) }

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
