package hub

import "golang.org/x/sys/unix"

// unsentBytes is what fd's send queue still holds (SO_NWRITE).
func unsentBytes(fd int) (int, error) {
	return unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_NWRITE)
}
