//go:build unix

package hub

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFcntlSocketCalls: the socket and accept used where SOCK_CLOEXEC and
// accept4 do not exist give descriptors that are close-on-exec and
// non-blocking, as the Linux calls do, and accept returns EAGAIN (not a
// block) when nobody waits.
func TestFcntlSocketCalls(t *testing.T) {
	flags := func(fd int) (cloexec, nonblock bool) {
		t.Helper()
		fd1, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil {
			t.Fatal(err)
		}
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fd1&unix.FD_CLOEXEC != 0, fl&unix.O_NONBLOCK != 0
	}
	ln, err := streamSocketFcntl()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	if c, nb := flags(ln); !c || !nb {
		t.Fatalf("listening socket: close-on-exec %v, non-blocking %v", c, nb)
	}
	path := filepath.Join(t.TempDir(), "s")
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := acceptFcntl(ln); err != unix.EAGAIN {
		t.Fatalf("accept with nobody waiting: %v, want EAGAIN", err)
	}
	c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(c)
	if err := unix.Connect(c, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	nfd, err := acceptFcntl(ln)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(nfd)
	if c, nb := flags(nfd); !c || !nb {
		t.Fatalf("accepted socket: close-on-exec %v, non-blocking %v", c, nb)
	}
}
