package pglisten

import (
	"context"
	"sync"
	"time"
)

// connTest is what a test set up for one Conn: the seams of conn.go, and
// the counts they keep. The counts are written and read on the Conn's loop.
type connTest struct {
	dialer          func(ctx context.Context) (transport, error)
	noCheck         bool
	batches, probes int
	batchDone       func(q *query, took time.Duration)
}

// connTests maps a *Conn to its *connTest.
var connTests sync.Map

// testOf returns c's test settings, made on first use.
func testOf(c *Conn) *connTest {
	v, _ := connTests.LoadOrStore(c, &connTest{})
	return v.(*connTest)
}

func lookup(c *Conn) *connTest {
	if v, ok := connTests.Load(c); ok {
		return v.(*connTest)
	}
	return nil
}

func init() {
	testDialer = func(c *Conn) func(ctx context.Context) (transport, error) {
		if t := lookup(c); t != nil {
			return t.dialer
		}
		return nil
	}
	noCheck = func(c *Conn) bool {
		t := lookup(c)
		return t != nil && t.noCheck
	}
	onBatchSent = func(c *Conn) { testOf(c).batches++ }
	onProbe = func(c *Conn) { testOf(c).probes++ }
	onBatchDone = func(c *Conn, q *query, took time.Duration) {
		if t := lookup(c); t != nil && t.batchDone != nil {
			t.batchDone(q, took)
		}
	}
}

// What the tests look at inside a Conn.

// checkChannel is the private channel of the delivery check: LISTENed on
// every connection, never delivered to OnNotification, refused to Listen.
func (c *Conn) checkChannel() string { return c.chk.channel }

// backendPIDs reports the connection's pid from BackendKeyData and the
// server's pg_backend_pid() (0 until the check asked for it). They differ
// when a pooler or proxy sits between.
func (c *Conn) backendPIDs() (keyData, server uint32) { return c.pid, c.chk.serverPID }
