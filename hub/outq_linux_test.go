package hub

import "golang.org/x/sys/unix"

// unsentBytes is what fd's send queue still holds (SIOCOUTQ).
func unsentBytes(fd int) (int, error) { return unix.IoctlGetInt(fd, unix.SIOCOUTQ) }
