package pglisten

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/listenhub/listenhub/internal/pgquote"
)

// PlainConfig configures a Plain listener. The fields mean what they mean in
// Config; the callbacks run on the listener's own goroutine instead of a
// loop.
type PlainConfig struct {
	ConnConfig *pgconn.Config

	HealthCheckInterval, HealthCheckTimeout time.Duration
	ReconnectMin, ReconnectMax              time.Duration

	// OnNotification is called for every notification, in the order the
	// server sent them, from the listener's goroutine. While it runs
	// nothing is read from the connection: hand slow work off.
	OnNotification func(channel, payload string)
	// OnHealth is called from the listener's goroutine: true right after
	// NewPlain and after every reconnect once the whole set is LISTENed
	// again, false when the connection is lost.
	OnHealth func(healthy bool)

	Logger *slog.Logger
}

// Plain is a per-process LISTEN connection for a worker that has no hub:
// one pgconn connection owned by one goroutine. pgconn cannot run a query
// while it is blocked in WaitForNotification, so commands are queued and
// the goroutine's wait is cut short by cancelling its context; it then runs
// everything queued as one multi-statement query, and goes back to waiting.
// All methods are safe for concurrent use.
type Plain struct {
	cfg     PlainConfig
	connCfg *pgconn.Config
	log     *slog.Logger

	ctx    context.Context // cancelled by Close: ends waits and reconnects
	cancel context.CancelFunc
	done   chan struct{} // closed when the goroutine has returned

	mu      sync.Mutex
	queue   []*plainReq        // guarded by mu
	wake    context.CancelFunc // guarded by mu: ends the current wait
	closing bool               // guarded by mu

	healthy atomic.Bool

	// check is the delivery check's private channel (check.go); got is
	// the payload of the last notification on it, lastNote when the last
	// notification of any channel arrived. Goroutine-only (NewPlain's
	// caller before the goroutine starts).
	check    string
	got      string
	lastNote time.Time
	checks   atomic.Int64 // end-to-end checks of the health check (tests)

	// Goroutine-only. notes counts notifications received; the wait
	// context lives across WaitForNotification calls until it expires or
	// is cancelled (allocating one per notification would double the
	// cost of a notification), and wsince is notes when it was made.
	notes  uint64
	wctx   context.Context
	wstop  context.CancelFunc
	wsince uint64
}

// plainReq is one Listen or Unlisten waiting for its answer.
type plainReq struct {
	listen  bool
	channel string
	// notify: a NOTIFY of channel with payload instead of a LISTEN or
	// UNLISTEN (the set is not touched).
	notify  bool
	payload string
	reply   chan error // buffered: the goroutine never blocks on it
	// state: 0 queued, 1 taken by the goroutine, 2 abandoned by its
	// caller (context done before it was taken: never sent).
	state atomic.Int32
}

// NewPlain connects now (an unreachable server is the error) and starts the
// listener's goroutine.
func NewPlain(ctx context.Context, cfg PlainConfig) (*Plain, error) {
	if cfg.ConnConfig == nil {
		return nil, errors.New("listener: PlainConfig.ConnConfig is nil (use ParseConfig)")
	}
	c := Config{HealthCheckInterval: cfg.HealthCheckInterval, HealthCheckTimeout: cfg.HealthCheckTimeout,
		ReconnectMin: cfg.ReconnectMin, ReconnectMax: cfg.ReconnectMax, Logger: cfg.Logger}
	c = c.withDefaults()
	cfg.HealthCheckInterval, cfg.HealthCheckTimeout = c.HealthCheckInterval, c.HealthCheckTimeout
	cfg.ReconnectMin, cfg.ReconnectMax, cfg.Logger = c.ReconnectMin, c.ReconnectMax, c.Logger

	p := &Plain{cfg: cfg, log: cfg.Logger, done: make(chan struct{}), check: newCheckChannel()}
	cc := cfg.ConnConfig.Copy()
	cc.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		p.lastNote = time.Now()
		if n.Channel == p.check {
			p.got = n.Payload
			return
		}
		p.notes++
		if p.cfg.OnNotification != nil {
			p.cfg.OnNotification(n.Channel, n.Payload)
		}
	}
	cc.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		p.log.Info("listener: notice from the server", "severity", n.Severity, "message", n.Message)
	}
	// A cancelled wait must only interrupt the read (a deadline), not
	// send a cancel request to the server or close the connection.
	cc.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	p.connCfg = cc

	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, connectErr(err)
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	if _, err := p.checkDelivery(ctx, conn); err != nil {
		p.cancel()
		conn.Close(context.Background())
		return nil, err
	}
	p.healthy.Store(true)
	go p.run(conn)
	return p, nil
}

// Listen starts listening to channel and returns once Postgres has
// confirmed it: every NOTIFY committed after that reaches OnNotification.
// While the connection is down it waits for the reconnect, bounded by ctx.
func (p *Plain) Listen(ctx context.Context, channel string) error {
	return p.do(ctx, true, channel)
}

// Unlisten stops listening to channel, like Listen.
func (p *Plain) Unlisten(ctx context.Context, channel string) error {
	return p.do(ctx, false, channel)
}

// Healthy reports whether the connection is up with the whole set LISTENed.
func (p *Plain) Healthy() bool { return p.healthy.Load() }

// Notify commits NOTIFY channel, payload on this connection, in order with
// the LISTENs and UNLISTENs before it. It is how a fail-back marks a
// point that this connection and the hub both see (client's cut).
func (p *Plain) Notify(ctx context.Context, channel, payload string) error {
	return p.send(ctx, &plainReq{notify: true, channel: channel, payload: payload})
}

func (p *Plain) do(ctx context.Context, listen bool, channel string) error {
	return p.send(ctx, &plainReq{listen: listen, channel: channel})
}

func (p *Plain) send(ctx context.Context, r *plainReq) error {
	channel := r.channel
	if err := ValidChannel(channel); err != nil {
		return err
	}
	if channel == p.check {
		return fmt.Errorf("%w: reserved for the delivery check", ErrInvalidChannel)
	}
	if strings.IndexByte(r.payload, 0) >= 0 {
		return fmt.Errorf("%w: a payload with a NUL", ErrInvalidChannel)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r.reply = make(chan error, 1)
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return ErrClosed
	}
	p.queue = append(p.queue, r)
	wake := p.wake
	p.mu.Unlock()
	if wake != nil {
		wake()
	}
	select {
	case err := <-r.reply:
		return err
	case <-ctx.Done():
		if r.state.CompareAndSwap(0, 2) {
			return ctx.Err()
		}
		// Already sent: its answer is moments away unless the
		// connection is dying; either way the caller has stopped
		// waiting.
		return ctx.Err()
	}
}

// Close sends UNLISTEN * and Terminate, closes the connection and waits for
// the goroutine to return. Commands still waiting get ErrClosed.
func (p *Plain) Close() error {
	p.mu.Lock()
	p.closing = true
	wake := p.wake
	p.mu.Unlock()
	if wake != nil {
		wake()
	}
	p.cancel()
	<-p.done
	return nil
}

// take moves the queued requests to the goroutine, skipping abandoned ones.
func (p *Plain) take(dst []*plainReq) ([]*plainReq, bool) {
	p.mu.Lock()
	q, closing := p.queue, p.closing
	p.queue = nil
	p.mu.Unlock()
	for _, r := range q {
		if r.state.CompareAndSwap(0, 1) {
			dst = append(dst, r)
		}
	}
	return dst, closing
}

func (p *Plain) setHealthy(h bool) {
	if p.healthy.Swap(h) != h && p.cfg.OnHealth != nil {
		p.cfg.OnHealth(h)
	}
}

// run is the goroutine that owns the connection.
func (p *Plain) run(conn *pgconn.PgConn) {
	defer close(p.done)
	defer func() {
		if p.wstop != nil {
			p.wstop()
		}
	}()
	if p.cfg.OnHealth != nil {
		p.cfg.OnHealth(true)
	}
	set := make(map[string]struct{})
	var pending []*plainReq // taken, not answered; oldest first
	isolate := false
	backoff := p.cfg.ReconnectMin
	for {
		if conn == nil {
			conn = p.reconnect(set, &backoff)
			if conn == nil { // closing
				p.finish(pending, nil)
				return
			}
			p.setHealthy(true)
		}
		var closing bool
		pending, closing = p.take(pending)
		if closing {
			p.finish(pending, conn)
			return
		}
		if len(pending) > 0 {
			var err error
			pending, isolate, err = p.exec(conn, pending, isolate, set)
			if err != nil {
				conn = p.lost(conn, err)
			}
			continue
		}
		if err := p.wait(conn); err != nil {
			conn = p.lost(conn, err)
		}
	}
}

// exec sends the pending requests (or the first alone, when isolating) as
// one multi-statement query and settles them like Conn does. A returned
// error means the connection is gone; the batch stays pending for the next
// one.
func (p *Plain) exec(conn *pgconn.PgConn, pending []*plainReq, isolate bool, set map[string]struct{}) ([]*plainReq, bool, error) {
	var sql []byte
	n := 0
	for _, r := range pending {
		if n > 0 {
			if len(sql) > maxBatchBytes || isolate {
				break
			}
			sql = append(sql, ';')
		}
		if r.notify {
			sql = appendNotify(sql, r.channel, r.payload)
		} else {
			sql = appendCommand(sql, r.listen, r.channel)
		}
		n++
	}
	completes, err := p.query(conn, string(sql))
	var pgErr *pgconn.PgError
	if err != nil && (!errors.As(err, &pgErr) || conn.IsClosed()) {
		return pending, false, err
	}
	batch := pending[:n]
	v, idx := settle(n, completes, err != nil)
	var answered []*plainReq
	var retry []*plainReq
	switch v {
	case allDone, allFailed:
		answered = batch
	case oneFailed:
		answered = batch[idx : idx+1]
		retry = append(append(retry, batch[:idx]...), batch[idx+1:]...)
	case isolateOne:
		retry = batch
	}
	rest := append(retry, pending[n:]...)
	for _, r := range answered {
		if err == nil && r.notify {
			// nothing to record
		} else if err == nil {
			if r.listen {
				set[r.channel] = struct{}{}
			} else {
				delete(set, r.channel)
			}
		} else {
			p.log.Warn("listener: command failed", "q", r.channel, "listen", r.listen, "reason", err)
		}
		r.reply <- err
	}
	return rest, v == isolateOne, nil
}

// query runs sql and counts the CommandCompletes before any error, bounded by
// the health-check timeout (a server that does not answer is dead).
func (p *Plain) query(conn *pgconn.PgConn, sql string) (int, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.HealthCheckTimeout)
	defer cancel()
	mrr := conn.Exec(ctx, sql)
	n := 0
	for mrr.NextResult() {
		if _, err := mrr.ResultReader().Close(); err == nil {
			n++
		}
	}
	return n, mrr.Close()
}

// wait blocks in WaitForNotification until a notification (delivered by
// pgconn's OnNotification hook, on this goroutine), a wake from a command or
// Close, or the end of the health-check interval; an interval without any
// notification is answered with a probe. An error means the connection is
// dead.
func (p *Plain) wait(conn *pgconn.PgConn) error {
	if p.wctx == nil {
		p.wctx, p.wstop = context.WithTimeout(p.ctx, p.cfg.HealthCheckInterval)
		p.wsince = p.notes
	}
	ctx := p.wctx
	p.mu.Lock()
	if len(p.queue) > 0 || p.closing {
		p.mu.Unlock()
		return nil
	}
	p.wake = p.wstop
	p.mu.Unlock()
	err := conn.WaitForNotification(ctx)
	p.mu.Lock()
	p.wake = nil
	p.mu.Unlock()
	if ctx.Err() != nil {
		p.wstop()
		p.wctx = nil // expired or woken: the next wait starts a new interval
	}
	switch {
	case err == nil:
		return nil
	case conn.IsClosed():
		return err
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		if p.notes != p.wsince {
			return nil // traffic during the interval is an answer
		}
		pctx, pcancel := context.WithTimeout(p.ctx, p.cfg.HealthCheckTimeout)
		defer pcancel()
		if time.Since(p.lastNote) >= checkEvery*p.cfg.HealthCheckInterval {
			// Every few intervals the probe is end to end
			// (check.go): our own NOTIFY must come back.
			p.checks.Add(1)
			if err := p.selfNotify(pctx, conn); err != nil {
				if p.ctx.Err() != nil {
					return nil
				}
				return err
			}
			return nil
		}
		if perr := conn.Exec(pctx, "").Close(); perr != nil {
			if p.ctx.Err() != nil {
				return nil // closing, not dead
			}
			return fmt.Errorf("%w: %w", ErrHealthCheck, perr)
		}
		return nil
	case ctx.Err() != nil:
		return nil // woken
	default:
		return err
	}
}

// lost closes a dead connection and reports unhealthy.
func (p *Plain) lost(conn *pgconn.PgConn, err error) *pgconn.PgConn {
	if p.ctx.Err() != nil {
		// Close cut a query short: not a loss. Keep the connection
		// if it survived, for the UNLISTEN * and Terminate.
		if conn.IsClosed() {
			return nil
		}
		return conn
	}
	p.log.Warn("listener: connection lost", "pid", conn.PID(), "reason", err)
	p.setHealthy(false)
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.HealthCheckTimeout)
	defer cancel()
	conn.Close(ctx) // Terminate is best effort: the peer may be gone
	return nil
}

// reconnect retries with capped exponential backoff and jitter until a
// connection is up with the whole set LISTENed again (in one query), or
// Close. It returns nil on Close.
func (p *Plain) reconnect(set map[string]struct{}, backoff *time.Duration) *pgconn.PgConn {
	for {
		d := *backoff
		d = d/2 + rand.N(d/2+1)
		*backoff = min(*backoff*2, p.cfg.ReconnectMax)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-p.ctx.Done():
			t.Stop()
			return nil
		}
		conn, err := p.connect(set)
		if err == nil {
			*backoff = p.cfg.ReconnectMin
			return conn
		}
		if p.ctx.Err() != nil {
			return nil
		}
		p.log.Warn("listener: reconnect failed", "reason", err)
	}
}

func (p *Plain) connect(set map[string]struct{}) (*pgconn.PgConn, error) {
	timeout := p.connCfg.ConnectTimeout
	if timeout <= 0 {
		timeout = defaultConnectTimeout
	}
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, p.connCfg)
	if err != nil {
		return nil, connectErr(err)
	}
	if _, err := p.checkDelivery(ctx, conn); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	if len(set) > 0 {
		var sql []byte
		for ch := range set {
			if len(sql) > 0 {
				sql = append(sql, ';')
			}
			sql = appendCommand(sql, true, ch)
		}
		if _, err := p.query(conn, string(sql)); err != nil {
			conn.Close(context.Background())
			return nil, fmt.Errorf("listener: re-LISTEN %d channels: %w", len(set), err)
		}
	}
	p.log.Info("listener: connected", "pid", conn.PID(), "channels", len(set))
	return conn, nil
}

// finish ends the goroutine: UNLISTEN * and Terminate on a live connection,
// ErrClosed for everything still waiting.
func (p *Plain) finish(pending []*plainReq, conn *pgconn.PgConn) {
	pending, _ = p.take(pending)
	for _, r := range pending {
		r.reply <- ErrClosed
	}
	if conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.HealthCheckTimeout)
		defer cancel()
		_ = conn.Exec(ctx, "UNLISTEN *").Close()
		_ = conn.Close(ctx)
	}
	p.healthy.Store(false)
}

// checkDelivery is Conn's delivery check (check.go) on a fresh connection:
// LISTEN the private channel, compare pg_backend_pid() with BackendKeyData,
// NOTIFY it and wait for it; when the pids differ (a pooler), a second
// session must NOTIFY it too and that must arrive.
func (p *Plain) checkDelivery(ctx context.Context, conn *pgconn.PgConn) (server uint32, err error) {
	qctx, cancel := context.WithTimeout(ctx, p.cfg.HealthCheckTimeout)
	defer cancel()
	sql := pgquote.AppendIdent([]byte("LISTEN "), p.check)
	sql = append(sql, "; SELECT pg_backend_pid()"...)
	res, err := conn.Exec(qctx, string(sql)).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("listener: delivery check: %w", err)
	}
	if len(res) == 2 && len(res[1].Rows) == 1 && len(res[1].Rows[0]) == 1 {
		v, _ := strconv.ParseUint(string(res[1].Rows[0][0]), 10, 32)
		server = uint32(v)
	}
	if err := p.selfNotify(qctx, conn); err != nil {
		if errors.Is(err, ErrNotDelivered) {
			return server, fmt.Errorf("%w: LISTEN and NOTIFY on it brought nothing back within %s", ErrNotDelivered, p.cfg.HealthCheckTimeout)
		}
		return server, err
	}
	if server == conn.PID() {
		return server, nil
	}
	payload := "peer-" + strconv.FormatUint(rand.Uint64(), 16)
	if err := notifyFrom(p.connCfg, p.check, payload); err != nil {
		return server, fmt.Errorf("%w: a pooler sits between (the backend pid differs from BackendKeyData's) and a second connection to check it failed: %v",
			ErrNotDelivered, err)
	}
	wctx, wcancel := context.WithTimeout(ctx, p.cfg.HealthCheckTimeout)
	defer wcancel()
	if err := p.await(wctx, conn, payload); err != nil {
		return server, fmt.Errorf("%w: %s (the backend pid differs from BackendKeyData's: a pooler sits between, and a NOTIFY from a second session did not arrive within %s)",
			ErrNotDelivered, poolerAdvice, p.cfg.HealthCheckTimeout)
	}
	p.log.Info("listener: connected through a pooler that delivers notifications (session pooling)",
		"pid", server, "backend_key_pid", conn.PID())
	return server, nil
}

// selfNotify NOTIFYs the private channel on conn and waits for it to come
// back (it normally does before the NOTIFY's ReadyForQuery).
func (p *Plain) selfNotify(ctx context.Context, conn *pgconn.PgConn) error {
	payload := strconv.FormatUint(rand.Uint64(), 16)
	if err := conn.Exec(ctx, string(appendNotify(nil, p.check, payload))).Close(); err != nil {
		return fmt.Errorf("listener: delivery check: %w", err)
	}
	if err := p.await(ctx, conn, payload); err != nil {
		if conn.IsClosed() || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return err
		}
		return fmt.Errorf("%w any more: a NOTIFY on it did not come back within %s", ErrNotDelivered, p.cfg.HealthCheckTimeout)
	}
	return nil
}

// await reads until the check notification with payload arrived, or ctx
// ends.
func (p *Plain) await(ctx context.Context, conn *pgconn.PgConn, payload string) error {
	for p.got != payload {
		if err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Delivery is what CheckDelivery found out about a connection.
type Delivery struct {
	// BackendPID is the server's pg_backend_pid() (0 when the check did
	// not get that far); KeyDataPID is the pid of the BackendKeyData the
	// connection got at start-up.
	BackendPID, KeyDataPID uint32
}

// Pooled reports whether something other than the server made up the
// BackendKeyData: a pooler (PgBouncer does, in every pool mode) or a proxy.
func (d Delivery) Pooled() bool { return d.BackendPID != 0 && d.BackendPID != d.KeyDataPID }

// CheckDelivery connects with cfg and runs the delivery check every Conn and
// Plain runs on each connection (check.go): LISTEN a private channel,
// compare pg_backend_pid() with BackendKeyData, NOTIFY it and wait for it,
// and when a pooler sits between, have a second session NOTIFY it too. An
// error wrapping ErrNotDelivered says notifications do not arrive on such a
// connection (and why, most likely); any other error is the connection's.
// timeout bounds each wait (default DefaultHealthCheckTimeout); ctx the
// whole. For tools (listenhub doctor).
func CheckDelivery(ctx context.Context, cfg *pgconn.Config, timeout time.Duration) (Delivery, error) {
	if timeout <= 0 {
		timeout = DefaultHealthCheckTimeout
	}
	p := &Plain{check: newCheckChannel(), log: slog.New(slog.DiscardHandler)}
	p.cfg.HealthCheckTimeout = timeout
	cc := cfg.Copy()
	cc.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		if n.Channel == p.check {
			p.got = n.Payload
		}
	}
	cc.OnNotice = nil
	cc.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	p.connCfg = cc
	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		return Delivery{}, connectErr(err)
	}
	defer conn.Close(context.Background())
	server, err := p.checkDelivery(ctx, conn)
	return Delivery{BackendPID: server, KeyDataPID: conn.PID()}, err
}
