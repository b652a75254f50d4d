//go:build unix

package monitor

import (
	"os"

	"golang.org/x/sys/unix"
)

// rusageCPU is the process's user and system CPU time from getrusage,
// in seconds: process_cpu_seconds_total off Linux (Linux tests it
// against /proc).
func rusageCPU() (float64, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, os.NewSyscallError("getrusage", err)
	}
	return tv(ru.Utime) + tv(ru.Stime), nil
}

func tv(t unix.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
