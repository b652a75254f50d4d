package hub

import (
	"os"

	"golang.org/x/sys/unix"
)

// streamSocket is a Unix stream socket, non-blocking and close-on-exec
// from birth.
func streamSocket() (int, error) {
	return unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
}

// socketDomain is the address family of socket fd (SO_DOMAIN).
func socketDomain(fd int) (int, error) {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return 0, os.NewSyscallError("getsockopt", err)
	}
	return v, nil
}

// physicalMemory is the machine's RAM in bytes (sysinfo), 0 if unknown.
func physicalMemory() uint64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}

// memfdCreate makes the upgrade's backlog file: anonymous shared memory,
// close-on-exec, that the new process maps.
func memfdCreate(name string) (int, error) {
	return unix.MemfdCreate(name, unix.MFD_CLOEXEC)
}

// punchHole frees n bytes of fd's pages from off, keeping its size.
func punchHole(fd int, off, n int64) {
	_ = unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

// writev is writev(2) of iov.
func writev(fd int, iov [][]byte) (int, error) { return unix.Writev(fd, iov) }

// openFDs counts the process's open descriptors (/proc/self/fd), or
// guesses 16 where that cannot be read (no /proc mounted).
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 16
	}
	return len(ents) - 1 // the directory read itself
}
