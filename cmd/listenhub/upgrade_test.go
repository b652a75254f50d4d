package main

// Hot upgrade (SIGUSR2) of the real binary against a real Postgres: the
// process that serves changes, the workers' connections do not.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

// upHub is a `listenhub serve` that is upgraded: the process serving is
// whatever the pid file names, not the one the test started.
type upHub struct {
	t       *testing.T
	bin     string // the path the hub runs from (a copy the test may replace)
	socket  string
	pidFile string
	logPath string
	app     string
	seen    []int // every serving pid, for the cleanup
	// firstDone is closed when the process the test started has exited,
	// firstErr its Wait result.
	firstDone chan struct{}
	firstErr  error
}

// replaceBin puts a script at the hub's path, unlinking the running binary
// first (never written into).
func (u *upHub) replaceBin(script string) {
	u.t.Helper()
	if err := os.Remove(u.bin); err != nil {
		u.t.Fatal(err)
	}
	if err := os.WriteFile(u.bin, []byte(script), 0o755); err != nil {
		u.t.Fatal(err)
	}
}

// waitFirstExit fails the test unless the process the test started exits
// within d; what says what should have ended it.
// sigtermExits sends SIGTERM to pid, the process the test started, and
// checks that it exits 0 within 5 s (when says in what state).
func (u *upHub) sigtermExits(pid int, when string) {
	u.t.Helper()
	start := time.Now()
	syscall.Kill(pid, syscall.SIGTERM)
	u.waitFirstExit(5*time.Second, "SIGTERM "+when)
	u.t.Logf("SIGTERM %s: exited in %v (%v)", when, time.Since(start).Round(time.Millisecond), u.firstErr)
	if u.firstErr != nil {
		u.t.Errorf("exit: %v, want 0", u.firstErr)
	}
}

func (u *upHub) waitFirstExit(d time.Duration, what string) {
	u.t.Helper()
	select {
	case <-u.firstDone:
	case <-time.After(d):
		u.t.Fatalf("%s: the first process is still running after %v", what, d)
	}
}

// startUpHub copies the binary into a directory of the test's (so that a
// test can replace the file at that path) and starts it serving.
func startUpHub(t *testing.T, dbURL string, args ...string) *upHub {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "listenhub")
	copyFile(t, hubBinary(t), bin)
	return startUpHubAt(t, bin, dbURL, args...)
}

// startUpHubAt starts the hub from bin, as given (a link, say).
func startUpHubAt(t *testing.T, bin, dbURL string, args ...string) *upHub {
	t.Helper()
	dir := t.TempDir()
	u := &upHub{t: t, bin: bin, socket: filepath.Join(dir, "hub.sock"),
		pidFile: filepath.Join(dir, "hub.pid"), logPath: filepath.Join(dir, "hub.log"), app: testApp(t),
		firstDone: make(chan struct{})}
	logf, err := os.OpenFile(u.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	full := append([]string{"serve", "--log-format", "json", "--log-level", "info", "--socket", u.socket,
		"--database-url", dbURL, "--application-name", u.app, "--pid-file", u.pidFile}, args...)
	cmd := exec.Command(u.bin, full...)
	cmd.Env = cleanEnv()
	// A file, not a pipe: the new processes inherit it and outlive the
	// first one, which the test reaps on its own.
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { u.firstErr = cmd.Wait(); close(u.firstDone) }()
	u.seen = append(u.seen, cmd.Process.Pid)
	t.Cleanup(func() {
		// The pid file too: a process started by an upgrade the test
		// gave up waiting for is in no list of the test's.
		for _, pid := range append(u.seen, u.pid()) {
			if pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			// The upgrade lines and the tail: the whole log of 21
			// workers coming and going buries the failure above it.
			var keep []string
			lines := strings.Split(u.log(), "\n")
			for i, l := range lines {
				if strings.Contains(l, "upgrade") || strings.Contains(l, `"level":"WARN"`) ||
					strings.Contains(l, `"level":"ERROR"`) || i >= len(lines)-20 {
					keep = append(keep, l)
				}
			}
			t.Logf("listenhub log (upgrade lines, warnings, tail):\n%s", strings.Join(keep, "\n"))
		}
	})
	testutil.WaitFor(t, timeout, "the pid file", func() bool { return u.pid() == cmd.Process.Pid })
	return u
}

// frozenWindows reads from the log how long each upgrade held the workers:
// from the old process's "freezing" to the new one's "took over".
func (u *upHub) frozenWindows() []time.Duration {
	var out []time.Duration
	var since time.Time
	for _, line := range strings.Split(u.log(), "\n") {
		var l struct {
			Time time.Time
			Msg  string
		}
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		switch l.Msg {
		case "upgrade: new process is up; freezing":
			since = l.Time
		case "upgrade: took over":
			if !since.IsZero() {
				out = append(out, l.Time.Sub(since))
				since = time.Time{}
			}
		}
	}
	return out
}

// metricsAddr is the address the hub logged for --metrics-addr.
func (u *upHub) metricsAddr() string {
	u.t.Helper()
	re := regexp.MustCompile(`"msg":"metrics listening","addr":"([^"]+)"`)
	var addr string
	testutil.WaitFor(u.t, timeout, "the metrics address in the log", func() bool {
		if m := re.FindStringSubmatch(u.log()); m != nil {
			addr = m[1]
			return true
		}
		return false
	})
	return addr
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b := testutil.ReadFile(t, from)
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func (u *upHub) log() string {
	b, _ := os.ReadFile(u.logPath)
	return string(b)
}

// pid is the pid in the pid file, 0 when there is none.
func (u *upHub) pid() int {
	b, err := os.ReadFile(u.pidFile)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// upgrade sends SIGUSR2 to the serving process and waits until another one
// serves (the pid file names it) and the old one is gone. It returns the
// new pid and the time from the signal to the pid file's change.
func (u *upHub) upgrade() (int, time.Duration) {
	u.t.Helper()
	old := u.pid()
	start := time.Now()
	if err := syscall.Kill(old, syscall.SIGUSR2); err != nil {
		u.t.Fatal(err)
	}
	var pid int
	testutil.WaitFor(u.t, 30*time.Second, "a new serving pid", func() bool {
		pid = u.pid()
		return pid != old && pid != 0
	})
	took := time.Since(start)
	u.seen = append(u.seen, pid)
	testutil.WaitFor(u.t, 30*time.Second, "the old process to exit", func() bool { return !alive(old) })
	return pid, took
}

// seqWorker is a worker connection whose reader goroutine records the
// payloads of the wakes on one channel, acks, and EOF.
type seqWorker struct {
	c net.Conn

	mu     sync.Mutex
	seqs   []int
	acks   []string
	err    error // how reading ended (EOF: the hub closed us)
	last   time.Time
	maxGap time.Duration
	ackCh  chan string
}

func dialSeqWorker(t *testing.T, socket string, subs ...string) *seqWorker {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	w := &seqWorker{c: c, ackCh: make(chan string, 64)}
	t.Cleanup(func() { c.Close() })
	go w.readLoop()
	for _, q := range subs {
		w.sub(t, q)
	}
	return w
}

func (w *seqWorker) sub(t *testing.T, q string) {
	t.Helper()
	if _, err := w.c.Write(frame.AppendSub(nil, q)); err != nil {
		t.Fatalf("sub %s: %v", q, err)
	}
	select {
	case got := <-w.ackCh:
		if got != q {
			t.Fatalf("ack for %q, want %q", got, q)
		}
	case <-time.After(timeout):
		t.Fatalf("no ack for %s within %v", q, timeout)
	}
}

func (w *seqWorker) readLoop() {
	var dec frame.Decoder
	buf := make([]byte, 64<<10)
	for {
		n, err := w.c.Read(buf)
		if n > 0 {
			dec.Feed(buf[:n])
			for {
				m, ok, derr := dec.Next()
				if derr != nil {
					err = derr
					break
				}
				if !ok {
					break
				}
				w.got(m)
			}
		}
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
	}
}

func (w *seqWorker) got(m frame.Message) {
	switch m.Type {
	case "ack":
		w.ackCh <- m.Name
	case "wake":
		if !m.HasPayload {
			return
		}
		n, _ := strconv.Atoi(m.Payload)
		now := time.Now()
		w.mu.Lock()
		if !w.last.IsZero() && now.Sub(w.last) > w.maxGap {
			w.maxGap = now.Sub(w.last)
		}
		w.last = now
		w.seqs = append(w.seqs, n)
		w.mu.Unlock()
	}
}

// awaitWakes waits until the worker has had n wakes (what names them).
func (w *seqWorker) awaitWakes(t *testing.T, n int, what string) {
	t.Helper()
	testutil.WaitFor(t, timeout, what, func() bool { got, _, _, _ := w.state(); return got == n })
}

func (w *seqWorker) state() (n int, seqs []int, gap time.Duration, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seqs), slices.Clone(w.seqs), w.maxGap, w.err
}

// seqNotifier sends NOTIFY q with payloads 1, 2, 3, … every pace until
// stopped, on its own connection.
type seqNotifier struct {
	background
	sent int
	err  error
}

func startSeqNotifier(t *testing.T, url, q string, pace time.Duration) *seqNotifier {
	t.Helper()
	pc := pgtesting.Connect(t, url).PgConn()
	n := &seqNotifier{background: newBackground()}
	t.Cleanup(func() { n.halt() })
	go n.every(pace, func() bool {
		sql := fmt.Sprintf("SELECT pg_notify('%s', '%d')", q, n.sent+1)
		if _, err := pc.Exec(context.Background(), sql).ReadAll(); err != nil {
			n.err = err
			return false
		}
		n.sent++
		return true
	})
	return n
}

func (n *seqNotifier) finish(t *testing.T) int {
	t.Helper()
	n.halt()
	if n.err != nil {
		t.Fatalf("seqNotifier: %v", n.err)
	}
	return n.sent
}

// backendSampler counts the hub's backends every 50 ms and keeps the
// largest count seen.
type backendSampler struct {
	background
	max int
	n   int
	err error
}

func sampleBackends(t *testing.T, url, app string) *backendSampler {
	t.Helper()
	pc := pgtesting.Connect(t, url).PgConn()
	s := &backendSampler{background: newBackground()}
	t.Cleanup(func() { s.halt() })
	sql := fmt.Sprintf("SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'", app)
	go s.every(50*time.Millisecond, func() bool {
		res, err := pc.Exec(context.Background(), sql).ReadAll()
		if err != nil || len(res) == 0 || len(res[0].Rows) == 0 {
			s.err = fmt.Errorf("sample: %v", err)
			return false
		}
		c, _ := strconv.Atoi(string(res[0].Rows[0][0]))
		s.max = max(s.max, c)
		s.n++
		return true
	})
	return s
}

func (s *backendSampler) finish(t *testing.T) (maxSeen, samples int) {
	t.Helper()
	s.halt()
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.max, s.n
}

// subscriber keeps subscribing to new names, one at a time, so that some
// sub is in flight whenever an upgrade happens; every one must be acked.
type subscriber struct {
	w *seqWorker
	background
	acked int
	err   error
}

func startSubscriber(t *testing.T, socket string) *subscriber {
	t.Helper()
	s := &subscriber{w: dialSeqWorker(t, socket), background: newBackground()}
	t.Cleanup(func() { s.halt() })
	go s.loop(0, func(i int) bool {
		q := fmt.Sprintf("sub_%d", i)
		if _, err := s.w.c.Write(frame.AppendSub(nil, q)); err != nil {
			s.err = err
			return false
		}
		select {
		case got := <-s.w.ackCh:
			if got != q {
				s.err = fmt.Errorf("ack for %q, want %q", got, q)
				return false
			}
			s.acked++
		case <-time.After(timeout):
			s.err = fmt.Errorf("no ack for %s within %v", q, timeout)
			return false
		}
		return true
	})
	return s
}

func (s *subscriber) halt() {
	s.ask()
	s.w.c.Close() // ends a wait for an ack
	<-s.done
}

func (s *subscriber) finish(t *testing.T) int {
	t.Helper()
	close(s.stop)
	<-s.done
	if s.err != nil {
		t.Fatalf("subscriber: %v", s.err)
	}
	return s.acked
}

// runUpgrades is the hot upgrade's end-to-end test: a paced stream of numbered NOTIFYs
// to 20 workers across 10 consecutive upgrades, with a subscriber
// subscribing all along. Every worker gets every number exactly once and
// never sees EOF, every sub is acked, the serving pid changes every time,
// and the hub never holds more than 2 backends (1 at the end). With k
// Postgres connections (--postgres-connections) every one of them moves:
// k backends at the end, at most 2k meanwhile, no reconnect, and a worker
// subscribed (before the first upgrade) to channels spread over all k gets
// a NOTIFY on each after the last.
func runUpgrades(t *testing.T, dbURL string, upgrades int, wantPG string, k int) {
	c := needDB(t)
	// The subscriber takes a new name every round trip for as long as the
	// test runs: past the default caps those would be nacked.
	u := startUpHub(t, dbURL, "--metrics-addr", "127.0.0.1:0",
		"--max-subscriptions", "1000000", "--max-channels", "1000000", "--postgres-connections", strconv.Itoa(k))
	q := "stream_" + strings.ToLower(appSafe.ReplaceAllString(t.Name(), "_"))
	workers := make([]*seqWorker, 20)
	for i := range workers {
		workers[i] = dialSeqWorker(t, u.socket, q)
	}
	var spread []string
	for i := range 4 * k {
		spread = append(spread, fmt.Sprint(q, "_spread", i))
	}
	spreadW := dialSeqWorker(t, u.socket, spread...)
	sampler := sampleBackends(t, c.URL(), u.app)
	subs := startSubscriber(t, u.socket)
	nf := startSeqNotifier(t, c.URL(), q, 2*time.Millisecond)

	waitProgress := func(what string) {
		t.Helper()
		base := make([]int, len(workers))
		for i, w := range workers {
			base[i], _, _, _ = w.state()
		}
		testutil.WaitFor(t, timeout, what, func() bool {
			for i, w := range workers {
				if n, _, _, _ := w.state(); n < base[i]+20 {
					return false
				}
			}
			return true
		})
	}
	waitProgress("wakes before the first upgrade")
	addr := u.metricsAddr()
	pids := []int{u.pid()}
	var tookMax, tookSum time.Duration
	for i := 0; i < upgrades; i++ {
		pid, took := u.upgrade()
		if slices.Contains(pids, pid) {
			t.Fatalf("upgrade %d: pid %d served before", i+1, pid)
		}
		pids = append(pids, pid)
		tookSum += took
		tookMax = max(tookMax, took)
		waitProgress(fmt.Sprintf("wakes from the new process after upgrade %d", i+1))
		if i == 0 {
			u.waitFirstExit(timeout, "the first upgrade")
			if u.firstErr != nil {
				t.Fatalf("the first hub exited with %v after the upgrade, want 0", u.firstErr)
			}
		}
	}
	if n := strings.Count(u.log(), `"postgres":"`+wantPG+`"`); n != upgrades {
		t.Errorf("%d of %d hand-overs logged postgres %q", n, upgrades, wantPG)
	}
	// The metrics listener moved along, and the counters with it.
	m := scrape(t, addr)
	if m["listenhub_upgrades_total"] != float64(upgrades) {
		t.Errorf("listenhub_upgrades_total %v, want %d", m["listenhub_upgrades_total"], upgrades)
	}
	if m["listenhub_accepts_total"] < float64(len(workers)+1) {
		t.Errorf("listenhub_accepts_total %v: the counters were not carried over", m["listenhub_accepts_total"])
	}
	if m["listenhub_workers"] != float64(len(workers)+2) {
		t.Errorf("listenhub_workers %v, want %d", m["listenhub_workers"], len(workers)+2)
	}
	if m["listenhub_postgres_reconnects_total"] != 0 {
		t.Errorf("listenhub_postgres_reconnects_total %v: a connection was not handed over", m["listenhub_postgres_reconnects_total"])
	}
	for i, ch := range spread {
		notify(t, fmt.Sprintf("NOTIFY %s, '%d'", ch, i))
	}
	testutil.WaitFor(t, timeout, "a wake on every spread channel", func() bool {
		n, _, _, _ := spreadW.state()
		return n == len(spread)
	})
	sent := nf.finish(t)
	acked := subs.finish(t)
	testutil.WaitFor(t, timeout, "every wake at every worker", func() bool {
		for _, w := range workers {
			if n, _, _, _ := w.state(); n < sent {
				return false
			}
		}
		return true
	})
	var gap time.Duration
	for i, w := range workers {
		n, seqs, g, err := w.state()
		if err != nil {
			t.Errorf("worker %d: connection ended: %v", i, err)
		}
		if n != sent {
			t.Errorf("worker %d: %d wakes, sent %d", i, n, sent)
		}
		for j, s := range seqs {
			if s != j+1 {
				t.Fatalf("worker %d: wake %d carries %d: lost or duplicated around there (%v)", i, j+1, s, seqs[max(0, j-3):min(len(seqs), j+3)])
			}
		}
		gap = max(gap, g)
	}
	// Only now: a sample taken before the old backends are gone may say
	// 2, never more.
	testutil.WaitFor(t, timeout, fmt.Sprintf("%d backends", k), func() bool { return census(t, u.app) == k })
	maxBackends, samples := sampler.finish(t)
	if maxBackends > 2*k {
		t.Errorf("up to %d backends seen, want at most %d", maxBackends, 2*k)
	}
	if acked == 0 {
		t.Error("the subscriber got no ack at all")
	}
	frozen := u.frozenWindows()
	var frozenMax time.Duration
	for _, d := range frozen {
		frozenMax = max(frozenMax, d)
	}
	t.Logf("%d upgrades: signal → new pid serving avg %v, max %v; workers frozen (old freezes → new live) max %v; "+
		"largest gap in the 2 ms stream %v; %d wakes to each of %d workers; %d subs acked meanwhile; "+
		"backends max %d over %d samples, %d at the end",
		upgrades, (tookSum / time.Duration(upgrades)).Round(time.Millisecond), tookMax.Round(time.Millisecond),
		frozenMax.Round(100*time.Microsecond), gap.Round(time.Millisecond), sent, len(workers), acked, maxBackends, samples, k)

	// A normal stop of the last process removes the pid file it wrote.
	last := u.pid()
	syscall.Kill(last, syscall.SIGTERM)
	testutil.WaitFor(t, timeout, "the last hub to exit", func() bool { return !alive(last) })
	if _, err := os.Stat(u.pidFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pid file after a normal stop: %v, want it removed", err)
	}
}

func TestUpgradeUnderLoad(t *testing.T) {
	runUpgrades(t, needDB(t).URL(), 10, "descriptor", 1)
}

// TestUpgradeFourConnections: with --postgres-connections 4 an upgrade
// hands over all four descriptors.
func TestUpgradeFourConnections(t *testing.T) {
	runUpgrades(t, needDB(t).URL(), 3, "descriptor", 4)
}

// TestUpgradeFailingBinary replaces the binary at the hub's path with a
// script that exits at once: SIGUSR2 then leaves the old hub serving (same
// pid, same workers, wakes still flowing) and its log says why.
func TestUpgradeFailingBinary(t *testing.T) {
	c := needDB(t)
	u := startUpHub(t, c.URL())
	w := dialSeqWorker(t, u.socket, "upgrade_fail")
	u.replaceBin("#!/bin/sh\nexit 1\n")
	pid := u.pid()
	syscall.Kill(pid, syscall.SIGUSR2)
	testutil.WaitFor(t, timeout, "the failed upgrade in the log", func() bool {
		return strings.Contains(u.log(), `"msg":"upgrade abandoned; the new process was stopped"`)
	})
	if !strings.Contains(u.log(), "exit status 1") {
		t.Errorf("the log does not say how the new process ended")
	}
	if got := u.pid(); got != pid {
		t.Fatalf("pid file says %d, want the old hub %d", got, pid)
	}
	notify(t, "NOTIFY upgrade_fail, '1'")
	w.awaitWakes(t, 1, "a wake through the old hub")
	if _, _, _, err := w.state(); err != nil {
		t.Fatalf("worker connection ended: %v", err)
	}
	// It still upgrades once the binary is back.
	copyFile(t, hubBinary(t), u.bin+".new")
	if err := os.Rename(u.bin+".new", u.bin); err != nil {
		t.Fatal(err)
	}
	u.upgrade()
	notify(t, "NOTIFY upgrade_fail, '2'")
	w.awaitWakes(t, 2, "a wake through the new hub")
}

// TestUpgradeTLS is TestUpgradeUnderLoad with the hub on TLS to Postgres:
// the new process opens its own connection, so at most 2 backends exist
// during an upgrade, and the marker NOTIFY splits the stream between the
// two without a loss or a duplicate.
func TestUpgradeTLS(t *testing.T) {
	u := needDB(t).TLSURL()
	if u == "" {
		t.Skip("the test cluster has no TLS")
	}
	runUpgrades(t, u, 5, "new connection", 1)
}

// TestUpgradeTLSFourConnections: under TLS each of the four connections
// splits its stream at the marker.
func TestUpgradeTLSFourConnections(t *testing.T) {
	u := needDB(t).TLSURL()
	if u == "" {
		t.Skip("the test cluster has no TLS")
	}
	runUpgrades(t, u, 2, "new connection", 4)
}
