//go:build unix

package pglisten

import (
	"errors"
	"fmt"
	"time"
)

// The command queue: LISTEN and UNLISTEN asked on the loop wait here, with
// their expiry (CommandTimeout), until flush sends them to the server in
// batches sized by how long the last ones took.

func (c *Conn) enqueue(listen bool, channel string, done func(error)) {
	if done == nil {
		// Nobody is told the outcome: a failure is logged here. (A
		// caller with a done logs, or not, as it sees fit.)
		done = func(err error) {
			if err != nil && !errors.Is(err, ErrClosed) {
				c.log.Warn("listener: command failed", "q", channel, "listen", listen, "reason", err)
			}
		}
	}
	if err := ValidChannel(channel); err != nil {
		c.later(done, err)
		return
	}
	if channel == c.chk.channel {
		c.later(done, fmt.Errorf("%w: reserved for the delivery check", ErrInvalidChannel))
		return
	}
	if c.state == stateClosing || c.state == stateClosed {
		c.later(done, c.closedErr())
		return
	}
	cmd := &command{listen: listen, channel: channel, done: done, waiting: true}
	c.pending = append(c.pending, cmd)
	if c.state == stateDown {
		c.startExpiry(cmd)
		c.hurryReconnect()
	}
	if !c.kicked {
		// flush runs at the end of this iteration, unless we are
		// called from an AfterIteration hook that runs after it: then
		// the loop could sleep in epoll_wait with the batch unsent.
		// A post guarantees another iteration comes promptly.
		c.kicked = true
		if c.l.Post(func() { c.kicked = false }) != nil {
			c.kicked = false
		}
	}
}

// closedErr is what a command on a closed Conn fails with.
func (c *Conn) closedErr() error {
	if c.fatal != nil {
		return c.fatal
	}
	return ErrClosed
}

// hurryReconnect brings a scheduled attempt forward to at most
// maxRetryWhileWaiting from now: a command is waiting for it.
func (c *Conn) hurryReconnect() {
	if c.reconnect == nil {
		return
	}
	if now := time.Now(); c.reconnectAt.Sub(now) > maxRetryWhileWaiting {
		c.reconnect.Reset(maxRetryWhileWaiting)
		c.reconnectAt = now.Add(maxRetryWhileWaiting)
	}
}

// later runs done(err) on the loop, after the current callback returns.
func (c *Conn) later(done func(error), err error) {
	if c.l.Post(func() { done(err) }) != nil {
		done(err) // the loop is stopping: no later to wait for
	}
}

// expiry is one entry of Conn.expq: current while cmd.expiring and
// cmd.deadline is still this deadline.
type expiry struct {
	cmd      *command
	deadline time.Time
}

func (e expiry) current() bool { return e.cmd.expiring && e.cmd.deadline.Equal(e.deadline) }

// startExpiry bounds how long cmd waits for a connection: O(1), one timer
// for all of them.
func (c *Conn) startExpiry(cmd *command) {
	if c.cfg.CommandTimeout <= 0 || cmd.resync || cmd.expiring {
		return
	}
	cmd.expiring = true
	cmd.deadline = time.Now().Add(c.cfg.CommandTimeout)
	c.expq = append(c.expq, expiry{cmd, cmd.deadline})
	if c.expTimer == nil {
		c.expTimer = c.l.AfterFunc(c.cfg.CommandTimeout, c.expireDue)
	}
}

// stopExpiry: cmd no longer waits for a connection. Its expq entry is
// dropped when its deadline comes.
func stopExpiry(cmd *command) { cmd.expiring = false }

// stopAllExpiry forgets every expiry: the connection is up (commands wait
// only for their turn, which the health check bounds) or nothing waits.
func (c *Conn) stopAllExpiry() {
	for _, e := range c.expq {
		e.cmd.expiring = false
	}
	c.expq = nil
	if c.expTimer != nil {
		c.expTimer.Stop()
		c.expTimer = nil
	}
}

// expireChunk bounds the commands one timer pass expires, so that a crowd
// of them (every worker's subs during an outage) cannot stall the loop: the
// rest go in the next pass, after whatever else is ready.
const expireChunk = 1024

// expireDue fails the commands whose CommandTimeout has passed with
// ErrCommandTimeout, at most expireChunk of them, and re-arms the timer for
// the next deadline.
func (c *Conn) expireDue() {
	c.expTimer = nil
	now := time.Now()
	var due []*command
	i := 0
	for ; i < len(c.expq) && len(due) < expireChunk; i++ {
		e := c.expq[i]
		if !e.current() {
			continue
		}
		if e.deadline.After(now) {
			break
		}
		cmd := e.cmd
		cmd.expiring = false
		if cmd.waiting {
			cmd.waiting = false
			c.expired++
			due = append(due, cmd)
		}
	}
	clear(c.expq[:i])
	c.expq = c.expq[i:]
	if len(c.expq) == 0 {
		c.expq = nil
	} else {
		wait := time.Duration(0)
		if len(due) < expireChunk {
			wait = max(c.expq[0].deadline.Sub(now), 0)
		}
		c.expTimer = c.l.AfterFunc(wait, c.expireDue)
	}
	if c.expired == len(c.pending) || c.expired > 64 && c.expired > len(c.pending)/2 {
		c.compactPending()
	}
	if len(due) == 0 {
		return
	}
	err := fmt.Errorf("%w (%s)", ErrCommandTimeout, c.cfg.CommandTimeout)
	if c.lastErr != nil {
		err = fmt.Errorf("%w (%s; last error: %v)", ErrCommandTimeout, c.cfg.CommandTimeout, c.lastErr)
	}
	for _, cmd := range due {
		cmd.done(err)
	}
}

// compactPending drops the expired commands from pending, keeping the order.
func (c *Conn) compactPending() {
	kept := c.pending[:0]
	for _, cmd := range c.pending {
		if cmd.waiting {
			kept = append(kept, cmd)
		}
	}
	clear(c.pending[len(kept):])
	c.pending = kept
	if len(kept) == 0 {
		c.pending = nil
	}
	c.expired = 0
}

// waitingCount is how many commands wait in pending.
func (c *Conn) waitingCount() int { return len(c.pending) - c.expired }

// Batch size. A LISTEN costs the server time proportional to the channels
// its session already listens to (PostgreSQL up to at least 17 keeps them in
// a list and searches it at commit), so one multi-statement query of many
// LISTENs on a busy session can take seconds: measured on PostgreSQL 15,
// 1,000 LISTENs take 16 ms with 1,000 channels already listened, 68 ms with
// 10,000 and 250 ms with 50,000. The server says nothing until the whole
// query has committed, and silence that long would look like a dead
// connection to the health check. So a batch carries at most batchLimit
// commands, adapted after every batch so that one query takes about
// targetBatchTime: it halves (or more) when a batch was slow and doubles
// when a full batch was fast. The rest waits its turn, in order, one query
// in flight at a time.
const (
	targetBatchTime = 50 * time.Millisecond
	initialBatch    = 256
	minBatch        = 8
	maxBatch        = 2048
)

// adaptBatch sets the next batch's bound from one answered batch of n
// commands that took took (write to ReadyForQuery). Only a batch slower
// than the target says the bound is too big, and only a full one that was
// fast says it could grow: a small batch's time is mostly the round trip.
func (c *Conn) adaptBatch(n int, took time.Duration) {
	switch {
	case n <= 0:
	case took > targetBatchTime:
		ideal := int(int64(n) * int64(targetBatchTime) / int64(took))
		c.batchLimit = max(min(ideal, c.batchLimit), c.batchLimit/4, minBatch)
	case n >= c.batchLimit && took < targetBatchTime/2:
		c.batchLimit = min(2*c.batchLimit, maxBatch)
	}
}

// flush sends the pending commands as one multi-statement query when the
// connection is up and no batch is in flight. It is the AfterIteration
// hook: everything queued during one iteration leaves in one write.
func (c *Conn) flush() {
	c.checkIdle()
	if c.state != stateUp || c.cmdInflight > 0 || c.waitingCount() == 0 || !c.chk.verified && !noCheck(c) {
		return
	}
	q := &query{kind: queryCommands}
	buf, start := beginQuery(c.qbuf[:0])
	n := 0 // entries taken off pending, expired ones included
	for _, cmd := range c.pending {
		if !cmd.waiting {
			c.expired--
			n++
			continue
		}
		if len(q.cmds) > 0 {
			if len(q.cmds) >= c.batchLimit || len(buf)-start > maxBatchBytes || c.isolate {
				break
			}
			buf = append(buf, ';')
		}
		buf = appendCommand(buf, cmd.listen, cmd.channel)
		cmd.waiting = false
		stopExpiry(cmd)
		q.cmds = append(q.cmds, cmd)
		n++
	}
	c.isolate = false
	// Off the front by reslicing: O(batch), not O(queue). append
	// reallocates (copying only what is left) when the array runs out.
	clear(c.pending[:n])
	c.pending = c.pending[n:]
	if len(c.pending) == 0 {
		c.pending = nil // let a big queue's array go
	}
	buf = finishQuery(buf, start)
	c.qbuf = buf
	if cap(buf) > 64<<10 {
		c.qbuf = nil // a one-off big batch: don't keep its buffer
	}
	if onBatchSent != nil {
		onBatchSent(c)
	}
	q.sent = time.Now()
	c.send(q, buf)
}

// send records q as in flight and writes msg. A write error declares the
// connection dead (which requeues q's commands).
func (c *Conn) send(q *query, msg []byte) {
	c.inflight = append(c.inflight, q)
	if q.kind == queryCommands {
		c.cmdInflight++
	}
	if err := c.tr.write(msg); err != nil {
		c.fail(fmt.Errorf("write: %w", err))
	}
}
