package hub

import (
	"testing"
	"unsafe"
)

// The worker struct is what a hub holds most of (one per idle worker): it
// fills the 384-byte allocation class exactly. A field more moves every
// worker to the 416-byte class; put rarely used state behind a pointer
// instead (docs/performance.md, idle memory).
func TestWorkerSize(t *testing.T) {
	if n := unsafe.Sizeof(worker{}); n > 240 {
		t.Fatalf("worker struct is %d bytes, budget 240", n)
	}
}
