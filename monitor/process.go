package monitor

import (
	"bytes"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The standard process_* series, read from /proc/self the way the
// Prometheus Go client (procfs) reads them, so that dashboards built for
// any Go service work for the hub without a dependency on that client.

// processStart is when this process started: process_start_time_seconds,
// and the uptime `listenhub status` shows. Read once; the clock at package
// initialisation stands in if /proc cannot say.
var processStart = sync.OnceValue(func() time.Time {
	if st, err := readProcStat(); err == nil {
		sec := int64(st.startTime)
		return time.Unix(sec, int64((st.startTime-float64(sec))*1e9))
	}
	return initTime
})

var initTime = time.Now()

// writeProcessMetrics writes the process_* families; a series whose source
// cannot be read is left out rather than reported as 0.
func writeProcessMetrics(buf *bytes.Buffer) {
	st, err := readProcStat()
	if err == nil {
		writeSample(buf, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", st.cpuSeconds)
	}
	if n, err := openFDs(); err == nil {
		writeSample(buf, "process_open_fds", "gauge", "Number of open file descriptors.", float64(n))
	}
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil {
		writeSample(buf, "process_max_fds", "gauge", "Maximum number of open file descriptors.", float64(lim.Cur))
	}
	if err == nil {
		writeSample(buf, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", st.vsize)
		writeSample(buf, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", st.rss)
		writeSample(buf, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", st.startTime)
	}
}
