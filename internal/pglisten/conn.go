//go:build unix

package pglisten

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/enum"
	"github.com/listenhub/listenhub/internal/fdreserve"
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

func (c *Conn) enqueue(listen bool, channel string, done func(error)) {
	if done == nil {
		// Nobody is told the outcome: a failure is logged here. (A
		// caller with a done logs, or not, as it sees fit.)
		done = func(err error) {
			if err != nil && !errors.Is(err, ErrClosed) {
				c.log.Warn("listener: command failed", "q", channel, "listen", listen, "reason", err)
			}
		}
	}
	if err := ValidChannel(channel); err != nil {
		c.later(done, err)
		return
	}
	if channel == c.chk.channel {
		c.later(done, fmt.Errorf("%w: reserved for the delivery check", ErrInvalidChannel))
		return
	}
	if c.state == stateClosing || c.state == stateClosed {
		c.later(done, c.closedErr())
		return
	}
	cmd := &command{listen: listen, channel: channel, done: done, waiting: true}
	c.pending = append(c.pending, cmd)
	if c.state == stateDown {
		c.startExpiry(cmd)
		c.hurryReconnect()
	}
	if !c.kicked {
		// flush runs at the end of this iteration, unless we are
		// called from an AfterIteration hook that runs after it: then
		// the loop could sleep in epoll_wait with the batch unsent.
		// A post guarantees another iteration comes promptly.
		c.kicked = true
		if c.l.Post(func() { c.kicked = false }) != nil {
			c.kicked = false
		}
	}
}

// closedErr is what a command on a closed Conn fails with.
func (c *Conn) closedErr() error {
	if c.fatal != nil {
		return c.fatal
	}
	return ErrClosed
}

// hurryReconnect brings a scheduled attempt forward to at most
// maxRetryWhileWaiting from now: a command is waiting for it.
func (c *Conn) hurryReconnect() {
	if c.reconnect == nil {
		return
	}
	if now := time.Now(); c.reconnectAt.Sub(now) > maxRetryWhileWaiting {
		c.reconnect.Reset(maxRetryWhileWaiting)
		c.reconnectAt = now.Add(maxRetryWhileWaiting)
	}
}

// later runs done(err) on the loop, after the current callback returns.
func (c *Conn) later(done func(error), err error) {
	if c.l.Post(func() { done(err) }) != nil {
		done(err) // the loop is stopping: no later to wait for
	}
}

// expiry is one entry of Conn.expq: current while cmd.expiring and
// cmd.deadline is still this deadline.
type expiry struct {
	cmd      *command
	deadline time.Time
}

func (e expiry) current() bool { return e.cmd.expiring && e.cmd.deadline.Equal(e.deadline) }

// startExpiry bounds how long cmd waits for a connection: O(1), one timer
// for all of them.
func (c *Conn) startExpiry(cmd *command) {
	if c.cfg.CommandTimeout <= 0 || cmd.resync || cmd.expiring {
		return
	}
	cmd.expiring = true
	cmd.deadline = time.Now().Add(c.cfg.CommandTimeout)
	c.expq = append(c.expq, expiry{cmd, cmd.deadline})
	if c.expTimer == nil {
		c.expTimer = c.l.AfterFunc(c.cfg.CommandTimeout, c.expireDue)
	}
}

// stopExpiry: cmd no longer waits for a connection. Its expq entry is
// dropped when its deadline comes.
func stopExpiry(cmd *command) { cmd.expiring = false }

// stopAllExpiry forgets every expiry: the connection is up (commands wait
// only for their turn, which the health check bounds) or nothing waits.
func (c *Conn) stopAllExpiry() {
	for _, e := range c.expq {
		e.cmd.expiring = false
	}
	c.expq = nil
	if c.expTimer != nil {
		c.expTimer.Stop()
		c.expTimer = nil
	}
}

// expireChunk bounds the commands one timer pass expires, so that a crowd
// of them (every worker's subs during an outage) cannot stall the loop: the
// rest go in the next pass, after whatever else is ready.
const expireChunk = 1024

// expireDue fails the commands whose CommandTimeout has passed with
// ErrCommandTimeout, at most expireChunk of them, and re-arms the timer for
// the next deadline.
func (c *Conn) expireDue() {
	c.expTimer = nil
	now := time.Now()
	var due []*command
	i := 0
	for ; i < len(c.expq) && len(due) < expireChunk; i++ {
		e := c.expq[i]
		if !e.current() {
			continue
		}
		if e.deadline.After(now) {
			break
		}
		cmd := e.cmd
		cmd.expiring = false
		if cmd.waiting {
			cmd.waiting = false
			c.expired++
			due = append(due, cmd)
		}
	}
	clear(c.expq[:i])
	c.expq = c.expq[i:]
	if len(c.expq) == 0 {
		c.expq = nil
	} else {
		wait := time.Duration(0)
		if len(due) < expireChunk {
			wait = max(c.expq[0].deadline.Sub(now), 0)
		}
		c.expTimer = c.l.AfterFunc(wait, c.expireDue)
	}
	if c.expired == len(c.pending) || c.expired > 64 && c.expired > len(c.pending)/2 {
		c.compactPending()
	}
	if len(due) == 0 {
		return
	}
	err := fmt.Errorf("%w (%s)", ErrCommandTimeout, c.cfg.CommandTimeout)
	if c.lastErr != nil {
		err = fmt.Errorf("%w (%s; last error: %v)", ErrCommandTimeout, c.cfg.CommandTimeout, c.lastErr)
	}
	for _, cmd := range due {
		cmd.done(err)
	}
}

// compactPending drops the expired commands from pending, keeping the order.
func (c *Conn) compactPending() {
	kept := c.pending[:0]
	for _, cmd := range c.pending {
		if cmd.waiting {
			kept = append(kept, cmd)
		}
	}
	clear(c.pending[len(kept):])
	c.pending = kept
	if len(kept) == 0 {
		c.pending = nil
	}
	c.expired = 0
}

// waitingCount is how many commands wait in pending.
func (c *Conn) waitingCount() int { return len(c.pending) - c.expired }

// Batch size. A LISTEN costs the server time proportional to the channels
// its session already listens to (PostgreSQL up to at least 17 keeps them in
// a list and searches it at commit), so one multi-statement query of many
// LISTENs on a busy session can take seconds: measured on PostgreSQL 15,
// 1,000 LISTENs take 16 ms with 1,000 channels already listened, 68 ms with
// 10,000 and 250 ms with 50,000. The server says nothing until the whole
// query has committed, and silence that long would look like a dead
// connection to the health check. So a batch carries at most batchLimit
// commands, adapted after every batch so that one query takes about
// targetBatchTime: it halves (or more) when a batch was slow and doubles
// when a full batch was fast. The rest waits its turn, in order, one query
// in flight at a time.
const (
	targetBatchTime = 50 * time.Millisecond
	initialBatch    = 256
	minBatch        = 8
	maxBatch        = 2048
)

// adaptBatch sets the next batch's bound from one answered batch of n
// commands that took took (write to ReadyForQuery). Only a batch slower
// than the target says the bound is too big, and only a full one that was
// fast says it could grow: a small batch's time is mostly the round trip.
func (c *Conn) adaptBatch(n int, took time.Duration) {
	switch {
	case n <= 0:
	case took > targetBatchTime:
		ideal := int(int64(n) * int64(targetBatchTime) / int64(took))
		c.batchLimit = max(min(ideal, c.batchLimit), c.batchLimit/4, minBatch)
	case n >= c.batchLimit && took < targetBatchTime/2:
		c.batchLimit = min(2*c.batchLimit, maxBatch)
	}
}

// flush sends the pending commands as one multi-statement query when the
// connection is up and no batch is in flight. It is the AfterIteration
// hook: everything queued during one iteration leaves in one write.
func (c *Conn) flush() {
	c.checkIdle()
	if c.state != stateUp || c.cmdInflight > 0 || c.waitingCount() == 0 || !c.chk.verified && !noCheck(c) {
		return
	}
	q := &query{kind: queryCommands}
	buf, start := beginQuery(c.qbuf[:0])
	n := 0 // entries taken off pending, expired ones included
	for _, cmd := range c.pending {
		if !cmd.waiting {
			c.expired--
			n++
			continue
		}
		if len(q.cmds) > 0 {
			if len(q.cmds) >= c.batchLimit || len(buf)-start > maxBatchBytes || c.isolate {
				break
			}
			buf = append(buf, ';')
		}
		buf = appendCommand(buf, cmd.listen, cmd.channel)
		cmd.waiting = false
		stopExpiry(cmd)
		q.cmds = append(q.cmds, cmd)
		n++
	}
	c.isolate = false
	// Off the front by reslicing: O(batch), not O(queue). append
	// reallocates (copying only what is left) when the array runs out.
	clear(c.pending[:n])
	c.pending = c.pending[n:]
	if len(c.pending) == 0 {
		c.pending = nil // let a big queue's array go
	}
	buf = finishQuery(buf, start)
	c.qbuf = buf
	if cap(buf) > 64<<10 {
		c.qbuf = nil // a one-off big batch: don't keep its buffer
	}
	if onBatchSent != nil {
		onBatchSent(c)
	}
	q.sent = time.Now()
	c.send(q, buf)
}

// send records q as in flight and writes msg. A write error declares the
// connection dead (which requeues q's commands).
func (c *Conn) send(q *query, msg []byte) {
	c.inflight = append(c.inflight, q)
	if q.kind == queryCommands {
		c.cmdInflight++
	}
	if err := c.tr.write(msg); err != nil {
		c.fail(fmt.Errorf("write: %w", err))
	}
}

// install puts a freshly connected transport to work: on the first connect
// from Open, on every reconnect from the dial goroutine's post.
func (c *Conn) install(tr transport) {
	if c.state == stateClosing || c.state == stateClosed {
		tr.discard()
		return
	}
	c.gen++
	if err := tr.start(c, c.gen); err != nil {
		tr.discard()
		c.lastErr = err
		c.state = stateDown
		c.scheduleReconnect()
		return
	}
	c.tr = tr
	c.pid = tr.backendPID()
	c.state = stateUp
	c.everUp = true
	c.failedAttempts, c.lastWarnMsg = 0, ""
	c.lastRx = c.l.Now()
	c.probeSince = time.Time{}
	c.hc = c.l.AfterFunc(c.cfg.HealthCheckInterval, c.healthTick)
	// The waiting commands have their connection: from here they wait
	// only for their turn.
	c.stopAllExpiry()
	if c.expired > 0 {
		c.compactPending()
	}
	if noCheck(c) {
		c.log.Info("listener: connected", "pid", c.pid, "tls", tr.isTLS(), "channels", len(c.set))
		c.ready()
		return
	}
	// Nothing goes out, and nobody is told healthy, before the
	// connection has shown that notifications arrive (check.go).
	c.startCheck()
}

// ready puts a connection that passed the delivery check to work.
func (c *Conn) ready() {
	// Re-LISTEN the whole set first, then whatever waited, in bounded
	// batches (see batchLimit): notifications for the channels already
	// re-LISTENed are delivered while the later batches run, and
	// OnHealth(true) waits for the last one. Duplicates with pending
	// LISTENs are harmless (LISTEN is idempotent); a pending UNLISTEN
	// comes after the re-LISTEN and wins, as it should.
	if len(c.set) > 0 {
		resync := make([]*command, 0, len(c.set)+len(c.pending))
		for ch := range c.set {
			resync = append(resync, &command{listen: true, channel: ch, resync: true, waiting: true})
		}
		c.resyncing = len(resync)
		c.pending = append(resync, c.pending...)
	}
	if c.resyncing == 0 {
		c.setHealthy(true)
	}
	c.flush()
}

// setHealthy reports a health change once.
func (c *Conn) setHealthy(h bool) {
	if h {
		c.backoff = c.cfg.ReconnectMin // the next loss starts over
	}
	if c.healthy == h {
		return
	}
	c.healthy = h
	if c.cfg.OnHealth != nil {
		c.cfg.OnHealth(h)
	}
}

// fail declares the connection dead: tear it down, put every command that
// was in flight back at the head of the queue (it may or may not have taken
// effect; it will be sent again), report unhealthy and schedule a
// reconnect.
func (c *Conn) fail(err error) {
	switch c.state {
	case stateClosing:
		c.finishClose()
		return
	case stateUp:
	default:
		return
	}
	c.lastErr = err
	if errors.Is(err, ErrNotDelivered) {
		c.notDelivered(err)
	} else {
		c.log.Warn("listener: connection lost", "pid", c.pid, "reason", err)
	}
	c.teardown()
	var requeue []*command
	for _, q := range c.inflight {
		for _, cmd := range q.cmds {
			if !cmd.resync {
				requeue = append(requeue, cmd)
			}
		}
	}
	c.inflight = nil
	c.cmdInflight = 0
	c.resyncing = 0
	// Drop the old resync's unsent re-LISTENs: the next install builds a
	// fresh one from the set.
	kept := requeue
	for _, cmd := range c.pending {
		if !cmd.resync && cmd.waiting {
			kept = append(kept, cmd)
		}
	}
	c.pending, c.expired = kept, 0
	c.isolate = false
	c.state = stateDown
	for _, cmd := range c.pending {
		cmd.waiting = true
		c.startExpiry(cmd)
	}
	c.setHealthy(false)
	if c.state == stateDown { // OnHealth may have closed us
		c.scheduleReconnect()
	}
}

// teardown closes the transport and stops its timers.
func (c *Conn) teardown() {
	if c.tr != nil {
		c.tr.close()
		c.tr = nil
	}
	c.gen++
	if c.hc != nil {
		c.hc.Stop()
		c.hc = nil
	}
	c.rpos, c.rend = 0, 0
	if len(c.rbuf) > readBufSize {
		c.rbuf = make([]byte, readBufSize)
	}
	c.probeSince = time.Time{}
	c.resetCheck()
	c.chk.listening, c.chk.verified, c.chk.serverPID = false, false, 0
}

// scheduleReconnect arms the next attempt, jittered into [d/2, d], and no
// later than maxRetryWhileWaiting while a command waits.
func (c *Conn) scheduleReconnect() {
	d := c.backoff
	d = d/2 + rand.N(d/2+1)
	c.backoff = min(c.backoff*2, c.cfg.ReconnectMax)
	if c.waitingCount() > 0 {
		d = min(d, maxRetryWhileWaiting)
	}
	c.reconnectAt = time.Now().Add(d)
	c.reconnect = c.l.AfterFunc(d, c.redial)
}

// retryLogEvery bounds the log lines of a server that stays unreachable.
const retryLogEvery = 30 * time.Second

// attemptFailed logs a failed connection attempt: the first of each reason
// at once, repeats at most every retryLogEvery with how many there were.
func (c *Conn) attemptFailed(err error) {
	c.failedAttempts++
	msg := err.Error()
	now := time.Now()
	if msg == c.lastWarnMsg && now.Sub(c.lastWarnAt) < retryLogEvery {
		return
	}
	what := "listener: connect failed"
	if c.everUp {
		what = "listener: reconnect failed"
	}
	c.log.Warn(what, "reason", err, "attempts", c.failedAttempts, "retry_in_max", c.backoff)
	c.failedAttempts = 0
	c.lastWarnAt, c.lastWarnMsg = now, msg
}

// giveUp ends a Conn whose configuration the server refused before it was
// ever connected: retrying cannot help. Every waiting command fails with
// err, OnFatal reports it, and later commands fail with it too.
func (c *Conn) giveUp(err error) {
	c.log.Error("listener: the server refused the configuration; not retrying", "reason", err)
	c.fatal = err
	c.lastErr = err
	c.state = stateClosed
	if c.reconnect != nil {
		c.reconnect.Stop()
		c.reconnect = nil
	}
	c.failWaiting(err)
	c.healthy = false
	if c.cfg.OnFatal != nil {
		c.cfg.OnFatal(err)
	}
}

// redial starts one connection attempt on a goroutine; its result comes back
// through Post, tagged with the gen it was started for.
func (c *Conn) redial() {
	c.reconnect = nil
	if c.state != stateDown {
		return
	}
	var timeout time.Duration
	if c.cfg.ConnConfig != nil {
		timeout = c.cfg.ConnConfig.ConnectTimeout
	}
	if timeout <= 0 {
		timeout = defaultConnectTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	c.cancelDial = cancel
	gen := c.gen
	cfg := c.cfg.ConnConfig
	dialer := testDialer(c)
	go func() {
		var tr transport
		// Out of descriptors (a limit lowered under the process, workers
		// holding the rest), the attempt runs again on the reserve kept
		// for it (package fdreserve), rather than fail for as long as
		// the shortage lasts.
		err := fdreserve.Retry(func() (err error) {
			if dialer != nil {
				tr, err = dialer(ctx)
			} else {
				tr, err = dial(ctx, cfg)
			}
			return err
		})
		cancel()
		if perr := c.l.Post(func() { c.dialed(gen, tr, err) }); perr != nil && tr != nil {
			tr.discard()
		}
	}()
}

func (c *Conn) dialed(gen uint64, tr transport, err error) {
	c.cancelDial = nil
	if gen != c.gen || c.state != stateDown {
		if tr != nil {
			tr.discard()
		}
		return
	}
	if err != nil {
		c.lastErr = err
		if !c.everUp && IsConfigError(err) {
			c.giveUp(err)
			return
		}
		c.attemptFailed(err)
		c.scheduleReconnect()
		return
	}
	c.install(tr)
}

// healthTick is the health-check timer. While nothing is expected from the
// server it waits for HealthCheckInterval of silence, then probes; while a
// probe or a query is in flight it gives the server HealthCheckTimeout to
// send anything at all.
func (c *Conn) healthTick() {
	if c.state != stateUp || c.hc == nil {
		return
	}
	if c.ho.holding && len(c.inflight) == 0 {
		// An upgrade waits for a quiet point: a probe now would be in
		// flight at the hand-over. The wait is bounded by the upgrade.
		c.probeSince = time.Time{}
		c.hc.Reset(c.cfg.HealthCheckInterval)
		return
	}
	now := c.l.Now()
	if !c.probeSince.IsZero() {
		if c.rxReads == c.probeReads {
			if wait := c.cfg.HealthCheckTimeout - now.Sub(c.probeSince); wait > 0 {
				c.hc.Reset(min(wait, c.cfg.HealthCheckInterval))
				return
			}
			c.fail(fmt.Errorf("%w within %s", ErrHealthCheck, c.cfg.HealthCheckTimeout))
			return
		}
		c.probeSince = time.Time{}
	}
	idle := now.Sub(c.lastRx)
	if idle < c.cfg.HealthCheckInterval {
		c.hc.Reset(c.cfg.HealthCheckInterval - idle)
		return
	}
	c.probeSince, c.probeReads = now, c.rxReads
	// Looked at again after an interval, not only at the timeout: a probe
	// answered at once is followed by the next one an interval after the
	// answer, whatever the timeout (one longer than the interval would
	// otherwise set the pace).
	c.hc.Reset(min(c.cfg.HealthCheckInterval, c.cfg.HealthCheckTimeout))
	if len(c.inflight) == 0 {
		if c.checkDue(now) {
			// Every few intervals without a notification the
			// probe is the end-to-end one (check.go): the server
			// answering is not enough.
			c.sendCheck()
			return
		}
		// The empty query: EmptyQueryResponse + ReadyForQuery, no
		// transaction, no parse. With a query already in flight its
		// answer is the probe.
		if onProbe != nil {
			onProbe(c)
		}
		c.send(&query{kind: queryProbe}, emptyQuery)
	}
}

var emptyQuery = appendQuery(nil, nil)

// readBufSize is the read buffer: hundreds of notifications per read.
const readBufSize = 64 << 10

// received processes c.rbuf[c.rpos:c.rend] after a read brought bytes. It
// returns false when the connection was torn down meanwhile (a callback
// closed it, or the stream was bad), telling the reader to stop.
func (c *Conn) received() bool {
	c.lastRx = c.l.Now()
	c.rxReads++
	gen := c.gen
	for {
		if c.ho.paused {
			return false // the rest waits in rbuf (an upgrade)
		}
		typ, body, n, want, err := nextMessage(c.rbuf[c.rpos:c.rend])
		if err != nil {
			c.fail(err)
			return false
		}
		if n == 0 {
			c.compact(want)
			return true
		}
		c.rpos += n
		c.dispatch(typ, body)
		if c.gen != gen {
			return false
		}
	}
}

// compact moves the partial message at rpos to the front and makes room for
// want bytes of it.
func (c *Conn) compact(want int) {
	if c.rpos == c.rend {
		c.rpos, c.rend = 0, 0
		if len(c.rbuf) > readBufSize {
			c.rbuf = make([]byte, readBufSize) // shrink once drained
		}
		return
	}
	if c.rpos > 0 {
		c.rend = copy(c.rbuf, c.rbuf[c.rpos:c.rend])
		c.rpos = 0
	}
	if want > len(c.rbuf) {
		nb := make([]byte, want)
		copy(nb, c.rbuf[:c.rend])
		c.rbuf = nb
	}
}

// dispatch handles one backend message: the one switch that updates state
// and calls out.
func (c *Conn) dispatch(typ byte, body []byte) {
	switch typ {
	case msgNotification:
		ch, payload, ok := parseNotification(body)
		if !ok {
			c.fail(fmt.Errorf("%w: malformed NotificationResponse", errProtocol))
			return
		}
		if string(ch) == c.chk.channel {
			c.checkNote(payload)
			return
		}
		c.chk.lastNote = c.lastRx
		if c.ho.marker != "" && c.markerFilter(ch) {
			return
		}
		if c.cfg.OnNotification != nil && c.state == stateUp {
			c.cfg.OnNotification(ch, payload)
		}
	case msgCommandComplete:
		if len(c.inflight) > 0 {
			q := c.inflight[0]
			if q.err == nil {
				q.completes++
			}
		}
	case msgEmptyQuery:
	case msgErrorResponse:
		e, err := parseError(body)
		if err != nil {
			c.fail(err)
			return
		}
		if fatalSeverity(e) {
			c.fail(e)
			return
		}
		if len(c.inflight) == 0 {
			c.log.Warn("listener: unexpected error from the server", "pid", c.pid, "reason", e)
			return
		}
		if q := c.inflight[0]; q.err == nil {
			q.err = e
		}
	case msgReadyForQuery:
		if len(c.inflight) == 0 {
			return // not ours; harmless
		}
		q := c.inflight[0]
		c.inflight[0] = nil
		c.inflight = c.inflight[1:]
		c.answered(q)
	case msgNotice:
		if e, err := parseError(body); err == nil {
			c.log.Info("listener: notice from the server", "pid", c.pid, "severity", e.Severity, "message", e.Message)
		}
	case msgDataRow:
		if len(c.inflight) > 0 && c.inflight[0].kind == queryCheck {
			if pid, ok := parsePIDRow(body); ok {
				c.chk.serverPID = pid
			}
		}
	case msgParameterStatus, msgBackendKeyData, msgRowDescription:
		// ParameterStatus arrives when a setting the server reports
		// changes (a SET, a reload); nothing here depends on one.
	default:
		c.log.Warn("listener: unexpected message from the server", "pid", c.pid, "type", string(rune(typ)))
	}
}

// answered completes a query at its ReadyForQuery.
func (c *Conn) answered(q *query) {
	switch q.kind {
	case queryProbe:
		return
	case queryCheck:
		c.checkAnswered(q)
		return
	case queryClose:
		if c.state == stateClosing {
			// Terminate follows; the server hangs up. Closing now is
			// as good as waiting for its EOF.
			c.finishClose()
		}
		return
	}
	c.cmdInflight--
	cmds := q.cmds
	took := time.Since(q.sent)
	c.adaptBatch(len(cmds), took)
	if onBatchDone != nil {
		onBatchDone(c, q, took)
	}
	v, idx := settle(len(cmds), q.completes, q.err != nil)
	var retry []*command
	var done []*command // commands to report, in order
	switch v {
	case allDone:
		done = cmds
	case allFailed:
		done = cmds
	case oneFailed:
		done = cmds[idx : idx+1]
		retry = slices.Concat(cmds[:idx], cmds[idx+1:])
	case isolateOne:
		retry = cmds
		c.isolate = true
	}
	if len(retry) > 0 {
		for _, cmd := range retry {
			cmd.waiting = true
		}
		c.pending = append(retry, c.pending...)
	}
	var err error
	if v == oneFailed || v == allFailed {
		err = q.err
		for _, cmd := range done {
			if cmd.resync {
				// A channel that was fine before the reconnect cannot
				// be LISTENed now: a server-wide condition (a
				// read-only standby after a failover, say). Healthy
				// would be a lie; try another connection, with every
				// command of this batch waiting for it.
				// (retry is already back in pending.)
				var again []*command
				for _, d := range done {
					if !d.resync {
						d.waiting = true
						again = append(again, d)
					}
				}
				c.pending = append(again, c.pending...)
				c.fail(fmt.Errorf("re-LISTEN %s: %w", QuoteIdentifier(cmd.channel), err))
				return
			}
		}
	}
	for _, cmd := range done {
		if err != nil {
			continue
		}
		if cmd.listen {
			c.set[cmd.channel] = struct{}{}
		} else {
			delete(c.set, cmd.channel)
		}
		if cmd.resync {
			c.resyncing--
		}
	}
	if c.resyncing == 0 && c.state == stateUp && !c.healthy {
		c.setHealthy(true)
	}
	for _, cmd := range done {
		// The owner gets the error and logs it as it sees fit (the hub
		// rate-limits it: a worker can make thousands of LISTENs fail);
		// enqueue gave a command without an owner a done that logs.
		// (A resync re-LISTEN has no done: its failure fails the
		// connection above.)
		if cmd.done != nil {
			cmd.done(err)
		}
	}
}

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
