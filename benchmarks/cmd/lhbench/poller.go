package main

import (
	"encoding/binary"
	"net"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/benchmarks/internal/wire"
)

// poller reads many hub connections from one epoll loop on one locked
// thread (the worker side of the 1×N layout).
type poller struct {
	epfd  int
	mu    sync.Mutex
	conns map[int32]*pconn
}

type pconn struct {
	fd      int
	s       *connStats
	pending []byte // the start of a frame not yet complete
}

func newPoller() (*poller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	p := &poller{epfd: epfd, conns: make(map[int32]*pconn)}
	go p.loop()
	return p, nil
}

// add takes over c's socket (and the bytes its reader already buffered).
func (p *poller) add(c *net.UnixConn, r *wire.Reader, s *connStats) (func(), error) {
	f, err := c.File() // a dup, in blocking mode
	leftover := r.Take()
	c.Close()
	if err != nil {
		return nil, err
	}
	fd, err := syscall.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		return nil, err
	}
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	pc := &pconn{fd: fd, s: s}
	if !pc.feed(leftover, time.Now().UnixNano()) {
		syscall.Close(fd)
		s.markEOF()
		return func() {}, nil
	}
	p.mu.Lock()
	p.conns[int32(fd)] = pc
	p.mu.Unlock()
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(fd)}
	if err := syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		p.drop(pc)
		return nil, err
	}
	return func() { p.drop(pc) }, nil
}

func (p *poller) drop(pc *pconn) {
	p.mu.Lock()
	if p.conns[int32(pc.fd)] != pc {
		p.mu.Unlock()
		return
	}
	delete(p.conns, int32(pc.fd))
	p.mu.Unlock()
	syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, pc.fd, nil)
	syscall.Close(pc.fd)
}

// feed parses data (appended to what is pending), recording every whole
// frame; false means a protocol error.
func (pc *pconn) feed(data []byte, now int64) bool {
	buf := data
	if len(pc.pending) > 0 {
		pc.pending = append(pc.pending, data...)
		buf = pc.pending
	}
	for len(buf) >= 4 {
		n := int(binary.BigEndian.Uint32(buf))
		if n > wire.MaxLen {
			return false
		}
		if len(buf) < 4+n {
			break
		}
		if !handleFrame(pc.s, buf[4:4+n], now) {
			return false
		}
		buf = buf[4+n:]
	}
	pc.pending = append(pc.pending[:0], buf...)
	return true
}

func (p *poller) loop() {
	runtime.LockOSThread()
	events := make([]syscall.EpollEvent, 512)
	buf := make([]byte, 256<<10)
	for {
		n, err := syscall.EpollWait(p.epfd, events, -1)
		if err != nil {
			if err == syscall.EINTR {
				continue
			}
			return
		}
		for _, ev := range events[:n] {
			p.mu.Lock()
			pc := p.conns[ev.Fd]
			p.mu.Unlock()
			if pc == nil {
				continue
			}
			for {
				k, err := syscall.Read(pc.fd, buf)
				if k > 0 {
					if !pc.feed(buf[:k], time.Now().UnixNano()) {
						pc.s.markEOF()
						p.drop(pc)
						break
					}
					if k < len(buf) {
						break // level-triggered: epoll reports what is left
					}
					continue
				}
				if err == syscall.EAGAIN || err == syscall.EINTR {
					break
				}
				pc.s.markEOF() // EOF (k == 0) or an error: the hub closed us
				p.drop(pc)
				break
			}
		}
	}
}
