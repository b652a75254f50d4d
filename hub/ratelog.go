package hub

import (
	"context"
	"log/slog"
	"strconv"
	"time"
	"unicode/utf8"
)

// logKind is a kind of per-worker or per-frame event the hub logs. Each
// kind has its own budget, so that one worker flooding the hub with one
// kind of bad input (a million refused subs, connect churn) writes a
// bounded number of lines, and the other kinds still get theirs.
type logKind uint8

const (
	logConnect     logKind = iota // worker connected (info)
	logDisconnect                 // worker disconnected (info)
	logRefusedConn                // connection refused: max workers, uid, credentials
	logProtocol                   // malformed frame, frame timeout: connection severed
	logRefusedSub                 // sub nacked: bad name, caps
	logEvicted                    // backlog over the hard limit
	logUnknownType                // unknown frame type skipped
	logAccept                     // accept paused or failed
	logPaused                     // worker not read: its answers pile up unread
	numLogKinds
)

var logKindNames = [numLogKinds]string{"connect", "disconnect", "refused_connection", "protocol_error",
	"refused_sub", "evicted", "unknown_type", "accept", "paused"}

// Every kind may log logBurst lines at once and logRate lines a second
// after that: 10 a second is more than anyone reads, and a flood costs at
// most a few KB of log a second per kind (names are cut to maxLogName).
const (
	logBurst = 20
	logRate  = 10
)

// maxLogName is how much of a worker-supplied name (a subscription name, an
// unknown frame type) goes into a log line: a name can be up to
// maxInboundFrame bytes, and a 64 KiB line per refused sub is a log flood
// on its own.
const maxLogName = 100

// logBucket is one kind's token bucket. Loop goroutine only.
type logBucket struct {
	tokens     float64
	last       time.Time // when tokens was last refilled
	suppressed uint64    // lines refused since the last one written
	level      slog.Level
}

// logOK reports whether a line of kind k at level may be written now: the
// level is enabled and the kind's budget has a token. A line refused for
// the budget is counted, and the next line of that kind written says how
// many were (see logLine). It allocates nothing, so that a disabled or
// suppressed line costs nothing on the loop.
func (h *Hub) logOK(k logKind, level slog.Level) bool {
	if !h.log.Enabled(context.Background(), level) {
		return false
	}
	b := &h.logBuckets[k]
	now := h.now()
	if b.last.IsZero() {
		b.tokens, b.last = logBurst, now
	} else if d := now.Sub(b.last); d > 0 {
		b.tokens = min(logBurst, b.tokens+d.Seconds()*logRate)
		b.last = now
	}
	if b.tokens < 1 {
		if b.suppressed == 0 || level > b.level {
			b.level = level
		}
		b.suppressed++
		return false
	}
	b.tokens--
	return true
}

// logLine writes a line logOK allowed, adding suppressed=N when lines of
// its kind were dropped before it.
func (h *Hub) logLine(k logKind, level slog.Level, msg string, attrs ...any) {
	b := &h.logBuckets[k]
	if b.suppressed > 0 {
		attrs = append(attrs, "suppressed", b.suppressed)
		b.suppressed = 0
	}
	h.log.Log(context.Background(), level, msg, attrs...)
}

// flushSuppressed writes, for every kind with suppressed lines and no line
// written for a second, one line with the count: the flood is over, and
// the count must not wait for the next event of that kind, which may never
// come. Called on the status tick.
func (h *Hub) flushSuppressed() {
	now := h.now()
	for k := range h.logBuckets {
		b := &h.logBuckets[k]
		if b.suppressed == 0 || now.Sub(b.last) < time.Second {
			continue
		}
		h.log.Log(context.Background(), b.level, "log lines suppressed", "kind", logKindNames[k],
			"suppressed", b.suppressed)
		b.suppressed = 0
	}
}

// now is the loop's time of this iteration (the wall clock for a hub whose
// loop does not exist, in tests that drive handlers by hand).
func (h *Hub) now() time.Time {
	if h.loop == nil {
		return time.Now()
	}
	return h.loop.Now()
}

// logName returns s for a log line, cut to maxLogName bytes (on a rune
// boundary) with a marker saying how long it was.
func logName(s string) string {
	if len(s) <= maxLogName {
		return s
	}
	cut := maxLogName
	for cut > maxLogName-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…[" + strconv.Itoa(len(s)) + " bytes]"
}
