//go:build darwin || freebsd

package monitor

import (
	"os"

	"golang.org/x/sys/unix"
)

// readProcStat: the CPU time from getrusage, the start time where the
// system says (startTime, proc_darwin.go); no memory sizes without cgo.
func readProcStat() (procStat, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return procStat{}, os.NewSyscallError("getrusage", err)
	}
	st := procStat{cpuSeconds: tv(ru.Utime) + tv(ru.Stime)}
	st.startTime, st.hasStart = startTime()
	return st, nil
}

func tv(t unix.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
