package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/pgtest/pgtls"
	"github.com/listenhub/listenhub/internal/testutil"
)

const timeout = 15 * time.Second

// One throwaway cluster for the package (pgtesting), with TLS for the TLS
// upgrade test; the binary is built once by the first test that needs it.
var db *pgtest.Cluster

func TestMain(m *testing.M) {
	if os.Getenv(hammerEnv) != "" {
		os.Exit(m.Run()) // TestAttackIntrospection's client process: no cluster
	}
	pgtesting.Main(m, pgtest.Options{TLS: pgtls.Certificate}, &db)
}

func needDB(t testing.TB) *pgtest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test (-short)")
	}
	return db
}

// hubBinary builds the real listenhub binary once (go build into a temporary
// directory), or returns LISTENHUB_TEST_BINARY.
func hubBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("LISTENHUB_TEST_BINARY"); p != "" {
		return p // another build's behaviour (the figures without a bound, docs/robustness.md)
	}
	return testutil.Binary(t, "github.com/listenhub/listenhub/cmd/listenhub")
}

// syncBuf is a goroutine-safe output buffer.
type syncBuf = testutil.SyncBuffer

// proc is a running `listenhub serve`.
type proc struct {
	t      testing.TB
	cmd    *exec.Cmd
	socket string
	app    string
	stderr *syncBuf
	done   chan struct{}
	err    error // Wait's result, set before done closes
}

var appSafe = regexp.MustCompile(`[^a-zA-Z0-9]+`)

func testApp(t testing.TB) string {
	app := "lhc-" + appSafe.ReplaceAllString(t.Name(), "-")
	if len(app) > 60 {
		app = app[:60]
	}
	return app
}

// serve starts the binary with the given extra flags; socket, database and
// a per-test application_name are filled in unless given.
func serve(t testing.TB, socket string, env []string, args ...string) *proc {
	t.Helper()
	c := needDB(t)
	p := &proc{t: t, socket: socket, app: testApp(t), stderr: &syncBuf{}, done: make(chan struct{})}
	full := []string{"serve", "--log-format", "json", "--log-level", "debug"}
	if socket != "" {
		full = append(full, "--socket", socket)
	}
	if !hasFlag(args, "--database-url") && !hasEnv(env, "DATABASE_URL") {
		full = append(full, "--database-url", c.URL())
	}
	if !hasFlag(args, "--application-name") && !hasEnv(env, "LISTENHUB_APPLICATION_NAME") {
		full = append(full, "--application-name", p.app)
	}
	full = append(full, args...)
	p.cmd = exec.Command(hubBinary(t), full...)
	p.cmd.Env = append(cleanEnv(), env...)
	p.cmd.Stderr = p.stderr
	p.cmd.Stdout = p.stderr
	p.start()
	return p
}

// start runs p.cmd, reaps it into p.err/p.done, and kills it at the end of
// the test, showing its output if the test failed.
func (p *proc) start() {
	t := p.t
	t.Helper()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("listenhub output:\n%s", p.stderr.String())
		}
	})
}

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

func hasEnv(env []string, name string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, name+"=") {
			return true
		}
	}
	return false
}

// cleanEnv is the test's environment without the variables serve reads, so
// that a developer's shell cannot change what a test means.
func cleanEnv() []string {
	var out []string
	for _, e := range os.Environ() {
		if strings.HasPrefix(e, "LISTENHUB_") || strings.HasPrefix(e, "DATABASE_URL=") || strings.HasPrefix(e, "PG") {
			continue
		}
		out = append(out, e)
	}
	return out
}

// ready waits until the hub answers on its socket and says Postgres is
// healthy (the socket accepts before Postgres is reached).
func (p *proc) ready() {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-p.done:
			p.t.Fatalf("listenhub exited early (%v):\n%s", p.err, p.stderr.String())
		default:
		}
		if c, err := net.Dial("unix", p.socket); err == nil {
			w := newWorker(p.t, c.(*net.UnixConn), 64<<10)
			m, err := w.read(timeout)
			for err == nil && m.Type == "status" && !m.Healthy {
				m, err = w.read(timeout)
			}
			c.Close()
			if err == nil && m.Type == "status" {
				return
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("listenhub not ready after %v:\n%s", timeout, p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exit waits for the process to end and returns its exit code.
func (p *proc) exit() int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("listenhub did not exit:\n%s", p.stderr.String())
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		p.t.Fatal(p.err)
	}
	return 0
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// fds counts the hub process's open descriptors.
func (p *proc) fds() int {
	p.t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid()))
	if err != nil {
		p.t.Fatal(err)
	}
	return len(ents)
}

// rssKiB reads VmRSS of the hub process.
func (p *proc) rssKiB() int {
	p.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid()))
	if err != nil {
		p.t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	p.t.Fatal("no VmRSS")
	return 0
}

// metricsAddr finds the address the hub logged for --metrics-addr.
func (p *proc) metricsAddr() string {
	p.t.Helper()
	var addr string
	testutil.WaitFor(p.t, timeout, "metrics address in the log", func() bool {
		sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
		for sc.Scan() {
			var l struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "metrics listening" {
				addr = l.Addr
				return true
			}
		}
		return false
	})
	return addr
}

// census runs `listenhub census` for this hub's application_name.
func census(t testing.TB, app string) int {
	t.Helper()
	out, err := exec.Command(hubBinary(t), "census", "--database-url", needDB(t).URL(), "--application-name", app).Output()
	if err != nil {
		t.Fatalf("census: %v", err)
	}
	var n int
	if _, err := fmt.Sscanf(string(out), "backends with application_name %q: %d\n", new(string), &n); err != nil {
		t.Fatalf("census printed %q: %v", out, err)
	}
	return n
}

func notify(t testing.TB, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := needDB(t).Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

func sockPath(t testing.TB) string { return filepath.Join(t.TempDir(), "hub.sock") }

func runCmd(args []string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

func TestVersionAndUsage(t *testing.T) {
	code, out, _ := runCmd([]string{"version"})
	if code != 0 || !strings.HasPrefix(out, "listenhub ") {
		t.Fatalf("version: %d %q", code, out)
	}
	if code, _, errOut := runCmd(nil); code != 2 || !strings.Contains(errOut, "usage:") {
		t.Fatalf("no command: %d %q", code, errOut)
	}
	if code, _, errOut := runCmd([]string{"frobnicate"}); code != 2 || !strings.HasPrefix(errOut, `listenhub: unknown command "frobnicate"`) {
		t.Fatalf("unknown command: %d %q", code, errOut)
	}
	if code, out, _ := runCmd([]string{"serve", "-h"}); code != 0 || !strings.Contains(out, "-hard-queue-limit") {
		t.Fatalf("serve -h: %d %q", code, out)
	}
}

// A bad flag, a bad environment value or a missing required flag prints one
// line and exits non-zero.
func TestServeBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--bogus"}, nil, "flag provided but not defined: --bogus"},
		{[]string{"--database-url", "postgres://x/y"}, nil, "--socket is required"},
		{[]string{"--socket", "/tmp/x", "--durable-queue-limit", "many"}, nil, `invalid value "many"`},
		{[]string{"--socket", "/tmp/x", "--hard-queue-limit", "0"}, nil, "--hard-queue-limit must be at least 1"},
		{[]string{"--socket", "/tmp/x", "--status-interval", "-1s"}, nil, "--status-interval must be positive"},
		{[]string{"--socket", "/tmp/x", "--log-format", "xml"}, nil, `--log-format "xml": want text or json`},
		{[]string{"--socket", "/tmp/x", "--log-level", "loud"}, nil, `--log-level "loud"`},
		{[]string{"--socket", "/tmp/x", "--allow-uid", "root"}, nil, `not a uid: "root"`},
		{[]string{"--socket", "/tmp/x", "extra"}, nil, `unexpected argument "extra"`},
		{[]string{"--socket", "/tmp/x"}, map[string]string{"LISTENHUB_HEALTH_CHECK_TIMEOUT": "soon"}, `invalid value "soon" for LISTENHUB_HEALTH_CHECK_TIMEOUT`},
	} {
		t.Run(c.want, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			code, _, errOut := runCmd(append([]string{"serve"}, c.args...))
			if code != 2 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, c.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and one line with %q", code, errOut, c.want)
			}
		})
	}
}

// A connection string that does not parse is a configuration error, like a
// refused password: one line naming the flag, exit 1.
func TestServeBadDatabaseURL(t *testing.T) {
	code, _, errOut := runCmd([]string{"serve", "--socket", "/tmp/x", "--database-url", "postgres://u:sekrit@%zz/db"})
	if code != 1 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "--database-url") {
		t.Fatalf("exit %d, stderr %q; want 1 and one line naming --database-url", code, errOut)
	}
	if strings.Contains(errOut, "sekrit") {
		t.Fatalf("password in %q", errOut)
	}
}

// An unreachable database is no reason to exit (docs/design.md,
// Lifecycle: Start): the hub accepts and tells workers healthy:false while
// it retries; SIGTERM then is a clean stop (exit 0, socket removed) and the
// password never shows.
func TestServeUnreachableDatabase(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, nil, "--database-url", "postgres://u:sekrit@127.0.0.1:1/db?connect_timeout=5")
	w := dialWhenListening(t, p)
	if m := w.expect("status"); m.Healthy {
		t.Fatal("healthy:true without a database")
	}
	testutil.WaitFor(t, timeout, "a failed attempt logged", func() bool {
		return strings.Contains(p.stderr.String(), "connection refused")
	})
	select {
	case <-p.done:
		t.Fatalf("serve exited (%v) while the database is unreachable:\n%s", p.err, p.stderr.String())
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	w.eofWithin(timeout)
	if code := p.exit(); code != 0 {
		t.Fatalf("exit %d after SIGTERM while unreachable, want 0", code)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
	if strings.Contains(p.stderr.String(), "sekrit") {
		t.Fatalf("password in the output:\n%s", p.stderr.String())
	}
}

// dialWhenListening waits for p's socket file (it appears once the hub
// accepts) and connects, without reading anything.
func dialWhenListening(t *testing.T, p *proc) *worker {
	t.Helper()
	testutil.WaitFor(t, timeout, "socket file", func() bool {
		select {
		case <-p.done:
			t.Fatalf("listenhub exited early (%v):\n%s", p.err, p.stderr.String())
		default:
		}
		_, err := os.Lstat(p.socket)
		return err == nil
	})
	return connectWorker(t, p.socket)
}

// SIGTERM: workers see EOF, the backend goes away (UNLISTEN, Terminate),
// the socket file is removed, exit 0. SIGINT does the same.
func TestServeSignals(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			path := sockPath(t)
			p := serve(t, path, nil)
			p.ready()
			w := subscribedWorker(t, path, "term")
			if n := census(t, p.app); n != 1 {
				t.Fatalf("census %d, want 1", n)
			}
			start := time.Now()
			p.cmd.Process.Signal(sig)
			eof := w.eofWithin(timeout)
			if code := p.exit(); code != 0 {
				t.Fatalf("exit %d after %v, want 0:\n%s", code, sig, p.stderr.String())
			}
			t.Logf("%v: worker EOF after %v, exit 0 after %v", sig, eof, time.Since(start))
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("socket file still there: %v", err)
			}
			testutil.WaitFor(t, timeout, "backend gone", func() bool { return census(t, p.app) == 0 })
		})
	}
}

// SIGKILL: the kernel closes every socket, so workers see EOF at once and
// can fall back; the stale socket file is replaced by the next hub.
func TestServeKilled(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, nil)
	p.ready()
	ws := subscribedWorkers(t, path, "kill", 8)
	p.cmd.Process.Kill()
	var worst time.Duration
	for _, w := range ws {
		worst = max(worst, w.eofWithin(2*time.Second))
	}
	t.Logf("slowest worker saw EOF %v after SIGKILL", worst)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a killed hub leaves its socket file: %v", err)
	}
	testutil.WaitFor(t, timeout, "backend gone", func() bool { return census(t, p.app) == 0 })
	p2 := serve(t, path, nil) // stale: replaced
	p2.ready()
	subscribedWorker(t, path, "kill")
}

// The socket is mode 0600; a second hub on a live path exits non-zero with a
// clear line and leaves the first untouched.
func TestServeSocketModeAndLivePath(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, nil)
	p.ready()
	checkSocketMode(t, path, "")
	w := subscribedWorker(t, path, "live")
	second := serve(t, path, nil)
	if code := second.exit(); code == 0 {
		t.Fatal("second hub on a live socket exited 0")
	}
	want := fmt.Sprintf("socket %s is in use by a running hub", path)
	if out := second.stderr.String(); !strings.Contains(out, want) || strings.Count(out, "\n") != 1 {
		t.Fatalf("second hub said %q, want one line with %q", out, want)
	}
	// The first hub still serves its worker and new ones.
	notify(t, "NOTIFY live, 'still here'")
	if m := w.expect("wake"); m.Payload != "still here" {
		t.Fatalf("wake %+v", m)
	}
	dialWorker(t, path).sub("live")
	if n := census(t, p.app); n != 1 {
		t.Fatalf("census %d, want 1 (the second hub must not connect)", n)
	}
	// A regular file at the path is not a socket: refused, not removed.
	file := filepath.Join(t.TempDir(), "not-a-socket")
	os.WriteFile(file, []byte("x"), 0o644)
	third := serve(t, file, nil)
	if code := third.exit(); code == 0 || !strings.Contains(third.stderr.String(), "not a socket") {
		t.Fatalf("exit %d: %s", code, third.stderr.String())
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatal("the file was removed")
	}
}

// Configuration through the environment only: LISTENHUB_* variables and
// DATABASE_URL as the fallback for the database.
func TestServeEnvironment(t *testing.T) {
	path := sockPath(t)
	app := testApp(t)
	p := serve(t, "", []string{
		"LISTENHUB_SOCKET=" + path,
		"DATABASE_URL=" + needDB(t).URL(),
		"LISTENHUB_APPLICATION_NAME=" + app,
		"LISTENHUB_CHANNEL_PREFIX=pre_",
	})
	p.socket = path
	p.ready()
	w := subscribedWorker(t, path, "q")
	if n := census(t, app); n != 1 {
		t.Fatalf("census for %s = %d", app, n)
	}
	notify(t, `NOTIFY pre_q, 'x'`)
	if m := w.expect("wake"); m.Name != "q" || m.Payload != "x" {
		t.Fatalf("wake %+v", m)
	}
}

// /metrics carries every metric of docs/design.md with HELP and TYPE; /healthz
// follows the Postgres connection.
func TestServeMetricsAndHealthz(t *testing.T) {
	c := needDB(t)
	path := sockPath(t)
	_, addr := serveMetrics(t, path, "--health-check-interval", "100ms",
		"--health-check-timeout", "500ms")
	get := func(path string) (int, string) { return httpGet(t, addr, path) }
	w := subscribedWorker(t, path, "m")
	notify(t, "NOTIFY m")
	w.expect("wake")
	code, body := get("/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, m := range []struct{ name, typ, value string }{
		{"listenhub_workers", "gauge", "1"},
		{"listenhub_channels", "gauge", "1"},
		{"listenhub_postgres_healthy", "gauge", "1"},
		{"listenhub_wakes_received_total", "counter", "1"},
		{"listenhub_frames_sent_total", "counter", ""},
		{"listenhub_durable_coalesced_total", "counter", "0"},
		{"listenhub_durable_dropped_total", "counter", "0"},
		{"listenhub_evictions_total", "counter", "0"},
		{"listenhub_protocol_errors_total", "counter", "0"},
		{"listenhub_postgres_reconnects_total", "counter", "0"},
		{"listenhub_accepts_total", "counter", ""},
	} {
		if !strings.Contains(body, "# HELP "+m.name+" ") || !strings.Contains(body, "# TYPE "+m.name+" "+m.typ+"\n") {
			t.Errorf("%s: no HELP/TYPE %s in\n%s", m.name, m.typ, body)
		}
		if m.value != "" && !strings.Contains(body, "\n"+m.name+" "+m.value+"\n") {
			t.Errorf("%s: want value %s in\n%s", m.name, m.value, body)
		}
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d while healthy", code)
	}
	if c.External() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, timeout, "/healthz 503 while Postgres is down", func() bool {
		code, _ := get("/healthz")
		return code == 503
	})
	w.status(false)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "/healthz 200 after Postgres is back", func() bool {
		code, _ := get("/healthz")
		return code == 200
	})
	w.status(true)
	if m := w.expect("wake"); m.Name != "m" || m.HasPayload {
		t.Fatalf("resync wake %+v", m)
	}
	_, body = get("/metrics")
	if !strings.Contains(body, "\nlistenhub_postgres_reconnects_total 1\n") {
		t.Fatalf("reconnect not counted:\n%s", body)
	}
}

// 64 workers on the real binary: census says 1.
func TestServe64WorkersOneBackend(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, nil)
	p.ready()
	ws := subscribedWorkers(t, path, "shared", 64)
	for i, w := range ws {
		w.sub(fmt.Sprint("own", i))
	}
	if n := census(t, p.app); n != 1 {
		t.Fatalf("census %d with 64 workers, want 1", n)
	}
	notify(t, "NOTIFY shared, 'all'")
	for _, w := range ws {
		if m := w.expect("wake"); m.Payload != "all" {
			t.Fatalf("wake %+v", m)
		}
	}
}

// 10,000 connect/subscribe/close cycles: the hub's descriptor count comes
// back to where it started.
func TestServeChurnFDs(t *testing.T) {
	path := sockPath(t)
	p, addr := serveMetrics(t, path)
	workers := func() string {
		series, _ := scrapeSeries(t, addr)
		n, ok := series["listenhub_workers"]
		if !ok {
			t.Fatalf("no listenhub_workers in /metrics")
		}
		return fmt.Sprint(n)
	}
	w := dialWorker(t, path) // warm-up: one worker, one channel
	w.sub("churn")
	w.c.Close()
	testutil.WaitFor(t, timeout, "no worker connected", func() bool { return workers() == "0" })
	before := p.fds()
	n := 10000
	if testing.Short() {
		n = 1000
	}
	start := time.Now()
	for i := range n {
		w := dialWorker(t, path)
		w.sub(fmt.Sprint("churn", i%4))
		w.c.Close()
	}
	elapsed := time.Since(start)
	testutil.WaitFor(t, timeout, "no worker connected", func() bool { return workers() == "0" })
	var after int
	testutil.WaitFor(t, timeout, "hub fds back to the start", func() bool { after = p.fds(); return after <= before })
	t.Logf("hub fds: %d before %d connect/subscribe/close cycles, %d after (%v, %.0f cycles/s)",
		before, n, after, elapsed, float64(n)/elapsed.Seconds())
}

// Memory: 1,000 idle workers, then a never-reading worker under 20,000
// durable NOTIFYs. Logs the RSS figures; fails only on gross growth.
func TestServeMemory(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, nil)
	p.ready()
	base := p.rssKiB()
	ws := make([]*worker, 1000)
	for i := range ws {
		ws[i] = dialWorker(t, path)
	}
	idle := p.rssKiB()
	t.Logf("hub RSS: %d KiB at start, %d KiB with 1,000 idle workers (%.1f KiB per worker)",
		base, idle, float64(idle-base)/1000)
	if idle-base > 64<<10 {
		t.Fatalf("1,000 idle workers cost %d KiB", idle-base)
	}
	for _, w := range ws {
		w.c.Close()
	}
	wedged := subscribedWorker(t, path, "d")
	sib := subscribedWorker(t, path, "d")
	notify(t, `DO $$ BEGIN FOR i IN 1..20000 LOOP PERFORM pg_notify('d', ''); COMMIT; END LOOP; END $$`)
	notify(t, `SELECT pg_notify('d', 'end')`)
	for {
		m := sib.expect("wake")
		if m.Payload == "end" {
			break
		}
	}
	after := p.rssKiB()
	t.Logf("hub RSS: %d KiB after 20,000 durable NOTIFYs to a never-reading worker", after)
	if after-idle > 64<<10 {
		t.Fatalf("wedged durable worker grew the hub by %d KiB", after-idle)
	}
	// The wedged worker was not evicted: it can still read what it was sent.
	if m := wedged.expect("wake"); m.Name != "d" {
		t.Fatalf("wedged worker: %+v", m)
	}
}

// cpuTicks is the hub process's user+system CPU time in clock ticks.
func (p *proc) cpuTicks() int {
	p.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid()))
	if err != nil {
		p.t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return u + s
}

// Out of descriptors (EMFILE) though under its worker cap (the limit was
// lowered under it): the hub refuses the waiting connections at once with
// its spare descriptor (they see EOF and fall back, rather than hang in the
// backlog), counts them, does not spin, keeps serving the workers it has,
// and admits new ones once descriptors free up.
func TestServeEMFILE(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, nil)
	p.ready()
	base := p.fds()
	var old unix.Rlimit
	if err := prlimitNofile(p.pid(), nil, &old); err != nil {
		t.Skipf("prlimit: %v", err)
	}
	lim := unix.Rlimit{Cur: testutil.Rlim(base+3, old.Cur), Max: old.Max}
	if err := prlimitNofile(p.pid(), &lim, nil); err != nil {
		t.Skipf("prlimit: %v", err)
	}
	// The cap follows the lowered limit from the next status tick on
	// (at most 1, then): until it does, accept itself runs out of
	// descriptors. Either way a connection is served or refused at once.
	admitted := []*worker{dialWorker(t, path)}
	admitted[0].sub("emfile")
	// These connect (the backlog takes them), but there is no descriptor
	// to serve them with.
	waiting := make([]*net.UnixConn, 8)
	for i := range waiting {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		waiting[i] = c
	}
	// Each is served (a descriptor was still free: base may count one the
	// ready probe was closing) or refused at once, told why (a nack with
	// an empty q, docs/protocol.md) and closed; none hangs.
	refused := 0
	for _, c := range waiting {
		w := newWorker(t, c, 4096)
		m, err := w.read(timeout)
		switch {
		case err == nil && m.Type == "nack" && m.Name == "":
			// Out of descriptors, or past the cap once the status tick
			// has read the lowered limit.
			if m.Error != "the hub is out of file descriptors (RLIMIT_NOFILE)" && !strings.Contains(m.Error, "too many workers") {
				t.Fatalf("refused with %q", m.Error)
			}
			w.eofWithin(timeout)
			refused++
		case err == nil && m.Type == "status":
		default:
			t.Fatalf("a connection past the descriptor limit: %+v, %v; want a status or a refusal", m, err)
		}
	}
	if refused < 2 {
		t.Fatalf("%d of %d connections past the descriptor limit refused", refused, len(waiting))
	}
	testutil.WaitFor(t, timeout, "refusals in the log", func() bool {
		out := p.stderr.String()
		return strings.Contains(out, `"msg":"worker connections refused: out of file descriptors"`) ||
			strings.Contains(out, `"msg":"worker connection refused"`)
	})
	cpu0, t0 := p.cpuTicks(), time.Now()
	time.Sleep(time.Second) // measure a second of EMFILE
	used := float64(p.cpuTicks()-cpu0) / 100 / time.Since(t0).Seconds()
	t.Logf("hub CPU while out of descriptors: %.0f%% of a core", used*100)
	if used > 0.3 {
		t.Fatalf("hub uses %.0f%% of a core while out of descriptors: spinning", used*100)
	}
	notify(t, "NOTIFY emfile, 'served'") // the admitted workers are served
	if m := admitted[0].expect("wake"); m.Payload != "served" {
		t.Fatalf("wake %+v", m)
	}
	for _, w := range admitted {
		w.c.Close()
	}
	for _, c := range waiting {
		c.Close()
	}
	// Now one gets in, once the hub has seen the others leave: base may
	// count a descriptor the ready probe was closing, so the count alone
	// can say "gone" while one served connection is still the hub's.
	testutil.WaitFor(t, timeout, "every worker gone", func() bool { return p.fds() <= base })
	testutil.WaitFor(t, timeout, "a worker admitted again", func() bool {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		m, err := newWorker(t, c, 4096).read(timeout)
		if err != nil || m.Type != "status" && !(m.Type == "nack" && strings.Contains(m.Error, "too many workers")) {
			t.Fatalf("a worker after the others left: %+v, %v; want a status (or, until the hub saw them go, the cap)", m, err)
		}
		return m.Type == "status"
	})
	prlimitNofile(p.pid(), &old, nil)
}

// A stop requested while the first Postgres connection is still being
// made (the hub accepts already) is a clean stop: exit 0, the socket file
// removed. The "server" here
// accepts the TCP connection and never answers the startup message.
func TestServeSignalWhileConnecting(t *testing.T) {
	ln := testutil.ListenTCP(t)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	path := sockPath(t)
	cmd := exec.Command(hubBinary(t), "serve", "--socket", path,
		"--database-url", "postgres://u@"+ln.Addr().String()+"/db?sslmode=disable&connect_timeout=30")
	cmd.Env = cleanEnv()
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(timeout):
		cmd.Process.Kill()
		t.Fatalf("hub never connected to the fake server:\n%s", stderr.String())
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if exited, err := waitCmd(cmd, timeout); !exited {
		t.Fatalf("no exit within %v of SIGTERM while connecting", timeout)
	} else if err != nil {
		t.Fatalf("exit after SIGTERM while connecting: %v, want 0:\n%s", err, stderr.String())
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file exists after a stop during connect: %v", err)
	}
}

// waitCmd waits up to d for the started cmd to exit and returns what Wait
// said; exited is false (and cmd killed) if it did not exit in time.
func waitCmd(cmd *exec.Cmd, d time.Duration) (exited bool, err error) {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return true, err
	case <-time.After(d):
		cmd.Process.Kill()
		return false, nil
	}
}

// background is the life of a test goroutine that runs until it is asked
// to stop: stop asks it to end, done is closed when it has.
type background struct {
	stop chan struct{}
	done chan struct{}
}

func newBackground() background {
	return background{stop: make(chan struct{}), done: make(chan struct{})}
}

// ask asks the goroutine to stop; more than once is fine.
func (b *background) ask() {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
}

// halt asks the goroutine to stop and waits until it has.
func (b *background) halt() {
	b.ask()
	<-b.done
}

// every calls step every d until step returns false or the goroutine is
// asked to stop; then it closes done.
func (b *background) every(d time.Duration, step func() bool) {
	defer close(b.done)
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
		}
		if !step() {
			return
		}
	}
}

// loop calls step(0), step(1), ... with pause before each (none: only a
// look for a stop) until step returns false or the goroutine is asked to
// stop; then it closes done.
func (b *background) loop(pause time.Duration, step func(i int) bool) {
	defer close(b.done)
	for i := 0; ; i++ {
		if pause == 0 {
			select {
			case <-b.stop:
				return
			default:
			}
		} else {
			select {
			case <-b.stop:
				return
			case <-time.After(pause):
			}
		}
		if !step(i) {
			return
		}
	}
}
