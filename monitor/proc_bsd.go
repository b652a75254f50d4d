//go:build darwin || freebsd

package monitor

// readProcStat: the CPU time from getrusage, the start time where the
// system says (startTime); no memory sizes without cgo.
func readProcStat() (procStat, error) {
	cpu, err := rusageCPU()
	if err != nil {
		return procStat{}, err
	}
	st := procStat{cpuSeconds: cpu}
	st.startTime, st.hasStart = startTime()
	return st, nil
}
