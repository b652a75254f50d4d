package monitor

import "golang.org/x/sys/unix"

// shutDown reports whether the peer of socket fd has shut its side down,
// without consuming anything: macOS has no POLLRDHUP, so a readable socket
// is peeked, and a read of 0 bytes is the peer's end of file.
func shutDown(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 0)
	if err != nil || n == 0 {
		return false
	}
	if p[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0 {
		return true
	}
	var b [1]byte
	m, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return err == nil && m == 0
}
