package pglisten

// What the tests look at inside a Conn.

// checkChannel is the private channel of the delivery check: LISTENed on
// every connection, never delivered to OnNotification, refused to Listen.
func (c *Conn) checkChannel() string { return c.chk.channel }

// backendPIDs reports the connection's pid from BackendKeyData and the
// server's pg_backend_pid() (0 until the check asked for it). They differ
// when a pooler or proxy sits between.
func (c *Conn) backendPIDs() (keyData, server uint32) { return c.pid, c.chk.serverPID }
