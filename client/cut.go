package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A fail-back has two listeners delivering at once: the local one it is
// leaving and the hub it is returning to. Both receive the notifications
// of one Postgres in commit order, so one notification committed by the
// Failover itself while both listen, the marker, is at the same place in
// both streams. The cut delivers the local listener's wakes up to the
// marker and the hub's after it, and nothing else: no wake twice, none
// lost. The hub's wakes after its marker wait in buf until the local
// listener has passed its own, so that the order holds too.
//
// The marker that does not come back through the hub within the ack
// timeout means the hub does not hear this database: it serves another
// one (or another cluster), and the fail-back is refused.
//
// Where the marker does not fit in a channel name beside the hub's prefix
// and suffix (63 bytes), the fail-back goes without a cut: make before
// break, over-delivering in the overlap.
//
// A fail-back that does not happen loses nothing either: the local
// listener's wakes after its marker wait in held until the hub passes its
// own (then the hub delivers them); when the fail-back is given up first
// (a hub on another database never passes it), abandon delivers them. A
// fail-back given up after both passed, when the hub was already
// delivering, ends with one durable wake per name: the wakes in flight at
// that instant may have reached neither side.
//
// The cut is exact when the hub's stream to this worker is in commit
// order: with one hub Postgres connection (--postgres-connections 1, the
// default). Durable wakes the hub coalesced across the marker are covered
// by the durable wake per name that follows every swap.
type cut struct {
	hc        *hubConn
	q, token  string // the marker: a private name and a random payload
	hubPast   bool   // the hub delivered the marker
	localPast bool   // the local listener delivered the marker
	buf       []Wake // the hub's wakes after its marker, before local passed
	held      []Wake // the local listener's wakes after its marker, before the hub passed
	both      chan struct{}
}

// newCut makes the cut of a fail-back to hc.
func newCut(hc *hubConn) *cut {
	b := make([]byte, 8)
	rand.Read(b)
	return &cut{
		hc:    hc,
		q:     "lh.cut." + hex.EncodeToString(b[:4]), // short: it must fit beside the hub's prefix and suffix
		token: hex.EncodeToString(b),
		both:  make(chan struct{}),
	}
}

// cutFits reports whether a marker fits between prefix and suffix.
func cutFits(prefix, suffix string) bool {
	return len(prefix)+len("lh.cut.")+8+len(suffix) <= 63
}

// passed closes both once both listeners delivered the marker.
func (c *cut) passed() {
	if c.hubPast && c.localPast {
		close(c.both)
	}
}

// ErrOtherDatabase is wrapped by the reason of a Failover that does not
// use a hub because the hub does not deliver what is committed on the
// Failover's own database: it serves another database or cluster.
var ErrOtherDatabase = errors.New("listenhub client: the hub serves another database")

// dbProbe is the start's check that the hub hears the Failover's database
// (checkDatabase): a private name, a random payload, closed came once the
// hub delivered it.
type dbProbe struct {
	q, token string
	came     chan struct{}
}

// probeWait bounds how long NewFailover waits for the hub's first healthy
// status before it checks the database; a hub whose Postgres is down is
// checked later, once it says healthy (verifyLater), its wakes held until
// then.
const probeWait = 500 * time.Millisecond

// checkDatabase makes sure, at the start, that the hub hears the database
// the Failover was given (DatabaseURL or ConnConfig): it subscribes a
// private name through the hub, commits a NOTIFY of it on a short
// connection of its own, and waits, up to the ack timeout, for the hub to
// deliver it. A hub on another database acks every subscribe and delivers
// nothing the application commits: that is ErrOtherDatabase, said once at
// ERROR, and NewFailover listens locally instead. A hub not healthy within
// probeWait is checked later: later is true, and hc is unverified until
// verifyLater has checked it. Anything else that keeps the check from
// running (no database configured, a database this process cannot reach)
// leaves the hub trusted.
func (f *Failover) checkDatabase(ctx context.Context, hc *hubConn, c *Conn) (later bool, err error) {
	if f.localCfg.ConnConfig == nil || !cutFits(f.opts.Local.ChannelPrefix, f.opts.Local.ChannelSuffix) {
		return false, nil
	}
	t := time.NewTimer(probeWait)
	defer t.Stop()
	for !c.Healthy() {
		select {
		case <-hc.status:
		case <-c.Done():
			return false, nil // the caller finds it dead
		case <-t.C:
			hc.unverified.Store(true)
			return true, nil
		case <-ctx.Done():
			return false, nil
		}
	}
	return false, f.probeDatabase(ctx, c)
}

// verifyLater checks, once hc's hub first says healthy, what the start
// could not: that it hears the Failover's database. Until then its wakes
// wait in hc.held (onHubWake). Verified, they are delivered; a hub on
// another database is left for a local listener (the reason wraps
// ErrOtherDatabase) and its held wakes, another database's, are dropped.
func (f *Failover) verifyLater(hc *hubConn) {
	c := hc.c
	for !c.Healthy() {
		select {
		case <-hc.status:
		case <-c.Done():
			f.releaseHeld(hc, false) // the failover resyncs with durable wakes
			return
		case <-f.done:
			return
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // Close ends the check
		select {
		case <-f.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := f.probeDatabase(ctx, c)
	if err == nil {
		f.releaseHeld(hc, true)
		return
	}
	f.releaseHeld(hc, false)
	f.startFailover(hc, err)
	c.Close()
}

// releaseHeld ends hc's unverified state: its held wakes are delivered
// (deliver, and hc still current) or dropped.
func (f *Failover) releaseHeld(hc *hubConn, deliver bool) {
	h := f.h.OnWake
	f.dispatch.Lock()
	defer f.dispatch.Unlock()
	held := hc.held
	hc.held = nil
	hc.unverified.Store(false)
	if deliver && h != nil && hc.current.Load() {
		for _, w := range held {
			h(w)
		}
	}
}

// probeDatabase is the check itself (see checkDatabase): nil when the hub
// delivered the probe, or when the check could not run.
func (f *Failover) probeDatabase(ctx context.Context, c *Conn) error {
	cc := f.localCfg.ConnConfig
	b := make([]byte, 8)
	rand.Read(b)
	p := &dbProbe{q: "lh.db." + hex.EncodeToString(b[:4]), token: hex.EncodeToString(b), came: make(chan struct{})}
	f.setProbe(p)
	defer func() {
		f.setProbe(nil)
		c.Unsubscribe(p.q)
	}()
	ctx, cancel := context.WithTimeout(ctx, f.opts.Hub.AckTimeout)
	defer cancel()
	if err := c.Subscribe(ctx, p.q); err != nil {
		return nil // the hub's own failure shows elsewhere
	}
	conn, err := pgconn.ConnectConfig(ctx, cc.Copy())
	if err != nil {
		return nil
	}
	rr := conn.ExecParams(ctx, "SELECT pg_notify($1, $2)", [][]byte{[]byte(f.opts.Local.ChannelPrefix + p.q + f.opts.Local.ChannelSuffix), []byte(p.token)}, nil, nil, nil)
	_, err = rr.Close()
	conn.Close(context.Background())
	if err != nil {
		return nil
	}
	select {
	case <-p.came:
		return nil
	case <-ctx.Done():
	}
	err = fmt.Errorf("listenhub client: %w: a NOTIFY committed on %s at %s:%d did not come back through the hub at %s within %v; listening on a connection of this process (run the hub with this database's URL)",
		ErrOtherDatabase, cc.Database, cc.Host, cc.Port, f.opts.Hub.SocketPath, f.opts.Hub.AckTimeout)
	f.wrongDatabase.Store(true)
	f.log.Error("listenhub: not using a hub on another database", "socket", f.opts.Hub.SocketPath, "reason", err)
	return err
}

func (f *Failover) setProbe(p *dbProbe) {
	f.dispatch.Lock()
	f.probe = p
	f.dispatch.Unlock()
}

// onHubWake routes a wake of the hub client hc: through the cut while hc
// is a fail-back's candidate, delivered when hc is the current hub,
// dropped otherwise (a candidate given up).
func (f *Failover) onHubWake(hc *hubConn, w Wake) {
	h := f.h.OnWake
	f.dispatch.Lock()
	defer f.dispatch.Unlock()
	if p := f.probe; p != nil && w.Name == p.q {
		if w.Payload == p.token {
			select {
			case <-p.came:
			default:
				close(p.came)
			}
		}
		return
	}
	if hc.unverified.Load() {
		hc.held = append(hc.held, w) // verifyLater delivers or drops them
		return
	}
	if c := f.cut; c != nil && c.hc == hc {
		switch {
		case w.Name == c.q:
			if w.Payload == c.token && !c.hubPast {
				c.hubPast = true
				c.held = nil // the hub delivers them from here on
				c.passed()
			}
			return
		case !c.hubPast:
			return // before the marker: the local listener delivers it
		case !c.localPast:
			c.buf = append(c.buf, w)
			return
		}
	} else if !hc.current.Load() {
		return
	}
	if h != nil {
		h(w)
	}
}

// onLocalWake routes a wake of the local listener: during a cut, up to
// the marker only.
func (f *Failover) onLocalWake(live *atomic.Bool, w Wake) {
	h := f.h.OnWake
	f.dispatch.Lock()
	defer f.dispatch.Unlock()
	if !live.Load() {
		return // swapped out by a fail-back: the hub delivers from the cut on
	}
	if c := f.cut; c != nil {
		switch {
		case w.Name == c.q:
			if w.Payload == c.token && !c.localPast {
				c.localPast = true
				if h != nil {
					for _, b := range c.buf {
						h(b)
					}
				}
				c.buf = nil
				c.passed()
			}
			return
		case c.localPast && !c.hubPast:
			c.held = append(c.held, w) // the hub's, once it passes; ours if it never does
			return
		case c.localPast:
			return // after the marker: the hub delivers it
		}
	}
	if h != nil {
		h(w)
	}
}

// setCut installs (or, with nil, removes) the cut, between two wakes.
func (f *Failover) setCut(c *cut) {
	f.dispatch.Lock()
	f.cut = c
	f.dispatch.Unlock()
}

// abandon removes c, the cut of a fail-back given up, so that the local
// listener delivers everything again, and makes up for what the cut held
// back: the local listener's wakes after its marker when the hub never
// passed its own, in order, before any later one; otherwise, when both
// passed, it reports that a durable wake per name is owed (see cut).
func (f *Failover) abandon(c *cut) (owed bool) {
	h := f.h.OnWake
	f.dispatch.Lock()
	defer f.dispatch.Unlock()
	if f.cut != c {
		return false
	}
	f.cut = nil
	if c.localPast && !c.hubPast && h != nil {
		for _, w := range c.held {
			h(w)
		}
	}
	c.held = nil
	return c.localPast && c.hubPast
}
