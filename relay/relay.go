// Package relay turns committed row changes into NOTIFYs: it reads a
// logical replication stream (pgoutput) from PostgreSQL and sends, from one
// ordinary connection of its own, a NOTIFY with an empty payload on the
// channel of every table and kind of change it saw, coalesced over a short
// window. Writers then need no NOTIFY trigger, and never take PostgreSQL's
// notify lock at commit; every LISTENer works unchanged.
//
// The guarantee (docs/design.md, "Relay"): every change committed to a
// published table is followed by a NOTIFY on its channel that commits after
// it and is sent only once the change is visible to other sessions. The
// slot's confirmed position moves only after the NOTIFY transaction that
// covers it has committed, so a relay killed at any point replays the rest
// on restart: wakes arrive at least once.
//
// Two relays may run on one slot: PostgreSQL lets one walsender use it, the
// other stands by and takes over when the slot is free.
//
//	r, err := relay.New(relay.Options{ConnConfig: cfg, Logger: log})
//	...
//	err = r.Run(ctx) // until ctx is done, or a *ConfigError
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/channame"
	"github.com/listenhub/listenhub/internal/defaults"
	"github.com/listenhub/listenhub/internal/enum"
	"github.com/listenhub/listenhub/internal/histogram"
	"github.com/listenhub/listenhub/latency"
)

// Defaults of Options (and of the command's flags).
const (
	defaultPublication     = "listenhub"
	defaultSlot            = "listenhub_relay"
	defaultChannelTemplate = "{schema}.{table}.{op}"
	defaultOps             = OpInsert
	defaultWindow          = time.Millisecond
	defaultStandbyRetry    = time.Second
	defaultMaxLag          = 10 * time.Second
	defaultMaxLagBytes     = 1 << 30
	defaultApplicationName = "listenhub-relay"
	defaultStatusInterval  = 10 * time.Second
	// defaultConfigRetry is a second: a relay with RetryConfigErrors is back within 2 s
	// of the fix (a publication created, a grant given). A retry costs
	// two connections and the preflight's queries.
	defaultConfigRetry = time.Second
)

// DefaultOptions returns Options with every field that has a default set
// to it: what a zero field means (Window aside: zero there is no window,
// one NOTIFY transaction per decoded transaction; DefaultOptions has the
// window the command uses). ConnConfig is left nil.
func DefaultOptions() Options {
	return Options{
		ApplicationName: defaultApplicationName,
		Publication:     defaultPublication,
		Slot:            defaultSlot,
		ChannelTemplate: defaultChannelTemplate,
		Ops:             defaultOps,
		Window:          defaultWindow,
		StandbyRetry:    defaultStandbyRetry,
		MaxLag:          defaultMaxLag,
		MaxLagBytes:     defaultMaxLagBytes,
		StatusInterval:  defaultStatusInterval,
		ConfigRetry:     defaultConfigRetry,
	}
}

// visibilityRetry is how long the relay waits before it checks again
// whether the transactions of a batch are visible: the gap between a commit
// record reaching the WAL and the transaction leaving the ProcArray is
// microseconds, except when the committing backend is descheduled.
const visibilityRetry = 100 * time.Microsecond

// Options configure a Relay. ConnConfig is required; the zero value of
// every other field is its default, except Window (0 means one NOTIFY
// transaction per decoded transaction; defaultWindow is what the command
// uses).
type Options struct {
	// ConnConfig is the server to read and NOTIFY on: a primary, through
	// a direct connection (a transaction pooler cannot carry replication).
	// The relay opens two connections with it: the replication connection
	// (replication=database) and the connection that NOTIFYs. It is not
	// modified.
	ConnConfig *pgconn.Config
	// ApplicationName of both connections, whatever ConnConfig says;
	// defaultApplicationName if empty.
	ApplicationName string
	// Publication the slot decodes; defaultPublication if empty.
	Publication string
	// CreatePublication, when not empty, creates a missing publication
	// with CREATE PUBLICATION <Publication> FOR <CreatePublication>, e.g.
	// "TABLES IN SCHEMA pgmq" or "ALL TABLES". Empty: a missing
	// publication is a ConfigError that names the SQL.
	CreatePublication string
	// Slot is the replication slot; defaultSlot if empty. A permanent
	// slot is created when missing and kept: it holds WAL while no relay
	// reads it.
	Slot string
	// TemporarySlot makes the slot live only as long as the replication
	// connection. Nothing holds WAL while the relay is down, and what was
	// committed then is covered by a resync: every channel of the
	// publication is NOTIFYed once after the slot is created.
	TemporarySlot bool
	// ChannelTemplate names the channel of a change; defaultChannelTemplate
	// if empty ({schema}, {table} and {op}, op in upper case as TG_OP).
	ChannelTemplate string
	// Ops are the kinds of change NOTIFYed; defaultOps if 0.
	Ops Ops
	// Window is how long transactions decoded one after the other are
	// gathered into one NOTIFY transaction. A batch goes out at once,
	// window or not, when nothing more is waiting to be decoded: a
	// window never costs an idle system latency. 0: one batch per
	// transaction.
	Window time.Duration
	// StandbyRetry is how often a relay whose slot is in use by another
	// tries to take it; defaultStandbyRetry if 0.
	StandbyRetry time.Duration
	// MaxLag and MaxLagBytes: above either, a warning is logged (at most
	// once a minute). Defaults defaultMaxLag and defaultMaxLagBytes.
	MaxLag      time.Duration
	MaxLagBytes int64
	// StatusInterval is how often an idle relay reports its position to
	// the server and asks for an answer (which also tells it the
	// connection is alive); defaultStatusInterval if 0.
	StatusInterval time.Duration
	// Logger receives the relay's log lines; slog.Default() if nil.
	Logger *slog.Logger
	// RetryConfigErrors keeps Run going on a permanent error (a
	// *ConfigError): the relay is down (StateDown), logs the error with
	// its fix, and sets everything up again every ConfigRetry, as a relay
	// inside another program (serve --relay) must. Default false: Run
	// returns the error.
	RetryConfigErrors bool
	// ConfigRetry is how often a relay with RetryConfigErrors that is down
	// tries again;
	// defaultConfigRetry if 0.
	ConfigRetry time.Duration
	// RecreateInvalidSlot lets the relay drop and create again a slot that
	// can no longer decode: invalidated (wal_status lost) or with a
	// position that predates its publication. The new slot's resync
	// NOTIFYs every channel once. Without it, such a slot is a ConfigError
	// that names the fix.
	RecreateInvalidSlot bool
}

// withDefaults fills the zero fields with their defaults and refuses the
// negative ones, by name.
func (o Options) withDefaults() (Options, error) {
	if err := errors.Join(
		defaults.Or(&o.StandbyRetry, defaultStandbyRetry, "Options.StandbyRetry"),
		defaults.Or(&o.MaxLag, defaultMaxLag, "Options.MaxLag"),
		defaults.Or(&o.MaxLagBytes, defaultMaxLagBytes, "Options.MaxLagBytes"),
		defaults.Or(&o.StatusInterval, defaultStatusInterval, "Options.StatusInterval"),
		defaults.Or(&o.ConfigRetry, defaultConfigRetry, "Options.ConfigRetry"),
	); err != nil {
		return o, fmt.Errorf("relay: %w", err)
	}
	if o.ApplicationName == "" {
		o.ApplicationName = defaultApplicationName
	}
	if o.Publication == "" {
		o.Publication = defaultPublication
	}
	if o.Slot == "" {
		o.Slot = defaultSlot
	}
	if o.ChannelTemplate == "" {
		o.ChannelTemplate = defaultChannelTemplate
	}
	if o.Ops == 0 {
		o.Ops = defaultOps
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// ConfigError is a misconfiguration that retrying cannot cure: Run returns
// it at once. Its message is one line that names the fix.
type ConfigError struct {
	Msg string
	Err error // the server's error, when there was one
}

func (e *ConfigError) Error() string { return e.Msg }
func (e *ConfigError) Unwrap() error { return e.Err }

func configErrorf(err error, format string, args ...any) *ConfigError {
	return &ConfigError{Msg: fmt.Sprintf(format, args...), Err: err}
}

// State is what a relay is doing.
type State int32

const (
	StateStarting State = iota // connecting, checking the configuration
	StateActive                // streaming from the slot and NOTIFYing
	StateStandby               // the slot is in use by another relay; retrying
	StateRetrying              // the connection was lost; reconnecting
	StateStopped               // Run returned
	StateDown                  // stopped by a permanent error, trying again every ConfigRetry (RetryConfigErrors)
)

// stateNames are the String forms, indexed by value.
var stateNames = [...]string{
	StateStarting: "starting", StateActive: "active", StateStandby: "standby",
	StateRetrying: "retrying", StateStopped: "stopped", StateDown: "down",
}

func (s State) String() string { return enum.Name(stateNames[:], int(s), "State") }

// Stats are the relay's counters and gauges (Relay.Stats).
type Stats struct {
	State State
	// Transactions decoded (committed transactions that touched a
	// published table), and their row changes (a TRUNCATE counts one per
	// table).
	Transactions, Changes uint64
	// Notifies are channels NOTIFYed, Batches the NOTIFY transactions
	// that carried them; Coalesced counts wakes merged into another of
	// the same batch (one per transaction and channel, less Notifies).
	Notifies, Batches, Coalesced uint64
	// ChannelsTooLong counts changes whose channel would exceed
	// the 63 bytes Postgres keeps (NAMEDATALEN-1): logged, never sent
	// truncated.
	ChannelsTooLong uint64
	// VisibilityWaits counts the times a batch was held back because a
	// transaction it covers was not yet visible to a new snapshot.
	VisibilityWaits uint64
	// Reconnects counts sessions started after a lost one; Takeovers the
	// times a standby became active.
	Reconnects, Takeovers uint64
	// Resyncs counts the times every channel of the publication was
	// NOTIFYed because the slot was new.
	Resyncs uint64
	// LagBytes is the WAL between the server's current position and the
	// slot's confirmed one (what the slot holds back), read every few
	// seconds; LagSeconds is how far the last NOTIFY was behind the
	// commit of the newest transaction it covered (0 when caught up).
	LagBytes   int64
	LagSeconds float64
	// ConfirmedLSN is the position last reported to the server.
	ConfirmedLSN uint64
	// Tables is how many tables the publication covers, and
	// TablesFiltered how many of them have a row filter (changes outside
	// it get no wake), as of the last look while streaming.
	Tables, TablesFiltered int64
	// LastError is why the relay is not streaming (one line, with the fix
	// when one is known), or what its set-up waits on; "" while it
	// streams or stands by.
	LastError string
	// Warning is what is wrong while the relay is up (one line, with the
	// fix when one is known): an active relay lagging past MaxLag or
	// MaxLagBytes (a long transaction being decoded counts from its last
	// progress), or, on a standby, an active relay that is not
	// confirming; "" otherwise.
	Warning string
}

// Relay is one relay. Its methods are safe for concurrent use; Run is
// called once.
type Relay struct {
	opts Options
	tmpl Template
	log  *slog.Logger
	hist *histogram.Recorder
	// decodeHist: commit timestamp to the relay reading the Commit
	// message (the walsender's share of hist).
	decodeHist *histogram.Recorder
	state      atomic.Int32
	ran        atomic.Bool

	transactions, changes, notifies, batches, coalesced atomic.Uint64
	tooLong, visWaits, reconnects, takeovers, resyncs   atomic.Uint64
	tables, tablesFiltered                              atomic.Int64 // watchTables
	lagBytes                                            atomic.Int64
	lagSeconds                                          atomic.Int64 // nanoseconds
	confirmed                                           atomic.Uint64
	lastErr                                             atomic.Pointer[string]
	warning                                             atomic.Pointer[string]
	// walsender is the backend pid of the last session's replication
	// connection: a slot still held by it after a reconnect is this
	// relay's own, never another relay.
	walsender atomic.Int32
	// ownConfirmed is the position this relay's last active session
	// confirmed; 0 at start and after standing by. Run's goroutine only.
	ownConfirmed uint64
	// resyncOwed: a session created the slot and was lost before it
	// recorded the resync in it.
	resyncOwed atomic.Bool

	tooLongLog rateLimit

	// Run's goroutine only:
	started       time.Time // when Run started
	standbyLogged bool      // "standing by" logged since the last active session
	againLogged   time.Time // the last "streaming again" at INFO (at most one a minute)
	stall         stallWatch
}

// stallWatch is a standby's watch of the active relay: the slot's
// confirmed position, and since when it has not moved.
type stallWatch struct {
	confirmed string
	since     time.Time
	warned    time.Time
}

// New checks opts and returns a relay; nothing is connected before Run.
func New(opts Options) (*Relay, error) {
	if opts.ConnConfig == nil {
		return nil, errors.New("relay: Options.ConnConfig is nil")
	}
	if opts.Window < 0 {
		return nil, fmt.Errorf("relay: Options.Window is negative (%v)", opts.Window)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkSlotName(opts.Slot); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if err := checkTemplateBytes(opts.ChannelTemplate); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	t, err := ParseTemplate(opts.ChannelTemplate)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if !t.has('t') {
		return nil, fmt.Errorf("relay: channel template %q has no {table}: every table would share one channel", opts.ChannelTemplate)
	}
	// The template with one-byte names: if this is over the limit, no
	// table can ever be NOTIFYed.
	for o := op(0); o < numOps; o++ {
		if n := len(t.channel("s", "t", o)); opts.Ops.has(o) && n > channame.MaxLen {
			return nil, fmt.Errorf("relay: channel template %q makes channels of %d bytes or more for %s, over the %d PostgreSQL keeps", opts.ChannelTemplate, n, opNames[o], channame.MaxLen)
		}
	}
	r := &Relay{opts: opts, tmpl: t, log: opts.Logger, hist: histogram.New(commitToNotifyBounds),
		decodeHist: histogram.New(commitToNotifyBounds)}
	r.tooLongLog = rateLimit{every: 10 * time.Second}
	// A start owes a resync: the relay cannot vouch for a position it
	// did not see confirmed itself (a start killed between the slot's
	// creation and its resync, a slot advanced or read by another
	// consumer while no relay ran). One durable wake per channel covers
	// whatever that position skipped.
	r.resyncOwed.Store(true)
	return r, nil
}

// Options returns the options in effect, defaults filled in.
func (r *Relay) Options() Options { return r.opts }

// Stats returns a snapshot of the counters and gauges.
func (r *Relay) Stats() Stats {
	return Stats{
		State:           State(r.state.Load()),
		Transactions:    r.transactions.Load(),
		Changes:         r.changes.Load(),
		Notifies:        r.notifies.Load(),
		Batches:         r.batches.Load(),
		Coalesced:       r.coalesced.Load(),
		ChannelsTooLong: r.tooLong.Load(),
		VisibilityWaits: r.visWaits.Load(),
		Reconnects:      r.reconnects.Load(),
		Takeovers:       r.takeovers.Load(),
		Resyncs:         r.resyncs.Load(),
		LagBytes:        r.lagBytes.Load(),
		Tables:          r.tables.Load(),
		TablesFiltered:  r.tablesFiltered.Load(),
		LagSeconds:      time.Duration(r.lagSeconds.Load()).Seconds(),
		ConfirmedLSN:    r.confirmed.Load(),
		LastError:       r.lastError(),
		Warning:         r.loadWarning(),
	}
}

func (r *Relay) loadWarning() string {
	if p := r.warning.Load(); p != nil {
		return *p
	}
	return ""
}

func (r *Relay) setWarning(s string) {
	if s == "" {
		r.warning.Store(nil)
		return
	}
	r.warning.Store(&s)
}

func (r *Relay) lastError() string {
	if p := r.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

func (r *Relay) setLastError(s string) {
	if s == "" {
		r.lastErr.Store(nil)
		return
	}
	r.lastErr.Store(&s)
}

// CommitToNotify returns the histogram of the time from a transaction's
// commit (its commit timestamp, the server's clock) to the commit of the
// NOTIFY transaction that covered it (the relay's clock), per transaction.
func (r *Relay) CommitToNotify() latency.Histogram { return r.hist.Snapshot() }

// CommitToDecode returns the histogram of the time from a transaction's
// commit timestamp to the relay reading its Commit message, per
// transaction: the server's (walsender's) share of CommitToNotify. Same
// buckets.
func (r *Relay) CommitToDecode() latency.Histogram { return r.decodeHist.Snapshot() }

// setState sets the state; a warning belongs to the state it was found in.
func (r *Relay) setState(s State) {
	if State(r.state.Swap(int32(s))) != s {
		r.setWarning("")
	}
}

// Backoff of the reconnects after a lost connection: capped at a second,
// since every second without a relay is a second of wakes late (an
// attempt costs the server two connections).
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = time.Second
)

// stableSession is how long a session must stream before its end resets
// the backoff: a session that fails at once, again and again, fails for a
// reason of its own and is never retried in a tight loop.
const stableSession = 10 * time.Second

// Run runs the relay until ctx is done (then it returns nil) or, unless
// Options.RetryConfigErrors, until a permanent error (a *ConfigError naming
// the fix).
// A lost connection, a server restart or a slot in use by another relay
// are retried.
func (r *Relay) Run(ctx context.Context) error {
	if !r.ran.CompareAndSwap(false, true) {
		return errors.New("relay: Run called twice")
	}
	defer r.setState(StateStopped)
	r.started = time.Now()
	backoff := minBackoff
	everActive := false
	failures := 0 // attempts failed since the last stable session
	var lastWarn time.Time
	var lastDown string
	for {
		res := r.session(ctx, everActive)
		if ctx.Err() != nil {
			return nil
		}
		if res.active {
			// The position this relay confirmed last: a next session
			// that finds the slot further on knows it moved without
			// this relay (movedSlot).
			r.ownConfirmed = r.confirmed.Load()
			everActive = true
			if time.Since(res.streaming) >= stableSession {
				backoff = minBackoff
				failures = 0
			}
		}
		err := res.err
		r.standbyLogged = false
		if ce := permanent(err); ce != nil {
			if !r.opts.RetryConfigErrors {
				return ce
			}
			// A guest is down, never gone: it says why, with the fix,
			// and sets everything up again now and then.
			r.setState(StateDown)
			r.setLastError(ce.Error())
			r.lagSeconds.Store(0)
			if ce.Error() != lastDown || time.Since(lastWarn) >= 5*time.Minute {
				lastDown, lastWarn = ce.Error(), time.Now()
				r.log.Warn("relay down: "+ce.Error(), "retry_in", r.opts.ConfigRetry)
			}
			if !sleep(ctx, r.opts.ConfigRetry) {
				return nil
			}
			continue
		}
		lastDown = ""
		if errors.Is(err, errSlotRecreated) {
			continue
		}
		r.setState(StateRetrying)
		r.setLastError(errLine(err))
		// A server that stays away is retried every second: one line
		// for the first failure, then one every 30 s with the count.
		failures++
		if failures == 1 || time.Since(lastWarn) >= 30*time.Second {
			lastWarn = time.Now()
			r.log.Warn("relay not streaming; retrying", "reason", errLine(err), "failures", failures, "retry_in", backoff)
		}
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// sleep waits d, or less when ctx is done first (then it reports false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// standBy is a session's wait while another relay has the slot (busy
// says how the server refused it): the relay is the standby, says so
// once, and tries again after --standby-retry on the connections it
// holds, so that a take-over costs no connection set-up. Run's goroutine
// only.
func (r *Relay) standBy(ctx context.Context, everActive bool, busy error) bool {
	if State(r.state.Load()) != StateStandby {
		// What this relay measured while it streamed is no longer its
		// figure: a standby's lag is the active relay's stall (watch),
		// and the slot's position another relay's.
		r.lagSeconds.Store(0)
		r.stall = stallWatch{}
		r.ownConfirmed = 0
	}
	r.setState(StateStandby)
	r.setLastError("")
	if !r.standbyLogged {
		r.standbyLogged = true
		r.log.Info("relay standing by: the slot is in use by another relay", "slot", r.opts.Slot,
			"retry", r.opts.StandbyRetry, "reason", busy)
	}
	wait := r.opts.StandbyRetry
	if !everActive && time.Since(r.started) < time.Second {
		// Just (re)started: the walsender holding the slot may be the
		// one of this relay's previous run, exiting now that its
		// client is gone.
		wait = min(wait, 100*time.Millisecond)
	}
	return sleep(ctx, wait)
}

// errSlotBusy: the slot is in use by another walsender (another relay).
var errSlotBusy = errors.New("replication slot in use")

// rateLimit lets one log line through every `every`, counting the others.
type rateLimit struct {
	every      time.Duration
	last       atomic.Int64
	suppressed atomic.Uint64
}

// allow reports whether a line may be written now, and how many were
// suppressed since the last one.
func (l *rateLimit) allow(now time.Time) (bool, uint64) {
	last := l.last.Load()
	if last != 0 && now.UnixNano()-last < int64(l.every) {
		l.suppressed.Add(1)
		return false, 0
	}
	if !l.last.CompareAndSwap(last, now.UnixNano()) {
		l.suppressed.Add(1)
		return false, 0
	}
	return true, l.suppressed.Swap(0)
}
