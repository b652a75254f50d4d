//go:build unix

package pglisten

import (
	"fmt"
	"slices"
	"time"
)

// Reading the server: the connection's bytes are cut into protocol
// messages and dispatched (notifications, command answers, errors), and
// answered batches settle their commands.

var emptyQuery = appendQuery(nil, nil)

// readBufSize is the read buffer: hundreds of notifications per read.
const readBufSize = 64 << 10

// received processes c.rbuf[c.rpos:c.rend] after a read brought bytes. It
// returns false when the connection was torn down meanwhile (a callback
// closed it, or the stream was bad), telling the reader to stop.
func (c *Conn) received() bool {
	c.lastRx = c.l.Now()
	c.rxReads++
	gen := c.gen
	for {
		if c.ho.paused {
			return false // the rest waits in rbuf (an upgrade)
		}
		typ, body, n, want, err := nextMessage(c.rbuf[c.rpos:c.rend])
		if err != nil {
			c.fail(err)
			return false
		}
		if n == 0 {
			c.compact(want)
			return true
		}
		c.rpos += n
		c.dispatch(typ, body)
		if c.gen != gen {
			return false
		}
	}
}

// compact moves the partial message at rpos to the front and makes room for
// want bytes of it.
func (c *Conn) compact(want int) {
	if c.rpos == c.rend {
		c.rpos, c.rend = 0, 0
		if len(c.rbuf) > readBufSize {
			c.rbuf = make([]byte, readBufSize) // shrink once drained
		}
		return
	}
	if c.rpos > 0 {
		c.rend = copy(c.rbuf, c.rbuf[c.rpos:c.rend])
		c.rpos = 0
	}
	if want > len(c.rbuf) {
		nb := make([]byte, want)
		copy(nb, c.rbuf[:c.rend])
		c.rbuf = nb
	}
}

// dispatch handles one backend message: the one switch that updates state
// and calls out.
func (c *Conn) dispatch(typ byte, body []byte) {
	switch typ {
	case msgNotification:
		ch, payload, ok := parseNotification(body)
		if !ok {
			c.fail(fmt.Errorf("%w: malformed NotificationResponse", errProtocol))
			return
		}
		if string(ch) == c.chk.channel {
			c.checkNote(payload)
			return
		}
		c.chk.lastNote = c.lastRx
		if c.ho.marker != "" && c.markerFilter(ch) {
			return
		}
		if c.cfg.OnNotification != nil && c.state == stateUp {
			c.cfg.OnNotification(ch, payload)
		}
	case msgCommandComplete:
		if len(c.inflight) > 0 {
			q := c.inflight[0]
			if q.err == nil {
				q.completes++
			}
		}
	case msgEmptyQuery:
	case msgErrorResponse:
		e, err := parseError(body)
		if err != nil {
			c.fail(err)
			return
		}
		if fatalSeverity(e) {
			c.fail(e)
			return
		}
		if len(c.inflight) == 0 {
			c.log.Warn("listener: unexpected error from the server", "pid", c.pid, "reason", e)
			return
		}
		if q := c.inflight[0]; q.err == nil {
			q.err = e
		}
	case msgReadyForQuery:
		if len(c.inflight) == 0 {
			return // not ours; harmless
		}
		q := c.inflight[0]
		c.inflight[0] = nil
		c.inflight = c.inflight[1:]
		c.answered(q)
	case msgNotice:
		if e, err := parseError(body); err == nil {
			c.log.Info("listener: notice from the server", "pid", c.pid, "severity", e.Severity, "message", e.Message)
		}
	case msgDataRow:
		if len(c.inflight) > 0 && c.inflight[0].kind == queryCheck {
			if pid, ok := parsePIDRow(body); ok {
				c.chk.serverPID = pid
			}
		}
	case msgParameterStatus, msgBackendKeyData, msgRowDescription:
		// ParameterStatus arrives when a setting the server reports
		// changes (a SET, a reload); nothing here depends on one.
	default:
		c.log.Warn("listener: unexpected message from the server", "pid", c.pid, "type", string(rune(typ)))
	}
}

// answered completes a query at its ReadyForQuery.
func (c *Conn) answered(q *query) {
	switch q.kind {
	case queryProbe:
		return
	case queryCheck:
		c.checkAnswered(q)
		return
	case queryClose:
		if c.state == stateClosing {
			// Terminate follows; the server hangs up. Closing now is
			// as good as waiting for its EOF.
			c.finishClose()
		}
		return
	}
	c.cmdInflight--
	cmds := q.cmds
	took := time.Since(q.sent)
	c.adaptBatch(len(cmds), took)
	if onBatchDone != nil {
		onBatchDone(c, q, took)
	}
	v, idx := settle(len(cmds), q.completes, q.err != nil)
	var retry []*command
	var done []*command // commands to report, in order
	switch v {
	case allDone:
		done = cmds
	case allFailed:
		done = cmds
	case oneFailed:
		done = cmds[idx : idx+1]
		retry = slices.Concat(cmds[:idx], cmds[idx+1:])
	case isolateOne:
		retry = cmds
		c.isolate = true
	}
	if len(retry) > 0 {
		for _, cmd := range retry {
			cmd.waiting = true
		}
		c.pending = append(retry, c.pending...)
	}
	var err error
	if v == oneFailed || v == allFailed {
		err = q.err
		for _, cmd := range done {
			if cmd.resync {
				// A channel that was fine before the reconnect cannot
				// be LISTENed now: a server-wide condition (a
				// read-only standby after a failover, say). Healthy
				// would be a lie; try another connection, with every
				// command of this batch waiting for it.
				// (retry is already back in pending.)
				var again []*command
				for _, d := range done {
					if !d.resync {
						d.waiting = true
						again = append(again, d)
					}
				}
				c.pending = append(again, c.pending...)
				c.fail(fmt.Errorf("re-LISTEN %s: %w", QuoteIdentifier(cmd.channel), err))
				return
			}
		}
	}
	for _, cmd := range done {
		if err != nil {
			continue
		}
		if cmd.listen {
			c.set[cmd.channel] = struct{}{}
		} else {
			delete(c.set, cmd.channel)
		}
		if cmd.resync {
			c.resyncing--
		}
	}
	if c.resyncing == 0 && c.state == stateUp && !c.healthy {
		c.setHealthy(true)
	}
	for _, cmd := range done {
		// The owner gets the error and logs it as it sees fit (the hub
		// rate-limits it: a worker can make thousands of LISTENs fail);
		// enqueue gave a command without an owner a done that logs.
		// (A resync re-LISTEN has no done: its failure fails the
		// connection above.)
		if cmd.done != nil {
			cmd.done(err)
		}
	}
}
