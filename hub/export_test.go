package hub

import (
	"sync/atomic"
	"testing"
)

// hooks are one test hub's replacements for its seams (hub.go): a
// Postgres side, a clock, a pause after an upgrade's pre-copy. A hub
// without hooks runs as in production.
type hooks = seams

// setHooks installs the non-nil hooks of hk for h, before Start.
func setHooks(t testing.TB, h *Hub, hk hooks) {
	t.Helper()
	if hk.openPG != nil {
		h.seams.openPG = hk.openPG
	}
	if hk.clock != nil {
		h.seams.clock = hk.clock
	}
	if hk.precopied != nil {
		h.seams.precopied = hk.precopied
	}
}

// setMaxPartialBytes sets the bound of every hub's partial frames. Call it
// on the loop goroutine of the test's only running hub (e.do); the test's
// end restores it.
func setMaxPartialBytes(t testing.TB, n int) {
	saved := maxPartialBytes
	maxPartialBytes = n
	t.Cleanup(func() { maxPartialBytes = saved })
}

// countWrites counts the writes to workers until the test ends.
func countWrites(t testing.TB) *atomic.Int64 {
	var n atomic.Int64
	onWrite = func(*worker) { n.Add(1) }
	t.Cleanup(func() { onWrite = nil })
	return &n
}
