package hub

import "time"

// fanoutBounds are the buckets of Hub.FanoutLatency: the hub's own work is
// microseconds; tens of milliseconds mean a loop iteration that carried a
// very large burst.
var fanoutBounds = []time.Duration{
	10 * time.Microsecond, 25 * time.Microsecond, 50 * time.Microsecond,
	100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, time.Second,
}

// ackBounds are the buckets of Hub.AckLatency: an ack for a channel already
// LISTENed takes microseconds, one that waits for a LISTEN a Postgres round
// trip, one that waits for a reconnect seconds.
var ackBounds = []time.Duration{
	100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}
