package hub

import (
	"io"
	"log/slog"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

// connCycleAllocs is the allocations of one worker connecting (admit) and
// disconnecting (closeWorker), with the loop played by the test goroutine
// as in benchHub, and the hub logging at level.
func connCycleAllocs(t *testing.T, level slog.Level) float64 {
	t.Helper()
	h, err := New(Config{SocketPath: "/nonexistent/alloc.sock",
		Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: level}))})
	if err != nil {
		t.Fatal(err)
	}
	l, err := loop.New(loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { discardLoop(l) })
	h.loop = l
	h.pg = &fakePG{l: l}
	h.allow[uint32(os.Getuid())] = struct{}{}
	return testing.AllocsPerRun(200, func() {
		fds, err := testutil.Socketpair(unix.SOCK_STREAM, true)
		if err != nil {
			t.Fatal(err)
		}
		h.admit(fds[0])
		w := h.workers.byID(h.nextID)
		if w == nil {
			t.Fatal("worker not admitted")
		}
		h.flush()
		h.closeWorker(w, reasonPeerClosed, nil)
		unix.Close(fds[1])
	})
}

// The accept and close path logs at info; with info disabled its log lines
// must cost nothing (their arguments allocate even when the handler drops
// them, so they are guarded).
func TestConnectDisconnectLogsFreeWhenDisabled(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops Puts under the race detector: allocation counts are noise")
	}
	quiet := connCycleAllocs(t, slog.LevelWarn)
	t.Logf("connect+disconnect: %.0f allocs with info disabled, %.0f enabled", quiet, connCycleAllocs(t, slog.LevelInfo))
	// What the cycle needs without its log lines: the worker, its
	// registration and handler closure, the peer credentials.
	const budget = 4
	if quiet > budget {
		t.Fatalf("connect+disconnect with info disabled: %.0f allocs, want <= %d", quiet, budget)
	}
}

// A worker that keeps sending a frame type this hub does not know is logged
// at warn once, then at debug: with debug off, each further frame must cost
// no allocation (its log arguments would, unguarded).
func TestUnknownFrameTypeFreeWhenDebugDisabled(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector are noise")
	}
	h, err := New(Config{SocketPath: "/nonexistent/alloc.sock",
		Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	w := &worker{id: 1000, fd: 1000, pid: 4000}
	m := frame.Message{Type: "future-extension", Name: "a"}
	h.handle(w, &m) // the warn line, once
	if allocs := testing.AllocsPerRun(100, func() { h.handle(w, &m) }); allocs != 0 {
		t.Fatalf("unknown frame type with debug disabled: %.0f allocs per frame, want 0", allocs)
	}
}
