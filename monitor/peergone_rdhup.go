//go:build linux || freebsd

package monitor

import "golang.org/x/sys/unix"

// shutDown reports whether the peer of socket fd has shut its side down,
// without reading from it (POLLRDHUP).
func shutDown(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	if n, err := unix.Poll(p, 0); err == nil && n > 0 {
		return p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	}
	return false
}
