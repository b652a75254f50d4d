package client

import "context"

// Listener is what a process subscribes through: the hub client (*Conn),
// the per-process Postgres listener (*Local) and the two combined
// (*Failover) all satisfy it, so code above them (a Mux, an application)
// does not care which one delivers.
//
// Wakes and statuses are delivered through the Handlers given to the
// constructor, one call at a time and in order; handlers must
// not block for long (see Handlers).
type Listener interface {
	// Subscribe returns once every NOTIFY committed from now on for q
	// will be delivered. It is bounded (ack timeout, command timeout,
	// silence timeout) even with a context that never ends, but while the
	// hub says its Postgres is down: then it waits for Postgres, as the
	// hub does (ctx bounds it). A set, not a count: subscribing a
	// subscribed name again is a no-op; errors.Is(err, ErrInvalidName)
	// for a name no channel can carry.
	Subscribe(ctx context.Context, q string) error
	// Unsubscribe drops q. Fire-and-forget: it never blocks and may be
	// called from a handler.
	Unsubscribe(q string)
	// Healthy reports whether wakes are flowing: alive, and Postgres
	// connected as far as this listener knows.
	Healthy() bool
	// Close releases the listener. Idempotent; safe from a handler.
	Close() error
	// Done is closed when the listener is dead for good, Err says why
	// (ErrClosed after Close).
	Done() <-chan struct{}
	Err() error
}

var (
	_ Listener = (*Conn)(nil)
	_ Listener = (*Local)(nil)
	_ Listener = (*Failover)(nil)
)
