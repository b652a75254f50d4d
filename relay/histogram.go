package relay

import (
	"slices"
	"time"

	"github.com/listenhub/listenhub/internal/histogram"
)

// Histogram is a snapshot of one of the relay's latency histograms, in
// the shape of a Prometheus histogram. It is hub.Histogram's twin: the
// relay builds where the hub does not (Windows), so it cannot return the
// hub's type.
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
