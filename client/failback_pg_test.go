package client

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// seqCounts returns, for q, how many times each "seq N" payload arrived.
func (r *recorder) seqCounts(q string) map[int]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[int]int)
	for _, w := range r.wakes {
		if w.Q != q {
			continue
		}
		if s, ok := strings.CutPrefix(w.Payload, "seq "); ok {
			if n, err := strconv.Atoi(s); err == nil {
				m[n]++
			}
		}
	}
	return m
}

// backendSampler polls the hub's and the local listeners' backend counts
// and keeps every change, for the test's log.
type backendSampler struct {
	e     *pgEnv
	start time.Time
	stop  chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	changes []string
	maxSum  int
}

func (e *pgEnv) sampleBackends() *backendSampler {
	s := &backendSampler{e: e, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		last := ""
		for {
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			hubPIDs, err1 := e.db.BackendPIDs(ctx, e.hubApp)
			localPIDs, err2 := e.db.BackendPIDs(ctx, e.localApp)
			cancel()
			if err1 == nil && err2 == nil {
				now := fmt.Sprintf("hub %d local %d", len(hubPIDs), len(localPIDs))
				s.mu.Lock()
				if now != last {
					s.changes = append(s.changes, fmt.Sprintf("%6dms %s", time.Since(s.start).Milliseconds(), now))
					last = now
				}
				s.maxSum = max(s.maxSum, len(hubPIDs)+len(localPIDs))
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	e.t.Cleanup(s.halt)
	return s
}

func (s *backendSampler) halt() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// The whole cycle against the real binary and Postgres, NOTIFYs streaming
// all along: the hub is SIGKILLed, the worker fails over (1 local backend),
// a new hub is started on the same socket, the worker returns to it (the
// backends go back to the hub's one) and closes its own connection. No
// payload NOTIFY committed after the first ack is lost (the stream pauses
// across the failover gap, which rule 7's durable wake covers; it flows
// through the fail-back); duplicates occur only in the fail-back's overlap.
func TestPGFailbackHubKilledAndRestarted(t *testing.T) {
	e := newPGEnv(t)
	proc := e.startHubProcess()
	e.waitBackends(1, 0)
	samples := e.sampleBackends()
	rec := &recorder{}
	var n *notifier
	var sentAtFailback atomic.Int64
	failedBack := make(chan time.Time, 1)
	f := e.failover(rec, func(o *FailoverOptions) {
		o.MinLocal = 500 * time.Millisecond
		o.OnFailback = func() {
			sentAtFailback.Store(int64(n.sent()))
			failedBack <- time.Now()
		}
	})
	n = e.startNotifier("a")
	mustSubscribe(t, f, "a")
	// seq first and later started after the ack (see startNotifier).
	first := n.sent() + 2
	testutil.WaitFor(t, waitLong, "wakes through the hub", func() bool { return rec.maxSeq("a") >= first+20 })

	// Quiesce, so that no NOTIFY is inside the hub when it dies.
	n.pause()
	atKill := n.sent()
	testutil.WaitFor(t, waitLong, "every NOTIFY sent so far", func() bool { return rec.maxSeq("a") >= atKill })
	proc.Process.Kill()
	proc.Wait()
	testutil.WaitFor(t, waitLong, "local mode", func() bool { return f.Mode() == ModeLocal })
	e.waitBackends(0, 1)
	n.resume()
	testutil.WaitFor(t, waitLong, "wakes through the local listener", func() bool { return rec.maxSeq("a") >= atKill+20 })

	sentAtNewHub := n.sent()
	started := time.Now()
	e.startHubProcess()
	var backAt time.Time
	select {
	case backAt = <-failedBack:
	case <-time.After(waitLong + f.opts.ProbeMaxInterval):
		t.Fatalf("not back on the hub %v after its start (Mode %v)", time.Since(started), f.Mode())
	}
	if f.Mode() != ModeHub || f.Reason() != nil {
		t.Fatalf("Mode %v Reason %v after OnFailback", f.Mode(), f.Reason())
	}
	e.waitBackends(1, 0)
	atFailback := int(sentAtFailback.Load())
	testutil.WaitFor(t, waitLong, "wakes through the new hub", func() bool { return rec.maxSeq("a") >= atFailback+20 })
	n.halt()
	last := n.sent()
	testutil.WaitFor(t, waitLong, "the last NOTIFY", func() bool { return rec.maxSeq("a") >= last })
	samples.halt()

	counts := rec.seqCounts("a")
	var lost, dups []int
	for s := first; s <= last; s++ {
		if counts[s] == 0 {
			lost = append(lost, s)
		}
	}
	for s, c := range counts {
		if c > 1 {
			dups = append(dups, s)
			// Only a NOTIFY committed while both listeners were
			// LISTENing: after the new hub started, before the local
			// listener closed (OnFailback; +1 for the one whose
			// commit raced the read of n.sent there).
			if s <= sentAtNewHub || s > atFailback+1 || c > 2 {
				t.Errorf("seq %d arrived %d times, outside the overlap (seqs %d..%d)", s, c, sentAtNewHub+1, atFailback+1)
			}
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d NOTIFYs lost of seqs %d..%d: %v", len(lost), first, last, lost[:min(len(lost), 20)])
	}
	if got := rec.count("durable a"); got != 2 {
		t.Errorf("%d durable wakes, want 2 (after the failover, after the fail-back)", got)
	}
	samples.mu.Lock()
	defer samples.mu.Unlock()
	if samples.maxSum > 2 {
		t.Errorf("up to %d backends at once, want at most 2 (the new hub's and ours in the overlap)", samples.maxSum)
	}
	t.Logf("new hub started → back on the hub: %v (the first attempt comes MinLocal = %v after the failover)",
		backAt.Sub(started).Round(time.Millisecond), f.opts.MinLocal)
	t.Logf("NOTIFYs %d..%d: none lost; %d delivered twice, all in the overlap (seqs %d..%d)",
		first, last, len(dups), sentAtNewHub+1, atFailback)
	t.Logf("backends (hub, local) over time:\n  %s", strings.Join(samples.changes, "\n  "))
}

// OneWay against the real binary: after the failover the worker stays on
// its own connection although a new hub is up (the hub's backend plus ours).
func TestPGFailbackOneWay(t *testing.T) {
	e := newPGEnv(t)
	proc := e.startHubProcess()
	rec := &recorder{}
	f := e.failover(rec, func(o *FailoverOptions) {
		o.OneWay = true
		o.MinLocal, o.ProbeInterval, o.ProbeMaxInterval = time.Millisecond, time.Millisecond, time.Millisecond
	})
	mustSubscribe(t, f, "a")
	proc.Process.Kill()
	proc.Wait()
	testutil.WaitFor(t, waitLong, "local mode", func() bool { return f.Mode() == ModeLocal })
	e.startHubProcess()
	e.waitBackends(1, 1)
	// Without OneWay these timings return within milliseconds; give it
	// a generous second, then the worker must still be local.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if f.Mode() != ModeLocal {
			t.Fatal("a OneWay Failover returned to the hub")
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.waitBackends(1, 1)
	e.waitFlowing(rec, "a")
}
