//go:build unix

package fdpass

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func cloexec(t *testing.T, fd int) bool {
	t.Helper()
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil {
		t.Fatalf("F_GETFD %d: %v", fd, err)
	}
	return fl&unix.FD_CLOEXEC != 0
}

// TestFcntlPathCloseOnExec: the path used where SOCK_CLOEXEC and
// MSG_CMSG_CLOEXEC do not exist leaves both ends of the pair and every
// received descriptor close-on-exec, where a plain recvmsg does not.
func TestFcntlPathCloseOnExec(t *testing.T) {
	fds, err := socketpairFcntl()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	for _, fd := range fds {
		if !cloexec(t, fd) {
			t.Fatalf("pair end %d not close-on-exec", fd)
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()

	recv := func(fcntl bool) int {
		t.Helper()
		if err := unix.Sendmsg(fds[0], []byte{flagLast}, unix.UnixRights(int(r.Fd())), nil, 0); err != nil {
			t.Fatal(err)
		}
		oob := make([]byte, unix.CmsgSpace(4))
		iov := [][]byte{make([]byte, 8)}
		var oobn int
		if fcntl {
			_, oobn, _, err = recvmsgFcntl(fds[1], iov, oob)
		} else {
			_, oobn, _, _, err = unix.RecvmsgBuffers(fds[1], iov, oob, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseRights(oob[:oobn])
		if err != nil || len(got) != 1 {
			t.Fatalf("rights %v, %v: want one descriptor", got, err)
		}
		return got[0]
	}
	plain := recv(false)
	defer unix.Close(plain)
	if cloexec(t, plain) {
		t.Fatal("a plain recvmsg already gives close-on-exec descriptors: this test proves nothing here")
	}
	viaFcntl := recv(true)
	defer unix.Close(viaFcntl)
	if !cloexec(t, viaFcntl) {
		t.Fatal("descriptor received on the fcntl path is not close-on-exec")
	}
}
