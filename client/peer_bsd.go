//go:build darwin || freebsd

package client

import "golang.org/x/sys/unix"

// dirOpenFlags opens the socket's directory for fstat and fstatat: there
// is no O_PATH, so the directory must be readable.
const dirOpenFlags = unix.O_RDONLY

// peerCredCall names the call, for errors.
const peerCredCall = "getsockopt LOCAL_PEERCRED"

// peerCred returns the uid of the socket's peer (LOCAL_PEERCRED) and its
// pid where the system says (LOCAL_PEERPID on macOS; 0 on FreeBSD).
func peerCred(fd int) (uid, pid int, err error) {
	xu, err := unix.GetsockoptXucred(fd, unix.SOL_LOCAL, unix.LOCAL_PEERCRED)
	if err != nil {
		return 0, 0, err
	}
	return int(xu.Uid), peerPID(fd), nil
}
