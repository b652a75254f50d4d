//go:build unix

package pglisten

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/loop"
)

// transport moves the bytes of one hijacked connection. Reads are pushed
// into the Conn (Conn.received, Conn.readFailed) on the loop goroutine.
type transport interface {
	// start begins serving on the loop goroutine for c at gen.
	start(c *Conn, gen uint64) error
	// write sends b or keeps what the kernel (or the bridge) has not taken
	// yet; it never blocks and does not retain b.
	write(b []byte) error
	// close stops serving and releases the connection. Loop goroutine.
	close()
	// discard releases a transport that was never started. Any goroutine.
	discard()
	backendPID() uint32
	isTLS() bool
}

// dial connects and authenticates with pgconn (every method it supports:
// password, md5, SCRAM, certificates, GSS if compiled in, multiple hosts,
// target_session_attrs), makes sure no message is left buffered in pgconn
// (SyncConn), hijacks the connection and prepares the transport for it. It
// blocks: never call it on the loop goroutine.
func dial(ctx context.Context, cfg *pgconn.Config) (transport, error) {
	pc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, connectErr(err)
	}
	if err := pc.SyncConn(ctx); err != nil {
		pc.Close(context.Background())
		return nil, fmt.Errorf("listener: sync: %w", err)
	}
	hc, err := pc.Hijack()
	if err != nil {
		pc.Close(context.Background())
		return nil, fmt.Errorf("listener: hijack: %w", err)
	}
	conn := hc.Conn
	_ = conn.SetDeadline(time.Time{})
	if tc, ok := conn.(*tls.Conn); ok {
		return newBridge(tc, tc.NetConn(), hc.PID, true), nil
	}
	if sc, ok := conn.(syscall.Conn); ok {
		fd, err := dupFD(sc)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("listener: %w", err)
		}
		// The dup keeps the socket open; closing the original
		// removes it from Go's netpoller (which deletes its epoll
		// registration explicitly), so only our loop watches it.
		conn.Close()
		return &fdTransport{fd: fd, pid: hc.PID}, nil
	}
	// A custom DialFunc returned something without a descriptor: serve
	// it like TLS, through the bridge.
	return newBridge(conn, conn, hc.PID, false), nil
}

// dupFD duplicates the descriptor of a net.Conn (close-on-exec) and makes
// sure it is non-blocking. O_NONBLOCK lives on the open file description,
// which the dup shares, so Go's own setting carries over; setting it again
// is cheap insurance against a DialFunc that handed over a blocking one.
func dupFD(sc syscall.Conn) (int, error) {
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("syscall conn: %w", err)
	}
	nfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) {
		nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, fmt.Errorf("control: %w", err)
	}
	if derr != nil {
		return -1, os.NewSyscallError("fcntl(F_DUPFD_CLOEXEC)", derr)
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return -1, os.NewSyscallError("fcntl(O_NONBLOCK)", err)
	}
	return nfd, nil
}

// fdTransport drives a plaintext socket from the loop: no goroutine.
type fdTransport struct {
	fd  int
	pid uint32
	c   *Conn
	tok loop.Token
	// out holds what the kernel has not taken yet; Writable is armed
	// exactly while it is non-empty.
	out []byte
}

func (t *fdTransport) backendPID() uint32 { return t.pid }
func (t *fdTransport) isTLS() bool        { return false }

func (t *fdTransport) start(c *Conn, gen uint64) error {
	t.c = c
	tok, err := c.l.Register(t.fd, loop.Readable, t.handle)
	if err != nil {
		return err
	}
	t.tok = tok
	return nil
}

// maxReadsPerEvent bounds the reads of one readiness event so that a
// firehose of notifications cannot starve the workers' sockets; the loop is
// level-triggered, so what is left is read next iteration.
const maxReadsPerEvent = 8

func (t *fdTransport) handle(ev loop.Events) {
	c := t.c
	gen := c.gen
	if ev&loop.Writable != 0 {
		if err := t.flushOut(); err != nil {
			c.fail(fmt.Errorf("write: %w", err))
			return
		}
	}
	if ev&loop.Readable == 0 || c.ho.paused {
		return
	}
	for i := 0; i < maxReadsPerEvent && c.gen == gen; i++ {
		space := c.rbuf[c.rend:]
		n, err := unix.Read(t.fd, space)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return
		case err != nil:
			c.readFailed(os.NewSyscallError("read", err))
			return
		case n == 0:
			c.readFailed(io.EOF)
			return
		}
		c.rend += n
		if !c.received() || n < len(space) {
			// A short read means the socket is drained (or the
			// connection was torn down): don't pay for the EAGAIN.
			return
		}
	}
}

func (t *fdTransport) write(b []byte) error {
	if len(t.out) > 0 {
		t.out = append(t.out, b...)
		return nil
	}
	for len(b) > 0 {
		n, err := unix.Write(t.fd, b)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			break
		}
		if err != nil {
			return os.NewSyscallError("write", err)
		}
		b = b[n:]
	}
	if len(b) == 0 {
		return nil
	}
	t.out = append(t.out, b...)
	return t.c.l.Modify(t.tok, t.interest())
}

func (t *fdTransport) flushOut() error {
	for len(t.out) > 0 {
		n, err := unix.Write(t.fd, t.out)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return nil
		}
		if err != nil {
			return os.NewSyscallError("write", err)
		}
		t.out = t.out[n:]
	}
	t.out = nil
	return t.c.l.Modify(t.tok, t.interest())
}

func (t *fdTransport) close() {
	if t.tok.Valid() {
		_ = t.c.l.Unregister(t.tok)
		t.tok = loop.Token{}
	}
	t.discard()
}

func (t *fdTransport) discard() {
	if t.fd >= 0 {
		// close(2) is not retried on EINTR: on Linux the descriptor is
		// gone whatever the result.
		unix.Close(t.fd)
		t.fd = -1
	}
}

// bridge serves a connection the loop cannot drive from an fd (TLS: the
// record layer lives in crypto/tls). One goroutine blocks in Read and posts
// each chunk to the loop, which parses it exactly like the fd path. Writes
// never block the loop either: they are handed to a short-lived goroutine,
// one at a time, and what is queued meanwhile goes in the next one — the
// bridge's equivalent of arming Writable.
type bridge struct {
	conn  net.Conn // what to read and write (the *tls.Conn)
	raw   net.Conn // what to close: the socket under it
	pid   uint32
	tlsOn bool

	c   *Conn
	gen uint64

	// free circulates the two read buffers between the reader goroutine
	// and the loop: the reader fills one while the loop parses the other.
	// Only two exist and the channel holds two, so the loop's send never
	// blocks.
	free chan []byte
	stop chan struct{}

	// Loop-goroutine state. out collects writes while wbuf is being
	// written by the writer goroutine (writing).
	out, wbuf []byte
	writing   bool
	closed    bool
}

const bridgeBufSize = 32 << 10

func newBridge(conn, raw net.Conn, pid uint32, tlsOn bool) *bridge {
	b := &bridge{conn: conn, raw: raw, pid: pid, tlsOn: tlsOn,
		free: make(chan []byte, 2), stop: make(chan struct{})}
	b.free <- make([]byte, bridgeBufSize)
	b.free <- make([]byte, bridgeBufSize)
	return b
}

func (b *bridge) backendPID() uint32 { return b.pid }
func (b *bridge) isTLS() bool        { return b.tlsOn }

func (b *bridge) start(c *Conn, gen uint64) error {
	b.c, b.gen = c, gen
	go b.readLoop()
	return nil
}

func (b *bridge) readLoop() {
	l := b.c.l
	for {
		var buf []byte
		select {
		case buf = <-b.free:
		case <-b.stop:
			return
		}
		n, err := b.conn.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if l.Post(func() { b.feed(chunk); b.free <- buf }) != nil {
				return
			}
		} else {
			b.free <- buf
		}
		if err != nil {
			_ = l.Post(func() {
				if b.c.gen == b.gen && !b.closed {
					b.c.readFailed(err)
				}
			})
			return
		}
	}
}

// feed copies a chunk the reader brought into the Conn's read buffer and
// parses it. Loop goroutine.
func (b *bridge) feed(chunk []byte) {
	c := b.c
	for len(chunk) > 0 && c.gen == b.gen && !b.closed {
		if c.ho.paused {
			c.hold(chunk) // an upgrade: kept for Resume
			return
		}
		k := copy(c.rbuf[c.rend:], chunk)
		c.rend += k
		chunk = chunk[k:]
		if !c.received() {
			return
		}
	}
}

func (b *bridge) write(p []byte) error {
	if b.closed {
		return net.ErrClosed
	}
	b.out = append(b.out, p...)
	if !b.writing {
		b.startWrite()
	}
	return nil
}

func (b *bridge) startWrite() {
	b.writing = true
	b.wbuf, b.out = b.out, b.wbuf[:0]
	w, l := b.wbuf, b.c.l
	go func() {
		_, err := b.conn.Write(w)
		_ = l.Post(func() { b.wrote(err) })
	}()
}

func (b *bridge) wrote(err error) {
	b.writing = false
	if b.closed {
		return
	}
	if err != nil {
		if b.c.gen == b.gen {
			b.c.fail(fmt.Errorf("write: %w", err))
		}
		return
	}
	if len(b.out) > 0 {
		b.startWrite()
	}
}

func (b *bridge) close() {
	if b.closed {
		return
	}
	b.closed = true
	close(b.stop)
	b.discard()
}

// discard closes the socket under the TLS layer: tls.Conn.Close would first
// write a close_notify alert, which can block for seconds on a dead peer.
func (b *bridge) discard() {
	_ = b.raw.Close() // dropped anyway: nothing to do with an error
}
