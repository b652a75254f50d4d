//go:build linux && !listenhub_poll

package loop

import (
	"os"

	"golang.org/x/sys/unix"
)

// Backend names the readiness interface compiled in: "epoll" here, "poll"
// where poll(2) is used.
const Backend = "epoll"

// backend is epoll: the kernel keeps the interest set, and each registration
// carries its fd and generation in the event's data, so that a wait returns
// exactly what the loop needs to find the handler and drop stale events.
type backend struct {
	epfd   int
	wakefd int // eventfd: wake writes to it to end epoll_wait
	events []unix.EpollEvent
}

func newBackend(maxEvents int) (*backend, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, os.NewSyscallError("eventfd", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wakefd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &ev); err != nil {
		unix.Close(wakefd)
		unix.Close(epfd)
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	return &backend{epfd: epfd, wakefd: wakefd, events: make([]unix.EpollEvent, maxEvents)}, nil
}

func toEpoll(ev Events) uint32 {
	var e uint32 = unix.EPOLLRDHUP
	if ev&Readable != 0 {
		e |= unix.EPOLLIN
	}
	if ev&Writable != 0 {
		e |= unix.EPOLLOUT
	}
	return e
}

func (b *backend) add(fd int, ev Events, gen uint32) error {
	e := unix.EpollEvent{Events: toEpoll(ev), Fd: int32(fd), Pad: int32(gen)}
	return os.NewSyscallError("epoll_ctl", unix.EpollCtl(b.epfd, unix.EPOLL_CTL_ADD, fd, &e))
}

func (b *backend) mod(fd int, ev Events, gen uint32) error {
	e := unix.EpollEvent{Events: toEpoll(ev), Fd: int32(fd), Pad: int32(gen)}
	return os.NewSyscallError("epoll_ctl", unix.EpollCtl(b.epfd, unix.EPOLL_CTL_MOD, fd, &e))
}

func (b *backend) del(fd int) error {
	return os.NewSyscallError("epoll_ctl", unix.EpollCtl(b.epfd, unix.EPOLL_CTL_DEL, fd, nil))
}

// wait appends to out what one epoll_wait reported, the wake-up eventfd
// drained and left out. EINTR reports nothing and no error.
func (b *backend) wait(out []ready, timeoutMs int) ([]ready, error) {
	n, err := unix.EpollWait(b.epfd, b.events, timeoutMs)
	if err != nil {
		if err == unix.EINTR {
			return out, nil
		}
		return out, os.NewSyscallError("epoll_wait", err)
	}
	for i := 0; i < n; i++ {
		e := &b.events[i]
		if int(e.Fd) == b.wakefd {
			var buf [8]byte
			// The eventfd is a counter: one read resets it, however
			// many writes.
			_, _ = unix.Read(b.wakefd, buf[:])
			continue
		}
		var ev Events
		if e.Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLPRI) != 0 {
			ev |= Readable
		}
		if e.Events&unix.EPOLLOUT != 0 {
			ev |= Writable
		}
		if e.Events&(unix.EPOLLHUP|unix.EPOLLERR) != 0 {
			ev |= Readable | Writable
		}
		out = append(out, ready{fd: e.Fd, gen: uint32(e.Pad), ev: ev})
	}
	return out, nil
}

// wake makes the current or next wait return.
func (b *backend) wake() {
	one := [8]byte{1, 0, 0, 0, 0, 0, 0, 0} // little-endian uint64 1
	for {
		_, err := unix.Write(b.wakefd, one[:])
		if err == unix.EINTR {
			continue
		}
		// EAGAIN means the counter is at its maximum: the loop is
		// already bound to wake. Other errors mean the eventfd is
		// closed, i.e. the loop is gone.
		return
	}
}

func (b *backend) close() {
	// close(2) is not retried on EINTR: on Linux the descriptor is gone
	// whatever the result.
	unix.Close(b.wakefd)
	unix.Close(b.epfd)
}
