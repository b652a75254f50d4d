package main

import (
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/systemd"
)

// sdReportEvery is how often the STATUS= line is brought up to date (the
// worker count moves all the time; a line per connect would be a syscall
// per connect for nobody's benefit).
const sdReportEvery = time.Second

// sdReporter tells systemd how the hub is doing (Type=notify): READY=1 once
// the socket accepts, a STATUS= line when it changes, WATCHDOG=1 when
// WatchdogSec= is set, STOPPING=1 when the hub stops. The periodic part runs
// as the hub's Report callback, on the hub's loop goroutine, so that a
// wedged loop stops the watchdog pings and systemd restarts the hub.
// Without $NOTIFY_SOCKET it does nothing and the hub gets no callback.
type sdReporter struct {
	log      *slog.Logger
	n        *systemd.Notifier // nil: not under a service manager
	watchdog bool
	interval time.Duration // of the Report callback
	stopped  atomic.Bool   // STOPPING=1 sent: the loop reports no more
	failed   atomic.Bool   // a send failed and was logged

	// Loop goroutine only.
	last      string // last STATUS= sent
	connected bool   // Postgres was healthy at least once
}

func newSDReporter(log *slog.Logger) *sdReporter {
	r := &sdReporter{log: log, interval: sdReportEvery}
	n, err := systemd.NewNotifier()
	if err != nil {
		log.Warn("cannot notify systemd; going on without", "reason", err)
		return r
	}
	r.n = n
	wd, err := systemd.WatchdogInterval()
	if err != nil {
		log.Warn("ignoring the systemd watchdog setting", "reason", err)
	}
	if wd > 0 {
		r.watchdog = true
		r.interval = min(r.interval, wd/2) // sd_watchdog_enabled(3): ping at half the timeout
		log.Info("systemd watchdog enabled", "timeout", wd, "ping_every", r.interval)
	}
	return r
}

// hook is the hub's Report callback, nil when there is nobody to tell.
func (r *sdReporter) hook() func(hub.Stats) {
	if r.n == nil {
		return nil
	}
	return r.report
}

// report runs on the hub's loop goroutine.
func (r *sdReporter) report(s hub.Stats) {
	if r.stopped.Load() {
		return
	}
	r.connected = r.connected || s.PostgresHealthy
	workers := fmt.Sprintf("serving %d workers", s.Workers)
	if s.Workers == 1 {
		workers = "serving 1 worker"
	}
	var status string
	switch {
	case s.PostgresHealthy:
		status = workers + ", postgres healthy"
	case !r.connected:
		status = workers + ", waiting for postgres"
	default:
		status = workers + ", postgres down; reconnecting"
	}
	var lines []string
	if r.watchdog {
		lines = append(lines, "WATCHDOG=1")
	}
	if status != r.last {
		lines = append(lines, "STATUS="+status)
	}
	if len(lines) == 0 {
		return
	}
	if r.send(strings.Join(lines, "\n")) && status != r.last {
		r.last = status
	}
}

// ready says the socket accepts.
func (r *sdReporter) ready() { r.send("READY=1") }

// stopping says the hub is going away, and why.
func (r *sdReporter) stopping(status string) {
	r.stopped.Store(true)
	r.send("STOPPING=1\nSTATUS=" + status)
}

// send reports whether msg went out; the first failure is logged, the
// rest are not (a service manager that stopped listening does not come
// back).
func (r *sdReporter) send(msg string) bool {
	if r.n == nil {
		return false
	}
	if err := r.n.Notify(msg); err != nil {
		if !r.failed.Swap(true) {
			r.log.Warn("systemd notify failed; further failures not logged", "reason", err)
		}
		return false
	}
	return true
}

func (r *sdReporter) close() { r.n.Close() }
