//go:build unix

package fdpass

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// The close-on-exec path for systems without SOCK_CLOEXEC and
// MSG_CMSG_CLOEXEC: fcntl under syscall.ForkLock, as package os does
// there, so that no fork in between inherits a descriptor. Built on every
// Unix (Linux tests it) and used off Linux.

// socketpairFcntl makes a SOCK_SEQPACKET pair and marks both ends
// close-on-exec.
func socketpairFcntl() ([2]int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		return fds, err
	}
	unix.CloseOnExec(fds[0])
	unix.CloseOnExec(fds[1])
	return fds, nil
}

// recvmsgFcntl receives one packet and marks the descriptors it carries
// close-on-exec before it releases syscall.ForkLock. The socket is
// non-blocking (the runtime's poller does the waiting), so the lock is
// held for one system call, never for a wait.
func recvmsgFcntl(fd int, iov [][]byte, oob []byte) (n, oobn, flags int, err error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	n, oobn, flags, _, err = unix.RecvmsgBuffers(fd, iov, oob, 0)
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return n, oobn, flags, err // recv reports the bad control message
		}
		for i := range msgs {
			fds, rerr := unix.ParseUnixRights(&msgs[i])
			if rerr != nil {
				continue
			}
			for _, rfd := range fds {
				unix.CloseOnExec(rfd)
			}
		}
	}
	return n, oobn, flags, err
}
