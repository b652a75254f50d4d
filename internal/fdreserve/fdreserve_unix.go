//go:build unix

package fdreserve

import "syscall"

func openNull() (int, error) {
	return syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
}

func closeFD(fd int) { syscall.Close(fd) }
