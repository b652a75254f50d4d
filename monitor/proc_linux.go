package monitor

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// The readers of /proc behind the process_* series and the start time:
// readProcStat and openFDs are all the rest of the package asks of the
// platform, so that another one can answer them in a file of its own.

// userHZ is the kernel's USER_HZ, the unit of the times in /proc/self/stat:
// 100 on every Linux the hub runs on (procfs assumes the same).
const userHZ = 100

func readProcStat() (procStat, error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return procStat{}, err
	}
	// The command name, field 2, is in parentheses and may hold spaces
	// and parentheses itself: the fields that follow start after the
	// last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/self/stat: no ')' in %q", b)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): field N is f[N-3].
	if len(f) < 22 {
		return procStat{}, fmt.Errorf("/proc/self/stat: %d fields", len(f)+2)
	}
	num := func(field int) float64 {
		v, _ := strconv.ParseFloat(f[field-3], 64)
		return v
	}
	st := procStat{
		cpuSeconds: (num(14) + num(15)) / userHZ,
		vsize:      num(23),
		rss:        num(24) * float64(os.Getpagesize()),
		hasMemory:  true,
	}
	bt, err := bootTime()
	if err != nil {
		return procStat{}, err
	}
	st.startTime, st.hasStart = bt+num(22)/userHZ, true
	return st, nil
}

// bootTime is btime of /proc/stat, which does not change.
var bootTime = sync.OnceValues(func() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("/proc/stat: no btime")
})

// openFDs counts /proc/self/fd, the directory's own descriptor included, as
// procfs does.
func openFDs() (int, error) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	defer d.Close()
	n := 0
	for {
		names, err := d.Readdirnames(1024)
		n += len(names)
		if err != nil || len(names) == 0 {
			break
		}
	}
	return n, nil
}
