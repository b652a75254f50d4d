package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
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

	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/testutil"
)

// demoWorkerEnv makes this test binary act as `listenhub demo-worker` when
// the in-process demo re-executes it (os.Executable is the test binary).
// It is checked in init, before the testing package parses the worker's
// arguments as test flags.
const demoWorkerEnv = "LISTENHUB_DEMO_TEST_WORKER"

func init() {
	if os.Getenv(demoWorkerEnv) == "1" && len(os.Args) > 1 && os.Args[1] == "demo-worker" {
		os.Exit(runDemoWorker(context.Background(), os.Args[2:], os.Stdout, os.Stderr))
	}
}

var (
	demoStartedRE = regexp.MustCompile(`^listenhub demo: started a throwaway PostgreSQL on 127\.0\.0\.1:(\d+) in (\S+) \(removed on exit\)$`)
	demoUsingRE   = regexp.MustCompile(`^listenhub demo: using (\S+)$`)
	demoHubRE     = regexp.MustCompile(`^listenhub demo: hub on (\S+); (\d+) worker process(?:es)? subscribed to "(listenhub_demo_\d+)"; notifying (\d+)/s\. Ctrl-C to stop\.$`)
	demoLineRE    = regexp.MustCompile(`^ +(\d+)s  backends (\d+) \((\d+) with direct LISTEN\)  notify/s (\d+)  wakes/s (\d+)  p50 (\S+)  p99 (\S+)  evictions (\d+)  workers (\d+) hub/(\d+) local$`)
	demoStopRE    = regexp.MustCompile(`^listenhub demo: workers and hub stopped(, throwaway cluster removed)?$`)
)

// demoOutput is the parsed stdout of a demo run.
type demoOutput struct {
	port        int    // throwaway cluster's port (0 with --database-url)
	clusterDir  string // throwaway cluster's directory
	using       string // the --database-url line's server
	socket      string
	channel     string
	workers     int
	lines       [][]string // submatches of demoLineRE
	stopped     bool
	removedNote bool
}

// parseDemo checks that every line of out is one the demo is documented to
// print, in order.
func parseDemo(t *testing.T, out string) demoOutput {
	t.Helper()
	var d demoOutput
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		switch {
		case demoStartedRE.MatchString(line):
			m := demoStartedRE.FindStringSubmatch(line)
			d.port, _ = strconv.Atoi(m[1])
			d.clusterDir = m[2]
		case demoUsingRE.MatchString(line):
			d.using = demoUsingRE.FindStringSubmatch(line)[1]
		case demoHubRE.MatchString(line):
			m := demoHubRE.FindStringSubmatch(line)
			d.socket, d.channel = m[1], m[3]
			d.workers, _ = strconv.Atoi(m[2])
		case demoLineRE.MatchString(line):
			if d.socket == "" || d.stopped {
				t.Fatalf("report line outside the run: %q\n%s", line, out)
			}
			d.lines = append(d.lines, demoLineRE.FindStringSubmatch(line))
		case demoStopRE.MatchString(line):
			d.stopped = true
			d.removedNote = demoStopRE.FindStringSubmatch(line)[1] != ""
		default:
			t.Fatalf("unexpected demo output line %q\nwhole output:\n%s", line, out)
		}
	}
	if d.socket == "" || !d.stopped {
		t.Fatalf("demo output lacks the hub or the stop line:\n%s", out)
	}
	return d
}

// checkReports checks the per-second lines: one backend where the workers
// alone would hold one each, every worker on the hub, no evictions, and
// wakes adding up to workers × NOTIFYs.
func checkReports(t *testing.T, d demoOutput, workers int, out string) {
	t.Helper()
	if len(d.lines) < 2 {
		t.Fatalf("%d report lines, want at least 2:\n%s", len(d.lines), out)
	}
	var notifies, wakes int
	for i, m := range d.lines {
		n := func(k int) int { v, _ := strconv.Atoi(m[k]); return v }
		if n(1) != i+1 {
			t.Errorf("line %d says %ss", i+1, m[1])
		}
		if n(2) != 1 || n(3) != workers {
			t.Errorf("line %d: backends %s (%s with direct LISTEN), want 1 (%d)", i+1, m[2], m[3], workers)
		}
		if n(8) != 0 || n(9) != workers || n(10) != 0 {
			t.Errorf("line %d: evictions %s, workers %s hub/%s local; want 0, %d/0", i+1, m[8], m[9], m[10], workers)
		}
		if (n(5) == 0) != (m[6] == "-") || m[6] == "-" != (m[7] == "-") {
			t.Errorf("line %d: %s wakes but p50 %s, p99 %s", i+1, m[5], m[6], m[7])
		}
		notifies += n(4)
		wakes += n(5)
	}
	// Each NOTIFY reaches every worker. The last reports may still be
	// in a worker's pipe when the run ends, and a loaded machine (this one
	// is shared) can stall a worker for a second, hence the slack below.
	if want := notifies * workers; wakes == 0 || wakes < want/2 || wakes > want {
		t.Errorf("%d wakes for %d NOTIFYs to %d workers, want about %d\n%s", wakes, notifies, workers, want, out)
	}
}

// checkNoWorkers fails if a process still carries the demo's channel name
// on its command line (a worker that outlived the demo).
func checkNoWorkers(t *testing.T, channel string) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if bytes.Contains(b, []byte(channel)) && bytes.Contains(b, []byte("demo-worker")) {
			t.Errorf("worker %s still running: %q", filepath.Dir(p), bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
}

// checkGone checks that the demo's socket directory and throwaway cluster
// are gone.
func checkGone(t *testing.T, d demoOutput) {
	t.Helper()
	if _, err := os.Stat(filepath.Dir(d.socket)); !os.IsNotExist(err) {
		t.Errorf("socket directory %s still exists (%v)", filepath.Dir(d.socket), err)
	}
	if d.clusterDir != "" {
		if _, err := os.Stat(d.clusterDir); !os.IsNotExist(err) {
			t.Errorf("cluster directory %s still exists (%v)", d.clusterDir, err)
		}
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", d.port), time.Second); err == nil {
			c.Close()
			t.Errorf("the throwaway server still accepts connections on port %d", d.port)
		}
	}
	checkNoWorkers(t, d.channel)
}

// demoReport checks that the demo exited 0 with nothing on stderr and
// returns its parsed output (logged).
func demoReport(t *testing.T, code int, out, errw *syncBuffer) demoOutput {
	t.Helper()
	t.Logf("demo output:\n%s", out.String())
	if code != 0 {
		t.Fatalf("demo exited %d; stderr:\n%s", code, errw.String())
	}
	if errw.String() != "" {
		t.Errorf("demo wrote to stderr:\n%s", errw.String())
	}
	return parseDemo(t, out.String())
}

// startDemoCmd starts cmd with its stderr captured and returns its stdout.
func startDemoCmd(t *testing.T, cmd *exec.Cmd) (io.ReadCloser, *syncBuffer) {
	t.Helper()
	errw := &syncBuffer{}
	cmd.Stderr = errw
	return testutil.StartPiped(t, cmd), errw
}

// TestDemo runs the demo as a user would (no database URL): it starts its
// own cluster, reports once a second, and removes everything at the end.
func TestDemo(t *testing.T) {
	if os.Getenv(pgtest.EnvURL) != "" {
		t.Skip("the throwaway-cluster path needs " + pgtest.EnvURL + " unset")
	}
	t.Setenv(demoWorkerEnv, "1")
	var out, errw syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const workers = 3
	code := runDemo(ctx, []string{"--workers", strconv.Itoa(workers), "--rate", "100", "--duration", "3s"}, &out, &errw)
	d := demoReport(t, code, &out, &errw)
	if len(d.lines) != 3 {
		t.Errorf("--duration 3s printed %d report lines, want 3", len(d.lines))
	}
	if d.port == 0 || d.clusterDir == "" || !d.removedNote || d.workers != workers {
		t.Errorf("want a throwaway cluster, %d workers and its removal announced; got %+v", workers, d)
	}
	checkReports(t, d, workers, out.String())
	checkGone(t, d)
}

// TestDemoDatabaseURL runs the demo against a server it does not own: it
// must use it, and leave it running with none of the demo's backends. The
// URL's password reaches the worker processes through their environment,
// never their argv (which every user of the host can read).
func TestDemoDatabaseURL(t *testing.T) {
	c := needDB(t) // the package's shared cluster
	t.Setenv(demoWorkerEnv, "1")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	url := c.URL()
	const secret = "demo-pw-not-in-argv"
	if !c.External() {
		// The throwaway cluster trusts every local connection: a
		// password in the URL is carried and ignored.
		url = strings.Replace(url, "postgres://postgres@", "postgres://postgres:"+secret+"@", 1)
	}
	workerProcs := make(chan []demoWorkerProc, 1)
	demoDone := make(chan struct{})
	go func() { workerProcs <- watchDemoWorkers(demoDone) }()

	var out, errw syncBuffer
	const workers = 2
	code := runDemo(ctx, []string{"--database-url", url, "--workers", strconv.Itoa(workers), "--duration", "2s"}, &out, &errw)
	close(demoDone)
	procs := <-workerProcs
	if len(procs) != workers {
		t.Errorf("saw %d demo-worker processes, want %d", len(procs), workers)
	}
	for _, p := range procs {
		if strings.Contains(p.cmdline, url) || strings.Contains(p.cmdline, secret) || strings.Contains(p.cmdline, "--database-url") {
			t.Errorf("demo-worker %d argv carries the database URL: %q", p.pid, p.cmdline)
		}
		if !strings.Contains(p.environ, demoWorkerURLEnv+"="+url+"\x00") {
			t.Errorf("demo-worker %d: no %s=<the URL> in its environment", p.pid, demoWorkerURLEnv)
		}
	}
	d := demoReport(t, code, &out, &errw)
	if d.using == "" || d.clusterDir != "" || d.removedNote {
		t.Errorf("want the given server used and not removed; got %+v", d)
	}
	if strings.Contains(out.String(), "password") {
		t.Errorf("output mentions a password:\n%s", out.String())
	}
	checkReports(t, d, workers, out.String())
	checkGone(t, d)

	// The server is still up, and the demo left no backend on it.
	pid := strings.TrimPrefix(d.channel, "listenhub_demo_")
	n, err := c.QueryInt(ctx, `SELECT count(*)::int FROM pg_stat_activity WHERE application_name LIKE $1`, "listenhub-demo-"+pid+"%")
	if err != nil {
		t.Fatalf("server gone after the demo: %v", err)
	}
	if n != 0 {
		t.Errorf("%d demo backends left on the server", n)
	}
}

// demoWorkerProc is a demo-worker child of this test process, as /proc
// shows it to other users (argv) and to its own (environment).
type demoWorkerProc struct {
	pid              int
	cmdline, environ string
}

// watchDemoWorkers records the demo-worker children of this process until
// done is closed.
func watchDemoWorkers(done <-chan struct{}) []demoWorkerProc {
	seen := map[int]demoWorkerProc{}
	for {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || seen[pid].pid != 0 {
				continue
			}
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				continue
			}
			f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
			if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) {
				continue
			}
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
			if bytes.Contains(cmd, []byte("demo-worker")) && len(env) > 0 {
				seen[pid] = demoWorkerProc{pid, strings.ReplaceAll(string(cmd), "\x00", " "), string(env)}
			}
		}
		select {
		case <-done:
			var out []demoWorkerProc
			for _, p := range seen {
				out = append(out, p)
			}
			return out
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestDemoBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--workers", "0"},
		{"--rate", "-1"},
		{"--duration", "-1s"},
		{"--nope"},
		{"extra"},
		{"--relay", "--rate", "5"},
		{"--writers", "4"},
		{"--relay", "--writers", "0"},
	} {
		var out, errw bytes.Buffer
		if code := runDemo(context.Background(), args, &out, &errw); code != 2 {
			t.Errorf("demo %q exited %d, want 2", args, code)
		}
		if lines := strings.Count(errw.String(), "\n"); lines != 1 || !strings.HasPrefix(errw.String(), "listenhub demo: ") {
			t.Errorf("demo %q: want one line on stderr, got %q", args, errw.String())
		}
		if out.Len() != 0 {
			t.Errorf("demo %q wrote to stdout: %q", args, out.String())
		}
	}
}

// TestDemoBinaryCtrlC builds the real binary and runs `listenhub demo` as
// the README says, through main's dispatch and the real demo-worker
// re-exec, then stops it with SIGINT as a Ctrl-C would.
func TestDemoBinaryCtrlC(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	if os.Getenv(pgtest.EnvURL) != "" {
		t.Skip("the throwaway-cluster path needs " + pgtest.EnvURL + " unset")
	}
	cmd := exec.Command(hubBinary(t), "demo", "--workers", "2")
	stdout, errw := startDemoCmd(t, cmd)
	var out syncBuffer
	reports := make(chan struct{}, 100)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.Write(append(sc.Bytes(), '\n'))
			if demoLineRE.Match(sc.Bytes()) {
				reports <- struct{}{}
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { <-copied; exited <- cmd.Wait() }()
	for range 2 {
		select {
		case <-reports:
		case err := <-exited:
			t.Fatalf("demo exited early (%v):\n%s\nstderr:\n%s", err, out.String(), errw.String())
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
			t.Fatalf("no report lines within 2 minutes:\n%s\nstderr:\n%s", out.String(), errw.String())
		}
	}
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("demo after SIGINT: %v\nstderr:\n%s", err, errw.String())
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("demo did not exit within a minute of SIGINT")
	}
	t.Logf("demo output:\n%s", out.String())
	d := parseDemo(t, out.String())
	if !d.removedNote {
		t.Errorf("no removal line after SIGINT:\n%s", out.String())
	}
	checkGone(t, d)
}

// syncBuffer is a bytes.Buffer safe for the demo's goroutines.
type syncBuffer = testutil.SyncBuffer

var (
	relayDemoStartedRE = regexp.MustCompile(`^listenhub demo: started a throwaway PostgreSQL on 127\.0\.0\.1:(\d+) in (\S+) \(wal_level=logical, fsync on; removed on exit\)$`)
	relayDemoHubRE     = regexp.MustCompile(`^listenhub demo: hub on (\S+); (\d+) workers? subscribed to 16 queues; (\d+) writers? insert one row per transaction, each second in turn into queues with pgmq's per-row NOTIFY trigger and into queues the relay wakes from the WAL\. Ctrl-C to stop\.$`)
	relayDemoLineRE    = regexp.MustCompile(`^ +(\d+)s  commits/s  per-row trigger (\d+)  relay (\d+) \((\d+\.\d×|-)\)  wakes/s per worker  trigger (\d+)  relay (\d+)$`)
	relayDemoSumRE     = regexp.MustCompile(`^listenhub demo: (\d+) writers?, (\d+) s each: per-row trigger (\d+) commits/s, relay (\d+) commits/s \((\d+\.\d×|-)\)$`)
	relayDemoStopRE    = regexp.MustCompile(`^listenhub demo: writers, workers, hub and relay stopped(, throwaway cluster removed)?$`)
)

// ownedClusterDirs lists the pgtest cluster directories next to dir that
// this process created (their owner.pid is ours).
func ownedClusterDirs(t *testing.T, dir string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	ents, _ := filepath.Glob(filepath.Join(dir, "listenhub-pgtest-*"))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(e, "owner.pid"))
		if err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(os.Getpid()) {
			out[e] = true
		}
	}
	return out
}

// TestDemoRelay runs `listenhub demo --relay` on its own throwaway cluster:
// a line per pair of seconds with both sources' commits/s and wakes, the
// averages, and nothing left behind (socket directory, cluster, its port).
func TestDemoRelay(t *testing.T) {
	if os.Getenv(pgtest.EnvURL) != "" {
		t.Skip("the throwaway-cluster path needs " + pgtest.EnvURL + " unset")
	}
	before := ownedClusterDirs(t, os.TempDir())
	var out, errw syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	code := runDemo(ctx, []string{"--relay", "--workers", "2", "--writers", "4", "--duration", "4s"}, &out, &errw)
	t.Logf("demo output:\n%s", out.String())
	if code != 0 {
		t.Fatalf("demo exited %d; stderr:\n%s", code, errw.String())
	}
	if errw.String() != "" {
		t.Errorf("demo wrote to stderr:\n%s", errw.String())
	}
	var port int
	var clusterDir, socket string
	var lines, sums int
	stopped := false
	for _, line := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		switch {
		case relayDemoStartedRE.MatchString(line):
			m := relayDemoStartedRE.FindStringSubmatch(line)
			port, _ = strconv.Atoi(m[1])
			clusterDir = m[2]
		case relayDemoHubRE.MatchString(line):
			m := relayDemoHubRE.FindStringSubmatch(line)
			socket = m[1]
			if m[2] != "2" || m[3] != "4" {
				t.Errorf("hub line says %s workers, %s writers; want 2, 4", m[2], m[3])
			}
		case relayDemoLineRE.MatchString(line):
			m := relayDemoLineRE.FindStringSubmatch(line)
			lines++
			n := func(k int) int { v, _ := strconv.Atoi(m[k]); return v }
			if n(1) != 2*lines {
				t.Errorf("line %d says %ss, want %ds", lines, m[1], 2*lines)
			}
			// Every commit of a trigger table NOTIFYs; the relay's
			// NOTIFYs are coalesced but come.
			if n(2) == 0 || n(3) == 0 || n(5) == 0 || n(6) == 0 {
				t.Errorf("line %d: a zero: %q", lines, line)
			}
		case relayDemoSumRE.MatchString(line):
			sums++
			if m := relayDemoSumRE.FindStringSubmatch(line); m[1] != "4" || m[2] != "2" {
				t.Errorf("summary says %s writers, %s s each; want 4, 2", m[1], m[2])
			}
		case relayDemoStopRE.MatchString(line):
			stopped = relayDemoStopRE.FindStringSubmatch(line)[1] != ""
		default:
			t.Errorf("unexpected line %q", line)
		}
	}
	if clusterDir == "" || socket == "" || lines != 2 || sums != 1 || !stopped {
		t.Fatalf("want the cluster, hub, 2 report lines, a summary and the removal; got cluster %q socket %q, %d lines, %d summaries, removed %v",
			clusterDir, socket, lines, sums, stopped)
	}
	for _, dir := range []string{filepath.Dir(socket), clusterDir} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s still exists (%v)", dir, err)
		}
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		c.Close()
		t.Errorf("the throwaway server still accepts connections on port %d", port)
	}
	for dir := range ownedClusterDirs(t, filepath.Dir(clusterDir)) {
		if !before[dir] {
			t.Errorf("cluster directory %s left behind", dir)
		}
	}
}

// TestDemoRelayNotLogical points `demo --relay` at a server without
// wal_level=logical: one line that names the fix, exit 1, and the schema and
// publication it created dropped again.
func TestDemoRelayNotLogical(t *testing.T) {
	c := ownDB(t, "the external server's wal_level is not ours to know")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errw syncBuffer
	code := runDemo(ctx, []string{"--relay", "--database-url", c.URL(), "--workers", "1", "--writers", "1", "--duration", "2s"}, &out, &errw)
	if code != 1 {
		t.Fatalf("demo exited %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out.String(), errw.String())
	}
	e := errw.String()
	if strings.Count(e, "\n") != 1 || !strings.HasPrefix(e, "listenhub demo: ") || !strings.Contains(e, "wal_level") || !strings.Contains(e, "ALTER SYSTEM") {
		t.Errorf("stderr %q: want one line naming wal_level and its fix", e)
	}
	name := fmt.Sprintf("listenhub_demo_%d", os.Getpid())
	n, err := c.QueryInt(ctx, `SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = $1) + (SELECT count(*) FROM pg_publication WHERE pubname = $1)`, name)
	if err != nil || n != 0 {
		t.Errorf("the demo's schema or publication %s left on the server (%d, %v)", name, n, err)
	}
}

// TestDemoLeavesNothingInTmp: `listenhub demo | head -3` (the reader goes
// away: SIGPIPE) and a Ctrl-C while it is still starting each end the demo
// through its cleanup: nothing is left in its TMPDIR (the throwaway
// cluster, the hub's socket directory). The demo used to die of SIGPIPE and
// leave both behind.
func TestDemoLeavesNothingInTmp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	if os.Getenv(pgtest.EnvURL) != "" {
		t.Skip("the throwaway-cluster path needs " + pgtest.EnvURL + " unset")
	}
	for _, how := range []string{"sigpipe", "ctrl-c"} {
		t.Run(how, func(t *testing.T) {
			// A TMPDIR of its own, reachable by the postgres user
			// when we are root (pgtest falls back to /tmp otherwise).
			tmp, err := os.MkdirTemp("", "lhdemo-tmp-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(tmp) })
			if err := os.Chmod(tmp, 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(hubBinary(t), "demo", "--workers", "1")
			cmd.Env = append(cleanEnv(), "TMPDIR="+tmp)
			stdout, errw := startDemoCmd(t, cmd)
			t.Cleanup(func() { cmd.Process.Kill() })
			r := bufio.NewReader(stdout)
			want := 3 // head -3
			if how == "ctrl-c" {
				want = 1 // the cluster is up; the hub and workers are starting
			}
			for i := range want {
				line, err := r.ReadString('\n')
				if err != nil {
					t.Fatalf("line %d: %v; stderr:\n%s", i+1, err, errw.String())
				}
				t.Logf("%s", strings.TrimSpace(line))
			}
			if how == "sigpipe" {
				stdout.Close() // the reader is gone
			} else {
				cmd.Process.Signal(syscall.SIGINT)
				go io.Copy(io.Discard, r)
			}
			if exited, err := waitCmd(cmd, time.Minute); !exited {
				t.Fatalf("demo still running a minute after %s; stderr:\n%s", how, errw.String())
			} else if err != nil {
				t.Fatalf("demo: %v; stderr:\n%s", err, errw.String())
			}
			left, err := os.ReadDir(tmp)
			if err != nil {
				t.Fatal(err)
			}
			if len(left) > 0 {
				var names []string
				for _, e := range left {
					names = append(names, e.Name())
				}
				t.Fatalf("left in TMPDIR after %s: %v; stderr:\n%s", how, names, errw.String())
			}
		})
	}
}

// TestDemoRelayDatabaseURL runs `demo --relay` on a logical server it does
// not own: it works there, says what it dropped, and leaves no schema,
// publication, slot or backend behind.
func TestDemoRelayDatabaseURL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	if os.Getenv(pgtest.EnvURL) != "" {
		t.Skip("needs a throwaway logical cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgtest.Start(ctx, pgtest.Options{Logical: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out, errw syncBuffer
	code := runDemo(ctx, []string{"--relay", "--database-url", c.URL(), "--workers", "1", "--writers", "2", "--duration", "2s"}, &out, &errw)
	t.Logf("demo output:\n%s", out.String())
	if code != 0 {
		t.Fatalf("demo exited %d; stderr:\n%s", code, errw.String())
	}
	name := fmt.Sprintf("listenhub_demo_%d", os.Getpid())
	if !strings.Contains(out.String(), "listenhub demo: using ") || !strings.Contains(out.String(), "listenhub demo: writers, workers, hub and relay stopped, schema "+name+" dropped\n") {
		t.Errorf("want the using and the dropped lines:\n%s", out.String())
	}
	if !relayDemoLineRE.MatchString(strings.Split(out.String(), "\n")[2]) {
		t.Errorf("third line is not a report line:\n%s", out.String())
	}
	// A backend leaves pg_stat_activity a moment after its client closed
	// (on a loaded machine, after the demo returned): wait for it.
	left := func() (string, error) {
		var what []string
		for _, q := range []struct{ what, sql string }{
			{"schema", "SELECT count(*)::int FROM pg_namespace WHERE nspname = $1"},
			{"publication", "SELECT count(*)::int FROM pg_publication WHERE pubname = $1"},
			{"slot", "SELECT count(*)::int FROM pg_replication_slots WHERE slot_name = $1"},
			{"backends", "SELECT count(*)::int FROM pg_stat_activity WHERE application_name LIKE $1 || '%'"},
		} {
			n, err := c.QueryInt(ctx, q.sql, name)
			if err != nil {
				return "", err
			}
			if n > 0 {
				what = append(what, fmt.Sprintf("%d %s", n, q.what))
			}
		}
		return strings.Join(what, ", "), nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		what, err := left()
		if err == nil && what == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the demo left %s on the server 10 s after it returned (%v)", what, err)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The demo starts a plain throwaway cluster; the fault tools of the tests
// (Freeze, Thaw, PgBouncer) and the TLS certificate maker never reach the
// shipped binary.
func TestBinaryHasNoTestTools(t *testing.T) {
	out, err := exec.Command("go", "tool", "nm", hubBinary(t)).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool nm: %v\n%s", err, out)
	}
	var found []string
	for _, line := range strings.Split(string(out), "\n") {
		for _, bad := range []string{"pgtest.(*Cluster).Freeze", "pgtest.(*Cluster).Thaw", "pgtest.(*Cluster).StartPgBouncer", "pgtest/pgtls."} {
			if strings.Contains(line, bad) {
				found = append(found, strings.TrimSpace(line))
			}
		}
	}
	if len(found) > 0 {
		t.Fatalf("the binary links test tools:\n%s", strings.Join(found, "\n"))
	}
	if !strings.Contains(string(out), "pgtest.Start") {
		t.Fatal("the binary has no pgtest.Start: the check looks at the wrong names")
	}
}
