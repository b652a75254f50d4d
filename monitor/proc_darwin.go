package monitor

import (
	"os"

	"golang.org/x/sys/unix"
)

// startTime is p_starttime of this process (sysctl kern.proc.pid).
func startTime() (float64, bool) {
	kp, err := unix.SysctlKinfoProc("kern.proc.pid", os.Getpid())
	if err != nil {
		return 0, false
	}
	return tv(kp.Proc.P_starttime), true
}

// openFDs counts /dev/fd, which lists every open descriptor on macOS, the
// directory's own included (as procfs counts on Linux).
func openFDs() (int, error) {
	ents, err := os.ReadDir("/dev/fd")
	if err != nil {
		return 0, err
	}
	return len(ents), nil
}
