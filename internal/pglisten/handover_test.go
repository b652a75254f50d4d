package pglisten

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/handoff"
	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

// TestDetachAdopt moves a plaintext connection between two loops as an
// upgrade moves it between processes (the descriptor duplicated, as
// SCM_RIGHTS does): a NOTIFY sent while it is detached is delivered once,
// by the adopter, after resume; the old side's abandon leaves the session
// alive; one backend throughout.
func TestDetachAdopt(t *testing.T) {
	r1 := newRecorder()
	app := testApp()
	s := variant{name: "loop-tcp", url: db.URL}.open(t, r1, opts{app: app}).(*loopSubject)
	if err := s.listen(t, "ho_x"); err != nil {
		t.Fatal(err)
	}
	notifySQL(t, "NOTIFY ho_x, '1'")
	r1.waitNote(t, "ho_x", "1")

	var h handoff.PG
	var derr error
	done := make(chan struct{})
	s.on(t, func() {
		s.c.whenIdle(func() { h, derr = s.c.detach(); close(done) })
	})
	testutil.WaitClosed(t, done, pgTimeout, "no quiet point")
	if derr != nil {
		t.Fatal(derr)
	}
	if !slices.Equal(h.Channels, []string{"ho_x"}) || h.BackendPID == 0 {
		t.Fatalf("handover %+v", h)
	}
	notifySQL(t, "NOTIFY ho_x, '2'") // waits in the kernel

	fd, err := unix.FcntlInt(uintptr(h.FD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	h.FD = fd
	r2 := newRecorder()
	l2, err := loop.New(loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cc := mustParseConfig(t, db.URL(), app)
	c2, err := adopt(l2, Config{ConnConfig: cc, OnNotification: func(ch, p []byte) { r2.note(string(ch), string(p)) },
		OnHealth: r2.onHealth, Logger: testLogger()}, h)
	if err != nil {
		t.Fatal(err)
	}
	go l2.Run()
	t.Cleanup(func() { l2.Stop(); <-l2.Done() })
	s.on(t, func() { s.c.abandon() })
	s2 := &loopSubject{l: l2, c: c2}
	s2.on(t, func() {
		if err := c2.resume(); err != nil {
			t.Error(err)
		}
	})
	r2.waitNote(t, "ho_x", "2")
	notifySQL(t, "NOTIFY ho_x, '3'")
	r2.waitNote(t, "ho_x", "3")
	select {
	case n := <-r1.notes:
		t.Fatalf("the detached side delivered %+v", n)
	default:
	}
	if pids, err := db.BackendPIDs(ctxT(t), app); err != nil || len(pids) != 1 || uint32(pids[0]) != h.BackendPID {
		t.Fatalf("backends %v (%v), want just %d", pids, err, h.BackendPID)
	}
	// The adopter runs the connection as its own: commands work.
	if err := s2.listen(t, "ho_y"); err != nil {
		t.Fatal(err)
	}
	notifySQL(t, "NOTIFY ho_y, '4'")
	r2.waitNote(t, "ho_y", "4")
}

// TestMarkerSplit: the marker hand-over splits a stream of NOTIFYs between
// the old connection (delivers up to the marker, then pauses) and the new
// one (drops everything before the marker, delivers after it once
// resumed): together they deliver every number exactly once, the old one a
// prefix.
func TestMarkerSplit(t *testing.T) {
	url := db.TLSURL
	if url() == "" {
		url = db.URL
	}
	r1 := newRecorder()
	s := variant{name: "old", url: url}.open(t, r1, opts{}).(*loopSubject)
	const marker = "ms_marker"
	for _, ch := range []string{"ms_x", marker} {
		if err := s.listen(t, ch); err != nil {
			t.Fatal(err)
		}
	}
	oldPaused := make(chan struct{})
	s.on(t, func() { s.c.pauseAtMarker(marker, func() { close(oldPaused) }) })

	r2 := newRecorder()
	l2, err := loop.New(loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	go l2.Run()
	t.Cleanup(func() { l2.Stop(); <-l2.Done() })
	cc := mustParseConfig(t, url(), testApp())
	newMarked := make(chan struct{})
	c2, err := openForTakeover(ctxT(t), l2, Config{ConnConfig: cc,
		OnNotification: func(ch, p []byte) { r2.note(string(ch), string(p)) }, OnHealth: r2.onHealth,
		Logger: testLogger()}, []string{"ms_x"}, marker, func() { close(newMarked) })
	if err != nil {
		t.Fatal(err)
	}
	s2 := &loopSubject{l: l2, c: c2}
	t.Cleanup(func() { s2.on(t, func() { c2.Close(nil) }) })
	r2.waitHealth(t, 0, pgTimeout, true) // ms_x and the marker LISTENed

	// A stream of numbered NOTIFYs; the marker goes out in the middle.
	const total = 300
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; i <= total; i++ {
			if err := db.Exec(ctxT(t), fmt.Sprintf("NOTIFY ms_x, '%d'", i)); err != nil {
				t.Error(err)
				return
			}
			if i == total/2 {
				s2.on(t, func() {
					if err := c2.sendMarker(marker); err != nil {
						t.Error(err)
					}
				})
				// The marker's NOTIFY goes out on the new connection,
				// whenever its loop and the server get to it: wait until
				// it is back, so that it is committed between this
				// NOTIFY and the next and the split falls in the
				// middle (on a loaded machine it once came after all
				// 300, and the new side rightly delivered none).
				select {
				case <-newMarked:
				case <-time.After(pgTimeout):
					t.Error("the marker did not come back to the new connection")
					return
				}
			}
		}
	}()
	wg.Wait()
	for _, c := range []chan struct{}{oldPaused, newMarked} {
		testutil.WaitClosed(t, c, pgTimeout, "the marker did not arrive")
	}
	s2.on(t, func() {
		if err := c2.resume(); err != nil {
			t.Error(err)
		}
	})
	got := func(r *recorder, want int) []int {
		var out []int
		deadline := time.After(pgTimeout)
		for len(out) < want {
			select {
			case n := <-r.notes:
				if n.ch != "ms_x" {
					t.Fatalf("notification on %q", n.ch)
				}
				v, _ := strconv.Atoi(n.payload)
				out = append(out, v)
			case <-deadline:
				return out
			}
		}
		return out
	}
	// The old side delivered on its loop before it paused: all of it is
	// in the channel already.
	var old []int
	for drained := false; !drained; {
		select {
		case n := <-r1.notes:
			v, _ := strconv.Atoi(n.payload)
			old = append(old, v)
		default:
			drained = true
		}
	}
	newer := got(r2, total-len(old))
	all := append(slices.Clone(old), newer...)
	for i, v := range all {
		if v != i+1 {
			t.Fatalf("old delivered %d (%v…), new %d (%v…): position %d is %d", len(old), head(old), len(newer), head(newer), i+1, v)
		}
	}
	if len(all) != total || len(old) == 0 || len(newer) == 0 {
		t.Fatalf("old delivered %d, new %d, of %d", len(old), len(newer), total)
	}
	t.Logf("the marker split %d NOTIFYs: %d by the old connection, %d by the new", total, len(old), len(newer))
}

func head(v []int) []int { return v[:min(len(v), 5)] }

func notifySQL(t *testing.T, sql string) {
	t.Helper()
	if err := db.Exec(ctxT(t), sql); err != nil {
		t.Fatal(err)
	}
}
