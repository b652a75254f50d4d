// Package fdpass sends messages that carry open file descriptors between two
// processes over a SOCK_SEQPACKET Unix socket pair (SCM_RIGHTS). A hot
// upgrade hands the hub's sockets to the new process with it.
//
// A message is a byte body of any size plus any number of descriptors. It
// travels as a series of packets of at most maxData bytes and at most
// MaxFDsPerPacket descriptors each: the kernel caps one SCM_RIGHTS message at
// 253 descriptors (SCM_MAX_FD), and a packet socket's send buffer bounds one
// packet's size. The first byte of every packet says whether more follow.
// SOCK_SEQPACKET keeps packet boundaries, so every descriptor arrives with
// the packet it was sent with, in order.
//
// Descriptors are close-on-exec from birth on Linux (SOCK_CLOEXEC,
// MSG_CMSG_CLOEXEC). Elsewhere the flag is set with fcntl while
// syscall.ForkLock is held, so that no exec in between inherits one. Pair
// asks for a large send buffer, past the system's cap only on Linux
// (SO_SNDBUFFORCE, with CAP_NET_ADMIN). Where AF_UNIX has no
// SOCK_SEQPACKET (macOS), Pair fails with the system's error.
//go:build unix

package fdpass

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// MaxFDsPerPacket stays under the kernel's SCM_MAX_FD (253).
	MaxFDsPerPacket = 250
	// maxData is the body bytes per packet: well under the default socket
	// send buffer (~208 KiB), so a packet never fails for EMSGSIZE.
	maxData = 32 << 10
	// maxMessage bounds what Recv assembles, so that a confused peer cannot
	// make it allocate without end.
	maxMessage = 1 << 32
	// bulkBuffer is the send buffer Pair asks for.
	bulkBuffer = 16 << 20

	flagLast = 0
	flagMore = 1
)

// Pair returns the two ends of a new SOCK_SEQPACKET socket pair, both
// close-on-exec: pass one to a child through exec.Cmd.ExtraFiles (which
// clears the flag on the child's copy).
func Pair() (a, b *os.File, err error) {
	fds, err := socketpair()
	if err != nil {
		return nil, nil, os.NewSyscallError("socketpair", err)
	}
	// Large buffers: a hot upgrade's bulk (the workers' unsent bytes)
	// then crosses in few round trips between the two processes.
	for _, fd := range fds {
		setSendBuffer(fd, bulkBuffer)
	}
	return os.NewFile(uintptr(fds[0]), "fdpass"), os.NewFile(uintptr(fds[1]), "fdpass"), nil
}

// Conn is one end of the pair.
type Conn struct {
	c *net.UnixConn
}

// New wraps f, an end of a SOCK_SEQPACKET pair (from Pair, or inherited).
// f is not used afterwards; the caller closes it.
func New(f *os.File) (*Conn, error) {
	fc, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("fdpass: %w", err)
	}
	uc, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return nil, fmt.Errorf("fdpass: %T is not a Unix socket", fc)
	}
	return &Conn{c: uc}, nil
}

// SetDeadline bounds the Send and Recv calls that follow.
func (c *Conn) SetDeadline(t time.Time) error { return c.c.SetDeadline(t) }

// Close closes this end; the peer's Recv sees EOF.
func (c *Conn) Close() error { return c.c.Close() }

// Send sends body with fds. The descriptors stay open in this process (the
// receiver gets duplicates).
func (c *Conn) Send(body []byte, fds []int) error {
	pkt := make([]byte, 0, 1+min(len(body), maxData))
	for first := true; first || len(body) > 0 || len(fds) > 0; first = false {
		n := min(len(body), maxData)
		k := min(len(fds), MaxFDsPerPacket)
		flag := byte(flagLast)
		if n < len(body) || k < len(fds) {
			flag = flagMore
		}
		pkt = append(append(pkt[:0], flag), body[:n]...)
		var oob []byte
		if k > 0 {
			oob = unix.UnixRights(fds[:k]...)
		}
		if _, _, err := c.c.WriteMsgUnix(pkt, oob, nil); err != nil {
			return fmt.Errorf("fdpass: send: %w", err)
		}
		body, fds = body[n:], fds[k:]
	}
	return nil
}

// SendParts sends the concatenation of parts as one message without
// descriptors, and without concatenating them first: a hot upgrade sends a
// worker's unsent bytes straight from its buffer.
func (c *Conn) SendParts(parts ...[]byte) error {
	parts = append([][]byte(nil), parts...) // consumed below, not the caller's
	pkt := make([]byte, 0, 1+maxData)
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	for first := true; first || total > 0; first = false {
		pkt = append(pkt[:0], flagMore)
		for len(pkt) < 1+maxData && len(parts) > 0 {
			n := min(len(parts[0]), 1+maxData-len(pkt))
			pkt = append(pkt, parts[0][:n]...)
			if parts[0] = parts[0][n:]; len(parts[0]) == 0 {
				parts = parts[1:]
			}
		}
		total -= len(pkt) - 1
		if total == 0 {
			pkt[0] = flagLast
		}
		if _, _, err := c.c.WriteMsgUnix(pkt, nil, nil); err != nil {
			return fmt.Errorf("fdpass: send: %w", err)
		}
	}
	return nil
}

// RecvSized is Recv for a message of about size bytes: its body is
// allocated once, at that size.
func (c *Conn) RecvSized(size int) (body []byte, fds []int, err error) {
	return c.recv(make([]byte, 0, min(uint64(max(size, 0)), maxMessage)))
}

// ErrTruncated means a packet or its descriptors did not fit the receive
// buffers: the peer does not speak this format.
var ErrTruncated = errors.New("fdpass: truncated packet")

// Recv receives one message. The descriptors are new in this process,
// close-on-exec; the caller owns them. On an error every descriptor received
// so far is closed.
func (c *Conn) Recv() (body []byte, fds []int, err error) { return c.recv(nil) }

func (c *Conn) recv(body []byte) (_ []byte, fds []int, err error) {
	defer func() {
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			fds = nil
		}
	}()
	rc, err := c.c.SyscallConn()
	if err != nil {
		return nil, nil, fmt.Errorf("fdpass: recv: %w", err)
	}
	var flag [1]byte
	var buf []byte // for packets that do not fit body's spare room
	oob := make([]byte, unix.CmsgSpace(4*MaxFDsPerPacket))
	iov := make([][]byte, 2)
	for {
		// Straight into body's spare room when a whole packet fits: a
		// sized message (RecvSized) is read without a copy but the last
		// packet's. One byte more than a packet holds, to see a longer one.
		iov[0] = flag[:]
		direct := cap(body)-len(body) >= maxData+1
		if direct {
			iov[1] = body[len(body) : len(body)+maxData+1]
		} else {
			if buf == nil {
				buf = make([]byte, maxData+1)
			}
			iov[1] = buf
		}
		var n, oobn, rflags int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			for {
				n, oobn, rflags, rerr = recvmsg(int(fd), iov, oob)
				if rerr != unix.EINTR {
					return rerr != unix.EAGAIN
				}
			}
		})
		if err == nil && rerr != nil {
			err = os.NewSyscallError("recvmsg", rerr)
		}
		if oobn > 0 {
			got, perr := parseRights(oob[:oobn])
			fds = append(fds, got...)
			if perr != nil {
				return nil, fds, perr
			}
		}
		if err != nil {
			return nil, fds, fmt.Errorf("fdpass: recv: %w", err)
		}
		if n == 0 {
			return nil, fds, fmt.Errorf("fdpass: recv: %w", os.ErrClosed)
		}
		if rflags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n > 1+maxData {
			return nil, fds, ErrTruncated
		}
		if uint64(len(body))+uint64(n-1) > maxMessage {
			return nil, fds, fmt.Errorf("fdpass: message over %d bytes", uint64(maxMessage))
		}
		if direct {
			body = body[:len(body)+n-1]
		} else {
			body = append(body, buf[:n-1]...)
		}
		if flag[0] == flagLast {
			return body, fds, nil
		}
	}
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("fdpass: control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue // not SCM_RIGHTS (credentials, say): nothing to own
		}
		fds = append(fds, got...)
	}
	return fds, nil
}
