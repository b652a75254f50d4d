package hub

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/listenhub/listenhub/loop"
)

// hooks are one test hub's replacements for the package's seams
// (hub.go): a Postgres side, a clock, a pause after an upgrade's
// pre-copy. A hub without hooks runs as in production.
type hooks struct {
	openPG    pgOpener
	clock     clock
	precopied func(*precopy)
}

// hubHooks maps a *Hub to its *hooks.
var hubHooks sync.Map

func hooksOf(h *Hub) *hooks {
	if v, ok := hubHooks.Load(h); ok {
		return v.(*hooks)
	}
	return nil
}

func init() {
	openPostgres = func(ctx context.Context, l *loop.Loop, h *Hub) (postgres, error) {
		if hk := hooksOf(h); hk != nil && hk.openPG != nil {
			return hk.openPG(ctx, l, h)
		}
		return openListener(ctx, l, h)
	}
	newClock = func(h *Hub, l *loop.Loop) clock {
		if hk := hooksOf(h); hk != nil && hk.clock != nil {
			return hk.clock
		}
		return loopClock{l}
	}
	afterPrecopy = func(h *Hub, pc *precopy) {
		if hk := hooksOf(h); hk != nil && hk.precopied != nil {
			hk.precopied(pc)
		}
	}
}

// setHooks installs the non-nil hooks of hk for h (before Start), until
// the test ends.
func setHooks(t testing.TB, h *Hub, hk hooks) {
	t.Helper()
	v, _ := hubHooks.LoadOrStore(h, &hooks{})
	cur := v.(*hooks)
	if hk.openPG != nil {
		cur.openPG = hk.openPG
	}
	if hk.clock != nil {
		cur.clock = hk.clock
	}
	if hk.precopied != nil {
		cur.precopied = hk.precopied
	}
	t.Cleanup(func() { hubHooks.Delete(h) })
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
