package client

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/defaults"
	"github.com/listenhub/listenhub/listener"
)

// defaultLocalApplicationName tags a local listener's backend in
// pg_stat_activity: distinct from the hub's "listenhub", so that an
// operator sees how many processes have fallen back.
const defaultLocalApplicationName = "listenhub-local"

// LocalOptions configure a Local listener.
type LocalOptions struct {
	// DatabaseURL (or ConnConfig, which wins) says where to connect.
	// Empty DatabaseURL means LISTENHUB_DATABASE_URL, then DATABASE_URL,
	// then the libpq PG* variables alone.
	DatabaseURL string
	ConnConfig  *pgconn.Config
	// ApplicationName for pg_stat_activity; default
	// "listenhub-local". Ignored with ConnConfig (or when the URL
	// or PGAPPNAME sets one).
	ApplicationName string
	// ChannelPrefix and ChannelSuffix map a subscription name to the
	// channel Prefix+name+Suffix, as the hub does.
	ChannelPrefix, ChannelSuffix string
	// CommandTimeout bounds each LISTEN and UNLISTEN, including the wait
	// for a reconnect when Postgres is down. Default 10s.
	CommandTimeout time.Duration

	// Logger receives the listener's debug lines. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// connConfig resolves the connection settings.
func (o LocalOptions) connConfig() (*pgconn.Config, error) {
	if o.ConnConfig != nil {
		return o.ConnConfig, nil
	}
	url := o.DatabaseURL
	if url == "" {
		url = os.Getenv("LISTENHUB_DATABASE_URL")
	}
	if url == "" {
		url = os.Getenv("DATABASE_URL")
	}
	app := o.ApplicationName
	if app == "" {
		app = defaultLocalApplicationName
	}
	cc, err := listener.ParseConfig(url, app)
	if err != nil {
		return nil, fmt.Errorf("listenhub client: local listener config: %w", err)
	}
	return cc, nil
}

// plain is what Local needs of listener.Conn (tests substitute it).
type plain interface {
	Listen(ctx context.Context, channel string) error
	Unlisten(ctx context.Context, channel string) error
	Notify(ctx context.Context, channel, payload string) error
	Close() error
}

// Local is a Listener over this process's own Postgres connection
// (listener.Conn): what a Failover swaps to, or usable alone. The
// connection reconnects by itself (with backoff, re-LISTENing the set), so
// a Local dies only by Close.
//
// LISTEN and UNLISTEN are issued one at a time, in call order, by one
// goroutine, so that Unsubscribe can be fire-and-forget and still never
// overtake an earlier or later Subscribe of the same name.
type Local struct {
	opts LocalOptions
	h    Handlers
	p    plain
	log  *slog.Logger

	mu        sync.Mutex
	listening map[string]bool // q → LISTEN confirmed (and not UNLISTENed since)
	ops       []localOp       // queued for the op goroutine, in call order
	err       error
	done      chan struct{}
	kick      chan struct{} // cap 1: ops is non-empty

	healthy atomic.Bool

	dispatch  sync.Mutex // see Client: no new handler call starts once Close was called
	inHandler atomic.Bool
	closing   atomic.Bool
	exited    chan struct{}
}

type localOp struct {
	q      string
	listen bool
	sync   bool       // a round trip only: see Local.sync
	reply  chan error // cap 1; nil for unlisten
}

// NewLocal connects to Postgres (ctx bounds the connect) and returns a
// Local with nothing subscribed.
//
// Its handlers are called from the listener's goroutine, one at a time, in
// order (see Handlers). OnStatus follows the Postgres connection: false
// when lost, true once reconnected and re-LISTENed.
func NewLocal(ctx context.Context, opts LocalOptions, h Handlers) (*Local, error) {
	if err := defaults.Or(&opts.CommandTimeout, defaultLocalTimeout, "LocalOptions.CommandTimeout"); err != nil {
		return nil, fmt.Errorf("listenhub client: %w", err)
	}
	cc, err := opts.connConfig()
	if err != nil {
		return nil, err
	}
	l := newLocalWith(opts, h)
	p, err := openPlain(ctx, cc, l)
	if err != nil {
		return nil, fmt.Errorf("listenhub client: local listener: %w", err)
	}
	l.start(p)
	return l, nil
}

func newLocalWith(opts LocalOptions, h Handlers) *Local {
	defaults.Set(&opts.CommandTimeout, defaultLocalTimeout)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Local{
		opts:      opts,
		h:         h,
		log:       opts.Logger,
		listening: make(map[string]bool),
		done:      make(chan struct{}),
		kick:      make(chan struct{}, 1),
		exited:    make(chan struct{}),
	}
}

// start runs the op goroutine over p; healthy from the start (the connect
// just succeeded) until the connection reports otherwise.
func (l *Local) start(p plain) {
	l.p = p
	l.healthy.Store(true)
	go l.opLoop()
}

// channel maps q to its Postgres channel.
func (l *Local) channel(q string) string { return l.opts.ChannelPrefix + q + l.opts.ChannelSuffix }

// Subscribe LISTENs to q's channel and returns once Postgres confirmed it.
// A name whose channel is invalid fails with ErrInvalidName. A LISTEN that
// fails (Postgres down past CommandTimeout) returns its error and leaves the
// Local alive. If ctx ends first, Subscribe returns ctx.Err() and the
// LISTEN still completes (the name stays subscribed: harmless
// over-delivery).
func (l *Local) Subscribe(ctx context.Context, q string) error {
	if err := checkName(q); err != nil {
		return err
	}
	if err := listener.ValidChannel(l.channel(q)); err != nil {
		return fmt.Errorf("listenhub client: %q: %w: %v", q, ErrInvalidName, err)
	}
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		return err
	}
	if err := ctx.Err(); err != nil {
		l.mu.Unlock()
		return err
	}
	if l.listening[q] && !l.unlistenQueuedLocked(q) {
		l.mu.Unlock()
		return nil
	}
	return l.doLocked(ctx, localOp{q: q, listen: true})
}

// doLocked queues op, unlocks l.mu and waits for op's answer.
func (l *Local) doLocked(ctx context.Context, op localOp) error {
	reply := make(chan error, 1)
	op.reply = reply
	l.queueLocked(op)
	l.mu.Unlock()
	select {
	case err := <-reply:
		return err
	case <-l.done:
		return l.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unlistenQueuedLocked reports whether the last queued op for q is an
// unlisten (so q is about to stop being listened).
func (l *Local) unlistenQueuedLocked(q string) bool {
	for i := len(l.ops) - 1; i >= 0; i-- {
		if l.ops[i].q == q {
			return !l.ops[i].listen
		}
	}
	return false
}

// sync returns once every notification the server sent before it answered
// a round trip made now has been handed to OnWake: a LISTEN of a channel
// already listened to (a no-op for Postgres), whose answer the connection
// reads after anything sent before it, dispatching on the way. Failover
// calls it before closing a Local it leaves for the hub, so that a NOTIFY
// committed just before the hub's LISTEN, and so only on its way here, is
// not dropped by the Close. With nothing listened to there is nothing to
// wait for.
func (l *Local) sync(ctx context.Context) error {
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		return err
	}
	return l.doLocked(ctx, localOp{sync: true})
}

// notify commits NOTIFY on q's channel with payload on this connection
// (a fail-back's marker: see cut.go).
func (l *Local) notify(ctx context.Context, q, payload string) error {
	if err := l.p.Notify(ctx, l.channel(q), payload); err != nil {
		return fmt.Errorf("listenhub client: local listener: %w", err)
	}
	return nil
}

// Unsubscribe queues an UNLISTEN of q's channel; it never blocks.
func (l *Local) Unsubscribe(q string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.queueLocked(localOp{q: q})
}

func (l *Local) queueLocked(op localOp) {
	l.ops = append(l.ops, op)
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Healthy reports whether the Postgres connection is up.
func (l *Local) Healthy() bool {
	select {
	case <-l.done:
		return false
	default:
		return l.healthy.Load()
	}
}

// Done is closed by Close.
func (l *Local) Done() <-chan struct{} { return l.done }

// Err is nil until Close, then ErrClosed.
func (l *Local) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Close closes the connection (UNLISTEN *, Terminate). Waiting Subscribes
// return ErrClosed; no new handler call starts once Close was called (the
// one already begun is not waited for, as with Client.Close). Safe from a
// handler; idempotent.
func (l *Local) Close() error {
	l.closing.Store(true)
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return nil
	}
	l.err = ErrClosed
	l.ops = nil
	close(l.done)
	l.mu.Unlock()
	l.healthy.Store(false)
	var err error
	if !l.inHandler.Load() {
		l.dispatch.Lock()
		l.dispatch.Unlock() //nolint:staticcheck // an empty critical section is the point
		err = l.p.Close()
	} else {
		// Closing the connection from its own callback could wait
		// for that callback: do it off this goroutine.
		go l.p.Close()
	}
	return err
}

func (l *Local) opLoop() {
	defer close(l.exited)
	for {
		select {
		case <-l.done:
			return
		case <-l.kick:
		}
		for {
			l.mu.Lock()
			if l.err != nil || len(l.ops) == 0 {
				l.mu.Unlock()
				break
			}
			op := l.ops[0]
			l.ops = l.ops[1:]
			skip := op.listen == l.listening[op.q]
			if op.sync {
				skip = true
				for q := range l.listening {
					op.q, op.listen, skip = q, true, false
					break
				}
			}
			l.mu.Unlock()
			var err error
			if !skip {
				ctx, cancel := context.WithTimeout(context.Background(), l.opts.CommandTimeout)
				if op.listen {
					err = l.p.Listen(ctx, l.channel(op.q))
				} else {
					err = l.p.Unlisten(ctx, l.channel(op.q))
				}
				cancel()
				l.mu.Lock()
				if err == nil {
					if op.listen {
						l.listening[op.q] = true
					} else {
						delete(l.listening, op.q)
					}
				}
				l.mu.Unlock()
			}
			if err != nil {
				err = fmt.Errorf("listenhub client: local listener: %w", err)
				if !op.listen {
					l.log.Warn("listenhub client: local UNLISTEN failed", "q", op.q, "reason", err)
				}
			}
			if op.reply != nil {
				op.reply <- err
			}
		}
	}
}

func (l *Local) onNotification(ch, payload string) {
	q, ok := strings.CutPrefix(ch, l.opts.ChannelPrefix)
	if ok {
		q, ok = strings.CutSuffix(q, l.opts.ChannelSuffix)
	}
	if !ok {
		l.log.Debug("listenhub client: notification on a channel outside the mapping", "channel", ch)
		return
	}
	w := Wake{Name: q, Payload: payload, Durable: payload == ""}
	if h := l.h.OnWake; h != nil {
		l.call(func() { h(w) })
	}
}

func (l *Local) onHealth(healthy bool) {
	l.healthy.Store(healthy)
	if h := l.h.OnStatus; h != nil {
		l.call(func() { h(healthy) })
	}
}

// call runs a handler under dispatch unless Close has begun. inHandler is
// set before closing is checked: see Client.call.
func (l *Local) call(f func()) {
	l.dispatch.Lock()
	defer l.dispatch.Unlock()
	l.inHandler.Store(true)
	defer l.inHandler.Store(false)
	if h := testEnterHook; h != nil {
		h()
	}
	if l.closing.Load() {
		return
	}
	f()
}
