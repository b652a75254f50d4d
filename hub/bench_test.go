package hub

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

// benchHub is a hub whose loop never runs: the benchmark goroutine plays the
// loop thread (loop methods are allowed before Run), calling the fanout and
// the end-of-iteration flush directly. n workers on socketpairs are
// subscribed to "bench"; a goroutine per worker drains the other end.
func benchHub(b testing.TB, n int) *Hub {
	b.Helper()
	h, err := New(Config{SocketPath: "/nonexistent/bench.sock", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	l, err := loop.New(loop.Options{})
	if err != nil {
		b.Fatal(err)
	}
	h.loop = l
	h.pg = &fakePG{l: l}
	h.healthy = true
	ch := &channel{q: "bench", pg: "bench", state: stateListening}
	h.channels["bench"] = ch
	var peers []*os.File
	for i := range n {
		fds, err := testutil.Socketpair(unix.SOCK_STREAM, false)
		if err != nil {
			b.Fatal(err)
		}
		unix.SetNonblock(fds[0], true)
		w := &worker{id: uint64(i + 1), fd: int32(fds[0])}
		w.out.Max = h.bufferMax()
		w.out.Retain = true // a busy worker, as the status tick marks one
		if w.tok, err = l.Register(fds[0], loop.Readable, func(loop.Events) {}); err != nil {
			b.Fatal(err)
		}
		h.workers.add(w)
		h.addSub(w, ch)
		peer := os.NewFile(uintptr(fds[1]), "peer")
		peers = append(peers, peer)
		go io.Copy(io.Discard, peer)
	}
	b.Cleanup(func() {
		for _, w := range h.workers.list {
			unix.Close(int(w.fd))
		}
		for _, p := range peers {
			p.Close()
		}
		discardLoop(l)
	})
	return h
}

// drain waits, with the benchmark timer stopped, until every worker's
// reader has taken everything (hub buffers empty, SIOCOUTQ zero): the write
// benchmarks measure the hub's cost, not how fast 64 reader goroutines
// sharing the machine's cores keep up.
func drain(b *testing.B, h *Hub) {
	b.StopTimer()
	defer b.StartTimer()
	deadline := time.Now().Add(10 * time.Second)
	for _, w := range h.workers.list {
		for {
			if w.out.Len() > 0 {
				h.write(w)
			}
			n, err := unsentBytes(int(w.fd))
			if err != nil {
				b.Fatal(err)
			}
			if n == 0 && w.out.Len() == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("readers did not drain")
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// noEvictions fails a benchmark whose workers fell behind and were evicted:
// its numbers would measure a fanout to nobody.
func noEvictions(b *testing.B, h *Hub) {
	b.Helper()
	if s := h.Stats(); s.Evictions != 0 {
		b.Fatalf("%d of the benchmark's workers were evicted (readers too slow); numbers meaningless", s.Evictions)
	}
}

// The fanout alone: one ephemeral NOTIFY encoded once and copied to 64
// workers' buffers, which are then emptied as if the kernel took it all.
// Must not allocate.
func BenchmarkFanout64(b *testing.B) {
	h := benchHub(b, 64)
	payload := []byte(strings.Repeat("x", 100))
	b.ReportAllocs()
	for b.Loop() {
		h.onNotification([]byte("bench"), payload)
		for _, w := range h.dirty {
			w.out.Discard(w.out.Len())
			w.dirty = false
		}
		h.dirty = h.dirty[:0]
	}
	noEvictions(b, h)
}

// One wake fanned out to 256 workers over socketpairs, with the real
// end-of-iteration flush: 256 writes of one frame each. The per-wake cost
// the hub pays for a large host; must not allocate.
func BenchmarkFanoutWrite256(b *testing.B) { benchFanoutWrite256(b, 0) }

// The same with every write on the loop's thread (WriteThreads 1).
func BenchmarkFanoutWrite256OneThread(b *testing.B) { benchFanoutWrite256(b, 1) }

func benchFanoutWrite256(b *testing.B, threads int) {
	h := benchHub(b, 256)
	if threads > 0 {
		h.cfg.WriteThreads = threads
	}
	payload := []byte(strings.Repeat("x", 100))
	// Warm up: the first wakes take the rings' slabs and the readers'
	// copy buffers; the steady state is what is measured.
	for range 16 {
		h.onNotification([]byte("bench"), payload)
		h.flush()
	}
	drain(b, h)
	fanoutLoop(b, h, 256, 1, 256)
}

// fanoutLoop measures batch NOTIFYs and one flush per iteration to h's
// workers, which read everything every drainEvery iterations, and reports
// the frames written per second.
func fanoutLoop(b *testing.B, h *Hub, workers, batch, drainEvery int) {
	payload := []byte(strings.Repeat("x", 100))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		for range batch {
			h.onNotification([]byte("bench"), payload)
		}
		h.flush()
		if i++; i%drainEvery == 0 {
			drain(b, h)
		}
	}
	b.ReportMetric(float64(batch*workers)*float64(b.N)/b.Elapsed().Seconds(), "frames/s")
	noEvictions(b, h)
}

// Fanout and flush with real writes: 16 NOTIFYs per iteration (one read of
// the Postgres socket) to 64 workers, one write per worker per iteration.
func BenchmarkFanoutWrite64Batch16(b *testing.B) { fanoutLoop(b, benchHub(b, 64), 64, 16, 32) }

// The same with one NOTIFY per iteration: one write per frame.
func BenchmarkFanoutWrite64Batch1(b *testing.B) { fanoutLoop(b, benchHub(b, 64), 64, 1, 256) }

// NOTIFY→worker latency with 64 workers on a real hub and a real Postgres:
// from just before the notifier sends NOTIFY (the payload carries that
// time) until each worker has decoded the wake. Reports p50 and p99 over
// all (NOTIFY, worker) pairs.
func BenchmarkNotifyLatency64(b *testing.B) {
	e := newPGEnv(b, nil)
	const workers = 64
	lat := make(chan time.Duration, workers*16)
	for range workers {
		w := e.dial()
		w.subscribe("lat")
		go func() {
			for {
				m, err := w.read(time.Hour)
				if err != nil {
					return
				}
				if m.Type != "wake" {
					continue
				}
				sent, _ := strconv.ParseInt(m.Payload, 10, 64)
				lat <- time.Duration(time.Now().UnixNano() - sent)
			}
		}()
	}
	notifier := connect(b, e.db.URL())
	var all []time.Duration
	for b.Loop() {
		sql := fmt.Sprintf("NOTIFY lat, '%d'", time.Now().UnixNano())
		if err := notifier.Exec(context.Background(), sql).Close(); err != nil {
			b.Fatal(err)
		}
		for range workers {
			all = append(all, <-lat)
		}
	}
	slices.Sort(all)
	q := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(float64(all[len(all)-1].Microseconds()), "max-µs")
}
