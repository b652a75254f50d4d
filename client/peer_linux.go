package client

import "golang.org/x/sys/unix"

// dirOpenFlags opens the socket's directory for fstat, fstatat and the
// connect through /proc/self/fd, without needing read permission on it.
const dirOpenFlags = unix.O_PATH

// peerCredCall names the call, for errors.
const peerCredCall = "getsockopt SO_PEERCRED"

// peerCred returns the uid and pid of the socket's peer.
func peerCred(fd int) (uid, pid int, err error) {
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return 0, 0, err
	}
	return int(cred.Uid), int(cred.Pid), nil
}
