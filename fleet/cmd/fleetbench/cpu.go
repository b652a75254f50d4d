package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clkTck is USER_HZ, what /proc/PID/stat counts CPU time in.
const clkTck = 100

// serverCPU is the CPU time in µs of the postmaster pid and every process
// whose parent it is (the backends, the walwriter, …), from /proc.
func serverCPU(postmaster int) (int64, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var total int64
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+2:]) // from field 3 (state) on
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if pid != postmaster && ppid != postmaster {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		total += (utime + stime) * 1e6 / clkTck
	}
	return total, nil
}
