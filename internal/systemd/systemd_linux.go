package systemd

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Notifier sends state lines to the service manager over one datagram
// socket, opened once, so that a process short of descriptors can still
// report (the watchdog in particular). Its methods never block: a datagram
// the manager's queue has no room for is dropped with an error, which is
// what a caller on an event loop needs. A nil *Notifier (no $NOTIFY_SOCKET)
// accepts every call and sends nothing.
type Notifier struct {
	fd   int
	addr *unix.SockaddrUnix
}

// NewNotifier opens a Notifier for $NOTIFY_SOCKET. It returns nil, nil when
// the variable is unset: the process does not run under a service manager
// that listens.
func NewNotifier() (*Notifier, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil, nil
	}
	addr, err := notifyAddr(path)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("systemd: notify socket: %w", os.NewSyscallError("socket", err))
	}
	return &Notifier{fd: fd, addr: addr}, nil
}

// notifyAddr parses $NOTIFY_SOCKET: an absolute path or an abstract name
// ('@' stands for the leading NUL, which x/sys/unix writes for us). systemd
// also knows vsock: addresses, for virtual machines; a hub never runs
// there.
func notifyAddr(s string) (*unix.SockaddrUnix, error) {
	if s[0] != '/' && s[0] != '@' {
		return nil, fmt.Errorf("systemd: NOTIFY_SOCKET=%q: want an absolute path or an @abstract name", s)
	}
	if len(s) < 2 || len(s) > len(unix.RawSockaddrUnix{}.Path) {
		return nil, fmt.Errorf("systemd: NOTIFY_SOCKET=%q: bad length", s)
	}
	return &unix.SockaddrUnix{Name: s}, nil
}

// Notify sends state, one or more newline-separated assignments such as
// "READY=1\nSTATUS=serving". Nil receiver: nothing to do.
func (n *Notifier) Notify(state string) error {
	if n == nil {
		return nil
	}
	err := unix.Sendto(n.fd, []byte(state), unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT, n.addr)
	if err != nil {
		return fmt.Errorf("systemd: notify %s: %w", n.addr.Name, os.NewSyscallError("sendto", err))
	}
	return nil
}

// Close closes the socket. Nil receiver: nothing to do.
func (n *Notifier) Close() error {
	if n == nil || n.fd < 0 {
		return nil
	}
	err := unix.Close(n.fd)
	n.fd = -1
	return err
}

// Notify sends state once, on a socket of its own, for a caller that has no
// Notifier (a one-off "MAINPID=…" after an upgrade, say). It is a no-op
// returning nil when $NOTIFY_SOCKET is unset.
func Notify(state string) error {
	n, err := NewNotifier()
	if err != nil || n == nil {
		return err
	}
	defer n.Close()
	return n.Notify(state)
}

// WatchdogInterval returns how often the service manager expects
// "WATCHDOG=1": $WATCHDOG_USEC, provided $WATCHDOG_PID is unset or names
// this process. Zero means the watchdog is off. Ping at half of it, as
// sd_watchdog_enabled(3) advises.
func WatchdogInterval() (time.Duration, error) {
	s := os.Getenv("WATCHDOG_USEC")
	if s == "" {
		return 0, nil
	}
	if p := os.Getenv("WATCHDOG_PID"); p != "" {
		pid, err := strconv.Atoi(p)
		if err != nil {
			return 0, fmt.Errorf("systemd: WATCHDOG_PID=%q: %w", p, err)
		}
		if pid != os.Getpid() {
			return 0, nil // meant for another process (our parent, say)
		}
	}
	us, err := strconv.ParseUint(s, 10, 63)
	if err != nil || us == 0 {
		return 0, fmt.Errorf("systemd: WATCHDOG_USEC=%q: want a positive number of microseconds", s)
	}
	return time.Duration(us) * time.Microsecond, nil
}

// Listeners returns the sockets passed by the service manager, in order,
// and removes $LISTEN_PID, $LISTEN_FDS and $LISTEN_FDNAMES from the
// environment, so that a child process (a re-executed binary, say) cannot
// take them for its own. It returns nil when the variables are unset or
// name another process. The descriptors are marked close-on-exec.
func Listeners() ([]Listener, error) {
	pidStr, nStr := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS")
	names := os.Getenv("LISTEN_FDNAMES")
	if pidStr == "" || nStr == "" {
		return nil, nil
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil {
		return nil, fmt.Errorf("systemd: LISTEN_PID=%q: %w", pidStr, err)
	}
	if pid != os.Getpid() {
		return nil, nil // inherited from a parent that did not consume them
	}
	defer func() {
		os.Unsetenv("LISTEN_PID")
		os.Unsetenv("LISTEN_FDS")
		os.Unsetenv("LISTEN_FDNAMES")
	}()
	n, err := strconv.Atoi(nStr)
	if err != nil || n < 0 || n > 1<<16 {
		return nil, fmt.Errorf("systemd: LISTEN_FDS=%q: want a count", nStr)
	}
	var nameList []string
	if names != "" {
		nameList = strings.Split(names, ":")
	}
	out := make([]Listener, 0, n)
	for i := range n {
		fd := listenFDsStart + i
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			return nil, fmt.Errorf("systemd: LISTEN_FDS=%d but descriptor %d is not open: %w", n, fd, err)
		}
		unix.CloseOnExec(fd)
		l := Listener{File: os.NewFile(uintptr(fd), "LISTEN_FD_"+strconv.Itoa(fd))}
		if i < len(nameList) {
			l.Name = nameList[i]
		}
		out = append(out, l)
	}
	return out, nil
}
