//go:build unix

package pglisten

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"github.com/listenhub/listenhub/internal/pgquote"
	"github.com/listenhub/listenhub/loop"
)

// The delivery check (docs/design.md rule 13): healthy means notifications
// provably arrive, not merely that the server answers.
//
// Every connection, before it reports healthy or runs a single command of
// its owner, LISTENs on a private channel of its own, asks the server for
// pg_backend_pid() and NOTIFYs the channel, and waits for the notification
// to come back. A backend pid that differs from the one in BackendKeyData
// means something sits between us and the server that made up its own key
// (PgBouncer does, in every pool mode). Through a transaction-pooling
// PgBouncer our own NOTIFY comes back all the same (the pooler hands the
// next transaction the server it just used, which delivers its own
// notification before ReadyForQuery, while we are still linked to it),
// but notifications from anyone else arrive while we are not linked and are
// thrown away. So when the pids differ the proof must come from another
// session: a short-lived second connection with the same settings sends
// the NOTIFY. A session pooler passes that (healthy; one log line says a
// pooler is there); a transaction pooler does not: the connection is
// unhealthy, dropped and retried with backoff, and one line (repeated at
// most every retryLogEvery) says what it most likely is.
//
// A direct connection needs no second session: the pids match, and its
// own NOTIFY coming back proves the LISTEN is in place and notifications
// flow. After that the health check repeats the own-NOTIFY every
// checkEvery intervals of a connection that delivered nothing meanwhile,
// instead of the empty query: an empty query answered proves the server
// is there, not that notifications still arrive. Each such NOTIFY is a tiny
// transaction (one transaction id, one commit record).

// checkState is a Conn's delivery check. The channel is the Conn's for its
// whole life; the rest describes the current connection and is reset by
// teardown.
type checkState struct {
	channel string
	// listening: channel is LISTENed on the current connection.
	listening bool
	// verified: the current connection proved that notifications arrive;
	// until then no command is sent and the Conn is not healthy.
	verified bool
	// awaiting is the payload of the check NOTIFY waited for ("" when
	// none); peer says it comes from a second session; timer is its
	// deadline (nil while the peer has not sent it yet).
	awaiting string
	peer     bool
	timer    *loop.Timer
	// serverPID is pg_backend_pid() of the current connection (0 until
	// known); compared with Conn.pid, from BackendKeyData.
	serverPID uint32
	// lastNote is when the last notification of any channel arrived: a
	// connection that delivers needs no end-to-end probe.
	lastNote time.Time
	seq      uint64
	// checks counts the end-to-end NOTIFYs the health check sent, failed
	// the checks that failed (tests).
	checks, failed int
	// lastMsg and lastAt rate-limit the log lines of failed checks (a
	// connection made and dropped every second must not log each time).
	lastMsg string
	lastAt  time.Time
}

func (c *Conn) nextCheckPayload() string {
	c.chk.seq++
	return strconv.FormatUint(c.chk.seq, 10)
}

// startCheck runs the first check of a freshly installed connection: LISTEN
// the private channel and ask pg_backend_pid() in one query, NOTIFY it in a
// second, both in one write.
func (c *Conn) startCheck() {
	payload := c.nextCheckPayload()
	q1 := &query{kind: queryCheck, listenCheck: true}
	q2 := &query{kind: queryCheck}
	sql := pgquote.AppendIdent([]byte("LISTEN "), c.chk.channel)
	sql = append(sql, "; SELECT pg_backend_pid()"...)
	msg := appendQuery(nil, sql)
	msg = appendQuery(msg, appendNotify(nil, c.chk.channel, payload))
	c.inflight = append(c.inflight, q1, q2)
	c.await(payload, false)
	if err := c.tr.write(msg); err != nil {
		c.fail(fmt.Errorf("write: %w", err))
	}
}

// sendCheck sends the health check's end-to-end NOTIFY (with the LISTEN
// first when an adopted connection does not have it yet).
func (c *Conn) sendCheck() {
	payload := c.nextCheckPayload()
	var sql []byte
	if !c.chk.listening {
		sql = pgquote.AppendIdent([]byte("LISTEN "), c.chk.channel)
		sql = append(sql, "; "...)
	}
	sql = appendNotify(sql, c.chk.channel, payload)
	c.chk.checks++
	c.await(payload, false)
	c.send(&query{kind: queryCheck, listenCheck: !c.chk.listening}, appendQuery(nil, sql))
}

// await starts waiting for the check NOTIFY carrying payload. The deadline
// runs from now, except for a peer's, which starts once the peer says it
// committed (peerSent).
func (c *Conn) await(payload string, peer bool) {
	c.stopCheckTimer()
	c.chk.awaiting, c.chk.peer = payload, peer
	if !peer {
		c.chk.timer = c.l.AfterFunc(c.cfg.HealthCheckTimeout, c.checkExpired)
	}
}

func (c *Conn) stopCheckTimer() {
	if c.chk.timer != nil {
		c.chk.timer.Stop()
		c.chk.timer = nil
	}
}

// resetCheck forgets the current connection's check (teardown, Pause).
func (c *Conn) resetCheck() {
	c.stopCheckTimer()
	c.chk.awaiting, c.chk.peer = "", false
}

// checkDue reports whether the health check should send the end-to-end
// NOTIFY now rather than the empty query.
func (c *Conn) checkDue(now time.Time) bool {
	return !noCheck(c) && c.chk.verified && c.chk.awaiting == "" && !c.ho.holding && !c.ho.paused &&
		now.Sub(c.chk.lastNote) >= checkEvery*c.cfg.HealthCheckInterval
}

// checkNote handles a notification on the private channel.
func (c *Conn) checkNote(payload []byte) {
	c.chk.lastNote = c.lastRx
	if c.chk.awaiting == "" || string(payload) != c.chk.awaiting {
		return // a check given up on (Pause), or a duplicate
	}
	peer := c.chk.peer
	c.resetCheck()
	if c.chk.verified {
		return
	}
	if !peer && c.chk.serverPID != c.pid {
		c.startPeerCheck()
		return
	}
	c.checkPassed(peer)
}

// checkAnswered handles the ReadyForQuery of a check query.
func (c *Conn) checkAnswered(q *query) {
	if q.err != nil {
		if c.chk.verified && !q.listenCheck {
			// The NOTIFY itself failed on a connection that has
			// delivered: a server-wide condition (the notification
			// queue is full), not this connection's. Reconnecting
			// would not help; the next check tries again.
			c.resetCheck()
			c.warnOnce(fmt.Sprintf("listener: delivery check: NOTIFY failed: %v", q.err))
			return
		}
		c.fail(fmt.Errorf("listener: delivery check: %w", q.err))
		return
	}
	if q.listenCheck {
		c.chk.listening = true
	}
}

// startPeerCheck asks a second session to NOTIFY the private channel: the
// pids say a pooler sits between, and only a notification from another
// session proves that this one hears others.
func (c *Conn) startPeerCheck() {
	payload := c.nextCheckPayload()
	c.await(payload, true)
	cfg := c.cfg.ConnConfig
	if cfg == nil {
		c.fail(fmt.Errorf("%w: a pooler sits between (the backend pid differs from BackendKeyData's) and no second connection can be made to check it",
			ErrNotDelivered))
		return
	}
	gen, ch, l := c.gen, c.chk.channel, c.l
	go func() {
		err := notifyFrom(cfg, ch, payload)
		_ = l.Post(func() { c.peerSent(gen, err) })
	}()
}

// peerSent: the second session's NOTIFY committed (or failed); from now
// the notification has HealthCheckTimeout to arrive.
func (c *Conn) peerSent(gen uint64, err error) {
	if gen != c.gen || c.state != stateUp || !c.chk.peer || c.chk.awaiting == "" {
		return // arrived already, or another connection by now
	}
	if err != nil {
		c.fail(fmt.Errorf("%w: a pooler sits between (the backend pid differs from BackendKeyData's) and a second connection to check it failed: %v",
			ErrNotDelivered, err))
		return
	}
	c.chk.timer = c.l.AfterFunc(c.cfg.HealthCheckTimeout, c.checkExpired)
}

// checkExpired: the awaited check NOTIFY did not come in time.
func (c *Conn) checkExpired() {
	c.chk.timer = nil
	if c.state != stateUp || c.chk.awaiting == "" {
		return
	}
	to := c.cfg.HealthCheckTimeout
	var err error
	switch {
	case c.chk.peer:
		err = fmt.Errorf("%w: %s (the backend pid differs from BackendKeyData's: a pooler sits between, and a NOTIFY from a second session did not arrive within %s)",
			ErrNotDelivered, poolerAdvice, to)
	case c.chk.verified:
		err = fmt.Errorf("%w any more: a NOTIFY on it did not come back within %s", ErrNotDelivered, to)
	default:
		err = fmt.Errorf("%w: LISTEN and NOTIFY on it brought nothing back within %s", ErrNotDelivered, to)
	}
	c.resetCheck()
	c.fail(err)
}

// checkPassed: the current connection delivers. Everything that waited for
// it goes now.
func (c *Conn) checkPassed(peer bool) {
	c.chk.verified = true
	c.chk.lastNote = c.l.Now()
	if peer {
		c.log.Info("listener: connected through a pooler that delivers notifications (session pooling)",
			"pid", c.chk.serverPID, "backend_key_pid", c.pid, "channels", len(c.set))
	} else {
		c.log.Info("listener: connected", "pid", c.pid, "tls", c.tr.isTLS(), "channels", len(c.set))
	}
	c.ready()
}

// warnOnce logs msg at most once per retryLogEvery while it stays the
// same.
func (c *Conn) warnOnce(msg string) {
	now := time.Now()
	if msg == c.chk.lastMsg && now.Sub(c.chk.lastAt) < retryLogEvery {
		return
	}
	c.chk.lastAt, c.chk.lastMsg = now, msg
	c.log.Warn(msg)
}

// notDelivered reports a failed delivery check to OnNotDelivered, or logs
// it: one line, the reason first, repeated at most every retryLogEvery
// while it stays the same.
func (c *Conn) notDelivered(err error) {
	c.chk.failed++
	if c.cfg.OnNotDelivered != nil {
		c.cfg.OnNotDelivered(err)
		return
	}
	msg := err.Error()
	now := time.Now()
	if msg == c.chk.lastMsg && now.Sub(c.chk.lastAt) < retryLogEvery {
		return
	}
	c.chk.lastAt, c.chk.lastMsg = now, msg
	c.log.Error(msg, "pid", c.chk.serverPID, "backend_key_pid", c.pid)
}

// parsePIDRow reads the one int4 text column of a DataRow.
func parsePIDRow(body []byte) (uint32, bool) {
	if len(body) < 6 || binary.BigEndian.Uint16(body) != 1 {
		return 0, false
	}
	n := int32(binary.BigEndian.Uint32(body[2:]))
	if n < 0 || int(n) != len(body)-6 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(body[6:]), 10, 32)
	return uint32(v), err == nil
}
