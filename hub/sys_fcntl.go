//go:build unix

package hub

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// The socket calls for systems without SOCK_CLOEXEC, SOCK_NONBLOCK and
// accept4 (macOS): the flags set with fcntl, close-on-exec under
// syscall.ForkLock as package net does there, so that no exec in between
// inherits the descriptor. Built on every Unix (Linux tests them) and
// used off Linux.

// streamSocketFcntl is a Unix stream socket, close-on-exec and
// non-blocking.
func streamSocketFcntl() (int, error) {
	syscall.ForkLock.RLock()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err == nil {
		unix.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return -1, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// acceptFcntl is accept(2), the new descriptor close-on-exec and
// non-blocking.
func acceptFcntl(fd int) (int, error) {
	syscall.ForkLock.RLock()
	nfd, _, err := unix.Accept(fd)
	if err == nil {
		unix.CloseOnExec(nfd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return -1, err
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return -1, err
	}
	return nfd, nil
}
