package hub

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Memory a burst took (a flood of connections, each with a partial frame
// and buffers) is garbage once the burst is over, but an idle process may
// not collect it for minutes (nothing allocates, so no GC runs until the
// runtime's 2-minute forced one), and the runtime returns freed pages to
// the OS only gradually. The memory returner gives it back: a goroutine off
// the loop looks every memCheckEvery and, when the process is quiet and its
// heap holds more than twice what it held after the last release (or at
// start), runs
// two collections (the first empties sync.Pool caches into their victim
// cache, the second frees them: the worker rings' slabs are pooled) and
// debug.FreeOSMemory. A forced collection stops the world only for its
// short pauses; its marking runs concurrently, so the loop keeps running.
// It never runs more than once per doubling of the heap while the process
// is quiet, so a hub whose live heap legitimately grew (workers connected)
// is collected once, not over and over.

// memCheckEvery is the memory returner's period; tests shorten it.
var memCheckEvery = 10 * time.Second

// memSlack is how much more than twice the base the heap may hold
// before it is worth returning: below it, the runtime's own scavenger is
// good enough.
const memSlack = 16 << 20

// memSample is one look at the heap and the hub's activity.
type memSample struct {
	heap    uint64 // heap objects (live and dead, not yet swept) plus free heap not returned
	accepts uint64
}

// shouldRelease decides whether to give memory back at cur, after prev, with
// base the heap held after the last release (or at start). Quiet means the
// burst is over: fewer connections accepted since prev than one accept
// batch (workers that come and go one by one are no burst), and the heap
// grew by less than an eighth (or 4 MiB) since prev (the ordinary
// allocations between two collections are no burst either).
func shouldRelease(prev, cur memSample, base uint64) bool {
	quiet := cur.accepts-prev.accepts < defaultAcceptBatch && cur.heap <= prev.heap+max(prev.heap/8, 4<<20)
	return quiet && cur.heap > 2*base+memSlack
}

var memMetrics = []string{
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/free:bytes",
}

// readHeap returns the heap held: objects (live, and dead not yet swept)
// plus free heap not returned to the OS.
func readHeap(s []metrics.Sample) (held uint64) {
	metrics.Read(s)
	for i := range s {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0 // unknown to this runtime: never release
		}
		held += s[i].Value.Uint64()
	}
	return held
}

// returnMemory is the memory returner, looking every period; it ends when
// the hub is done.
func (h *Hub) returnMemory(every time.Duration) {
	s := make([]metrics.Sample, len(memMetrics))
	for i, name := range memMetrics {
		s[i].Name = name
	}
	t := time.NewTicker(every)
	defer t.Stop()
	base := readHeap(s)
	prev := memSample{heap: base, accepts: h.stats.accepts.Load()}
	for {
		select {
		case <-h.done:
			return
		case <-t.C:
		}
		held := readHeap(s)
		cur := memSample{heap: held, accepts: h.stats.accepts.Load()}
		if held != 0 && shouldRelease(prev, cur, base) {
			start := time.Now()
			runtime.GC()
			debug.FreeOSMemory()
			base = readHeap(s)
			cur.heap = base
			h.log.Info("memory returned to the OS", "heap_before", held, "heap_after", base,
				"took", time.Since(start).Round(time.Microsecond))
		}
		prev = cur
	}
}
