//go:build unix && (!linux || listenhub_poll)

package loop

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Backend names the readiness interface compiled in: "poll" here, "epoll"
// where epoll is used.
const Backend = "poll"

// backend is poll(2). The interest set lives here, as the array every wait
// hands to the kernel: fds[0] is the wake-up pipe, the rest are the loop's
// registrations in no particular order. pos finds an fd's slot, so that
// Modify and Unregister cost O(1) like epoll_ctl; Unregister moves the last
// slot into the hole. A wait costs one pass over the whole array.
type backend struct {
	fds   []unix.PollFd
	gens  []uint32 // gens[i] is the generation fds[i] was registered under
	pos   []int32  // indexed by fd: its slot in fds plus one; 0 when absent
	wakeR int      // self-pipe: wake writes a byte to wakeW, wait drains wakeR
	wakeW int
}

func newBackend(int) (*backend, error) {
	// A self-pipe, on Linux too, so that the wake-up path CI tests here
	// is the one macOS and FreeBSD run. pipe2 is not on macOS, so the
	// flags are set afterwards, under ForkLock as the standard library
	// does, so that no fork in between inherits the pipe.
	var p [2]int
	syscall.ForkLock.RLock()
	err := unix.Pipe(p[:])
	if err == nil {
		unix.CloseOnExec(p[0])
		unix.CloseOnExec(p[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, os.NewSyscallError("pipe", err)
	}
	for _, fd := range p {
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(p[0])
			unix.Close(p[1])
			return nil, os.NewSyscallError("fcntl", err)
		}
	}
	return &backend{
		fds:   []unix.PollFd{{Fd: int32(p[0]), Events: unix.POLLIN}},
		gens:  []uint32{0},
		wakeR: p[0],
		wakeW: p[1],
	}, nil
}

func toPoll(ev Events) int16 {
	var e int16
	if ev&Readable != 0 {
		e |= unix.POLLIN
	}
	if ev&Writable != 0 {
		e |= unix.POLLOUT
	}
	return e
}

func (b *backend) slot(fd int) int {
	if fd < 0 || fd >= len(b.pos) {
		return -1
	}
	return int(b.pos[fd]) - 1
}

func (b *backend) add(fd int, ev Events, gen uint32) error {
	// epoll_ctl refuses a descriptor that is not open; poll would only
	// say so (POLLNVAL) on every later wait. Refuse it here as well.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return os.NewSyscallError("fcntl", err)
	}
	if b.slot(fd) >= 0 {
		return os.NewSyscallError("poll: add", unix.EEXIST)
	}
	if fd >= cap(b.pos) {
		grown := make([]int32, fd+1, max(2*cap(b.pos), fd+1, 64))
		copy(grown, b.pos)
		b.pos = grown
	} else if fd >= len(b.pos) {
		b.pos = b.pos[:fd+1]
	}
	b.fds = append(b.fds, unix.PollFd{Fd: int32(fd), Events: toPoll(ev)})
	b.gens = append(b.gens, gen)
	b.pos[fd] = int32(len(b.fds))
	return nil
}

func (b *backend) mod(fd int, ev Events, gen uint32) error {
	i := b.slot(fd)
	if i < 0 {
		return os.NewSyscallError("poll: modify", unix.ENOENT)
	}
	b.fds[i].Events = toPoll(ev)
	b.gens[i] = gen
	return nil
}

func (b *backend) del(fd int) error {
	i := b.slot(fd)
	if i < 0 {
		return os.NewSyscallError("poll: delete", unix.ENOENT)
	}
	last := len(b.fds) - 1
	if i != last {
		b.fds[i] = b.fds[last]
		b.gens[i] = b.gens[last]
		b.pos[b.fds[i].Fd] = int32(i + 1)
	}
	b.fds = b.fds[:last]
	b.gens = b.gens[:last]
	b.pos[fd] = 0
	return nil
}

// wait appends to out what one poll reported, the wake-up pipe drained and
// left out. Events are collected before any handler runs, because a
// handler's Unregister reorders the array. EINTR reports nothing and no
// error.
func (b *backend) wait(out []ready, timeoutMs int) ([]ready, error) {
	n, err := unix.Poll(b.fds, timeoutMs)
	if err != nil {
		if err == unix.EINTR {
			return out, nil
		}
		return out, os.NewSyscallError("poll", err)
	}
	for i := 0; n > 0 && i < len(b.fds); i++ {
		re := b.fds[i].Revents
		if re == 0 {
			continue
		}
		n--
		if i == 0 {
			b.drain()
			continue
		}
		var ev Events
		if re&(unix.POLLIN|unix.POLLPRI) != 0 {
			ev |= Readable
		}
		if re&unix.POLLOUT != 0 {
			ev |= Writable
		}
		// POLLNVAL: the fd was closed while registered. Reported like a
		// hang-up, so that its owner's next read or write sees it.
		if re&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
			ev |= Readable | Writable
		}
		out = append(out, ready{fd: b.fds[i].Fd, gen: b.gens[i], ev: ev})
	}
	return out, nil
}

func (b *backend) drain() {
	var buf [128]byte
	for {
		n, err := unix.Read(b.wakeR, buf[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || n < len(buf) {
			return
		}
	}
}

// wake makes the current or next wait return.
func (b *backend) wake() {
	one := [1]byte{1}
	for {
		_, err := unix.Write(b.wakeW, one[:])
		if err == unix.EINTR {
			continue
		}
		// EAGAIN means the pipe is full: the loop is already bound to
		// wake. Other errors mean the pipe is closed: the loop is gone.
		return
	}
}

func (b *backend) close() {
	unix.Close(b.wakeR)
	unix.Close(b.wakeW)
}
