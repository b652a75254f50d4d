//go:build unix

package pglisten

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/enum"
	"github.com/listenhub/listenhub/loop"
)

// connState is where a Conn is in its life.
type connState uint8

const (
	// stateConnecting: Open has connected but the loop has not installed
	// the transport yet (the install is posted).
	stateConnecting connState = iota
	// stateUp: a transport is installed and commands flow.
	stateUp
	// stateDown: no connection: Start's first one, or the one that was
	// lost, is being made; an attempt is scheduled or in progress.
	// Commands wait in pending.
	stateDown
	// stateClosing: Close sent UNLISTEN * and Terminate and waits for the
	// server to hang up (bounded by the health-check timeout).
	stateClosing
	// stateClosed: nothing left; every method is a no-op or fails with
	// ErrClosed (or, after OnFatal, with the fatal error).
	stateClosed
)

// connStateNames are the String forms, indexed by value.
var connStateNames = [...]string{
	stateConnecting: "connecting", stateUp: "up", stateDown: "down", stateClosing: "closing",
	stateClosed: "closed",
}

func (s connState) String() string { return enum.Name(connStateNames[:], int(s), "connState") }

// queryKind tells the queries in flight apart.
type queryKind uint8

const (
	queryCommands queryKind = iota // a batch of Listen/Unlisten
	queryProbe                     // the health check's empty query
	queryClose                     // UNLISTEN * before Terminate
	queryCheck                     // the delivery check's LISTEN, pid query or NOTIFY (check.go)
)

// query is one simple Query sent and not yet answered by its ReadyForQuery.
type query struct {
	kind      queryKind
	cmds      []*command
	completes int             // CommandCompletes received so far
	err       *pgconn.PgError // the ErrorResponse of this query, if any
	sent      time.Time       // when it was written (queryCommands)
	// listenCheck: a queryCheck that LISTENs the private channel.
	listenCheck bool
}

// Conn is the loop-driven LISTEN connection. Every method, and every
// callback of Config, runs on the loop goroutine.
type Conn struct {
	l   *loop.Loop
	cfg Config
	log *slog.Logger

	state connState
	tr    transport // the installed transport; nil unless up or closing
	// gen is bumped whenever the transport changes. Posts from bridge
	// goroutines and reconnect attempts carry the gen they were made
	// for and are dropped when it no longer matches (STYLE.md rule 8).
	gen uint64

	// set holds the channels whose LISTEN Postgres confirmed and whose
	// UNLISTEN it has not: what a resync re-LISTENs.
	set map[string]struct{}
	// pending are the commands not sent yet, in order; inflight the
	// queries sent and not yet answered by ReadyForQuery, in order. At
	// most one queryCommands is in flight: on an error the commands of a
	// batch are sent again, and a later batch already on the wire could
	// overtake them.
	pending  []*command
	inflight []*query
	// expired counts the commands in pending that expired (waiting
	// false) and were left there: removing one from the middle would cost
	// O(len). flush skips them; the queue is compacted once they are half
	// of it.
	expired int
	// expq holds the commands whose CommandTimeout runs, in deadline
	// order (the timeout is the same for all, so that is the order they
	// started in); expTimer fires for the first. An entry whose expiry
	// was stopped (or restarted: a new entry) stays until its deadline
	// passes and is skipped then.
	expq     []expiry
	expTimer *loop.Timer
	// cmdInflight counts the queryCommands in inflight (0 or 1).
	cmdInflight int
	// isolate: send the next batch with only its first command (see
	// settle).
	isolate bool
	// batchLimit is how many commands the next batch may carry: adapted
	// to the measured duration of the batches before it (see adaptBatch).
	batchLimit int
	// resyncing counts the re-LISTENs of the current resync not yet
	// confirmed; OnHealth(true) waits for it to reach zero.
	resyncing int
	healthy   bool

	// Reading. rbuf[rpos:rend] holds received bytes not parsed yet.
	rbuf       []byte
	rpos, rend int

	// Health. lastRx is the loop time of the last read that brought
	// bytes; probeSince is when the current probe (or deadline on a query
	// in flight) started, zero when none.
	lastRx     time.Time
	probeSince time.Time
	// rxReads counts the reads that brought bytes, and probeReads is its
	// value when the probe went out: an answer is a read after that.
	// Not lastRx against probeSince: both are the loop's time of their
	// iteration, and through the TLS bridge the answer can be fed in the
	// very iteration that sent the probe (the bridge's reader posts it,
	// and posts run after timers), so the two times are equal.
	rxReads, probeReads uint64
	hc                  *loop.Timer

	// Reconnect.
	backoff     time.Duration // delay before the next attempt
	reconnect   *loop.Timer   // the scheduled attempt, nil when none
	reconnectAt time.Time     // when reconnect fires
	cancelDial  context.CancelFunc
	lastErr     error // why the connection was last lost or not made
	pid         uint32
	// everUp: a connection was made once. Before that a configuration
	// error is fatal (Config.OnFatal); after it, it is retried.
	everUp bool
	// fatal is the error OnFatal reported; commands fail with it.
	fatal error
	// Failed attempts are logged once per distinct reason and then at
	// most every retryLogEvery, with the count in between.
	failedAttempts int
	lastWarnAt     time.Time
	lastWarnMsg    string

	// Close.
	closeTimer *loop.Timer
	closeDone  []func()

	qbuf []byte // scratch for building queries; reused

	kicked bool // a post is queued that ensures another iteration (see enqueue)

	ho handover // hot upgrade (handover.go)

	chk checkState // the delivery check (check.go)
}

// A Conn's seams, package variables that tests replace (export_test.go):
// testDialer returns a dial function that replaces dial for c (a fake
// server), or nil; noCheck says c runs without the delivery check (a
// scripted server answers only what a test expects); onBatchSent, onProbe
// and onBatchDone, when set, see every command query sent, every health
// probe sent, and every answered batch with how long it took.
var (
	testDialer  = func(*Conn) func(ctx context.Context) (transport, error) { return nil }
	noCheck     = func(*Conn) bool { return false }
	onBatchSent func(*Conn)
	onProbe     func(*Conn)
	onBatchDone func(c *Conn, q *query, took time.Duration)
)

// Start returns at once with a Conn that connects in the background: the
// connection is opened and authenticated off the loop, exactly as a
// reconnect is, and installed on the loop when made. Until then Healthy is
// false and commands wait (bounded by CommandTimeout); once the connection
// is up and everything asked meanwhile is LISTENed, OnHealth(true) follows.
// An unreachable server is retried forever with the capped backoff, and
// while a command waits the next attempt is at most 500 ms away. A
// configuration error before the first connection (IsConfigError) is not
// retried: OnFatal reports it and the Conn is closed.
//
// Start may be called from any goroutine; from then on the Conn belongs to
// the loop: call its methods only there (or in the loop's setup phase
// before Run).
func Start(l *loop.Loop, cfg Config) *Conn {
	c := newConn(l, cfg)
	c.start()
	return c
}

// start hands c to the loop and makes its first connection attempt there.
func (c *Conn) start() {
	c.state = stateDown
	l := c.l
	if err := l.Post(func() {
		l.AfterIteration(c.flush)
		l.OnClose(c.loopStopped)
		if c.cfg.ConnConfig == nil && testDialer(c) == nil {
			c.giveUp(errNoConnConfig)
			return
		}
		c.redial()
	}); err != nil {
		// The loop is gone: nothing will ever run. Commands fail.
		c.state = stateClosed
		c.fatal = fmt.Errorf("listener: %w", err)
	}
}

// Open connects and authenticates now, in the calling goroutine (which must
// not be the loop's: it blocks), then hands the connection to the loop. An
// unreachable server or a failed authentication is returned as the error.
// From then on the Conn belongs to the loop: call its methods only there.
// Calling them in the loop's setup phase before Run is fine; they queue
// until the posted install runs.
func Open(ctx context.Context, l *loop.Loop, cfg Config) (*Conn, error) {
	if cfg.ConnConfig == nil {
		return nil, errNoConnConfig
	}
	c := newConn(l, cfg)
	if err := c.dialAndBegin(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// dialAndBegin connects c (off the loop, bounded by ctx) and starts it on
// the new transport.
func (c *Conn) dialAndBegin(ctx context.Context) error {
	tr, err := dial(ctx, c.cfg.ConnConfig)
	if err != nil {
		return err
	}
	return c.begin(tr)
}

func newConn(l *loop.Loop, cfg Config) *Conn {
	c := &Conn{
		l:    l,
		cfg:  cfg.withDefaults(),
		set:  make(map[string]struct{}),
		rbuf: make([]byte, readBufSize),
	}
	c.log = c.cfg.Logger
	c.backoff = c.cfg.ReconnectMin
	c.batchLimit = initialBatch
	c.chk.channel = newCheckChannel()
	return c
}

// begin hands the first transport to the loop. Nothing of c is touched by
// the caller after this: the post is the hand-over.
func (c *Conn) begin(tr transport) error {
	l := c.l
	if err := l.Post(func() {
		l.AfterIteration(c.flush)
		l.OnClose(c.loopStopped)
		c.install(tr)
	}); err != nil {
		tr.discard()
		return fmt.Errorf("listener: %w", err)
	}
	return nil
}

// Healthy reports whether the connection is up and the whole set is
// LISTENed.
func (c *Conn) Healthy() bool { return c.healthy }

// Listen starts listening to channel. done runs on the loop once Postgres
// has confirmed it (CommandComplete, then ReadyForQuery: from then on every
// NOTIFY committed reaches OnNotification), or with the reason it failed.
// done never runs inside Listen. Commands issued in one loop iteration go
// out together, in one write and one multi-statement query.
func (c *Conn) Listen(channel string, done func(error)) { c.enqueue(true, channel, done) }

// Unlisten stops listening to channel; done as for Listen.
func (c *Conn) Unlisten(channel string, done func(error)) { c.enqueue(false, channel, done) }

// Close stops listening and closes the connection: UNLISTEN * and Terminate
// in one write, then the fd is closed when the server hangs up or after the
// health-check timeout, and done runs (on the loop, never inside Close).
// Commands not yet answered get ErrClosed, from inside Close; commands issued
// after it get ErrClosed later. A second Close only adds its done.
func (c *Conn) Close(done func()) {
	if done != nil {
		c.closeDone = append(c.closeDone, done)
	}
	switch c.state {
	case stateClosing:
		return
	case stateClosed:
		c.runCloseDone()
		return
	}
	prev := c.state
	c.state = stateClosing
	c.stopReconnecting()
	if c.hc != nil {
		c.hc.Stop()
		c.hc = nil
	}
	c.failWaiting(ErrClosed)
	if prev != stateUp || c.tr == nil {
		c.finishClose()
		return
	}
	c.healthy = false // no OnHealth: the owner asked for this
	msg := appendQuery(nil, []byte("UNLISTEN *"))
	msg = append(msg, terminate...)
	c.inflight = append(c.inflight, &query{kind: queryClose})
	if err := c.tr.write(msg); err != nil {
		c.finishClose()
		return
	}
	c.closeTimer = c.l.AfterFunc(c.cfg.HealthCheckTimeout, c.finishClose)
}

// failWaiting ends every command not yet answered with err. The queries in
// flight stay in inflight, emptied, so that their ReadyForQuery is still
// matched to them and not to the close query queued behind.
func (c *Conn) failWaiting(err error) {
	var cmds []*command
	for _, q := range c.inflight {
		cmds = append(cmds, q.cmds...)
		q.cmds, q.kind = nil, queryProbe
	}
	for _, cmd := range c.pending {
		if cmd.waiting { // not the expired ones: their done has run
			cmds = append(cmds, cmd)
		}
	}
	c.pending, c.expired, c.cmdInflight = nil, 0, 0
	c.stopAllExpiry()
	for _, cmd := range cmds {
		cmd.waiting = false
		if cmd.done != nil {
			cmd.done(err)
		}
	}
}

func (c *Conn) finishClose() {
	if c.state == stateClosed {
		return
	}
	c.state = stateClosed
	if c.closeTimer != nil {
		c.closeTimer.Stop()
		c.closeTimer = nil
	}
	c.teardown()
	c.inflight = nil
	c.healthy = false
	c.log.Info("listener: closed", "pid", c.pid)
	c.runCloseDone()
}

func (c *Conn) runCloseDone() {
	fs := c.closeDone
	c.closeDone = nil
	for _, f := range fs {
		if c.l.Post(f) != nil {
			f()
		}
	}
}

// stopReconnecting stops a scheduled reconnect and a dial in progress.
func (c *Conn) stopReconnecting() {
	if c.reconnect != nil {
		c.reconnect.Stop()
		c.reconnect = nil
	}
	if c.cancelDial != nil {
		c.cancelDial()
		c.cancelDial = nil
	}
}

// loopStopped is the loop's OnClose hook: the loop is going away, so drop
// the connection without ceremony (the server cleans up the LISTENs of a
// closed session) and end every waiting command.
func (c *Conn) loopStopped() {
	if c.state == stateClosed {
		return
	}
	c.state = stateClosing
	c.stopReconnecting()
	c.failWaiting(ErrClosed)
	c.finishClose()
}

// readFailed is how a transport reports a read error or EOF.
func (c *Conn) readFailed(err error) {
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("server closed the connection: %w", err)
	}
	c.fail(err)
}
