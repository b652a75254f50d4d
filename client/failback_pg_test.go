package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
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
		if w.Name != q {
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
	f := e.failover(rec, func(o *foSetup) {
		o.FailbackDelay = 500 * time.Millisecond
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
			dups = append(dups, s) // the cut (cut.go) leaves none
		}
	}
	if len(dups) > 0 {
		t.Errorf("%d NOTIFYs delivered twice (the overlap was seqs %d..%d): %v", len(dups), sentAtNewHub+1, atFailback+1, dups[:min(len(dups), 20)])
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
	t.Logf("new hub started → back on the hub: %v (the first attempt comes FailbackDelay = %v after the failover)",
		backAt.Sub(started).Round(time.Millisecond), f.opts.FailbackDelay)
	t.Logf("NOTIFYs %d..%d: none lost, none twice (the overlap was seqs %d..%d)", first, last, sentAtNewHub+1, atFailback)
	t.Logf("backends (hub, local) over time:\n  %s", strings.Join(samples.changes, "\n  "))
}

// DisableFailback against the real binary: after the failover the worker stays on
// its own connection although a new hub is up (the hub's backend plus ours).
func TestPGFailbackOneWay(t *testing.T) {
	e := newPGEnv(t)
	proc := e.startHubProcess()
	rec := &recorder{}
	f := e.failover(rec, func(o *foSetup) {
		o.DisableFailback = true
		o.FailbackDelay, o.ProbeInterval, o.ProbeMaxInterval = time.Millisecond, time.Millisecond, time.Millisecond
	})
	mustSubscribe(t, f, "a")
	proc.Process.Kill()
	proc.Wait()
	testutil.WaitFor(t, waitLong, "local mode", func() bool { return f.Mode() == ModeLocal })
	e.startHubProcess()
	e.waitBackends(1, 1)
	// Without DisableFailback these timings return within milliseconds; give it
	// a generous second, then the worker must still be local.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if f.Mode() != ModeLocal {
			t.Fatal("a DisableFailback Failover returned to the hub")
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.waitBackends(1, 1)
	e.waitFlowing(rec, "a")
}

// seqOrder returns q's "seq N" payloads in the order they arrived.
func (r *recorder) seqOrder(q string) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for _, w := range r.wakes {
		if s, ok := strings.CutPrefix(w.Payload, "seq "); ok && w.Name == q {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// Fail-back is exact: numbered NOTIFYs at 500 a second flow through 20
// fail-backs (the hub killed while the notifier pauses, so that the
// failover's gap is not counted; restarted while it sends), and every one
// arrives exactly once, in commit order. The cut (cut.go) switches from
// the local listener to the hub at a marker both deliver.
func TestPGFailbackExactThrough20(t *testing.T) {
	const cycles = 20
	e := newPGEnv(t)
	proc := e.startHubProcess()
	e.waitBackends(1, 0)
	rec := &recorder{}
	var failbacks atomic.Int64
	f := e.failover(rec, func(o *foSetup) {
		o.FailbackDelay = 100 * time.Millisecond
		o.ProbeInterval = 50 * time.Millisecond
		o.ProbeMaxInterval = 200 * time.Millisecond
		o.OnFailback = func() { failbacks.Add(1) }
	})
	n := e.startNotifierAt("a", 500)
	mustSubscribe(t, f, "a")
	first := n.sent() + 2 // sent after the ack (see TestPGFailbackHubKilledAndRestarted)
	testutil.WaitFor(t, waitLong, "wakes through the hub", func() bool { return rec.maxSeq("a") >= first+20 })
	for i := 1; i <= cycles; i++ {
		n.pause()
		at := n.sent()
		testutil.WaitFor(t, waitLong, "every NOTIFY sent so far", func() bool { return rec.maxSeq("a") >= at })
		proc.Process.Kill()
		proc.Wait()
		testutil.WaitFor(t, waitLong, "local mode", func() bool { return f.Mode() == ModeLocal })
		n.resume()
		testutil.WaitFor(t, waitLong, "wakes through the local listener", func() bool { return rec.maxSeq("a") >= at+10 })
		proc = e.startHubProcess()
		testutil.WaitFor(t, waitLong, fmt.Sprintf("fail-back %d", i), func() bool { return failbacks.Load() == int64(i) })
		back := n.sent()
		testutil.WaitFor(t, waitLong, "wakes through the hub", func() bool { return rec.maxSeq("a") >= back+10 })
	}
	n.halt()
	last := n.sent()
	testutil.WaitFor(t, waitLong, "the last NOTIFY", func() bool { return rec.maxSeq("a") >= last })

	checkExactlyOnce(t, rec, "a", first, last, fmt.Sprintf("%d fail-backs", cycles))
}

// startHubOnOtherDatabase creates a database (name prefix + pid, dropped
// at the end) and runs `listenhub serve` on it, on e's socket.
func (e *pgEnv) startHubOnOtherDatabase(prefix string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	other := prefix + strconv.Itoa(os.Getpid())
	if err := e.db.Exec(ctx, "CREATE DATABASE "+other); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { e.db.Exec(context.Background(), "DROP DATABASE IF EXISTS "+other+" WITH (FORCE)") })
	cmd := exec.Command(listenhubBinary(e.t), "serve", "--database-url", strings.Replace(e.db.URL(), "/postgres?", "/"+other+"?", 1),
		"--socket", e.socket, "--application-name", e.hubApp, "--channel-prefix", e.prefix)
	cmd.Stdout, cmd.Stderr = e.logs, e.logs
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
}

// A hub on another database than the Failover's: its marker never comes
// back through the hub, so the Failover does not fail back to it. It stays
// on its own connection (the wakes keep coming) and says why once, at
// ERROR, naming its database.
func TestPGFailbackRefusesHubOnAnotherDatabase(t *testing.T) {
	e := newPGEnv(t)
	logs := &logBuf{}
	rec := &recorder{}
	var failbacks atomic.Int64
	f := e.failover(rec, func(o *foSetup) {
		o.FailbackDelay = 50 * time.Millisecond
		o.ProbeInterval = 50 * time.Millisecond
		o.ProbeMaxInterval = 100 * time.Millisecond
		o.Hub.AckTimeout = 500 * time.Millisecond
		o.OnFailback = func() { failbacks.Add(1) }
		o.Logger = logs.logger()
	})
	mustSubscribe(t, f, "a")
	if f.Mode() != ModeLocal {
		t.Fatalf("mode %v without a hub, want local", f.Mode())
	}
	e.startHubOnOtherDatabase("lhc_other_")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("client log:\n%s", logs.String())
		}
	})
	testutil.WaitFor(t, waitLong, "two refused fail-back attempts", func() bool {
		return strings.Count(logs.String(), "the hub does not deliver this database's notifications") >= 2
	})
	if n := failbacks.Load(); n != 0 || f.Mode() != ModeLocal {
		t.Fatalf("%d fail-backs, mode %v: failed back to a hub on another database", n, f.Mode())
	}
	e.waitFlowing(rec, "a")
	out := logs.String()
	if n := strings.Count(out, "level=ERROR msg=\"listenhub: not failing back to a hub on another database\""); n != 1 || !strings.Contains(out, "postgres at 127.0.0.1") {
		t.Errorf("%d ERROR lines naming the database, want 1:\n%s", n, out)
	}
}

// A fail-back that does not happen loses nothing: with a hub on another
// database on the socket, every attempt's marker passes the local
// listener and never the hub, and the local wakes held after the marker
// are delivered when the attempt is given up. Numbered NOTIFYs at 200 a
// second through 10 refused attempts: every one arrives exactly once, in
// commit order.
func TestPGRefusedFailbacksLoseNothing(t *testing.T) {
	const attempts = 10
	e := newPGEnv(t)
	rec := &recorder{}
	f, logs := e.probingFailover(rec)
	mustSubscribe(t, f, "a")
	n := e.startNotifierAt("a", 200)
	first := n.sent() + 2 // sent after the ack (see TestPGFailbackHubKilledAndRestarted)
	e.startHubOnOtherDatabase("lhc_refused_")
	refused := func() int {
		return strings.Count(logs.String(), "the hub does not deliver this database's notifications")
	}
	testutil.WaitFor(t, 2*waitLong, fmt.Sprintf("%d refused fail-back attempts", attempts), func() bool { return refused() >= attempts })
	n.halt()
	last := n.sent()
	testutil.WaitFor(t, waitLong, "the last NOTIFY", func() bool { return rec.maxSeq("a") >= last })
	if f.Mode() != ModeLocal {
		t.Fatalf("mode %v: failed back to a hub on another database", f.Mode())
	}
	checkExactlyOnce(t, rec, "a", first, last, fmt.Sprintf("%d refused fail-backs", refused()))
}

// A hub on another database at the start: the Failover's check NOTIFY
// never comes back through it, so it listens on its own connection from
// the start (Reason wraps ErrOtherDatabase), says so once at ERROR, and
// the fail-backs that follow refuse the hub too.
func TestPGFailoverRefusesHubOnAnotherDatabaseAtStart(t *testing.T) {
	e := newPGEnv(t)
	e.startHubOnOtherDatabase("lhc_start_")
	e.waitBackends(1, 0)
	rec := &recorder{}
	f, logs := e.probingFailover(rec)
	if f.Mode() != ModeLocal || !errors.Is(f.Reason(), ErrOtherDatabase) {
		t.Fatalf("mode %v, reason %v: want local for a hub on another database", f.Mode(), f.Reason())
	}
	mustSubscribe(t, f, "a")
	e.waitFlowing(rec, "a")
	testutil.WaitFor(t, waitLong, "a refused fail-back attempt", func() bool {
		return strings.Contains(logs.String(), "the hub does not deliver this database's notifications")
	})
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || f.Mode() != ModeLocal {
		t.Errorf("%d ERROR lines (want 1), mode %v (want local)", n, f.Mode())
	}
}

// probingFailover is a Failover that probes the hub every 50-100 ms with a
// 500 ms ack timeout, logging into the returned buffer (shown when the
// test fails).
func (e *pgEnv) probingFailover(rec *recorder) (*Failover, *logBuf) {
	e.t.Helper()
	logs := &logBuf{}
	f := e.failover(rec, func(o *foSetup) {
		o.FailbackDelay = 50 * time.Millisecond
		o.ProbeInterval = 50 * time.Millisecond
		o.ProbeMaxInterval = 100 * time.Millisecond
		o.Hub.AckTimeout = 500 * time.Millisecond
		o.Logger = logs.logger()
	})
	e.t.Cleanup(func() {
		if e.t.Failed() {
			e.t.Logf("client log:\n%s", logs.String())
		}
	})
	return f, logs
}

// checkExactlyOnce fails t unless every "seq N" payload on q from first to
// last arrived once, in commit order.
func checkExactlyOnce(t *testing.T, rec *recorder, q string, first, last int, through string) {
	t.Helper()
	counts := rec.seqCounts(q)
	var lost, dups []int
	for s := first; s <= last; s++ {
		switch {
		case counts[s] == 0:
			lost = append(lost, s)
		case counts[s] > 1:
			dups = append(dups, s)
		}
	}
	if len(lost) > 0 || len(dups) > 0 {
		t.Fatalf("seqs %d..%d through %s: %d lost %v, %d duplicated %v", first, last, through,
			len(lost), lost[:min(len(lost), 20)], len(dups), dups[:min(len(dups), 20)])
	}
	prev := 0
	for _, s := range rec.seqOrder(q) {
		if s < prev {
			t.Fatalf("seq %d arrived after seq %d: out of commit order", s, prev)
		}
		prev = s
	}
	t.Logf("seqs %d..%d through %s: none lost, none twice, in order", first, last, through)
}
