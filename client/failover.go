package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/listenhub/listenhub/internal/defaults"
	"github.com/listenhub/listenhub/internal/enum"
)

// defaultLocalTimeout bounds building the local listener on failover (the
// Postgres connect) and each of its LISTENs.
const defaultLocalTimeout = 10 * time.Second

// Mode says what a Failover delivers from.
type Mode int

const (
	// ModeHub: wakes come from the shared hub over its Unix socket.
	ModeHub Mode = iota
	// ModeLocal: wakes come from this process's own Postgres connection.
	ModeLocal
)

// modeNames are the String forms, indexed by value.
var modeNames = [...]string{
	ModeHub: "hub", ModeLocal: "local",
}

func (m Mode) String() string { return enum.Name(modeNames[:], int(m), "Mode") }

// FailoverOptions configure a Failover: the hub client it dials (Hub), the
// local listener it builds when the hub is away (Local), when it returns
// to the hub, and the handlers that receive whichever is current.
type FailoverOptions struct {
	// Hub configures the hub client: its SocketPath (required: NewFailover
	// fails without it), AckTimeout, WriteTimeout, FrameTimeout and
	// AllowUIDs. A socket that is not our hub's (see SocketError,
	// PeerError) is refused at dial, which means local mode (and, for a
	// fail-back, an attempt that failed). Hub.AckTimeout also bounds a
	// fail-back's connect and its wait for the hub's first healthy
	// status. A nil Logger means the Failover's.
	Hub Options
	// Local configures the local listener: DatabaseURL or ConnConfig,
	// ApplicationName, ChannelPrefix and ChannelSuffix (which must be the
	// hub's --channel-prefix and --channel-suffix), and CommandTimeout,
	// which here also bounds building the listener. The URL is parsed by
	// NewFailover, so a bad one fails at once rather than on the day the
	// hub goes away. A nil Logger means the Failover's.
	Local LocalOptions

	// DisableFailback keeps pgbus's rule: once local (after a failover, or from
	// the start when the hub was absent) the Failover stays on its local
	// listener until Close, and a restarted hub serves only the processes
	// started after it. Default false: the Failover returns to the hub
	// (see Failover).
	DisableFailback bool
	// FailbackDelay is the least time in local mode before a fail-back is
	// attempted, so that a hub that keeps failing cannot make the
	// Failover flap. The first attempt comes between FailbackDelay and 20%
	// later, at random. Default 5s.
	FailbackDelay time.Duration
	// ProbeInterval and ProbeMaxInterval space the fail-back attempts
	// after the first one (which comes FailbackDelay after the swap to local
	// mode): ProbeInterval after the first failed attempt, doubling after
	// each further one up to ProbeMaxInterval, each wait ±20% at random.
	// Defaults 1s and 30s.
	ProbeInterval, ProbeMaxInterval time.Duration

	// Logger receives the failover's lines: one warning with the reason
	// at every fall back to the local listener (Reason returns it too),
	// and the fail-back's progress. Nil means slog.Default().
	Logger *slog.Logger
}

// FailoverHandlers receive what a Failover hears. Any may be nil.
//
// Calls never overlap: every handler runs under one lock, from the
// goroutine of the listener that delivers (the hub client's reader, the
// local listener's, or the swap's), one call at a time. Around a swap:
//
//   - to local: the hub's last wakes, then OnFailover, OnStatus with the
//     local listener's health, and one durable wake per subscribed name.
//     The local listener's wakes start as soon as its LISTENs are confirmed,
//     so some may come before OnFailover (nothing committed during the swap
//     is held back).
//   - back to the hub: OnFailback, OnStatus with the hub's health, and one
//     durable wake per name; no wake of the local listener comes after
//     OnFailback. The hub's wakes start at the cut, so some may come before
//     OnFailback or among the durable wakes.
type FailoverHandlers struct {
	// OnWake and OnStatus receive the wakes and statuses of whichever
	// listener is current, one call at a time and in order per source
	// (see Handlers for what a handler must not do). OnStatus is
	// called with false when the hub fails, with the local listener's
	// health once it is swapped in (or at start, in local mode from the
	// start) and on each change of it, and with the hub's health again
	// after a fail-back. During a fail-back both listeners deliver wakes
	// (see Failover); statuses come from the current one only.
	OnWake   func(Wake)
	OnStatus func(healthy bool)
	// OnFailover, when set, is called after each swap to local mode, with
	// the hub client's error; not called when the hub was absent at
	// start.
	OnFailover func(reason error)
	// OnFailback, when set, is called after each return to the hub: Mode
	// is ModeHub and the local listener is closed. It comes before the
	// durable wakes of the fail-back.
	OnFailback func()
}

// newLocal builds a Failover's local listener and localConfig resolves its
// connection settings at start; tests replace both (export_test.go).
var (
	newLocal = func(ctx context.Context, opts LocalOptions, h Handlers) (Listener, error) {
		return NewLocal(ctx, opts, h)
	}
	localConfig = LocalOptions.connConfig
)

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
// own Postgres connection while it cannot.
//
// It records the subscription set. On the hub client's first failure —
// connect refused or socket missing (at start: local mode from the start),
// ack timeout, a nack other than an invalid name, EOF (hub gone, or this
// process evicted as a slow consumer), a stalled write — it builds a Local
// listener, subscribes it to the recorded set, swaps it in, and then
// delivers one durable wake per recorded name. Wakes committed between the
// hub's failure and the local LISTENs are lost: the durable wake after the
// swap tells durable readers to re-read; an ephemeral payload sent in that
// gap is gone, as with the hub's own reconnect to Postgres (docs/design.md,
// "What the hub guarantees", rule 7).
//
// Fail-back. In local mode it keeps trying the hub: first FailbackDelay (up to
// 20% more) after the swap, then with backoff (ProbeInterval doubling to ProbeMaxInterval,
// with jitter). An attempt connects a second hub client, waits (up to
// AckTimeout) for the hub to report healthy, subscribes it to the whole
// recorded set and waits for every ack, while the local listener keeps
// delivering. Then it commits a marker NOTIFY on the local connection,
// which both listeners deliver at the same place in commit order: the
// local listener's wakes are delivered up to the marker and the hub's
// after it, so no wake arrives twice and none is lost; a marker
// that does not come back through the hub means a hub on another database,
// and the attempt is refused (an ERROR line, once). Only then does it swap
// the hub client in and close the local listener (make before break).
// Without room for the marker in a channel name (a long ChannelPrefix and
// ChannelSuffix), a NOTIFY committed in the overlap may be delivered
// twice. Then it calls OnFailback and
// delivers one durable wake per recorded name. An attempt that fails — no
// hub, a hub that is not healthy, a nack, an ack timeout, EOF — is
// abandoned: the local listener stays, the Failover tries again later.
// Back on the hub, the hub client is subject to failover as before, so the
// cycle repeats as often as the hub fails and returns. DisableFailback turns the
// fail-back off (pgbus's rule: once local, local until Close).
//
// Subscribe and Unsubscribe during a fail-back act on the local listener
// and on the recorded set; the swap happens only once every name recorded
// at that moment is acked by the hub, and a name dropped meanwhile is
// unsubscribed from the hub as it is swapped in.
//
// A Subscribe that meets the hub's failure waits for the swap and
// subscribes the local listener; if the local listener cannot be built or
// subscribed, Subscribe returns that error (the Failover is then dead, a
// *FailoverError), bounded by Hub.AckTimeout plus Local.CommandTimeout. While the hub
// says its Postgres is down, a Subscribe on the hub waits for Postgres
// (its ctx bounds it): failing over would not help, the local listener
// could not reach Postgres either.
type Failover struct {
	opts     FailoverOptions
	h        FailoverHandlers
	localCfg LocalOptions
	log      *slog.Logger

	dispatch sync.Mutex // one handler call at a time across hub and local
	cut      *cut       // a fail-back's switch point (cut.go); under dispatch
	probe    *dbProbe   // the start's database check (cut.go); under dispatch
	// wrongDatabase: a fail-back found the hub on another database
	// (logged at ERROR once).
	wrongDatabase atomic.Bool

	mu     sync.Mutex
	mode   Mode
	reason error    // the hub failure that made it local; nil in hub mode
	hub    *hubConn // the current hub client (ModeHub); nil in local mode
	local  Listener // the current local listener (ModeLocal); nil in hub mode
	// localLive is the current local listener's flag: its wakes are
	// delivered while it is set, and a fail-back clears it at the swap,
	// so that a wake the listener was handing over as it closed is not
	// delivered after the cut is gone (the hub delivers it).
	localLive  *atomic.Bool
	cand       *hubConn // a fail-back's hub client until it is swapped in or given up
	localSince time.Time
	subs       map[string]struct{} // the recorded set
	swapping   bool                // a failover is building the local listener
	changed    chan struct{}       // closed (and replaced) when a failover ends
	err        error               // dead: ErrClosed or *FailoverError
	done       chan struct{}
}

// hubConn is one hub client of a Failover. Its handlers hold it, not the
// *Conn: the hub's first status frame can arrive before Dial returns.
type hubConn struct {
	c      *Conn         // set (under Failover.mu) once Dial returned
	status chan struct{} // cap 1: a status frame arrived
	// current: its wakes are delivered (the hub of hub mode); a
	// fail-back's candidate goes through the cut until it is swapped in.
	current atomic.Bool
	// unverified: the start could not check that this hub hears the
	// Failover's database (it was not healthy yet); its wakes wait in
	// held (under Failover.dispatch) until verifyLater has (cut.go).
	unverified atomic.Bool
	held       []Wake
}

// NewFailover dials the hub; if that fails it connects the local listener
// instead (local mode from the start, and fail-back from there unless
// DisableFailback). It fails only if the options are invalid (an empty SocketPath, a
// bad DatabaseURL), ctx ends, or neither hub nor Postgres can be reached.
func NewFailover(ctx context.Context, opts FailoverOptions, h FailoverHandlers) (*Failover, error) {
	if opts.Hub.SocketPath == "" {
		return nil, errEmptyPath
	}
	if opts.Logger == nil {
		// A fallback must never be silent: without a logger of the
		// application's, the process's default one says why.
		opts.Logger = slog.Default()
	}
	if opts.Hub.Logger == nil {
		opts.Hub.Logger = opts.Logger
	}
	hubOpts, err := opts.Hub.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w (FailoverOptions.Hub)", err)
	}
	opts.Hub = hubOpts
	if err := errors.Join(
		defaults.Or(&opts.Local.CommandTimeout, defaultLocalTimeout, "FailoverOptions.Local.CommandTimeout"),
		defaults.Or(&opts.FailbackDelay, defaultFailbackDelay, "FailoverOptions.FailbackDelay"),
		defaults.Or(&opts.ProbeInterval, defaultProbeInterval, "FailoverOptions.ProbeInterval"),
		defaults.Or(&opts.ProbeMaxInterval, defaultProbeMaxInterval, "FailoverOptions.ProbeMaxInterval"),
	); err != nil {
		return nil, fmt.Errorf("listenhub client: %w", err)
	}
	opts.ProbeMaxInterval = max(opts.ProbeMaxInterval, opts.ProbeInterval)
	f := &Failover{
		opts:    opts,
		h:       h,
		log:     opts.Logger,
		subs:    make(map[string]struct{}),
		changed: make(chan struct{}),
		done:    make(chan struct{}),
	}
	f.localCfg = opts.Local
	if f.localCfg.Logger == nil {
		f.localCfg.Logger = opts.Logger
	}
	// Parse now: a bad URL must not wait for the hub to fail.
	cc, err := localConfig(f.localCfg)
	if err != nil {
		return nil, err
	}
	f.localCfg.ConnConfig = cc

	hc := newHubConn()
	f.hub = hc // current before Dial returns: its first status counts
	hc.current.Store(true)
	hub, err := f.dialHub(ctx, hc)
	later := false
	if err == nil {
		if later, err = f.checkDatabase(ctx, hc, hub); err != nil {
			hub.Close()
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, ErrOtherDatabase) {
			// checkDatabase said it, at ERROR.
		} else if hubSupported {
			f.log.Warn("listenhub: hub unreachable, listening locally", "socket", opts.Hub.SocketPath, "reason", err)
		} else {
			f.log.Info("listenhub: no hub on this platform, listening locally", "reason", err)
		}
		lctx, cancel := context.WithTimeout(ctx, opts.Local.CommandTimeout)
		handlers, live := f.localHandlers()
		local, lerr := newLocal(lctx, f.localCfg, handlers)
		cancel()
		if lerr != nil {
			return nil, &FailoverError{Hub: err, Local: lerr}
		}
		f.mu.Lock() // the local listener's goroutine is already running
		f.mode, f.reason, f.hub, f.local, f.localSince = ModeLocal, err, nil, local, time.Now()
		f.localLive = live
		f.mu.Unlock()
		f.startLocal(local)
		if h := h.OnStatus; h != nil {
			healthy := local.Healthy()
			f.deliver(func() { h(healthy) })
		}
		return f, nil
	}
	f.mu.Lock() // the hub client's reader is already running
	hc.c = hub
	f.mu.Unlock()
	go f.watchHub(hc)
	if later {
		go f.verifyLater(hc)
	}
	return f, nil
}

func newHubConn() *hubConn { return &hubConn{status: make(chan struct{}, 1)} }

// dialHub connects a hub client whose handlers know it as hc.
func (f *Failover) dialHub(ctx context.Context, hc *hubConn) (*Conn, error) {
	return Dial(ctx, f.opts.Hub, Handlers{
		OnWake:   func(w Wake) { f.onHubWake(hc, w) },
		OnStatus: func(healthy bool) { f.onHubStatus(hc, healthy) },
	})
}

// localHandlers are the handlers of a new local listener of the Failover,
// and its live flag (set: its wakes are delivered; see localLive).
func (f *Failover) localHandlers() (Handlers, *atomic.Bool) {
	live := new(atomic.Bool)
	live.Store(true)
	return Handlers{OnWake: func(w Wake) { f.onLocalWake(live, w) }, OnStatus: f.onLocalStatus}, live
}

// Mode returns where wakes come from now. During a failover it is still
// ModeHub; during a fail-back it is still ModeLocal.
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
// local listener instead. During a fail-back it subscribes the local
// listener, and the fail-back subscribes the hub before it swaps. See
// Listener.
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
	// Recorded before any listener is asked: a swap from now on
	// includes q, so whichever listener ends up current has it.
	f.subs[q] = struct{}{}
	f.mu.Unlock()

	for {
		f.mu.Lock()
		if f.err != nil {
			err := f.err
			f.mu.Unlock()
			return err
		}
		if f.swapping {
			ch := f.changed
			f.mu.Unlock()
			select {
			case <-ch:
			case <-f.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		var cur Listener
		hc := f.hub
		if f.mode == ModeHub {
			cur = hc.c
		} else {
			cur = f.local
		}
		f.mu.Unlock()

		err := cur.Subscribe(ctx, q)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrInvalidName) || errors.Is(err, ErrLimit) {
			// Final for q, harmless for the listener: no failover.
			f.forget(q)
			return err
		}
		if hc != nil && isClosed(hc.c.Done()) && !errors.Is(hc.c.Err(), ErrClosed) {
			// The hub failed under this call: fail over (a no-op if
			// the watcher was first) and wait for the local listener.
			f.startFailover(hc, hc.c.Err())
			continue
		}
		f.mu.Lock()
		dead, current := f.err, f.isCurrentLocked(cur)
		f.mu.Unlock()
		if dead != nil {
			return dead
		}
		if !current && ctx.Err() == nil {
			continue // swapped meanwhile (a fail-back closed the local listener)
		}
		return err // ctx ended, or the local LISTEN failed (Postgres down)
	}
}

// isCurrentLocked reports whether l is the listener wakes come from now.
func (f *Failover) isCurrentLocked(l Listener) bool {
	if f.swapping {
		return false
	}
	if f.mode == ModeHub {
		return f.hub != nil && Listener(f.hub.c) == l
	}
	return f.local == l
}

// Unsubscribe drops q from the recorded set and from the current listener.
// A failover or fail-back in progress drops it from the listener it swaps
// in.
func (f *Failover) Unsubscribe(q string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.subs, q)
	// Under f.mu, so that it cannot overtake a later Subscribe of q.
	// Both Unsubscribes only queue.
	switch {
	case f.err != nil, f.swapping:
		// Dead, or the failover reconciles the local listener with
		// the set when it swaps.
	case f.mode == ModeHub:
		f.hub.c.Unsubscribe(q)
	default:
		f.local.Unsubscribe(q)
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
		return f.hub.c.Healthy()
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

// Close closes whichever listeners exist, a fail-back's hub client
// included. Safe from a handler; idempotent.
func (f *Failover) Close() error {
	f.mu.Lock()
	if f.err != nil {
		f.mu.Unlock()
		return nil
	}
	f.err = ErrClosed
	close(f.done)
	ls := f.listenersLocked()
	f.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	return nil
}

// listenersLocked returns every listener the Failover holds.
func (f *Failover) listenersLocked() []Listener {
	var ls []Listener
	for _, hc := range []*hubConn{f.hub, f.cand} {
		if hc != nil && hc.c != nil {
			ls = append(ls, hc.c)
		}
	}
	if f.local != nil {
		ls = append(ls, f.local)
	}
	return ls
}

func (f *Failover) forget(q string) {
	f.mu.Lock()
	delete(f.subs, q)
	f.mu.Unlock()
}

func (f *Failover) watchHub(hc *hubConn) {
	<-hc.c.Done()
	if err := hc.c.Err(); !errors.Is(err, ErrClosed) {
		f.startFailover(hc, err)
	}
}

// startFailover begins the swap from hc, the current hub client, to a
// local listener, unless one is in progress or done (or hc is no longer
// current). On return, Subscribe sees swapping and waits for it.
func (f *Failover) startFailover(hc *hubConn, reason error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil || f.swapping || f.mode != ModeHub || f.hub != hc {
		return
	}
	f.swapping = true
	go f.failover(reason)
}

// failover builds the local listener, subscribes it to the recorded set
// and swaps it in.
func (f *Failover) failover(reason error) {
	f.log.Warn("listenhub: hub failed, failing over to a local listener", "socket", f.opts.Hub.SocketPath, "reason", reason)
	if h := f.h.OnStatus; h != nil {
		f.deliver(func() { h(false) })
	}

	ctx, cancel := context.WithTimeout(context.Background(), f.opts.Local.CommandTimeout)
	defer cancel()
	handlers, live := f.localHandlers()
	local, err := newLocal(ctx, f.localCfg, handlers)
	if err != nil {
		f.die(&FailoverError{Hub: reason, Local: err})
		return
	}
	// Subscribe the recorded set; names recorded meanwhile join the loop,
	// names dropped meanwhile are unsubscribed as it swaps.
	listened := make(map[string]struct{})
	for {
		f.mu.Lock()
		if f.err != nil {
			f.endSwapLocked()
			f.mu.Unlock()
			local.Close()
			return
		}
		todo := missing(f.subs, listened)
		if len(todo) == 0 {
			// Under f.mu: a Subscribe of q right after the swap
			// must not be undone by this.
			for _, q := range missing(listened, f.subs) {
				local.Unsubscribe(q)
			}
			recorded := keys(f.subs)
			f.mode, f.reason, f.hub, f.local, f.localSince = ModeLocal, reason, nil, local, time.Now()
			f.localLive = live
			f.endSwapLocked()
			f.mu.Unlock()
			f.startLocal(local)
			f.log.Info("listenhub: local listener active", "subscriptions", len(recorded))
			if h := f.h.OnFailover; h != nil {
				f.deliver(func() { h(reason) })
			}
			if h := f.h.OnStatus; h != nil {
				healthy := local.Healthy()
				f.deliver(func() { h(healthy) })
			}
			f.durableWakes(recorded)
			return
		}
		f.mu.Unlock()
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

// endSwapLocked ends a failover in progress and wakes the Subscribes that
// wait for it. Under f.mu.
func (f *Failover) endSwapLocked() {
	if f.swapping {
		f.swapping = false
		close(f.changed)
		f.changed = make(chan struct{})
	}
}

// startLocal watches local, now current, and starts trying the hub again.
func (f *Failover) startLocal(local Listener) {
	go f.watchLocal(local)
	if !f.opts.DisableFailback && hubSupported {
		go f.failbackLoop(local)
	}
}

// durableWakes delivers one durable wake per name: the gap (or overlap)
// of a swap is covered by a re-read.
func (f *Failover) durableWakes(names []string) {
	h := f.h.OnWake
	if h == nil {
		return
	}
	for _, q := range names {
		f.deliver(func() { h(Wake{Name: q, Durable: true}) })
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
	f.endSwapLocked()
	ls := f.listenersLocked()
	f.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	if h := f.h.OnStatus; h != nil {
		f.deliver(func() { h(false) })
	}
}

// watchLocal kills the Failover when its current local listener dies other
// than by Close.
func (f *Failover) watchLocal(l Listener) {
	<-l.Done()
	f.mu.Lock()
	current, hubErr := f.local == l, f.reason
	f.mu.Unlock()
	if err := l.Err(); current && !errors.Is(err, ErrClosed) {
		f.die(&FailoverError{Hub: hubErr, Local: err})
	}
}

func (f *Failover) deliver(fn func()) {
	f.dispatch.Lock()
	defer f.dispatch.Unlock()
	fn()
}

// onHubStatus delivers the statuses of the current hub client only; it
// also tells a fail-back waiting for a healthy hub.
func (f *Failover) onHubStatus(hc *hubConn, healthy bool) {
	select {
	case hc.status <- struct{}{}:
	default:
	}
	f.mu.Lock()
	current := f.err == nil && f.mode == ModeHub && !f.swapping && f.hub == hc
	f.mu.Unlock()
	if !current {
		return
	}
	if h := f.h.OnStatus; h != nil {
		f.deliver(func() { h(healthy) })
	}
}

func (f *Failover) onLocalStatus(healthy bool) {
	f.mu.Lock()
	current := f.mode == ModeLocal && f.err == nil
	f.mu.Unlock()
	if !current {
		// Not swapped in yet (or swapped out): the swap reports the
		// current listener's health itself.
		return
	}
	if h := f.h.OnStatus; h != nil {
		f.deliver(func() { h(healthy) })
	}
}

// missing returns the names of a that are not in b.
func missing(a, b map[string]struct{}) []string {
	var out []string
	for q := range a {
		if _, ok := b[q]; !ok {
			out = append(out, q)
		}
	}
	return out
}

func keys(m map[string]struct{}) []string {
	out := make([]string, 0, len(m))
	for q := range m {
		out = append(out, q)
	}
	return out
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
