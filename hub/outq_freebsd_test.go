package hub

import "golang.org/x/sys/unix"

// unsentBytes is what fd's send queue still holds (FIONWRITE).
func unsentBytes(fd int) (int, error) { return unix.IoctlGetInt(fd, 0x40046677) } // FIONWRITE: _IOR('f', 119, int)
