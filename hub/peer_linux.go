package hub

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The names of the calls, for errors and logs.
const (
	acceptCall   = "accept4"
	peerCredCall = "getsockopt SO_PEERCRED"
)

// ucred is what peerCred returns: the peer's pid and effective uid.
type ucred = unix.Ucred

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

// peerCred is getsockopt(SO_PEERCRED) into a value on the stack:
// unix.GetsockoptUcred returns a pointer, one allocation per connection.
func peerCred(fd int) (ucred, error) {
	var cred unix.Ucred
	size := uint32(unix.SizeofUcred)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERCRED,
		uintptr(unsafe.Pointer(&cred)), uintptr(unsafe.Pointer(&size)), 0)
	if errno != 0 {
		return cred, errno
	}
	return cred, nil
}
