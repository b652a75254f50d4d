package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/listenhub/listenhub/hub"
)

// UpstreamOptions configure an Upstream.
type UpstreamOptions struct {
	// NATS is the connection to take notifications from. Required; the
	// Upstream does not close it. Give it nats.MaxReconnects(-1): the
	// Upstream reads its disconnects and reconnects (Watch).
	NATS *nats.Conn
	// Subjects are the fleet's subjects for the hub's database. Required.
	Subjects Subjects
	// HubID names this hub's interest at the bridge (the host name, say).
	// Required, unique in the fleet.
	HubID string
	// HeartbeatTimeout is how old the bridge's last heartbeat may be
	// while the hub says healthy. Default 4 × DefaultHeartbeatInterval.
	HeartbeatTimeout time.Duration
	// InterestTTL is the lease of this hub's interest at the bridge,
	// renewed every third of it. Default 30s.
	InterestTTL time.Duration
	// RequestTimeout bounds each registration at the bridge (the LISTENs
	// it waits for included). Default 10s.
	RequestTimeout time.Duration
	// Logger: nil means slog.Default().
	Logger *slog.Logger
}

// Upstream feeds a hub from NATS (hub.Config.Upstream): the notifications a
// Bridge publishes, for the channels the hub's workers hold.
type Upstream struct {
	opts UpstreamOptions
	log  *slog.Logger
	sink hub.UpstreamSink

	mu        sync.Mutex
	chans     map[string]*upChan
	epoch     uint64 // of the bridge our registration was confirmed by
	hbEpoch   uint64 // of the last heartbeat
	hbAt      time.Time
	hbPG      bool
	connected bool
	resync    bool // a gap was seen: re-register before saying healthy
	healthy   bool // what the sink was told last
	reason    string
	hbSub     *nats.Subscription

	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	malformed atomic.Uint64
	gaps      atomic.Uint64
}

type upChan struct {
	sub     *nats.Subscription
	lastSeq uint64 // 0: none seen in this epoch
}

// NewUpstream checks opts.
func NewUpstream(opts UpstreamOptions) (*Upstream, error) {
	switch {
	case opts.NATS == nil:
		return nil, errors.New("fleet: UpstreamOptions.NATS is nil")
	case opts.Subjects.prefix == "":
		return nil, errors.New("fleet: UpstreamOptions.Subjects is unset (NewSubjects)")
	case opts.HubID == "":
		return nil, errors.New("fleet: UpstreamOptions.HubID is empty")
	case opts.HeartbeatTimeout < 0, opts.InterestTTL < 0, opts.RequestTimeout < 0:
		return nil, errors.New("fleet: UpstreamOptions: a negative duration")
	}
	if opts.HeartbeatTimeout == 0 {
		opts.HeartbeatTimeout = 4 * DefaultHeartbeatInterval
	}
	if opts.InterestTTL == 0 {
		opts.InterestTTL = DefaultInterestTTL
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Upstream{opts: opts, log: opts.Logger, chans: map[string]*upChan{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Malformed counts the messages dropped on the notification subjects: not
// one of ours (no epoch or sequence, another subject's shape).
func (u *Upstream) Malformed() uint64 { return u.malformed.Load() }

// Gaps counts the gaps seen (a sequence skipped, a new bridge, a NATS
// reconnect), each a resync.
func (u *Upstream) Gaps() uint64 { return u.gaps.Load() }

// Reason says why the hub is not healthy now ("" when it is).
func (u *Upstream) Reason() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.reason
}

// Watch is the NATS connection's handlers that make the Upstream see a
// disconnect or a reconnect at once rather than at its next look (a
// quarter of HeartbeatTimeout): pass them to nats.Connect
// (nats.DisconnectErrHandler, nats.ReconnectHandler) or call them from
// yours.
func (u *Upstream) Watch() (disconnected func(*nats.Conn, error), reconnected func(*nats.Conn)) {
	return func(*nats.Conn, error) {
			u.poke()
		}, func(*nats.Conn) {
			u.mu.Lock()
			u.resync = true // however short the outage, messages were lost
			u.mu.Unlock()
			u.gaps.Add(1)
			u.poke()
		}
}

// Open implements hub.Upstream.
func (u *Upstream) Open(sink hub.UpstreamSink) error {
	u.sink = sink
	sub, err := u.opts.NATS.Subscribe(u.opts.Subjects.Heartbeat(), u.onHeartbeat)
	if err != nil {
		return fmt.Errorf("fleet: subscribe %s: %w", u.opts.Subjects.Heartbeat(), err)
	}
	u.mu.Lock()
	u.hbSub = sub
	u.connected = u.opts.NATS.IsConnected()
	u.mu.Unlock()
	go u.run()
	return nil
}

func (u *Upstream) poke() {
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

func (u *Upstream) onHeartbeat(m *nats.Msg) {
	var hb heartbeat
	if json.Unmarshal(m.Data, &hb) != nil || hb.Epoch == 0 {
		u.malformed.Add(1)
		return
	}
	u.mu.Lock()
	if u.hbEpoch != 0 && hb.Epoch != u.hbEpoch {
		u.resync = true // another bridge took over
		u.gaps.Add(1)
	}
	u.hbEpoch, u.hbAt, u.hbPG = hb.Epoch, time.Now(), hb.PG
	u.mu.Unlock()
	u.poke()
}

// run judges the health whenever something changed and every quarter of
// the heartbeat timeout, re-registers after a gap, and renews the interest.
func (u *Upstream) run() {
	defer close(u.done)
	tick := time.NewTicker(u.opts.HeartbeatTimeout / 4)
	defer tick.Stop()
	renewed := time.Now()
	for {
		select {
		case <-u.stop:
			return
		case <-u.kick:
		case <-tick.C:
		}
		connected := u.opts.NATS.IsConnected()
		u.mu.Lock()
		if connected && !u.connected {
			// Connected again (or for the first time after a failed
			// first connect): what was published meanwhile is lost.
			u.resync = true
		}
		u.connected = connected
		reason := ""
		switch {
		case !u.connected:
			reason = "NATS disconnected"
		case u.hbAt.IsZero():
			reason = "no heartbeat from an active bridge yet"
		case time.Since(u.hbAt) > u.opts.HeartbeatTimeout:
			reason = "the active bridge's heartbeat is stale (" + time.Since(u.hbAt).Round(time.Millisecond).String() + ")"
		case !u.hbPG:
			reason = "the bridge's Postgres connection is down"
		}
		// A heartbeat of another epoch than the one our channels were
		// registered with: a takeover. (Epoch 0: nothing registered yet.)
		resync := u.resync || (reason == "" && u.epoch != 0 && u.epoch != u.hbEpoch && len(u.chans) > 0)
		if resync && reason == "" {
			reason = "resyncing after a gap"
		}
		u.setHealthLocked(reason)
		u.mu.Unlock()
		if resync && u.connected {
			if err := u.register(u.names(), nil); err != nil {
				u.log.Warn("fleet upstream: re-registering at the bridge failed", "error", err)
				continue
			}
			u.mu.Lock()
			u.resync = false
			u.mu.Unlock()
			renewed = time.Now()
			u.poke()
			continue
		}
		if reason == "" && time.Since(renewed) > u.opts.InterestTTL/3 {
			added, err := u.registerAdded(u.names(), nil)
			if err != nil {
				u.log.Warn("fleet upstream: renewing the interest failed", "error", err)
			}
			renewed = time.Now()
			if len(added) > 0 {
				// The bridge had let our lease go: what it published
				// on those channels meanwhile never reached us.
				u.log.Warn("fleet upstream: the bridge had dropped this hub's interest; resyncing", "channels", added)
				u.mu.Lock()
				u.resync = true
				u.mu.Unlock()
				u.gaps.Add(1)
				u.poke()
			}
		}
	}
}

// setHealthLocked tells the sink when the health changes, and logs why.
func (u *Upstream) setHealthLocked(reason string) {
	healthy := reason == ""
	u.reason = reason
	if healthy == u.healthy {
		return
	}
	u.healthy = healthy
	if healthy {
		u.log.Info("fleet upstream: healthy")
	} else {
		u.log.Warn("fleet upstream: not healthy", "reason", reason)
	}
	u.sink.Health(healthy)
}

func (u *Upstream) names() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]string, 0, len(u.chans))
	for ch := range u.chans {
		out = append(out, ch)
	}
	return out
}

// register sends the hub's interest and waits for the bridge's reply; on
// success it adopts the bridge's epoch (and forgets the sequences of the
// last one).
func (u *Upstream) register(listen, unlisten []string) error {
	_, err := u.registerAdded(listen, unlisten)
	return err
}

// registerAdded is register, with the channels the bridge did not hold
// for this hub.
func (u *Upstream) registerAdded(listen, unlisten []string) ([]string, error) {
	req := interestRequest{Hub: u.opts.HubID, Listen: listen, Unlisten: unlisten, TTLMS: u.opts.InterestTTL.Milliseconds()}
	m, err := u.opts.NATS.Request(u.opts.Subjects.Interest(), mustJSON(req), u.opts.RequestTimeout)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, errors.New("no active bridge answers on " + u.opts.Subjects.Interest())
		}
		return nil, err
	}
	var rep interestReply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		return nil, fmt.Errorf("bridge reply: %w", err)
	}
	if rep.Error != "" {
		return nil, &bridgeError{rep.Error}
	}
	u.mu.Lock()
	if rep.Epoch != u.epoch {
		for _, c := range u.chans {
			c.lastSeq = 0
		}
		u.epoch = rep.Epoch
	}
	u.mu.Unlock()
	return rep.Added, nil
}

// Listen implements hub.Upstream: subscribe, flush, register at the bridge.
// Without an active bridge (or NATS) it waits for one, as a hub waits for
// Postgres; the bridge's refusal (a LISTEN that failed) is done's error.
func (u *Upstream) Listen(channel string, done func(error)) {
	go func() {
		sub, err := u.opts.NATS.Subscribe(u.opts.Subjects.Notify(channel), u.onNotify)
		if err == nil {
			err = u.opts.NATS.Flush()
		}
		if err != nil {
			if sub != nil {
				sub.Unsubscribe()
			}
			done(fmt.Errorf("NATS: %w", err))
			return
		}
		u.mu.Lock()
		u.chans[channel] = &upChan{sub: sub}
		u.mu.Unlock()
		// No bridge (yet), NATS away: wait for them, as a hub waits
		// for Postgres; a bridge's refusal is the answer.
		for {
			err := u.register([]string{channel}, nil)
			var refused *bridgeError
			switch {
			case err == nil:
				done(nil)
				return
			case errors.As(err, &refused):
				u.mu.Lock()
				delete(u.chans, channel)
				u.mu.Unlock()
				sub.Unsubscribe()
				done(err)
				return
			}
			select {
			case <-u.stop:
				done(errors.New("fleet: upstream closed"))
				return
			case <-time.After(u.opts.HeartbeatTimeout / 4):
			}
		}
	}()
}

// bridgeError is the bridge's refusal of a registration: final, unlike
// its absence.
type bridgeError struct{ msg string }

func (e *bridgeError) Error() string { return "bridge: " + e.msg }

// Unlisten implements hub.Upstream.
func (u *Upstream) Unlisten(channel string, done func(error)) {
	u.mu.Lock()
	c := u.chans[channel]
	delete(u.chans, channel)
	u.mu.Unlock()
	if c != nil {
		c.sub.Unsubscribe()
	}
	go func() {
		if err := u.register(nil, []string{channel}); err != nil {
			u.log.Debug("fleet upstream: unregistering failed; the lease ends it", "channel", channel, "error", err)
		}
		done(nil)
	}()
}

// Close implements hub.Upstream.
func (u *Upstream) Close(done func()) {
	close(u.stop)
	go func() {
		<-u.done
		u.mu.Lock()
		subs := []*nats.Subscription{u.hbSub}
		for _, c := range u.chans {
			subs = append(subs, c.sub)
		}
		u.mu.Unlock()
		for _, s := range subs {
			if s != nil {
				s.Unsubscribe()
			}
		}
		done()
	}()
}

// onNotify checks a notification's epoch and sequence and hands it to the
// hub; anything else on the subject is dropped and counted.
func (u *Upstream) onNotify(m *nats.Msg) {
	ch, ok := u.opts.Subjects.Channel(m.Subject)
	epoch, e1 := strconv.ParseUint(m.Header.Get(hdrEpoch), 10, 64)
	seq, e2 := strconv.ParseUint(m.Header.Get(hdrSeq), 10, 64)
	if !ok || e1 != nil || e2 != nil || epoch == 0 || seq == 0 {
		u.malformed.Add(1)
		return
	}
	u.mu.Lock()
	c := u.chans[ch]
	if c == nil {
		u.mu.Unlock()
		return // unsubscribed meanwhile
	}
	switch {
	case u.epoch != 0 && epoch != u.epoch:
		// A bridge we did not register with: a takeover, seen on a
		// notification before its heartbeat.
		u.resync = true
		u.gaps.Add(1)
	case c.lastSeq != 0 && seq != c.lastSeq+1:
		u.resync = true
		u.gaps.Add(1)
		u.log.Warn("fleet upstream: a notification was lost", "channel", ch, "expected", c.lastSeq+1, "got", seq)
	}
	c.lastSeq = seq
	gap := u.resync
	u.mu.Unlock()
	if gap {
		u.poke()
	}
	u.sink.Notify(ch, string(m.Data))
}
