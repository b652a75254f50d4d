package relay

import "time"

// commitToNotifyBounds are the buckets of Relay.CommitToNotify: an idle
// relay NOTIFYs a few hundred microseconds after the commit; a window, a
// visibility wait or a busy server add milliseconds; seconds mean a backlog
// (a replay after a restart).
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
