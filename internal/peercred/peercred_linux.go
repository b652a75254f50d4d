package peercred

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Call names the system call, for errors and logs.
const Call = "getsockopt SO_PEERCRED"

// Get is getsockopt(SO_PEERCRED) into a value on the stack:
// unix.GetsockoptUcred returns a pointer, one allocation per connection the
// hub accepts.
func Get(fd int) (Cred, error) {
	var cred unix.Ucred
	size := uint32(unix.SizeofUcred)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERCRED,
		uintptr(unsafe.Pointer(&cred)), uintptr(unsafe.Pointer(&size)), 0)
	if errno != 0 {
		return Cred{}, errno
	}
	return Cred{PID: cred.Pid, UID: cred.Uid}, nil
}
