package main

import (
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/testutil"
)

// Descriptor pressure: RLIMIT_NOFILE lowered under a running hub to what
// a little below what it holds (every descriptor taken by workers
// admitted under the old limit), then its Postgres backend terminated. The Postgres
// connection and /healthz get descriptors first: the newest workers are
// shed down to the new budget (they see EOF and fall back; counted and
// logged), the reconnect succeeds, /healthz answers 200, the oldest worker
// (the sibling) stays and gets a NOTIFY sent after the reconnect, and the
// metrics server does not spin on EMFILE meanwhile.
func TestAttackLoweredFDLimitSheds(t *testing.T) {
	const n = 110 // the black-box check's 114 workers under a limit of 128, give or take the hub's own
	h := startAttackHub(t, nil)
	sib := dialWorker(t, h.socket)
	sib.sub("fdshed.sib")
	ws := connectWorkers(t, h.socket, "fdshed.w", n)
	h.waitMetric("listenhub_workers", n+1, timeout)

	var old unix.Rlimit
	if err := prlimitNofile(h.pid(), nil, &old); err != nil {
		t.Skipf("prlimit: %v", err)
	}
	open := h.fds()
	// Below what it holds: not one descriptor left, even if a few close
	// meanwhile (a keep-alive connection of a scrape, say).
	lim := unix.Rlimit{Cur: testutil.Rlim(open-8, old.Cur), Max: old.Max}
	if err := prlimitNofile(h.pid(), &lim, nil); err != nil {
		t.Skipf("prlimit: %v", err)
	}
	t.Cleanup(func() { prlimitNofile(h.pid(), &old, nil) })
	mark := h.log.mark()

	// At once, before any status tick re-read the limit.
	start := h.terminateBackend()
	sib.status(false)
	sib.status(true)
	reconnect := time.Since(start)
	if m := sib.expect("wake"); m.Name != "fdshed.sib" || m.HasPayload {
		t.Fatalf("resync wake %+v", m)
	}
	codes, _ := healthzCodes(h.addr, 10)
	if codes[200] != 10 {
		t.Fatalf("/healthz after the reconnect: %v\n%s", codes, tail(h.log.since(t, mark), 3000))
	}
	notify(t, "NOTIFY \"fdshed.sib\", 'after'")
	if m := sib.expect("wake"); m.Name != "fdshed.sib" || m.Payload != "after" {
		t.Fatalf("the sibling after the reconnect: %+v", m)
	}

	// Which workers were shed: those that see EOF. They must be the
	// newest, as many as the metrics say.
	m := h.metrics()
	kept := int(m["listenhub_workers"]) - 1 // the sibling
	shedCount := n - kept
	eof := make([]bool, n)
	var wg sync.WaitGroup
	for i, c := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			deadline := time.Now().Add(2 * time.Second)
			for {
				c.SetReadDeadline(deadline)
				_, err := c.Read(buf)
				if err == nil {
					continue
				}
				eof[i] = !errors.Is(err, os.ErrDeadlineExceeded)
				return
			}
		}()
	}
	wg.Wait()
	var firstShed = -1
	got := 0
	for i, e := range eof {
		if e {
			got++
			if firstShed < 0 {
				firstShed = i
			}
		}
	}
	log := h.log.since(t, mark)
	accepts := strings.Count(log, "Accept error") + strings.Count(log, "accept paused")
	t.Logf("%d workers + a sibling, RLIMIT_NOFILE lowered to %d (the hub held %d), backend terminated: healthy again after %v; %d workers shed (metric %v), %d kept; 10 /healthz: %v; %d log lines since, %d about accepting",
		n, lim.Cur, open, reconnect.Round(time.Millisecond), got, m["listenhub_workers_shed_total"], kept, codes,
		strings.Count(log, "\n"), accepts)
	if reconnect > 10*time.Second {
		t.Fatalf("healthy again only after %v: the reconnect starved", reconnect)
	}
	if shedCount <= 0 || got != shedCount {
		t.Fatalf("%d workers saw EOF, %d left the hub (workers metric %v)", got, shedCount, m["listenhub_workers"])
	}
	if firstShed != n-shedCount {
		t.Fatalf("shed workers from index %d on, want the newest %d (from %d): %v", firstShed, shedCount, n-shedCount, eof)
	}
	if m["listenhub_workers_shed_total"] != float64(shedCount) {
		t.Fatalf("listenhub_workers_shed_total %v, %d shed", m["listenhub_workers_shed_total"], shedCount)
	}
	if !strings.Contains(log, "workers shed") {
		t.Fatalf("no line about the shed workers in the log:\n%s", tail(log, 3000))
	}
	if strings.Count(log, "too many open files") > 20 || accepts > 20 {
		t.Fatalf("the log repeats EMFILE (%d accept lines):\n%s", accepts, tail(log, 3000))
	}

	// The limit back up: workers are admitted again.
	if err := prlimitNofile(h.pid(), &old, nil); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "a worker admitted again", func() bool {
		_, ok, _ := dialRaw(t, h.socket, 0)
		return ok
	})
}

// TestLoweredFDLimitRefusalNamesIt: a worker refused because RLIMIT_NOFILE
// lowered the cap is told so, not pointed at --max-workers, which is far
// above it and would not help.
func TestLoweredFDLimitRefusalNamesIt(t *testing.T) {
	h := startAttackHub(t, nil)
	first := dialWorker(t, h.socket)
	first.sub("fdcap.first")
	var old unix.Rlimit
	if err := prlimitNofile(h.pid(), nil, &old); err != nil {
		t.Skipf("prlimit: %v", err)
	}
	// Room to accept, none left for a second worker after the reserve.
	lim := unix.Rlimit{Cur: testutil.Rlim(h.fds()+10, old.Cur), Max: old.Max}
	mark := h.log.mark()
	if err := prlimitNofile(h.pid(), &lim, nil); err != nil {
		t.Skipf("prlimit: %v", err)
	}
	t.Cleanup(func() { prlimitNofile(h.pid(), &old, nil) })
	testutil.WaitFor(t, 5*time.Second, "the cap lowered to 1", func() bool {
		return strings.Contains(h.log.since(t, mark), `"max_workers":1,`)
	})
	_, ok, nack := dialRaw(t, h.socket, 1)
	if ok {
		t.Fatal("a second worker was admitted past a cap of 1")
	}
	if !strings.Contains(nack, "RLIMIT_NOFILE") || strings.Contains(nack, "--max-workers") {
		t.Fatalf("refused with %q: want the cause, RLIMIT_NOFILE, not --max-workers", nack)
	}
}
