package client

import (
	"crypto/rand"
	"encoding/hex"
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

// onHubWake routes a wake of the hub client hc: through the cut while hc
// is a fail-back's candidate, delivered when hc is the current hub,
// dropped otherwise (a candidate given up).
func (f *Failover) onHubWake(hc *hubConn, w Wake) {
	h := f.opts.OnWake
	f.dispatch.Lock()
	defer f.dispatch.Unlock()
	if c := f.cut; c != nil && c.hc == hc {
		switch {
		case w.Q == c.q:
			if w.Payload == c.token && !c.hubPast {
				c.hubPast = true
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
func (f *Failover) onLocalWake(w Wake) {
	h := f.opts.OnWake
	f.dispatch.Lock()
	defer f.dispatch.Unlock()
	if c := f.cut; c != nil {
		switch {
		case w.Q == c.q:
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
