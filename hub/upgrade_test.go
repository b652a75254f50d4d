package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/fdpass"
)

// TestHandedWorkerRoundTrip: a worker's state survives encoding to JSON and
// rebuilding in another hub: the unsent bytes frame by frame (the first one
// partly written), the durable wakes still mergeable, the unsent status,
// the partial inbound frame and the subscriptions.
func TestHandedWorkerRoundTrip(t *testing.T) {
	cfg := Config{SocketPath: filepath.Join(t.TempDir(), "s")}
	old, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ch := &channel{q: "a", pg: "a", state: stateListening}
	old.channels["a"] = ch
	connected := time.Now().Add(-time.Hour)
	w := &worker{id: 7, fd: 3, pid: 42, uid: 1000,
		connectedAt: connected.UnixNano(), framesSent: 11, durableCoalesced: 12, durableDropped: 13}
	w.out.Max = old.bufferMax()
	old.addSub(w, ch)

	wake := frame.AppendWake(nil, "x", []byte("first"), true)
	if err := w.out.Append(wake); err != nil {
		t.Fatal(err)
	}
	w.out.Discard(5) // the kernel took part of the first frame
	old.enqueueDurable(w, "a", frame.AppendWake(nil, "a", nil, false))
	old.sendStatus(w)
	old.enqueue(w, frame.AppendWake(nil, "x", []byte("second"), true))
	sub := frame.AppendSub(nil, "b")
	w.dec.Feed(sub[:len(sub)-3]) // a partial inbound frame
	if _, ok, _ := w.dec.Next(); ok {
		t.Fatal("partial frame decoded")
	}

	hw := handWorker(w, 2)
	b, err := json.Marshal(hw)
	if err != nil {
		t.Fatal(err)
	}
	var back handedWorker
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	bs := []handedWorker{back}
	rawRoundTrip(t, []handedWorker{hw}, bs)
	back = bs[0]

	nh, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nch := &channel{q: "a", pg: "a", state: stateListening}
	nh.channels["a"] = nch
	nw := nh.adoptWorker(&back, 9)

	if nw.id != 7 || nw.fd != 9 || nw.pid != 42 || nw.uid != 1000 {
		t.Errorf("identity: id %d fd %d pid %d uid %d", nw.id, nw.fd, nw.pid, nw.uid)
	}
	// What Hub.Workers shows carries over: connected since, counters.
	if nw.connectedAt != connected.UnixNano() || nw.framesSent != 11 || nw.durableCoalesced != 12 || nw.durableDropped != 13 {
		t.Errorf("introspection: connected %v (want %v), sent %d, coalesced %d, dropped %d; want 11, 12, 13",
			nw.connectedAt, connected, nw.framesSent, nw.durableCoalesced, nw.durableDropped)
	}
	oa, ob := w.out.Peek()
	na, nb := nw.out.Peek()
	if want, got := append(append([]byte{}, oa...), ob...), append(append([]byte{}, na...), nb...); !bytes.Equal(got, want) {
		t.Errorf("unsent bytes differ:\n got %q\nwant %q", got, want)
	}
	if nw.out.Frames() != w.out.Frames() || nw.out.Frames() != 4 {
		t.Errorf("frames: %d, old %d, want 4", nw.out.Frames(), w.out.Frames())
	}
	if nw.pendingDurable() != 1 || nw.tr.durableBytes != w.tr.durableBytes {
		t.Errorf("durable: %d pending, %d bytes; want 1, %d", nw.pendingDurable(), nw.tr.durableBytes, w.tr.durableBytes)
	}
	if !nw.hasStatus {
		t.Error("the unsent status was not carried over")
	}
	if nw.subs.get("a") != nch || len(nch.subs) != 1 {
		t.Error("subscription not rebuilt")
	}
	// A durable wake for a still merges into the handed one.
	before := nh.stats.durableCoalesced.Load()
	nh.enqueueDurable(nw, "a", frame.AppendWake(nil, "a", nil, false))
	if nh.stats.durableCoalesced.Load() != before+1 {
		t.Error("a durable wake after the hand-over did not merge into the handed one")
	}
	// The rest of the partial inbound frame completes it.
	nw.dec.Feed(sub[len(sub)-3:])
	m, ok, err := nw.next()
	if err != nil || !ok || m.Type != "sub" || m.Name != "b" {
		t.Errorf("inbound frame after the hand-over: %+v %v %v", m, ok, err)
	}
	// Written out, the bytes make whole frames: the partial first one's
	// rest, then the others.
	var dec frame.Decoder
	dec.Feed(wake[:5])
	dec.Feed(append(append([]byte{}, na...), nb...))
	var types []string
	for {
		m, ok, err := dec.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		types = append(types, m.Type)
	}
	if got := len(types); got != 4 {
		t.Errorf("decoded %v, want 4 frames", types)
	}
}

// TestHandedStateJSON: the hub state message survives JSON with every
// field, descriptors as indexes.
func TestHandedStateJSON(t *testing.T) {
	st := handedHub{Version: handedVersion, Socket: handedSocket{FD: 0, Path: "/run/x.sock", Dev: 1, Ino: 2},
		PGFD: 1, Healthy: true, NextID: 99, Stats: Stats{Accepts: 5, Upgrades: 3},
		Channels: []handedChannel{{Q: "q", PG: "p.q"}},
		Workers:  []handedWorker{{ID: 1, FD: 2, Subs: []string{"p.q"}, Out: []byte{1, 2}, Ends: []uint64{2}, Spans: []span{{start: 0, end: 2}}, Answers: []span{{start: 2, end: 4}}, StatusAt: -1}},
		Extra:    map[string]int{"metrics": 3}}
	b, err := json.Marshal(upMsg{T: "state", State: &st})
	if err != nil {
		t.Fatal(err)
	}
	var m upMsg
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(m.State)
	want, _ := json.Marshal(&st)
	if !bytes.Equal(got, want) {
		t.Errorf("round trip:\n got %s\nwant %s", got, want)
	}
	if m.State.Workers[0].Spans[0] != (span{start: 0, end: 2}) || m.State.Workers[0].Answers[0] != (span{start: 2, end: 4}) {
		t.Errorf("span: %+v", m.State.Workers[0].Spans[0])
	}
}

// rawRoundTrip sends the workers' bytes of from as an upgrade does and
// receives them into to (the same workers, through JSON).
func rawRoundTrip(t *testing.T, from, to []handedWorker) {
	t.Helper()
	a, b := connPair(t)
	sent := make(chan error, 1)
	go func() { sent <- sendRaw(a, from) }()
	if err := recvRaw(b, to); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}

// TestHandedStateFromVersion2: the state of a 0.1.0 hub (version 2: no
// mem_fd field, every worker's bytes raw) is adopted as having no memfd,
// instead of taking descriptor 0 for one; other versions are refused.
func TestHandedStateFromVersion2(t *testing.T) {
	var st handedHub
	v2 := `{"version":2,"socket":{"fd":0,"path":"/run/x.sock","Dev":1,"Ino":2},"pg_fd":1,"healthy":true,"next_id":3,
		"channels":[{"q":"q","pg":"q"}],"workers":[{"id":1,"fd":2,"subs":["q"],"out_len":2,"frames":1}]}`
	if err := json.Unmarshal([]byte(v2), &st); err != nil {
		t.Fatal(err)
	}
	if err := st.fromVersion(); err != nil || st.MemFD != -1 {
		t.Fatalf("version 2: %v, MemFD %d, want accepted with -1", err, st.MemFD)
	}
	st = handedHub{Version: 2, Workers: []handedWorker{{ID: 7, Mapped: true}}}
	if err := st.fromVersion(); err == nil {
		t.Error("a version 2 state with a mapped worker accepted")
	}
	for _, v := range []int{1, handedVersion + 1} {
		st = handedHub{Version: v}
		if err := st.fromVersion(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("state version %d", v)) {
			t.Errorf("version %d: %v, want refused", v, err)
		}
	}
	st = handedHub{Version: handedVersion, MemFD: 4}
	if err := st.fromVersion(); err != nil || st.MemFD != 4 {
		t.Errorf("this version: %v, MemFD %d", err, st.MemFD)
	}
}

// connPair returns the two ends of an upgrade's conversation, closed when
// the test ends.
func connPair(t *testing.T) (a, b *fdpass.Conn) {
	t.Helper()
	fa, fb, err := fdpass.Pair()
	if err != nil {
		t.Fatal(err)
	}
	a, err = fdpass.New(fa)
	fa.Close()
	if err != nil {
		fb.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err = fdpass.New(fb)
	fb.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b
}

// upgradeInProcess starts an upgrade of h to a new hub of this process
// with h's configuration (stopped when the test ends): handed and took
// report the ends' results, handover's and takeover's.
func upgradeInProcess(t *testing.T, h *Hub) (nh *Hub, handed, took <-chan error) {
	t.Helper()
	nh, err := New(h.Config())
	if err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, nh, nil)
	oldEnd, newEnd := connPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	tk := make(chan error, 1)
	go func() {
		_, err := nh.takeover(ctx, newEnd, nil)
		tk <- err
	}()
	hd := make(chan error, 1)
	go func() { hd <- h.handover(ctx, oldEnd, nil) }()
	return nh, hd, tk
}

// helloPrepared plays a new process on fake up to the freeze: hello, the
// old one's plan, prepared. It returns the plan.
func helloPrepared(fake *fdpass.Conn) (upMsg, error) {
	if err := sendMsg(fake, upMsg{T: "hello", PID: 1}, nil); err != nil {
		return upMsg{}, err
	}
	plan, _, err := recvMsg(fake)
	if err != nil {
		return upMsg{}, err
	}
	return plan, sendMsg(fake, upMsg{T: "prepared"}, nil)
}
