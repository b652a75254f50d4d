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
// Off Linux (proc_bsd.go) the CPU time comes from getrusage and the
// descriptors from /dev/fd (macOS) or probing (FreeBSD);
// process_virtual_memory_bytes and process_resident_memory_bytes are left
// out there, and process_start_time_seconds on FreeBSD, as the Prometheus
// client leaves them out where it cannot read them.

// procStat is what the system says about this process.
type procStat struct {
	cpuSeconds float64 // utime + stime
	vsize      float64 // bytes, when hasMemory
	rss        float64 // bytes, when hasMemory
	startTime  float64 // unix seconds, when hasStart
	hasMemory  bool
	hasStart   bool
}

// processStart is when this process started: process_start_time_seconds,
// and the uptime `listenhub status` shows. Read once; the clock at package
// initialisation stands in if /proc cannot say.
var processStart = sync.OnceValue(func() time.Time {
	if st, err := readProcStat(); err == nil && st.hasStart {
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
	if err == nil && st.hasMemory {
		writeSample(buf, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", st.vsize)
		writeSample(buf, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", st.rss)
	}
	if err == nil && st.hasStart {
		writeSample(buf, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", st.startTime)
	}
}
