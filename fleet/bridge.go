package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"

	"github.com/listenhub/listenhub/listener"
)

// Defaults of BridgeOptions and UpstreamOptions.
const (
	DefaultHeartbeatInterval = 500 * time.Millisecond
	DefaultInterestTTL       = 30 * time.Second
	DefaultStandbyRetry      = time.Second
)

// BridgeOptions configure a Bridge.
type BridgeOptions struct {
	// ConnConfig is the database whose LISTEN the bridge holds (a direct
	// or session-pooled connection). Required.
	ConnConfig *pgconn.Config
	// NATS is the connection to publish on. Required; the bridge does
	// not close it.
	NATS *nats.Conn
	// Subjects are the fleet's subjects for this database. Required.
	Subjects Subjects
	// HeartbeatInterval is how often the active bridge says it is alive.
	// Default 500ms; hubs call it stale after 4 intervals.
	HeartbeatInterval time.Duration
	// StandbyRetry is how often a standing-by bridge tries for the lease.
	// Default 1s.
	StandbyRetry time.Duration
	// Logger: nil means slog.Default().
	Logger *slog.Logger
}

// Bridge holds a database's one LISTEN connection for a fleet and publishes
// every notification on NATS. Run it on two or more hosts: one is active,
// under a session advisory lock on a Postgres connection of its own (a lease
// that cannot be held twice, and that ends with the connection), the others
// stand by and take over when it ends.
type Bridge struct {
	opts BridgeOptions
	log  *slog.Logger

	active    atomic.Bool
	term      atomic.Pointer[term] // while active
	takeovers atomic.Uint64
	published atomic.Uint64
}

// NewBridge checks opts.
func NewBridge(opts BridgeOptions) (*Bridge, error) {
	switch {
	case opts.ConnConfig == nil:
		return nil, errors.New("fleet: BridgeOptions.ConnConfig is nil")
	case opts.NATS == nil:
		return nil, errors.New("fleet: BridgeOptions.NATS is nil")
	case opts.Subjects.prefix == "":
		return nil, errors.New("fleet: BridgeOptions.Subjects is unset (NewSubjects)")
	case opts.HeartbeatInterval < 0:
		return nil, fmt.Errorf("fleet: BridgeOptions.HeartbeatInterval is negative (%v)", opts.HeartbeatInterval)
	case opts.StandbyRetry < 0:
		return nil, fmt.Errorf("fleet: BridgeOptions.StandbyRetry is negative (%v)", opts.StandbyRetry)
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if opts.StandbyRetry == 0 {
		opts.StandbyRetry = DefaultStandbyRetry
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Bridge{opts: opts, log: opts.Logger.With("subjects", opts.Subjects.prefix)}, nil
}

// Active reports whether this bridge holds the lease now.
func (b *Bridge) Active() bool { return b.active.Load() }

// Published counts the notifications this bridge published.
func (b *Bridge) Published() uint64 { return b.published.Load() }

// Run stands by for the lease, serves while it holds it, and stands by
// again when it loses it, until ctx ends.
func (b *Bridge) Run(ctx context.Context) error {
	for {
		lease, err := b.acquire(ctx)
		if err != nil {
			return err
		}
		b.takeovers.Add(1)
		err = b.serve(ctx, lease)
		lease.Close(context.Background())
		if ctx.Err() != nil {
			return nil
		}
		b.log.Warn("fleet bridge: lost the lease; standing by", "reason", err)
	}
}

// leaseKey is the advisory lock of these subjects: one active bridge per
// fleet and database.
func (b *Bridge) leaseKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("listenhub fleet bridge " + b.opts.Subjects.prefix))
	return int64(h.Sum64())
}

// acquire waits for the lease: a connection of its own holding the
// session advisory lock.
func (b *Bridge) acquire(ctx context.Context) (*pgx.Conn, error) {
	said := false
	for {
		conn, err := pgx.ConnectConfig(ctx, b.connConfig("listenhub-bridge-lease"))
		if err == nil {
			var got bool
			if err = conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", b.leaseKey()).Scan(&got); err == nil && got {
				return conn, nil
			}
			conn.Close(context.Background())
			if err == nil && !said {
				b.log.Info("fleet bridge: another bridge is active; standing by")
				said = true
			}
		}
		if err != nil && ctx.Err() == nil {
			b.log.Warn("fleet bridge: cannot reach Postgres for the lease", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(b.opts.StandbyRetry):
		}
	}
}

func (b *Bridge) connConfig(app string) *pgx.ConnConfig {
	cc, _ := pgx.ParseConfig("")
	cc.Config = *b.opts.ConnConfig.Copy()
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		cc.RuntimeParams["application_name"] = app
	}
	return cc
}

// term is one term of holding the lease.
type term struct {
	b     *Bridge
	epoch uint64
	pg    *listener.Conn
	pgOK  atomic.Bool

	mu   sync.Mutex
	seq  map[string]uint64               // per channel, this epoch
	refs map[string]map[string]time.Time // channel → hub → lease expiry
}

// serve publishes and answers interest while lease is held; it returns why
// it stopped (the lease connection failed, ctx ended).
func (b *Bridge) serve(ctx context.Context, lease *pgx.Conn) error {
	t := &term{b: b, epoch: uint64(time.Now().UnixNano()), seq: map[string]uint64{}, refs: map[string]map[string]time.Time{}}
	pg, err := listener.Connect(ctx, listener.Config{
		ConnConfig:     b.connConfig("listenhub-bridge").Config.Copy(),
		OnNotification: t.onNotification,
		OnHealth: func(ok bool) {
			t.pgOK.Store(ok)
			t.heartbeat()
		},
		Logger: b.log,
	})
	if err != nil {
		return fmt.Errorf("LISTEN connection: %w", err)
	}
	defer pg.Close()
	t.pg = pg
	t.pgOK.Store(pg.Healthy())
	sub, err := b.opts.NATS.Subscribe(b.opts.Subjects.Interest(), t.onInterest)
	if err != nil {
		return fmt.Errorf("NATS subscribe: %w", err)
	}
	defer sub.Unsubscribe()
	b.term.Store(t)
	b.active.Store(true)
	defer func() {
		b.active.Store(false)
		b.term.Store(nil)
	}()
	b.log.Info("fleet bridge: active", "epoch", t.epoch)
	t.heartbeat()

	tick := time.NewTicker(b.opts.HeartbeatInterval)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		t.heartbeat()
		if n%4 == 0 {
			// The lease is the connection: a bridge that cannot
			// reach it any more must stop, since the lock is gone
			// with it and another bridge may be active.
			pctx, cancel := context.WithTimeout(ctx, 4*b.opts.HeartbeatInterval)
			err := lease.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("lease connection: %w", err)
			}
			t.expire(time.Now())
		}
	}
}

func (t *term) heartbeat() {
	_ = t.b.opts.NATS.Publish(t.b.opts.Subjects.Heartbeat(), mustJSON(heartbeat{Epoch: t.epoch, PG: t.pgOK.Load()}))
}

func (t *term) onNotification(channel, payload string) {
	t.mu.Lock()
	t.seq[channel]++
	seq := t.seq[channel]
	t.mu.Unlock()
	m := nats.NewMsg(t.b.opts.Subjects.Notify(channel))
	m.Header.Set(hdrEpoch, formatUint(t.epoch))
	m.Header.Set(hdrSeq, formatUint(seq))
	m.Data = []byte(payload)
	if err := t.b.opts.NATS.PublishMsg(m); err != nil {
		t.b.log.Warn("fleet bridge: publish failed", "channel", channel, "error", err)
		return
	}
	t.b.published.Add(1)
}

// onInterest registers a hub's channels: LISTENs the new ones (waiting for
// Postgres to confirm) and replies with the epoch.
func (t *term) onInterest(m *nats.Msg) {
	var req interestRequest
	if err := json.Unmarshal(m.Data, &req); err != nil || req.Hub == "" {
		_ = m.Respond(mustJSON(interestReply{Error: "malformed interest request"}))
		return
	}
	ttl := req.ttl()
	if ttl <= 0 {
		ttl = DefaultInterestTTL
	}
	until := time.Now().Add(ttl)
	var fresh, added []string
	t.mu.Lock()
	for _, ch := range req.Listen {
		hubs := t.refs[ch]
		if hubs == nil {
			hubs = map[string]time.Time{}
			t.refs[ch] = hubs
			fresh = append(fresh, ch)
		}
		if _, ok := hubs[req.Hub]; !ok {
			added = append(added, ch)
		}
		hubs[req.Hub] = until
	}
	// A channel the hub no longer names is not renewed, so a lost
	// Unlisten ends with the lease.
	var gone []string
	for _, ch := range req.Unlisten {
		if hubs := t.refs[ch]; hubs != nil {
			delete(hubs, req.Hub)
			if len(hubs) == 0 {
				delete(t.refs, ch)
				gone = append(gone, ch)
			}
		}
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, ch := range fresh {
		if err := listener.ValidChannel(ch); err != nil {
			t.drop(ch)
			_ = m.Respond(mustJSON(interestReply{Error: err.Error()}))
			return
		}
		if err := t.pg.Listen(ctx, ch); err != nil {
			t.drop(ch)
			_ = m.Respond(mustJSON(interestReply{Error: "LISTEN " + ch + ": " + err.Error()}))
			return
		}
	}
	for _, ch := range gone {
		_ = t.pg.Unlisten(ctx, ch)
	}
	_ = m.Respond(mustJSON(interestReply{Epoch: t.epoch, Added: added}))
}

// Channels returns the channels this bridge LISTENs for the fleet while
// active, each with the number of hubs holding a lease on it.
func (b *Bridge) Channels() map[string]int {
	t := b.term.Load()
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int, len(t.refs))
	for ch, hubs := range t.refs {
		out[ch] = len(hubs)
	}
	return out
}

// drop forgets ch after its LISTEN failed.
func (t *term) drop(ch string) {
	t.mu.Lock()
	delete(t.refs, ch)
	t.mu.Unlock()
}

// expire ends the interest of hubs that did not renew it (a dead host), and
// UNLISTENs the channels nobody holds any more.
func (t *term) expire(now time.Time) {
	var gone []string
	t.mu.Lock()
	for ch, hubs := range t.refs {
		for hub, until := range hubs {
			if now.After(until) {
				delete(hubs, hub)
			}
		}
		if len(hubs) == 0 {
			delete(t.refs, ch)
			gone = append(gone, ch)
		}
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, ch := range gone {
		t.b.log.Info("fleet bridge: channel's interest expired; UNLISTEN", "channel", ch)
		_ = t.pg.Unlisten(ctx, ch)
	}
}
