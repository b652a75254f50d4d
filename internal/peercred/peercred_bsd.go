//go:build darwin || freebsd

package peercred

import "golang.org/x/sys/unix"

// Call names the system call, for errors and logs.
const Call = "getsockopt LOCAL_PEERCRED"

// Get is LOCAL_PEERCRED (the peer's effective uid when it connected or
// listened), and the pid from LOCAL_PEERPID where there is one.
func Get(fd int) (Cred, error) {
	xu, err := unix.GetsockoptXucred(fd, unix.SOL_LOCAL, unix.LOCAL_PEERCRED)
	if err != nil {
		return Cred{}, err
	}
	return Cred{PID: peerPID(fd), UID: xu.Uid}, nil
}
