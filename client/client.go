package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/defaults"
)

// Defaults for the zero fields of Options.
const (
	// defaultAckTimeout bounds the wait for an ack from a hub that says
	// its Postgres is healthy. Such a hub acks once Postgres has confirmed
	// the LISTEN, a round trip of a millisecond or so: two seconds without
	// an answer means a wedged hub. A hub that says its Postgres is down
	// acks once Postgres is back and LISTEN ran, however long that takes,
	// so the wait does not count then (see Options.AckTimeout).
	defaultAckTimeout = 2 * time.Second
	// defaultSilenceTimeout: three of the hub's status re-sends (every
	// 5 s with its default --status-interval) missed in a row.
	defaultSilenceTimeout = 15 * time.Second
	// defaultWriteTimeout bounds one write of queued frames. Frames to the
	// hub are tiny, so a write that cannot finish within it means the hub
	// has stopped reading.
	defaultWriteTimeout = 2 * time.Second
	// defaultFrameTimeout bounds the read of one frame from the hub, from
	// its first byte to its last: the hub's own --frame-timeout default. A
	// hub that stops in the middle of a frame is wedged; without a bound
	// the client would wait forever.
	defaultFrameTimeout = 10 * time.Second
)

// Test hooks, set only by tests (export_test.go): testEnterHook runs in a
// reader between the two steps of entering a handler call, testAckTimeoutHook
// as an ack timer fires.
var testEnterHook, testAckTimeoutHook func()

// readBufferSize is the size of one read from the hub socket. The hub writes
// many frames per write(2) (its end-of-iteration flush); one read takes a
// whole burst of ordinary wakes.
const readBufferSize = 64 << 10

// Wake is one NOTIFY as the hub (or a local listener) delivered it.
type Wake struct {
	// Name is the subscription name: the channel without the hub's
	// prefix and suffix (the wire's "q").
	Name string
	// Payload is the NOTIFY payload (the wire's "p"); empty for a
	// durable wake.
	Payload string
	// Durable is true for a wake without payload ("something changed,
	// re-read"): such wakes may be coalesced and may be synthesized after a
	// gap (a hub reconnect to Postgres, a failover), so a durable reader
	// re-reads its source of truth on every one. A false Durable means the
	// payload may be the only copy of the message.
	Durable bool
}

// Options configure a hub client. SocketPath is required.
type Options struct {
	// SocketPath is the hub's Unix socket (the hub's --socket).
	SocketPath string
	// AckTimeout bounds Subscribe's wait for the hub's answer while the
	// hub says its Postgres is healthy (or has said nothing yet). Default
	// 2s. A timeout kills the client. While the hub's last status says
	// healthy:false (Postgres down, at the start or later), a sub waits
	// for Postgres to come back, as the hub does, and its AckTimeout
	// starts afresh at the next healthy:true: a worker started while
	// Postgres is down stays on the hub and works once Postgres is back.
	AckTimeout time.Duration
	// WriteTimeout bounds each write to the hub socket. Default 2s.
	// A stalled write kills the client.
	WriteTimeout time.Duration
	// FrameTimeout bounds each frame from the hub, from its first byte to
	// its last. Default 10s. A frame that stalls kills the
	// client (a *ConnError, Op "read").
	FrameTimeout time.Duration
	// SilenceTimeout bounds the time without a single frame from the hub.
	// Default 15s. The hub re-sends its status every 5 status intervals
	// (5 s with its default --status-interval), so a hub silent for three
	// of those is frozen (SIGSTOPped, a wedged loop) even though its
	// socket is open: the client dies (a *ConnError, Op "read") and a
	// Failover fails over, as for a hub that died. Raise it above 5 times
	// the hub's --status-interval when that is over 3s.
	SilenceTimeout time.Duration

	// AllowUIDs lists the uids the hub may run as. Dial checks the peer
	// of the socket (SO_PEERCRED) and refuses any other as not our hub: a
	// process that took the socket path (a stale directory, a path
	// another user can write) must not receive this process's
	// subscriptions or feed it wakes. Empty means this process's own
	// (effective) uid and root; a non-empty list replaces that default,
	// so name your own uid in it if the hub may run as you.
	AllowUIDs []int

	// Logger receives debug logs (stray acks, unknown frame types) and the
	// reason of the client's death. Nil means slog.Default(), as everywhere
	// in this module; slog.New(slog.DiscardHandler) silences it.
	Logger *slog.Logger
}

// Handlers receive what a Conn or a Local hears. Either may be nil.
//
// OnWake is called for every wake, in the order the source sent them.
// OnStatus is called for every status with the source's Postgres health:
// each status frame of the hub, each change of a Local's connection. Both
// are called from the source's single reader goroutine, one call at a
// time, wakes and statuses interleaved in the order they came.
//
// A handler must not block for long: while it runs the Conn reads
// nothing, so acks wait (a Subscribe may hit its ack timeout, which kills
// the Conn) and the hub's outbound queue for this process grows until the
// hub evicts it, which also kills the Conn. Hand slow work to another
// goroutine; Mux does that with a bounded buffer per subscriber. A handler
// may call Subscribe only from another goroutine (Subscribe waits for an
// ack that this same goroutine would have to read); it may call
// Unsubscribe, Healthy, Err and Close.
//
// Wake values are copies; the handler may keep them.
type Handlers struct {
	OnWake   func(Wake)
	OnStatus func(healthy bool)
}

// withDefaults fills the zero fields with their defaults and refuses the
// negative ones.
func (o Options) withDefaults() (Options, error) {
	err := errors.Join(
		defaults.Or(&o.AckTimeout, defaultAckTimeout, "Options.AckTimeout"),
		defaults.Or(&o.SilenceTimeout, defaultSilenceTimeout, "Options.SilenceTimeout"),
		defaults.Or(&o.WriteTimeout, defaultWriteTimeout, "Options.WriteTimeout"),
		defaults.Or(&o.FrameTimeout, defaultFrameTimeout, "Options.FrameTimeout"),
	)
	if err != nil {
		return o, fmt.Errorf("listenhub client: %w", err)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// Conn is a connection to a listenhub hub: one per process, shared by all
// its subscribers (put a Mux in front of it for many in-process
// subscribers). All methods are safe for concurrent use.
//
// A client is alive until its first failure and then dead for good: it
// never reconnects (that is Failover's job, one level up). Done is closed
// and Err says why at the moment it dies: Close (ErrClosed), a transport
// failure (*ConnError: EOF, which is also what an eviction by the hub looks
// like; a malformed frame; a stalled write), an ack timeout
// (*AckTimeoutError), or a nack that is neither about the name nor a cap
// (*NackError).
//
// A client runs two goroutines: the reader, which also runs the handlers,
// and a writer, which owns the write side of the socket so that Subscribe
// and Unsubscribe never block on a stalled write.
type Conn struct {
	path string
	opts Options
	h    Handlers
	conn net.Conn
	log  *slog.Logger

	mu   sync.Mutex
	subs map[string]*subState // q → state; absent means not subscribed
	err  error                // set once, under mu, when the client dies
	out  []byte               // frames queued for the writer, in decision order
	done chan struct{}        // closed when err is set

	kick    chan struct{} // cap 1: out is non-empty
	healthy atomic.Bool   // last status frame; false until the first
	// sawStatus: a status frame arrived. Until then a hub that says
	// nothing is not one whose Postgres is down (see ackTimeout).
	sawStatus atomic.Bool

	// Close's guarantee that no new handler call starts once it was
	// called: the reader holds dispatch around every handler call and
	// checks closing inside it; inHandler lets Close (possibly called from
	// a handler) avoid waiting for the handler that has begun.
	dispatch  sync.Mutex
	inHandler atomic.Bool
	closing   atomic.Bool

	exited chan struct{} // closed when both goroutines have returned
	// readerDone is closed when the reader has returned: a writer whose
	// peer went away waits for it, so that the hub's last words (a
	// refusal) win over the writer's EPIPE.
	readerDone chan struct{}
}

// subState is the client's view of one subscription name. At most one sub
// frame is unanswered per name, so an ack or nack always answers the one
// pending call: the hub answers every sub exactly once and keeps the order
// of its frames to a worker.
type subState struct {
	active    bool  // acked and not unsubscribed
	call      *call // the unanswered sub, nil if none
	wantUnsub bool  // Unsubscribe (or abandonment) while call was pending: send unsub on its ack
}

// call is one unanswered sub frame; every concurrent Subscribe of the name
// waits on it.
type call struct {
	done     chan struct{} // closed when answered or the client died
	err      error         // valid once done is closed
	waiters  int           // Subscribe calls still waiting (under Client.mu)
	resolved bool          // under Client.mu
	timer    *time.Timer   // ack timeout
}

// Dial connects to the hub socket at opts.SocketPath and checks that it is our hub's:
// the socket file and its directory first (see SocketError: lstat, a
// socket, its owner, the directory's owner and mode, and a connect through
// the directory that was checked), then the peer's uid (SO_PEERCRED,
// Options.AllowUIDs). ctx bounds the connect only; the client lives until
// Close or its first failure. An empty path is an error. Other errors are
// *ConnError with Op "dial": ENOENT for a missing socket, ECONNREFUSED for
// a stale one, a *SocketError or a *PeerError (both errors.Is
// ErrNotOurHub) for a socket that is not our hub's, whose connection is
// closed before a byte is sent or read.
//
// A hub that refuses this connection (its --allow-uid, --max-workers) says
// why in its first frame and closes it: Dial has returned by then, and the
// client dies with a *RefusedError (errors.Is ErrRefused), which Err and
// the next Subscribe return.
func Dial(ctx context.Context, opts Options, h Handlers) (*Conn, error) {
	path := opts.SocketPath
	if path == "" {
		return nil, errEmptyPath
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	conn, err := dialSocket(ctx, path, opts.AllowUIDs)
	if err != nil {
		return nil, err
	}
	if err := checkPeer(conn, opts.AllowUIDs); err != nil {
		conn.Close()
		return nil, &ConnError{Op: "dial", Path: path, Err: err}
	}
	return newClient(conn, path, opts, h), nil
}

// newClient runs a client over conn, with opts' defaults applied.
func newClient(conn net.Conn, path string, opts Options, h Handlers) *Conn {
	c := &Conn{
		path:   path,
		opts:   opts,
		h:      h,
		conn:   conn,
		log:    opts.Logger.With("socket", path),
		subs:   make(map[string]*subState),
		done:   make(chan struct{}),
		kick:   make(chan struct{}, 1),
		exited: make(chan struct{}),

		readerDone: make(chan struct{}),
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); defer close(c.readerDone); c.readLoop() }()
	go func() { defer wg.Done(); c.writeLoop() }()
	go func() { wg.Wait(); close(c.exited) }()
	return c
}

// Subscribe subscribes to q and returns once the hub has acked it: from
// then on every NOTIFY committed on q's channel reaches OnWake. Wakes for q
// may arrive before Subscribe returns (over-delivery is harmless).
//
// Subscriptions are a set, not a count: Subscribe of a name that is already
// acked returns nil at once without a round trip; concurrent Subscribes of
// one name share one sub frame and all return its answer; one Unsubscribe
// undoes any number of Subscribes (use a Mux to count subscribers).
//
// Errors: a refusal of the name (errors.Is(err, ErrInvalidName)) or for one
// of the hub's caps (errors.Is(err, ErrLimit)) leaves the client alive. Any
// other nack, the ack timeout, EOF or a write failure
// kills the client and is returned. After the client died (Close included),
// Subscribe returns Err at once. If ctx ends first, Subscribe returns
// ctx.Err() without killing the client and the subscription is abandoned:
// once the ack arrives the client unsubscribes, unless another Subscribe of
// the name is waiting by then.
func (c *Conn) Subscribe(ctx context.Context, q string) error {
	if err := checkName(q); err != nil {
		return err
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	if err := ctx.Err(); err != nil {
		c.mu.Unlock()
		return err
	}
	s := c.subs[q]
	if s == nil {
		s = &subState{}
		c.subs[q] = s
	}
	if s.active && s.call == nil {
		c.mu.Unlock()
		return nil
	}
	cl := s.call
	if cl == nil {
		cl = &call{done: make(chan struct{})}
		s.call = cl
		c.queueLocked(frame.AppendSub(nil, q))
		cl.timer = time.AfterFunc(c.opts.AckTimeout, func() { c.ackTimeout(cl, q) })
	}
	s.wantUnsub = false
	cl.waiters++
	c.mu.Unlock()

	select {
	case <-cl.done:
		return cl.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl.resolved {
		return cl.err
	}
	cl.waiters--
	if cl.waiters == 0 {
		s.wantUnsub = true
	}
	return ctx.Err()
}

// Unsubscribe drops q from the set and tells the hub (no answer is
// expected). It never blocks. Unsubscribe of a name whose Subscribe is still
// waiting takes effect when the ack arrives: the waiting Subscribes return
// nil, and the client then unsubscribes. Unsubscribe of an unknown name, or
// on a dead client, does nothing.
func (c *Conn) Unsubscribe(q string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	s := c.subs[q]
	switch {
	case s == nil:
	case s.call != nil:
		s.wantUnsub = true
	default:
		delete(c.subs, q)
		c.queueLocked(frame.AppendUnsub(nil, q))
	}
}

// Healthy reports whether the client is alive and the hub's last status
// said its Postgres connection is healthy. It is false until the hub's
// first status frame (sent on connect).
func (c *Conn) Healthy() bool {
	select {
	case <-c.done:
		return false
	default:
		return c.healthy.Load()
	}
}

// Done is closed when the client dies (Close included).
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is nil while the client is alive and the reason once it is dead.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close kills the client with ErrClosed and closes the socket; the hub
// drops its subscriptions. Waiting Subscribes return ErrClosed. Once Close
// has been called, no new handler call starts; the one call that had
// already begun when Close was called (the one calling Close, say, or one
// that a lock held by Close's caller would block) is not waited for, so it
// may finish after Close returns. Close is idempotent and always returns
// nil.
func (c *Conn) Close() error {
	c.closing.Store(true)
	c.fail(ErrClosed)
	if !c.inHandler.Load() {
		// A reader that took dispatch before closing was set will see it
		// and skip the handler; wait for it to let go.
		c.dispatch.Lock()
		c.dispatch.Unlock() //nolint:staticcheck // an empty critical section is the point
	}
	return nil
}

// wait blocks until both goroutines have returned (tests).
func (c *Conn) wait() { <-c.exited }

// fail kills the client with err, once: first error wins.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.dieLocked(err)
	c.mu.Unlock()
	c.closeDead(err)
}

// dieLocked is fail's decision: err is the client's, every waiting
// Subscribe gets it. Under c.mu, with c.err nil; closeDead must follow.
func (c *Conn) dieLocked(err error) {
	c.err = err
	close(c.done)
	for _, s := range c.subs {
		if cl := s.call; cl != nil {
			c.resolveLocked(cl, err)
		}
	}
	c.subs = nil
	c.out = nil
}

// closeDead releases what a dead client holds (outside c.mu).
func (c *Conn) closeDead(err error) {
	c.healthy.Store(false)
	c.conn.Close()
	if err == ErrClosed {
		c.log.Debug("listenhub client closed")
	} else {
		c.log.Warn("listenhub client dead", "reason", err)
	}
}

// resolveLocked answers cl with err (nil for an ack). Under c.mu.
func (c *Conn) resolveLocked(cl *call, err error) {
	if cl.resolved {
		return
	}
	cl.resolved = true
	cl.err = err
	cl.timer.Stop()
	close(cl.done)
}

// ackTimeout kills the client unless cl was answered. The check and the
// death are one critical section: an ack that lands in between would
// otherwise let Subscribe return nil and then kill the client anyway.
func (c *Conn) ackTimeout(cl *call, q string) {
	if h := testAckTimeoutHook; h != nil {
		h()
	}
	c.mu.Lock()
	if cl.resolved || c.err != nil {
		c.mu.Unlock()
		return
	}
	if c.sawStatus.Load() && !c.healthy.Load() {
		// The hub's Postgres is down: the ack comes once it is back.
		// The status that says so restarts the timer; until then,
		// look again one AckTimeout later.
		cl.timer.Reset(c.opts.AckTimeout)
		c.mu.Unlock()
		return
	}
	err := &AckTimeoutError{Name: q, Timeout: c.opts.AckTimeout}
	c.dieLocked(err)
	c.mu.Unlock()
	c.closeDead(err)
}

// queueLocked appends a frame for the writer. Under c.mu, so that frames
// leave in the order the decisions were taken.
func (c *Conn) queueLocked(b []byte) {
	c.out = append(c.out, b...)
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *Conn) writeLoop() {
	var buf []byte
	for {
		select {
		case <-c.done:
			return
		case <-c.kick:
		}
		c.mu.Lock()
		buf, c.out = c.out, buf[:0]
		c.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		if err := c.conn.SetWriteDeadline(time.Now().Add(c.opts.WriteTimeout)); err != nil {
			c.fail(&ConnError{Op: "write", Path: c.path, Err: err})
			return
		}
		if _, err := c.conn.Write(buf); err != nil {
			if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
				// The hub closed the connection: what it said before
				// (a refusal), or the EOF the reader is about to
				// see, is the better reason. Bounded, in case it
				// only shut down its read side.
				t := time.NewTimer(c.opts.WriteTimeout)
				select {
				case <-c.readerDone:
				case <-t.C:
				}
				t.Stop()
			}
			c.fail(&ConnError{Op: "write", Path: c.path, Err: err})
			return
		}
	}
}

// readLoop reads and handles the hub's frames until the client dies. While
// a frame is partly read, a read deadline bounds it (FrameTimeout from its
// first byte, or from the end of the frame before it in the same read);
// between frames the reader waits without one.
func (c *Conn) readLoop() {
	var dec frame.Decoder
	buf := make([]byte, readBufferSize)
	greeted := false // a frame arrived: a nack is no longer a refusal
	partial := false // the read deadline is the frame timeout's, else the silence timeout's
	c.conn.SetReadDeadline(time.Now().Add(c.opts.SilenceTimeout))
	for {
		n, err := c.conn.Read(buf)
		if n > 0 {
			dec.Feed(buf[:n])
			completed := false
			for {
				m, ok, derr := dec.Next()
				if derr != nil {
					c.fail(&ConnError{Op: "read", Path: c.path, Err: derr})
					return
				}
				if !ok {
					break
				}
				completed = true
				if !greeted {
					greeted = true
					if m.Type == "nack" && c.refusal(m) {
						return
					}
				}
				if !c.handle(m) {
					return
				}
			}
			switch {
			case dec.Buffered() == 0:
				partial = false
				c.conn.SetReadDeadline(time.Now().Add(c.opts.SilenceTimeout))
			case !partial || completed:
				partial = true
				c.conn.SetReadDeadline(time.Now().Add(c.opts.FrameTimeout))
			}
		}
		if err != nil {
			if c.closing.Load() {
				return
			}
			if errors.Is(err, net.ErrClosed) {
				// Closed by fail on another goroutine: its error stands.
				return
			}
			if partial && errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("a frame from the hub stalled: %d bytes of it in %v (frame timeout)", dec.Buffered(), c.opts.FrameTimeout)
			} else if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("no frame from the hub for %v (silence timeout; it re-sends its status every few seconds): frozen or wedged", c.opts.SilenceTimeout)
			}
			if err == io.EOF && dec.Buffered() > 0 {
				err = io.ErrUnexpectedEOF
			}
			c.fail(&ConnError{Op: "read", Path: c.path, Err: err})
			return
		}
	}
}

// refusal handles a nack that is the connection's first frame: the hub's
// refusal of this connection (docs/protocol.md: a served connection's first
// frame is a status), unless it answers a pending sub (a scripted hub in
// tests; the real hub never sends a nack before its status). True means the
// client is dead.
func (c *Conn) refusal(m frame.Message) bool {
	c.mu.Lock()
	s := c.subs[m.Name]
	answers := m.Name != "" && s != nil && s.call != nil
	c.mu.Unlock()
	if answers {
		return false
	}
	reason := m.Error
	if reason == "" {
		reason = "no reason given"
	}
	c.fail(&RefusedError{Path: c.path, Reason: reason})
	return true
}

// handle processes one frame; false means the client is dead.
func (c *Conn) handle(m frame.Message) bool {
	switch m.Type {
	case "ack":
		c.mu.Lock()
		s := c.subs[m.Name]
		if s == nil || s.call == nil {
			c.mu.Unlock()
			c.log.Debug("listenhub client: ack without a pending sub", "q", m.Name)
			return true
		}
		c.resolveLocked(s.call, nil)
		s.call = nil
		if s.wantUnsub {
			delete(c.subs, m.Name)
			c.queueLocked(frame.AppendUnsub(nil, m.Name))
		} else {
			s.active = true
		}
		c.mu.Unlock()
	case "nack":
		err := &NackError{Name: m.Name, Reason: m.Error, Kind: nackKind(m.Error)}
		c.mu.Lock()
		s := c.subs[m.Name]
		if s == nil || s.call == nil {
			c.mu.Unlock()
			c.log.Debug("listenhub client: nack without a pending sub", "q", m.Name, "reason", m.Error)
			return true
		}
		if err.Kind == NackOther {
			// Dead before the waiters wake: they see Done closed.
			c.mu.Unlock()
			c.fail(err)
			return false
		}
		c.resolveLocked(s.call, err)
		s.call = nil
		if !s.active {
			delete(c.subs, m.Name)
		}
		c.mu.Unlock()
	case "wake":
		w := Wake{Name: m.Name, Payload: m.Payload, Durable: !m.HasPayload || m.Payload == ""}
		if h := c.h.OnWake; h != nil {
			return c.call(func() { h(w) })
		}
	case "status":
		was := c.healthy.Swap(m.Healthy)
		c.sawStatus.Store(true)
		if m.Healthy && !was {
			// Postgres is back: every sub still waiting gets a whole
			// AckTimeout from now.
			c.mu.Lock()
			for _, s := range c.subs {
				if cl := s.call; cl != nil && !cl.resolved {
					cl.timer.Reset(c.opts.AckTimeout)
				}
			}
			c.mu.Unlock()
		}
		if h := c.h.OnStatus; h != nil {
			return c.call(func() { h(m.Healthy) })
		}
	default:
		c.log.Debug("listenhub client: skipping unknown frame type", "t", m.Type)
	}
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// call runs a handler under dispatch unless Close has begun; false means the
// client is closing.
//
// inHandler is set before closing is checked, the mirror of Close (which
// sets closing before it checks inHandler): either this call sees closing
// and runs nothing, or Close sees inHandler and does not wait. Checked the
// other way round, a Close in between would wait for a handler that may need
// a lock Close's caller holds (Failover's dispatch, say): a deadlock.
func (c *Conn) call(f func()) bool {
	c.dispatch.Lock()
	defer c.dispatch.Unlock()
	c.inHandler.Store(true)
	defer c.inHandler.Store(false)
	if h := testEnterHook; h != nil {
		h()
	}
	if c.closing.Load() {
		return false
	}
	f()
	return true
}
