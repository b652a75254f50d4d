package relay

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/client"
	"github.com/listenhub/listenhub/internal/testutil"
)

// readsSince counts the re-reads caused by wakes received after t0.
func (w *workload) readsSince(t0 time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, rs := range w.reads {
		for _, r := range rs {
			if r.wake.After(t0) {
				n++
			}
		}
	}
	return n
}

// TestRelayProcessKilledMidStream SIGKILLs the real binary while writers
// commit, restarts it on the same slot, and checks that every insert still
// gets its wake: the slot replays what the killed relay had not confirmed.
func TestRelayProcessKilledMidStream(t *testing.T) {
	f := newFixture(t, "q_a", "q_b", "q_c")
	w := newWorkload(t, f, "q_a", "q_b", "q_c")
	p := startRelayProc(t, f.procArgs("--standby-retry", "1s")...)
	testutil.WaitFor(t, 20*time.Second, "the relay's slot active", func() bool { return f.slotActivePID() != 0 })
	w.burst(20)
	w.settle(10 * time.Second)
	for round := 0; round < 3; round++ {
		// The writers write until told to stop; the relay is killed
		// once it has NOTIFYed part of what they wrote, and they go on
		// writing across the restart.
		t0, n0 := time.Now(), w.commitCount()
		stop, done := make(chan struct{}), make(chan struct{})
		go func() { w.write(1<<30, stop); close(done) }()
		testutil.WaitFor(t, 20*time.Second, "wakes of the burst", func() bool {
			return w.readsSince(t0) >= 1 && w.commitCount() >= n0+20*(round+1)
		})
		p.kill()
		restart, n1 := time.Now(), w.commitCount()
		p = startRelayProc(t, f.procArgs("--standby-retry", "1s")...)
		testutil.WaitFor(t, 20*time.Second, "commits after the restart", func() bool { return w.commitCount() >= n1+60 })
		close(stop)
		<-done
		w.settle(15 * time.Second)
		t.Logf("round %d: first wake %v after the restart", round, firstWakeAfter(w, restart))
	}
	w.report()
}

func firstWakeAfter(w *workload, t0 time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	for _, rs := range w.reads {
		for _, r := range rs {
			if r.wake.After(t0) && (first.IsZero() || r.wake.Before(first)) {
				first = r.wake
			}
		}
	}
	if first.IsZero() {
		return -1
	}
	return first.Sub(t0)
}

// TestRelayProcessStandbyTakeover runs two relays on one slot: one
// streams, the other stands by (and says so once); when the active one is
// SIGKILLed, the standby takes over within 2 s and no insert misses its
// wake.
func TestRelayProcessStandbyTakeover(t *testing.T) {
	f := newFixture(t, "q_a", "q_b")
	w := newWorkload(t, f, "q_a", "q_b")
	// The default --standby-retry (1s): the 2 s target is for it.
	p1 := startRelayProc(t, f.procArgs("--standby-retry", "1s")...)
	// Streaming, not merely the slot active: the session that creates a
	// new slot holds it for a moment and lets it go before the stream
	// takes it again, and a second relay started in that moment takes it
	// instead (then the first stands by, and this test would wait for the
	// wrong one).
	testutil.WaitFor(t, 20*time.Second, "the first relay streaming", func() bool {
		return strings.Contains(p1.out.String(), "relay streaming") && f.slotActivePID() != 0
	})
	p2 := startRelayProc(t, f.procArgs("--standby-retry", "1s")...)
	p2started := time.Now()
	testutil.WaitFor(t, 20*time.Second, "the second relay standing by", func() bool {
		return strings.Contains(p2.out.String(), "standing by")
	})
	w.burst(20)
	w.settle(10 * time.Second)
	if n := strings.Count(p2.out.String(), "standing by"); n != 1 {
		t.Errorf("the standby logged %d times that it stands by, want once", n)
	}
	// Past its first second, the standby retries at --standby-retry.
	testutil.WaitFor(t, 5*time.Second, "the standby's first second over", func() bool {
		return time.Since(p2started) > 1200*time.Millisecond
	})
	active := f.slotActivePID()
	t0, n0 := time.Now(), w.commitCount()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { w.write(1<<30, stop); close(done) }()
	testutil.WaitFor(t, 20*time.Second, "wakes of the burst", func() bool {
		return w.readsSince(t0) >= 1 && w.commitCount() >= n0+20
	})
	p1.kill()
	killed := time.Now()
	testutil.WaitFor(t, 10*time.Second, "the standby streaming", func() bool {
		pid := f.slotActivePID()
		return pid != 0 && pid != active
	})
	took := time.Since(killed)
	n1 := w.commitCount()
	testutil.WaitFor(t, 20*time.Second, "commits after the take-over", func() bool { return w.commitCount() >= n1+60 })
	close(stop)
	<-done
	w.settle(15 * time.Second)
	t.Logf("standby streaming %v after the SIGKILL; first wake after it %v", took, firstWakeAfter(w, killed))
	if took > 2*time.Second {
		t.Errorf("the standby took %v to take over, want at most 2s", took)
	}
	if !strings.Contains(p2.out.String(), "took over") {
		t.Errorf("the standby did not log the take-over:\n%s", p2.out.String())
	}
	w.report()
}

// TestRelayProcessMisconfigured: the binary exits 1 with one line that
// names the fix.
func TestRelayProcessMisconfigured(t *testing.T) {
	f := newFixture(t, "q_a")
	p := startRelayProc(t, "--database-url", db.URL(), "--publication", "nope", "--slot", f.slot)
	if code := p.exitCode(t, 20*time.Second); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	out := p.out.String()
	var last string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		last = line
	}
	if want := `listenhub relay: publication 'nope' does not exist: run CREATE PUBLICATION "nope" FOR TABLES IN SCHEMA pgmq;`; !strings.HasPrefix(last, want) {
		t.Errorf("last line %q, want it to start with %q", last, want)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln := testutil.ListenTCP(t)
	defer ln.Close()
	return ln.Addr().String()
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestServeRelay runs the relay inside the hub's process (serve --relay):
// a wake reaches a LISTENer, the listenhub_relay_* metrics are on the
// hub's metrics address, and listenhub status has a relay section. The
// relay's backends never carry the hub's application_name.
func TestServeRelay(t *testing.T) {
	f, ch, l := newListened(t, "q_jobs")
	addr := freeAddr(t)
	bin := relayBinary(t)
	p := execListenhub(t, "serve", "--relay", "--socket", filepath.Join(t.TempDir(), "hub.sock"),
		"--database-url", db.URL(), "--publication", f.pub, "--slot", f.slot, "--metrics-addr", addr)
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			t.Errorf("serve --relay did not stop on SIGTERM:\n%s", p.out.String())
			p.cmd.Process.Kill()
			<-p.done
		}
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("serve --relay exited %d on SIGTERM:\n%s", code, p.out.String())
		}
	})
	testutil.WaitFor(t, 20*time.Second, "the resync wake", func() bool { return l.count(ch) == 1 })
	f.exec("INSERT INTO " + f.schema + ".q_jobs (v) VALUES ('a')")
	testutil.WaitFor(t, 10*time.Second, "the wake", func() bool { return l.count(ch) == 2 })
	testutil.WaitFor(t, 10*time.Second, "relay metrics", func() bool {
		m := httpGet(t, "http://"+addr+"/metrics")
		return strings.Contains(m, "\nlistenhub_relay_active 1\n") && strings.Contains(m, "\nlistenhub_relay_transactions_total 1\n") &&
			strings.Contains(m, "listenhub_relay_commit_to_notify_seconds_count 1\n") && strings.Contains(m, "\nlistenhub_workers 0\n")
	})
	out, err := exec.Command(bin, "status", "--metrics-addr", addr).CombinedOutput()
	t.Logf("listenhub status:\n%s", out)
	if err != nil || !strings.Contains(string(out), "relay  ") || !strings.Contains(string(out), "active") ||
		!strings.Contains(string(out), "1 transactions, 1 changes") || !strings.Contains(string(out), "workers") {
		t.Errorf("listenhub status: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := db.QueryInt(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'listenhub-relay'")
	if err != nil || n != 2 {
		t.Errorf("%d backends named listenhub-relay (%v), want 2", n, err)
	}
}

// TestRelayProcessStatus: listenhub status on a relay's own metrics
// address prints the relay section alone; /healthz says active.
func TestRelayProcessStatus(t *testing.T) {
	f := newFixture(t, "q_jobs")
	addr := freeAddr(t)
	startRelayProc(t, f.procArgs("--metrics-addr", addr)...)
	testutil.WaitFor(t, 20*time.Second, "healthz", func() bool {
		return httpGet(t, "http://"+addr+"/healthz") == "ok (active)\n"
	})
	out, err := exec.Command(relayBinary(t), "status", "--metrics-addr", addr).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "relay ") || !strings.Contains(string(out), "slot_rt") {
		t.Errorf("listenhub status: %v\n%s", err, out)
	}
	out, err = exec.Command(relayBinary(t), "status", "--metrics-addr", addr, "--json").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), `{"relay":{"state":"active"`) {
		t.Errorf("listenhub status --json: %v\n%s", err, out)
	}
	m := httpGet(t, "http://"+addr+"/metrics")
	for _, want := range []string{"\nlistenhub_relay_standby 0\n", "listenhub_build_info{", "process_open_fds "} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestRelayProcessGracefulStop: on SIGTERM the relay NOTIFYs what it has
// decoded and confirms it before it exits 0, so the next start replays
// nothing: it decodes no transaction, and its one wake is the start's
// resync.
func TestRelayProcessGracefulStop(t *testing.T) {
	f := newFixture(t, "q_a", "fence")
	ch := f.schema + ".q_a.INSERT"
	l := listen(t, ch, f.schema+".fence.INSERT")
	p := startRelayProc(t, f.procArgs()...)
	testutil.WaitFor(t, 20*time.Second, "the resync wake", func() bool { return l.count(ch) == 1 })
	for i := 0; i < 5; i++ {
		f.exec("INSERT INTO " + f.schema + ".q_a (v) VALUES ('x')")
	}
	f.fence(l) // all five are NOTIFYed
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.exitCode(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d on SIGTERM:\n%s", code, p.out.String())
	}
	n := l.count(ch)
	addr := freeAddr(t)
	startRelayProc(t, f.procArgs("--metrics-addr", addr)...)
	f.fence(l)
	// The fence's own insert is the one transaction the restart decodes;
	// a replay would come before it.
	var decoded int
	testutil.WaitFor(t, 10*time.Second, "the fence decoded", func() bool {
		m := httpGet(t, "http://"+addr+"/metrics")
		_, v, _ := strings.Cut(m, "\nlistenhub_relay_transactions_total ")
		v, _, _ = strings.Cut(v, "\n")
		decoded, _ = strconv.Atoi(v)
		return decoded >= 1
	})
	if decoded != 1 {
		t.Errorf("the restarted relay decoded %d transactions, want 1 (the fence): the stop did not confirm what it had NOTIFYed", decoded)
	}
	testutil.WaitFor(t, 10*time.Second, "the start's resync", func() bool { return l.count(ch) > n })
	f.fence(l)
	if got := l.count(ch); got != n+1 {
		t.Errorf("%d wakes on %s after the restart, want 1 (the start's resync)", got-n, ch)
	}
}

// TestServeRelayUpgrade: a hot upgrade (SIGUSR2) of serve --relay hands
// the slot to the new process's relay, and wakes go on.
func TestServeRelayUpgrade(t *testing.T) {
	f := newFixture(t, "q_jobs")
	ch := f.schema + ".q_jobs.INSERT"
	l := listen(t, ch)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "hub.pid")
	p := &relayProc{done: make(chan struct{})}
	p.cmd = exec.Command(relayBinary(t), "serve", "--relay", "--socket", filepath.Join(dir, "hub.sock"),
		"--pid-file", pidFile, "--database-url", db.URL(), "--publication", f.pub, "--slot", f.slot)
	// A file, not a pipe: the new process inherits it, and Wait would
	// wait for it to close.
	logf, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	readPID := func() int {
		b, _ := os.ReadFile(pidFile)
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	t.Cleanup(func() {
		if pid := readPID(); pid > 0 {
			syscall.Kill(pid, syscall.SIGTERM)
			testutil.WaitFor(t, 15*time.Second, "the new process gone", func() bool { return syscall.Kill(pid, 0) != nil })
		}
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("serve output:\n%s", b)
		}
	})
	testutil.WaitFor(t, 20*time.Second, "the resync wake", func() bool { return l.count(ch) == 1 })
	first := readPID()
	active := f.slotActivePID()
	p.cmd.Process.Signal(syscall.SIGUSR2)
	testutil.WaitFor(t, 20*time.Second, "the new process serving", func() bool { pid := readPID(); return pid != 0 && pid != first })
	testutil.WaitClosed(t, p.done, 15*time.Second, "the old process did not exit after the upgrade")
	testutil.WaitFor(t, 10*time.Second, "the new process's relay streaming", func() bool {
		pid := f.slotActivePID()
		return pid != 0 && pid != active
	})
	// The new relay's start resync may come too; what counts is a wake
	// after the insert.
	inserted := time.Now()
	f.exec("INSERT INTO " + f.schema + ".q_jobs (v) VALUES ('a')")
	testutil.WaitFor(t, 10*time.Second, "the wake after the upgrade", func() bool { return l.lastAt(ch).After(inserted) })
}

// TestRelayProcessGOMAXPROCS: `listenhub relay` runs on one P unless the
// environment sets GOMAXPROCS (cmd/listenhub relayProcs says why).
func TestRelayProcessGOMAXPROCS(t *testing.T) {
	f := newFixture(t, "q_a")
	for _, c := range []struct{ env, want string }{{"", "gomaxprocs=1"}, {"GOMAXPROCS=2", "gomaxprocs=2"}} {
		cmd := exec.Command(relayBinary(t), "relay", "--database-url", db.URL(), "--publication", "nope", "--slot", f.slot)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "GOMAXPROCS=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		if c.env != "" {
			cmd.Env = append(cmd.Env, c.env)
		}
		out, _ := cmd.CombinedOutput() // exits 1: the publication is missing
		if !strings.Contains(string(out), "listenhub relay starting") || !strings.Contains(string(out), c.want) {
			t.Errorf("environment %q: want %s in the start line:\n%s", c.env, c.want, out)
		}
	}
}

// TestServeRelayPublicationDropped: under serve --relay, a publication
// dropped while the relay streams makes the relay a guest that is down:
// the hub serves on (a worker keeps its connection and its wakes on a
// plain NOTIFY channel), /metrics says listenhub_relay_up 0 and /healthz
// answers 200 for the hub with the relay's line naming the fix.
func TestServeRelayPublicationDropped(t *testing.T) {
	f, ch, l := newListened(t, "q_jobs")
	addr := freeAddr(t)
	sock := filepath.Join(t.TempDir(), "hub.sock")
	p := execListenhub(t, "serve", "--relay", "--socket", sock,
		"--database-url", db.URL(), "--publication", f.pub, "--slot", f.slot, "--metrics-addr", addr)
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("serve output:\n%s", p.out.String())
		}
	})
	testutil.WaitFor(t, 20*time.Second, "the resync wake", func() bool { return l.count(ch) == 1 })
	relayAgrees(t, addr, "active", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wakes := make(chan client.Wake, 16)
	c, err := client.Dial(ctx, client.Options{SocketPath: sock}, client.Handlers{OnWake: func(w client.Wake) { wakes <- w }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	plain := f.schema + "_plain"
	if err := c.Subscribe(ctx, plain); err != nil {
		t.Fatal(err)
	}
	f.exec("DROP PUBLICATION " + f.pub)
	f.exec("INSERT INTO " + f.schema + ".q_jobs (v) VALUES ('a')")
	dropped := time.Now()
	testutil.WaitFor(t, 20*time.Second, "the relay down", func() bool {
		return strings.Contains(httpGet(t, "http://"+addr+"/metrics"), "\nlistenhub_relay_up 0\n")
	})
	t.Logf("relay down %v after the drop", time.Since(dropped))
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "ok\nrelay down: publication '"+f.pub+"' was dropped while the relay ran") {
		t.Errorf("/healthz %d %q", resp.StatusCode, body)
	}
	f.exec("NOTIFY " + plain)
	testutil.WaitClosed(t, wakes, 10*time.Second, "no wake on a plain channel while the relay is down")
	select {
	case <-c.Done():
		t.Fatalf("the worker lost its hub: %v", c.Err())
	case <-p.done:
		t.Fatal("serve --relay exited")
	default:
	}
	relayAgrees(t, addr, "down", "0")
}

// relayAgrees checks that /relay, /metrics and /healthz say the same of a
// relay in a settled state: one State behind all three.
func relayAgrees(t *testing.T, addr, state, up string) {
	t.Helper()
	if r := httpGet(t, "http://"+addr+"/relay"); !strings.Contains(r, `"state":"`+state+`"`) {
		t.Errorf("/relay does not say %s: %s", state, r)
	}
	m := httpGet(t, "http://"+addr+"/metrics")
	active := map[bool]string{true: "1", false: "0"}[state == "active"]
	for _, want := range []string{"\nlistenhub_relay_up " + up + "\n", "\nlistenhub_relay_active " + active + "\n"} {
		if !strings.Contains(m, want) {
			t.Errorf("/relay says %s; /metrics lacks %q", state, strings.TrimSpace(want))
		}
	}
	if h := httpGet(t, "http://"+addr+"/healthz"); (state == "down") != strings.Contains(h, "relay down") {
		t.Errorf("/relay says %s; /healthz %q", state, h)
	}
}
