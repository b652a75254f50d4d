//go:build darwin || freebsd

package hub

import (
	"golang.org/x/sys/unix"
)

// The names of the calls, for errors and logs.
const (
	acceptCall   = "accept"
	peerCredCall = "getsockopt LOCAL_PEERCRED"
)

// ucred is what peerCred returns: the peer's pid (0 where the system does
// not say: FreeBSD) and effective uid.
type ucred struct {
	Pid int32
	Uid uint32
}

// accept: no accept4 on macOS; see acceptFcntl.
func accept(fd int) (int, error) { return acceptFcntl(fd) }

// peerCred is LOCAL_PEERCRED (the peer's effective uid when it connected
// or listened), and the pid from LOCAL_PEERPID where there is one.
func peerCred(fd int) (ucred, error) {
	xu, err := unix.GetsockoptXucred(fd, unix.SOL_LOCAL, unix.LOCAL_PEERCRED)
	if err != nil {
		return ucred{}, err
	}
	return ucred{Pid: peerPID(fd), Uid: xu.Uid}, nil
}
