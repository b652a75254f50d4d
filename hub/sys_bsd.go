//go:build darwin || freebsd

package hub

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// streamSocket: no SOCK_CLOEXEC on macOS; see streamSocketFcntl.
func streamSocket() (int, error) { return streamSocketFcntl() }

// socketDomain is the address family of socket fd, from its address
// (macOS has no SO_DOMAIN).
func socketDomain(fd int) (int, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0, fmt.Errorf("getsockname: %w", err)
	}
	switch sa.(type) {
	case *unix.SockaddrUnix:
		return unix.AF_UNIX, nil
	case *unix.SockaddrInet4:
		return unix.AF_INET, nil
	case *unix.SockaddrInet6:
		return unix.AF_INET6, nil
	}
	return -1, nil
}

// physicalMemory is the machine's RAM in bytes (sysctl), 0 if unknown.
func physicalMemory() uint64 {
	name := "hw.physmem"
	if runtime.GOOS == "darwin" {
		name = "hw.memsize"
	}
	n, err := unix.SysctlUint64(name)
	if err != nil {
		return 0
	}
	return n
}

// errNoMemfd: the hot upgrade is Linux only (command listenhub refuses it
// elsewhere before a hand-over starts), so nothing here reaches these.
var errNoMemfd = errors.New("no memfd on " + runtime.GOOS + ": hot upgrade is Linux only")

func memfdCreate(name string) (int, error) { return -1, errNoMemfd }

func punchHole(fd int, off, n int64) {}
