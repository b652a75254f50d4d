package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

// Attack (answers a worker never reads): 100 connections send subs the hub refuses
// (names one byte too long for Postgres) as fast as they can and never read
// the nacks. The hub stops reading each of them once its unread answers
// pass a threshold (backpressure, not eviction): its RSS stays within 200
// MiB of idle, nobody is evicted, a sibling loses nothing, and a flooder
// that starts reading gets every nack and is served again.
func TestAttackNackFlood(t *testing.T) {
	const conns = 100
	flood := 3 * time.Second
	if os.Getenv("LISTENHUB_TEST_LARGE_SET") != "" {
		flood = 15 * time.Second
	}
	h := startAttackHub(t, nil)
	sib := startSibling(t, h.socket, "sib", 25)
	base := int64(h.rssKiB())
	rss := sampleRSS(t, h.pid())

	bad := strings.Repeat("n", 64)
	var chunk []byte
	for len(chunk) < 64<<10 {
		chunk = frame.AppendSub(chunk, bad)
	}
	subSize := len(frame.AppendSub(nil, bad))
	ws := make([]*worker, conns)
	for i := range ws {
		ws[i] = dialWorker(t, h.socket)
	}
	var (
		wg      sync.WaitGroup
		stop    = make(chan struct{})
		written = make([]int64, conns)
		broken  atomic.Int64
		errMu   sync.Mutex
		errs    []string
	)
	start := time.Now()
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := 0 // chunk is whole frames: a write cut short goes on where it stopped
			for {
				select {
				case <-stop:
					return
				default:
				}
				w.c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				n, err := w.c.Write(chunk[off:])
				written[i] += int64(n)
				off = (off + n) % len(chunk)
				if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					broken.Add(1)
					errMu.Lock()
					errs = append(errs, fmt.Sprintf("flooder %d: %v", i, err))
					errMu.Unlock()
					return
				}
			}
		}()
	}
	time.Sleep(flood) // the attack runs for a fixed time; the sibling's stream runs through it
	close(stop)
	wg.Wait()
	peak := rss.end()
	var total int64
	for _, n := range written {
		total += n
	}
	m := h.metrics()
	t.Logf("%d connections flooding refused subs for %v without reading: %d MB of subs written (%d subs), %v nacked; hub RSS %d KiB idle, peak %d KiB (+%d KiB); evictions %v, workers paused %v, read pauses %v, outbound bytes %v",
		conns, time.Since(start).Round(time.Millisecond), total>>20, total/int64(subSize), m["listenhub_nacks_total"],
		base, peak, peak-base, m["listenhub_evictions_total"], m["listenhub_workers_paused"], m["listenhub_read_pauses_total"],
		m["listenhub_outbound_bytes"])
	if grow := peak - base; grow > 200<<10 {
		t.Fatalf("hub RSS grew %d KiB (from %d to %d): the bound is idle + 200 MiB", grow, base, peak)
	}
	if n := broken.Load(); n > 0 || m["listenhub_evictions_total"] > 0 {
		t.Fatalf("flooders cut off (%d, evictions %v): backpressure must not evict: %v", n, m["listenhub_evictions_total"], errs)
	}
	if m["listenhub_workers"] != conns+1 {
		t.Fatalf("%v workers connected, want %d", m["listenhub_workers"], conns+1)
	}
	h.healthyThroughout()
	t.Logf("sibling: %v", sib.check(2*time.Second))

	// A flooder that reads gets a nack for every sub it wrote (the one
	// the write deadline cut is completed first) and is served again.
	w := ws[0]
	want := written[0] / int64(subSize)
	var tail []byte
	if rest := written[0] % int64(subSize); rest > 0 {
		want++
		tail = frame.AppendSub(nil, bad)[rest:]
	}
	tail = frame.AppendSub(tail, "ok.after.flood")
	wrote := make(chan error, 1)
	go func() { // its socket is full until it reads
		w.c.SetWriteDeadline(time.Now().Add(timeout))
		_, err := w.c.Write(tail)
		wrote <- err
	}()
	var nacks int64
	for {
		m, err := w.read(timeout)
		if err != nil {
			t.Fatalf("flooder 0, after %d nacks of %d: %v", nacks, want, err)
		}
		if m.Type == "nack" && m.Name == bad {
			nacks++
			continue
		}
		if m.Type == "ack" && m.Name == "ok.after.flood" {
			break
		}
		if m.Type != "status" {
			t.Fatalf("flooder 0, after %d nacks: %+v", nacks, m)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if nacks != want {
		t.Fatalf("flooder 0 got %d nacks for the %d subs it wrote", nacks, want)
	}
	for _, w := range ws {
		w.c.Close()
	}
	h.waitMetric("listenhub_workers", 1, timeout)
	testutil.WaitFor(t, timeout, "the hub holds nothing for workers", func() bool {
		return h.metric("listenhub_outbound_bytes") == 0 && h.metric("listenhub_workers_paused") == 0
	})
}
