package client

import "golang.org/x/sys/unix"

// peerPID is LOCAL_PEERPID, 0 if it fails.
func peerPID(fd int) int {
	pid, err := unix.GetsockoptInt(fd, unix.SOL_LOCAL, unix.LOCAL_PEERPID)
	if err != nil {
		return 0
	}
	return pid
}
