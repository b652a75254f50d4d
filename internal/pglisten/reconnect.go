//go:build unix

package pglisten

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/listenhub/listenhub/internal/fdreserve"
)

// A connection's life: installed once dialed, ready once the whole set is
// LISTENed and the delivery check passed, failed and torn down on loss, and
// dialed again off the loop with a capped, jittered backoff.

// install puts a freshly connected transport to work: on the first connect
// from Open, on every reconnect from the dial goroutine's post.
func (c *Conn) install(tr transport) {
	if c.state == stateClosing || c.state == stateClosed {
		tr.discard()
		return
	}
	c.gen++
	if err := tr.start(c, c.gen); err != nil {
		tr.discard()
		c.lastErr = err
		c.state = stateDown
		c.scheduleReconnect()
		return
	}
	c.tr = tr
	c.pid = tr.backendPID()
	c.state = stateUp
	c.everUp = true
	c.failedAttempts, c.lastWarnMsg = 0, ""
	c.lastRx = c.l.Now()
	c.probeSince = time.Time{}
	c.hc = c.l.AfterFunc(c.cfg.HealthCheckInterval, c.healthTick)
	// The waiting commands have their connection: from here they wait
	// only for their turn.
	c.stopAllExpiry()
	if c.expired > 0 {
		c.compactPending()
	}
	if noCheck(c) {
		c.log.Info("listener: connected", "pid", c.pid, "tls", tr.isTLS(), "channels", len(c.set))
		c.ready()
		return
	}
	// Nothing goes out, and nobody is told healthy, before the
	// connection has shown that notifications arrive (check.go).
	c.startCheck()
}

// ready puts a connection that passed the delivery check to work.
func (c *Conn) ready() {
	// Re-LISTEN the whole set first, then whatever waited, in bounded
	// batches (see batchLimit): notifications for the channels already
	// re-LISTENed are delivered while the later batches run, and
	// OnHealth(true) waits for the last one. Duplicates with pending
	// LISTENs are harmless (LISTEN is idempotent); a pending UNLISTEN
	// comes after the re-LISTEN and wins, as it should.
	if len(c.set) > 0 {
		resync := make([]*command, 0, len(c.set)+len(c.pending))
		for ch := range c.set {
			resync = append(resync, &command{listen: true, channel: ch, resync: true, waiting: true})
		}
		c.resyncing = len(resync)
		c.pending = append(resync, c.pending...)
	}
	if c.resyncing == 0 {
		c.setHealthy(true)
	}
	c.flush()
}

// setHealthy reports a health change once.
func (c *Conn) setHealthy(h bool) {
	if h {
		c.backoff = c.cfg.ReconnectMin // the next loss starts over
	}
	if c.healthy == h {
		return
	}
	c.healthy = h
	if c.cfg.OnHealth != nil {
		c.cfg.OnHealth(h)
	}
}

// fail declares the connection dead: tear it down, put every command that
// was in flight back at the head of the queue (it may or may not have taken
// effect; it will be sent again), report unhealthy and schedule a
// reconnect.
func (c *Conn) fail(err error) {
	switch c.state {
	case stateClosing:
		c.finishClose()
		return
	case stateUp:
	default:
		return
	}
	c.lastErr = err
	if errors.Is(err, ErrNotDelivered) {
		c.notDelivered(err)
	} else {
		c.log.Warn("listener: connection lost", "pid", c.pid, "reason", err)
	}
	c.teardown()
	var requeue []*command
	for _, q := range c.inflight {
		for _, cmd := range q.cmds {
			if !cmd.resync {
				requeue = append(requeue, cmd)
			}
		}
	}
	c.inflight = nil
	c.cmdInflight = 0
	c.resyncing = 0
	// Drop the old resync's unsent re-LISTENs: the next install builds a
	// fresh one from the set.
	kept := requeue
	for _, cmd := range c.pending {
		if !cmd.resync && cmd.waiting {
			kept = append(kept, cmd)
		}
	}
	c.pending, c.expired = kept, 0
	c.isolate = false
	c.state = stateDown
	for _, cmd := range c.pending {
		cmd.waiting = true
		c.startExpiry(cmd)
	}
	c.setHealthy(false)
	if c.state == stateDown { // OnHealth may have closed us
		c.scheduleReconnect()
	}
}

// teardown closes the transport and stops its timers.
func (c *Conn) teardown() {
	if c.tr != nil {
		c.tr.close()
		c.tr = nil
	}
	c.gen++
	if c.hc != nil {
		c.hc.Stop()
		c.hc = nil
	}
	c.rpos, c.rend = 0, 0
	if len(c.rbuf) > readBufSize {
		c.rbuf = make([]byte, readBufSize)
	}
	c.probeSince = time.Time{}
	c.resetCheck()
	c.chk.listening, c.chk.verified, c.chk.serverPID = false, false, 0
}

// scheduleReconnect arms the next attempt, jittered into [d/2, d], and no
// later than maxRetryWhileWaiting while a command waits.
func (c *Conn) scheduleReconnect() {
	d := c.backoff
	d = d/2 + rand.N(d/2+1)
	c.backoff = min(c.backoff*2, c.cfg.ReconnectMax)
	if c.waitingCount() > 0 {
		d = min(d, maxRetryWhileWaiting)
	}
	c.reconnectAt = time.Now().Add(d)
	c.reconnect = c.l.AfterFunc(d, c.redial)
}

// retryLogEvery bounds the log lines of a server that stays unreachable.
const retryLogEvery = 30 * time.Second

// attemptFailed logs a failed connection attempt: the first of each reason
// at once, repeats at most every retryLogEvery with how many there were.
func (c *Conn) attemptFailed(err error) {
	c.failedAttempts++
	msg := err.Error()
	now := time.Now()
	if msg == c.lastWarnMsg && now.Sub(c.lastWarnAt) < retryLogEvery {
		return
	}
	what := "listener: connect failed"
	if c.everUp {
		what = "listener: reconnect failed"
	}
	c.log.Warn(what, "reason", err, "attempts", c.failedAttempts, "retry_in_max", c.backoff)
	c.failedAttempts = 0
	c.lastWarnAt, c.lastWarnMsg = now, msg
}

// giveUp ends a Conn whose configuration the server refused before it was
// ever connected: retrying cannot help. Every waiting command fails with
// err, OnFatal reports it, and later commands fail with it too.
func (c *Conn) giveUp(err error) {
	c.log.Error("listener: the server refused the configuration; not retrying", "reason", err)
	c.fatal = err
	c.lastErr = err
	c.state = stateClosed
	if c.reconnect != nil {
		c.reconnect.Stop()
		c.reconnect = nil
	}
	c.failWaiting(err)
	c.healthy = false
	if c.cfg.OnFatal != nil {
		c.cfg.OnFatal(err)
	}
}

// redial starts one connection attempt on a goroutine; its result comes back
// through Post, tagged with the gen it was started for.
func (c *Conn) redial() {
	c.reconnect = nil
	if c.state != stateDown {
		return
	}
	var timeout time.Duration
	if c.cfg.ConnConfig != nil {
		timeout = c.cfg.ConnConfig.ConnectTimeout
	}
	if timeout <= 0 {
		timeout = defaultConnectTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	c.cancelDial = cancel
	gen := c.gen
	cfg := c.cfg.ConnConfig
	dialer := testDialer(c)
	go func() {
		var tr transport
		// Out of descriptors (a limit lowered under the process, workers
		// holding the rest), the attempt runs again on the reserve kept
		// for it (package fdreserve), rather than fail for as long as
		// the shortage lasts.
		err := fdreserve.Retry(func() (err error) {
			if dialer != nil {
				tr, err = dialer(ctx)
			} else {
				tr, err = dial(ctx, cfg)
			}
			return err
		})
		cancel()
		if perr := c.l.Post(func() { c.dialed(gen, tr, err) }); perr != nil && tr != nil {
			tr.discard()
		}
	}()
}

func (c *Conn) dialed(gen uint64, tr transport, err error) {
	c.cancelDial = nil
	if gen != c.gen || c.state != stateDown {
		if tr != nil {
			tr.discard()
		}
		return
	}
	if err != nil {
		c.lastErr = err
		if !c.everUp && IsConfigError(err) {
			c.giveUp(err)
			return
		}
		c.attemptFailed(err)
		c.scheduleReconnect()
		return
	}
	c.install(tr)
}
