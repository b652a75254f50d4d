package monitor

import "golang.org/x/sys/unix"

// startTime: x/sys/unix has no kinfo_proc for FreeBSD, so
// process_start_time_seconds is left out there and the uptime counts from
// the package's initialisation.
func startTime() (float64, bool) { return 0, false }

// openFDs counts the open descriptors by asking each number up to the soft
// RLIMIT_NOFILE (at most 1<<16): /dev/fd shows only 0 to 2 unless fdescfs
// is mounted.
func openFDs() (int, error) {
	var rl unix.Rlimit
	limit := int64(1 << 16)
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Cur > 0 && rl.Cur < limit {
		limit = rl.Cur
	}
	n := 0
	for fd := 0; int64(fd) < limit; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
			n++
		}
	}
	return n, nil
}
