// Package client is the worker side of listenhub: what a process uses to
// receive Postgres NOTIFYs through the host's hub, and without it.
//
// Three layers, each usable alone:
//
//   - Client (Dial) is one connection to the hub's Unix socket. Subscribe
//     returns once the hub's LISTEN is confirmed (its ack); wakes and status
//     frames arrive through handlers, in wire order, on the client's reader
//     goroutine. It never reconnects: its first failure (EOF, an eviction,
//     an ack timeout, a nack other than an invalid name, a stalled write)
//     leaves it dead, with Done closed and Err saying why.
//   - Failover (NewFailover) starts on a Client and, on its failure, swaps
//     to a Local listener (this process's own Postgres connection,
//     listener.Conn), re-subscribing the names it recorded. From local mode
//     it keeps trying the hub (after FailoverOptions.FailbackDelay, then with
//     backoff) and returns to it once a healthy hub has acked the whole set
//     and a marker NOTIFY came through both (exact: no wake twice, none
//     lost; a hub on another database is refused); and fails over again if
//     the hub fails again.
//     FailoverOptions.DisableFailback keeps it local for good instead. A hub absent
//     at start means local mode from the start. Local is also usable
//     directly.
//   - Mux fans one Listener's wakes out to many in-process subscribers (SSE
//     streams, websockets), each with a bounded buffer, so that a process
//     holds one subscription per name however many subscribers it has.
//
// Conn, Local and Failover satisfy Listener, which is what a Mux is bound
// to.
//
// # Handlers
//
// Handlers (for Dial and NewLocal) and FailoverHandlers (for NewFailover),
// given to the constructor beside the options, are the delivery API, as
// pgconn.Config.OnNotification is pgx's: called one at a time, in order,
// from the listener's own goroutine. A handler that blocks
// stops that goroutine from reading: acks wait (Subscribe may time out and
// kill the client) and the hub's backlog for this process grows until the
// hub evicts it, which is a failover. Hand work off; a Mux does, to
// bounded per-subscriber buffers, and never blocks.
//
// # Durable and ephemeral wakes
//
// A wake without payload (Wake.Durable) means "something changed, re-read":
// the hub coalesces them, Mux coalesces them per subscriber, and both the
// hub (after its Postgres reconnects) and Failover (after each swap, either
// way) send one per subscribed name to cover a gap in which NOTIFYs may have
// been lost. A wake with
// a payload may be the only copy of the message: the hub never drops one
// while the worker is connected, and a Mux subscriber that cannot keep up
// with them is closed with a *SlowSubscriberError rather than silently
// skipping some.
//
// # Errors
//
// errors.Is(err, ErrInvalidName) for a name no channel can carry and
// errors.Is(err, ErrLimit) for a refusal at one of the hub's caps (both
// harmless to the listener); *NackError, *AckTimeoutError (ErrAckTimeout) and
// *ConnError for hub failures (at Dial, a *SocketError or a *PeerError,
// both errors.Is ErrNotOurHub, for a socket that is not our hub's: see
// Dial; a stalled frame from the hub, see Options.FrameTimeout);
// *RefusedError (ErrRefused) when the hub refuses the connection and says
// why (its --allow-uid, --max-workers); *FailoverError when the local
// listener fails too; ErrClosed after Close. An empty socket path is an
// error at Dial and NewFailover.
//
// # Platforms
//
// Linux, macOS and FreeBSD: everything above. The hub's identity is checked
// with the peer's credentials (SO_PEERCRED on Linux, LOCAL_PEERCRED
// elsewhere). On Windows the hub, a Unix-socket service, does not exist:
// Dial fails at once with a *ConnError saying so, and a Failover listens
// locally from the start and never tries the hub (no fail-back), so the
// same code builds and runs on a developer's Windows machine.
//
// # Processes
//
// A Client, Local or Failover belongs to the process that made it. Go
// processes do not inherit one: a Go program cannot fork without exec, and
// a program started with os/exec (or syscall.ForkExec) starts afresh, with
// the client's socket and Postgres connection closed on exec. Each process
// makes its own. (The Python client, where fork without exec is a
// pattern, raises ForkedError in a child that uses its parent's client.)
package client
