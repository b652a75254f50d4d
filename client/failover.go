package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultLocalTimeout bounds building the local listener on failover (the
// Postgres connect) and each of its LISTENs.
const DefaultLocalTimeout = 10 * time.Second

// Mode says what a Failover delivers from.
type Mode int

const (
	// ModeHub: wakes come from the shared hub over its Unix socket.
	ModeHub Mode = iota
	// ModeLocal: wakes come from this process's own Postgres connection.
	ModeLocal
)

func (m Mode) String() string {
	switch m {
	case ModeHub:
		return "hub"
	case ModeLocal:
		return "local"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// FailoverOptions configure a Failover.
type FailoverOptions struct {
	// SocketPath is the hub's socket.
	SocketPath string
	// AckTimeout, WriteTimeout and AllowUIDs configure the hub client (see
	// Options). A hub whose uid is not allowed is refused at dial, which
	// means local mode.
	AckTimeout, WriteTimeout time.Duration
	AllowUIDs                []int

	// DatabaseURL (or ConnConfig, which wins) is where the local listener
	// connects. Empty DatabaseURL means LISTENHUB_DATABASE_URL, then
	// DATABASE_URL, then the libpq PG* variables. It is parsed by
	// NewFailover, so a bad URL fails at once rather than on the day the
	// hub goes away.
	DatabaseURL string
	ConnConfig  *pgconn.Config
	// ApplicationName tags the local listener's backend in
	// pg_stat_activity. Default DefaultLocalApplicationName. Ignored with
	// ConnConfig.
	ApplicationName string
	// ChannelPrefix and ChannelSuffix must be the hub's (its
	// --channel-prefix and --channel-suffix): in local mode, subscribing
	// to Q LISTENs to Prefix+Q+Suffix and delivers the wakes under Q.
	ChannelPrefix, ChannelSuffix string
	// LocalTimeout bounds building the local listener and each of its
	// LISTENs. Default DefaultLocalTimeout.
	LocalTimeout time.Duration

	// OnWake and OnStatus receive the wakes and statuses of whichever
	// listener is current, one call at a time and in order per source
	// (see Options.OnWake for what a handler must not do). OnStatus is
	// called with false when the hub fails, and with the local listener's
	// health once it is swapped in (or at start, in local mode from the
	// start), then on each change of it.
	OnWake   func(Wake)
	OnStatus func(healthy bool)
	// OnFailover, when set, is called once, after the swap to local mode,
	// with the hub client's error; not called when the hub was absent at
	// start.
	OnFailover func(reason error)

	Logger *slog.Logger

	// newLocal replaces NewLocal in tests.
	newLocal func(ctx context.Context, opts LocalOptions) (Listener, error)
}

// FailoverError is the error of a Failover whose local listener failed
// too: after the hub client died (Hub), building or running the local
// listener failed (Local).
type FailoverError struct {
	Hub   error // why the hub client died (or could not connect)
	Local error
}

func (e *FailoverError) Error() string {
	return fmt.Sprintf("listenhub client: local listener failed (%v) after hub failure (%v)", e.Local, e.Hub)
}

// Unwrap returns both causes, so errors.Is sees through to either.
func (e *FailoverError) Unwrap() []error { return []error{e.Local, e.Hub} }

// Failover is a Listener that uses the hub while it can and this process's
// own Postgres connection after that.
//
// It records the subscription set. On the hub client's first failure —
// connect refused or socket missing (at start: local mode from the start),
// ack timeout, a nack other than an invalid name, EOF (hub gone, or this
// process evicted as a slow consumer), a stalled write — it builds a Local
// listener, subscribes it to the recorded set, swaps it in, and then
// delivers one durable wake per recorded name. The swap happens once and is
// one-way: a Failover never goes back to the hub (a restarted hub serves the
// processes started after it; this one keeps its own connection until it
// exits).
//
// Wakes committed between the hub's failure and the local LISTENs are lost:
// the durable wake after the swap tells durable readers to re-read; an
// ephemeral payload sent in that gap is gone, as with the hub's own
// reconnect to Postgres (docs/design.md rule 7).
//
// A Subscribe that meets the failure waits for the swap and subscribes the
// local listener; if the local listener cannot be built or subscribed,
// Subscribe returns that error (the Failover is then dead, a
// *FailoverError), bounded by AckTimeout plus LocalTimeout: it never hangs.
type Failover struct {
	opts     FailoverOptions
	localCfg LocalOptions
	log      *slog.Logger

	dispatch sync.Mutex // one handler call at a time across hub and local

	mu       sync.Mutex
	mode     Mode
	reason   error // the hub failure that made it local
	hub      *Client
	local    Listener
	subs     map[string]struct{} // the recorded set
	swapping bool                // a failover is building the local listener
	swapped  chan struct{}       // closed when the failover finished (well or not)
	err      error               // dead: ErrClosed or *FailoverError
	done     chan struct{}
}

// NewFailover dials the hub; if that fails it connects the local listener
// instead (local mode from the start). It fails only if the options are
// invalid, ctx ends, or neither hub nor Postgres can be reached.
func NewFailover(ctx context.Context, opts FailoverOptions) (*Failover, error) {
	if opts.LocalTimeout <= 0 {
		opts.LocalTimeout = DefaultLocalTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Failover{
		opts:    opts,
		log:     opts.Logger,
		subs:    make(map[string]struct{}),
		swapped: make(chan struct{}),
		done:    make(chan struct{}),
	}
	f.localCfg = LocalOptions{
		DatabaseURL:     opts.DatabaseURL,
		ConnConfig:      opts.ConnConfig,
		ApplicationName: opts.ApplicationName,
		ChannelPrefix:   opts.ChannelPrefix,
		ChannelSuffix:   opts.ChannelSuffix,
		CommandTimeout:  opts.LocalTimeout,
		OnWake:          f.onLocalWake,
		OnStatus:        f.onLocalStatus,
		Logger:          opts.Logger,
	}
	if f.opts.newLocal == nil {
		// Parse now: a bad URL must not wait for the hub to fail.
		cc, err := f.localCfg.connConfig()
		if err != nil {
			return nil, err
		}
		f.localCfg.ConnConfig = cc
		f.opts.newLocal = func(ctx context.Context, o LocalOptions) (Listener, error) { return NewLocal(ctx, o) }
	}

	hub, err := Dial(ctx, opts.SocketPath, Options{
		AckTimeout:   opts.AckTimeout,
		WriteTimeout: opts.WriteTimeout,
		AllowUIDs:    opts.AllowUIDs,
		OnWake:       f.onHubWake,
		OnStatus:     f.onHubStatus,
		Logger:       opts.Logger,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		f.log.Warn("listenhub: hub unreachable, listening locally", "socket", opts.SocketPath, "reason", err)
		lctx, cancel := context.WithTimeout(ctx, opts.LocalTimeout)
		local, lerr := f.opts.newLocal(lctx, f.localCfg)
		cancel()
		if lerr != nil {
			return nil, &FailoverError{Hub: err, Local: lerr}
		}
		f.mu.Lock() // the local listener's goroutine is already running
		f.mode, f.reason, f.local = ModeLocal, err, local
		f.mu.Unlock()
		close(f.swapped)
		go f.watchLocal(local)
		if h := opts.OnStatus; h != nil {
			healthy := local.Healthy()
			f.deliver(func() { h(healthy) })
		}
		return f, nil
	}
	f.mu.Lock() // the hub client's reader is already running
	f.hub = hub
	f.mu.Unlock()
	go func() {
		<-hub.Done()
		if !errors.Is(hub.Err(), ErrClosed) {
			f.failover(hub.Err())
		}
	}()
	return f, nil
}

// Mode returns where wakes come from now.
func (f *Failover) Mode() Mode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mode
}

// Reason is nil in hub mode; in local mode, the hub client's error that
// caused the swap (or the dial error, when the hub was absent at start).
func (f *Failover) Reason() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reason
}

// Subscribe records q and subscribes the current listener to it. In hub
// mode a failure of the hub client (anything but an invalid-name refusal or
// ctx ending) triggers the failover and the subscription is made on the
// local listener instead. See Listener.
func (f *Failover) Subscribe(ctx context.Context, q string) error {
	if err := checkName(q); err != nil {
		return err
	}
	f.mu.Lock()
	if f.err != nil {
		err := f.err
		f.mu.Unlock()
		return err
	}
	f.subs[q] = struct{}{} // before the call: a failover meanwhile includes q
	hub := f.hub
	inHub := f.mode == ModeHub && !f.swapping
	f.mu.Unlock()

	if inHub {
		err := hub.Subscribe(ctx, q)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrInvalidName) {
			f.forget(q)
			return err
		}
		select {
		case <-hub.Done():
			if errors.Is(hub.Err(), ErrClosed) {
				// Failover.Close, or the hub client closed by
				// Failover itself: no failover.
				return f.errOr(err)
			}
			// On its own goroutine, so that this caller can leave
			// when its ctx ends; a concurrent one (the watcher's)
			// makes this one a no-op.
			go f.failover(hub.Err())
		default:
			return err // ctx ended; the hub client is fine
		}
	}

	select {
	case <-f.swapped:
	case <-f.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	f.mu.Lock()
	local, err := f.local, f.err
	f.mu.Unlock()
	if err != nil {
		return err
	}
	err = local.Subscribe(ctx, q)
	if errors.Is(err, ErrInvalidName) {
		f.forget(q)
	}
	return err
}

// Unsubscribe drops q from the recorded set and from the current listener.
func (f *Failover) Unsubscribe(q string) {
	f.mu.Lock()
	delete(f.subs, q)
	var cur Listener
	switch {
	case f.err != nil, f.swapping:
		// Dead, or the failover will reconcile the local listener
		// with the set when it swaps.
	case f.mode == ModeHub:
		cur = f.hub
	default:
		cur = f.local
	}
	f.mu.Unlock()
	if cur != nil {
		cur.Unsubscribe(q)
	}
}

// Healthy reports whether the current listener is healthy.
func (f *Failover) Healthy() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.err != nil, f.swapping:
		return false
	case f.mode == ModeHub:
		return f.hub.Healthy()
	default:
		return f.local.Healthy()
	}
}

// Done is closed when the Failover is dead: closed, or the local listener
// failed too.
func (f *Failover) Done() <-chan struct{} { return f.done }

// Err is nil while alive, ErrClosed after Close, or a *FailoverError.
func (f *Failover) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Close closes whichever listeners exist. Safe from a handler; idempotent.
func (f *Failover) Close() error {
	f.mu.Lock()
	if f.err != nil {
		f.mu.Unlock()
		return nil
	}
	f.err = ErrClosed
	close(f.done)
	hub, local := f.hub, f.local
	f.mu.Unlock()
	if hub != nil {
		hub.Close()
	}
	if local != nil {
		local.Close()
	}
	return nil
}

func (f *Failover) errOr(err error) error {
	if e := f.Err(); e != nil {
		return e
	}
	return err
}

func (f *Failover) forget(q string) {
	f.mu.Lock()
	delete(f.subs, q)
	f.mu.Unlock()
}

// failover swaps to a local listener, once; a concurrent or later call
// waits for the first one to finish.
func (f *Failover) failover(reason error) {
	f.mu.Lock()
	if f.err != nil || f.mode == ModeLocal {
		f.mu.Unlock()
		return
	}
	if f.swapping {
		f.mu.Unlock()
		select {
		case <-f.swapped:
		case <-f.done:
		}
		return
	}
	f.swapping = true
	f.mu.Unlock()
	f.log.Warn("listenhub: hub failed, failing over to a local listener", "socket", f.opts.SocketPath, "reason", reason)
	if h := f.opts.OnStatus; h != nil {
		f.deliver(func() { h(false) })
	}

	ctx, cancel := context.WithTimeout(context.Background(), f.opts.LocalTimeout)
	defer cancel()
	local, err := f.opts.newLocal(ctx, f.localCfg)
	if err != nil {
		f.die(&FailoverError{Hub: reason, Local: err})
		return
	}
	// Subscribe the recorded set; names recorded meanwhile join the loop,
	// names dropped meanwhile are unsubscribed after the swap.
	listened := make(map[string]struct{})
	for {
		f.mu.Lock()
		var todo []string
		for q := range f.subs {
			if _, ok := listened[q]; !ok {
				todo = append(todo, q)
			}
		}
		if len(todo) == 0 && f.err == nil {
			var extra []string
			for q := range listened {
				if _, ok := f.subs[q]; !ok {
					extra = append(extra, q)
				}
			}
			recorded := make([]string, 0, len(f.subs))
			for q := range f.subs {
				recorded = append(recorded, q)
			}
			f.mode, f.reason, f.local, f.swapping = ModeLocal, reason, local, false
			close(f.swapped)
			f.mu.Unlock()
			for _, q := range extra {
				local.Unsubscribe(q)
			}
			go f.watchLocal(local)
			f.log.Info("listenhub: local listener active", "subscriptions", len(recorded))
			if h := f.opts.OnFailover; h != nil {
				f.deliver(func() { h(reason) })
			}
			if h := f.opts.OnStatus; h != nil {
				healthy := local.Healthy()
				f.deliver(func() { h(healthy) })
			}
			if h := f.opts.OnWake; h != nil {
				for _, q := range recorded {
					f.deliver(func() { h(Wake{Q: q, Durable: true}) })
				}
			}
			return
		}
		closed := f.err != nil
		f.mu.Unlock()
		if closed {
			local.Close()
			f.mu.Lock()
			f.swapping = false
			close(f.swapped)
			f.mu.Unlock()
			return
		}
		for _, q := range todo {
			err := local.Subscribe(ctx, q)
			if errors.Is(err, ErrInvalidName) {
				f.forget(q)
				continue
			}
			if err != nil {
				local.Close()
				f.die(&FailoverError{Hub: reason, Local: fmt.Errorf("subscribe %q: %w", q, err)})
				return
			}
			listened[q] = struct{}{}
		}
	}
}

// die marks the Failover dead with err and ends a failover in progress.
func (f *Failover) die(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
		close(f.done)
		f.log.Error("listenhub: no listener left", "reason", err)
	}
	if f.swapping {
		f.swapping = false
		close(f.swapped)
	}
	hub, local := f.hub, f.local
	f.mu.Unlock()
	if hub != nil {
		hub.Close()
	}
	if local != nil {
		local.Close()
	}
	if h := f.opts.OnStatus; h != nil {
		f.deliver(func() { h(false) })
	}
}

func (f *Failover) watchLocal(l Listener) {
	<-l.Done()
	f.mu.Lock()
	hubErr := f.reason
	f.mu.Unlock()
	if err := l.Err(); !errors.Is(err, ErrClosed) {
		f.die(&FailoverError{Hub: hubErr, Local: err})
	}
}

func (f *Failover) deliver(fn func()) {
	f.dispatch.Lock()
	defer f.dispatch.Unlock()
	fn()
}

func (f *Failover) onHubWake(w Wake) {
	if h := f.opts.OnWake; h != nil {
		f.deliver(func() { h(w) })
	}
}

func (f *Failover) onHubStatus(healthy bool) {
	if h := f.opts.OnStatus; h != nil {
		f.deliver(func() { h(healthy) })
	}
}

func (f *Failover) onLocalWake(w Wake) {
	if h := f.opts.OnWake; h != nil {
		f.deliver(func() { h(w) })
	}
}

func (f *Failover) onLocalStatus(healthy bool) {
	f.mu.Lock()
	current := f.mode == ModeLocal && f.err == nil
	f.mu.Unlock()
	if !current {
		// Not swapped in yet: the swap reports the local health
		// itself once it is the one that counts.
		return
	}
	if h := f.opts.OnStatus; h != nil {
		f.deliver(func() { h(healthy) })
	}
}
