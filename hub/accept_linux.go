package hub

import (
	"golang.org/x/sys/unix"
)

// acceptCall names the call, for errors and logs.
const acceptCall = "accept4"

// accept is accept4(2) without the peer's address, which unix.Accept4
// decodes into a new Sockaddr on every call: a worker's Unix socket address
// says nothing (SO_PEERCRED does), and a connection should cost the hub no
// garbage.
func accept(fd int) (int, error) {
	nfd, _, errno := unix.Syscall6(unix.SYS_ACCEPT4, uintptr(fd), 0, 0, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(nfd), nil
}
