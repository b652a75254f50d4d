package hub

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// writev is writev(2) of iov (x/sys/unix has no Writev for FreeBSD).
func writev(fd int, iov [][]byte) (int, error) {
	var vs [2]unix.Iovec
	v := vs[:0]
	for _, b := range iov {
		if len(b) == 0 {
			continue
		}
		var one unix.Iovec
		one.Base = &b[0]
		one.SetLen(len(b))
		v = append(v, one)
	}
	if len(v) == 0 {
		return 0, nil
	}
	n, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&v[0])), uintptr(len(v)))
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}

// openFDs counts the process's open descriptors by asking each number up
// to the soft RLIMIT_NOFILE (at most 1<<16 of them): /dev/fd shows only 0
// to 2 unless fdescfs is mounted. Called at Start and when descriptors run
// short, never per connection.
func openFDs() int {
	var rl unix.Rlimit
	limit := int64(1 << 16)
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur > 0 && rl.Cur < limit {
		limit = rl.Cur
	}
	n := 0
	for fd := 0; int64(fd) < limit; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
			n++
		}
	}
	return n
}
