//go:build unix

package pglisten

import (
	"fmt"
	"time"
)

// The health check of an idle connection: a probe after HealthCheckInterval
// of silence, the connection declared dead when nothing comes back within
// HealthCheckTimeout.

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
