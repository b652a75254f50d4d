package fdpass

import "golang.org/x/sys/unix"

// socketpair makes the pair close-on-exec in the one call.
func socketpair() ([2]int, error) {
	return unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
}

// setSendBuffer asks for n bytes of send buffer: past net.core.wmem_max
// with CAP_NET_ADMIN (the FORCE option), else up to it.
func setSendBuffer(fd, n int) {
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, n) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, n)
	}
}

// recvmsg receives one packet; the descriptors it carries are born
// close-on-exec.
func recvmsg(fd int, iov [][]byte, oob []byte) (n, oobn, flags int, err error) {
	n, oobn, flags, _, err = unix.RecvmsgBuffers(fd, iov, oob, unix.MSG_CMSG_CLOEXEC)
	return n, oobn, flags, err
}
