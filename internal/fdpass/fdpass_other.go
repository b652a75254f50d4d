//go:build unix && !linux

package fdpass

import "golang.org/x/sys/unix"

// socketpair: no SOCK_CLOEXEC to rely on; see socketpairFcntl.
func socketpair() ([2]int, error) { return socketpairFcntl() }

// setSendBuffer asks for n bytes of send buffer, which the system caps
// (kern.ipc.maxsockbuf); there is no FORCE option off Linux.
func setSendBuffer(fd, n int) {
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, n)
}

// recvmsg: no MSG_CMSG_CLOEXEC to rely on; see recvmsgFcntl.
func recvmsg(fd int, iov [][]byte, oob []byte) (n, oobn, flags int, err error) {
	return recvmsgFcntl(fd, iov, oob)
}
