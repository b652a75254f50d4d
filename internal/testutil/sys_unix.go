//go:build unix

package testutil

import (
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Socketpair is socketpair(2) of AF_UNIX sockets of type typ, both ends
// close-on-exec and, with nonblock, non-blocking, on every Unix: the flags
// are set with fcntl under syscall.ForkLock, as package os does where
// SOCK_CLOEXEC does not exist (macOS).
func Socketpair(typ int, nonblock bool) ([2]int, error) {
	syscall.ForkLock.RLock()
	fds, err := unix.Socketpair(unix.AF_UNIX, typ, 0)
	if err == nil {
		unix.CloseOnExec(fds[0])
		unix.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil || !nonblock {
		return fds, err
	}
	for _, fd := range fds {
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fds[0])
			unix.Close(fds[1])
			return fds, err
		}
	}
	return fds, nil
}

// Socket is socket(2), close-on-exec and blocking, on every Unix.
func Socket(domain, typ int) (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := unix.Socket(domain, typ, 0)
	if err == nil {
		unix.CloseOnExec(fd)
	}
	return fd, err
}

// Rlim converts n to the type of an Rlimit field, like: uint64 on Linux
// and macOS, int64 on FreeBSD.
func Rlim[T ~int64 | ~uint64](n int, like T) T { return T(n) }

// LowerNofile lowers the soft RLIMIT_NOFILE to n until the test ends; a
// system that refuses skips the test.
func LowerNofile(t testing.TB, n int) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = Rlim(n, old.Cur)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("setrlimit: %v", err)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}
