package main

import "golang.org/x/sys/unix"

// prlimitNofile reads (old) and sets (lim) the RLIMIT_NOFILE of process pid.
func prlimitNofile(pid int, lim, old *unix.Rlimit) error {
	return unix.Prlimit(pid, unix.RLIMIT_NOFILE, lim, old)
}

// passCred asks the kernel for each datagram's sender (SO_PASSCRED), as
// systemd does on its notify socket.
func passCred(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PASSCRED, 1) }

// senderPID is the sender's pid from a datagram's control messages, 0 if
// none says.
func senderPID(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	pid := 0
	for _, m := range msgs {
		if cred, err := unix.ParseUnixCredentials(&m); err == nil {
			pid = int(cred.Pid)
		}
	}
	return pid
}
