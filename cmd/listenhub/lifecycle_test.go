package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/testutil"
)

// fakeSystemd is the service manager's notify socket: a datagram socket
// the test binds, named to the hub by NOTIFY_SOCKET.
type fakeSystemd struct {
	t    *testing.T
	c    *net.UnixConn
	path string
}

func newFakeSystemd(t *testing.T) *fakeSystemd {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// As systemd does: the kernel tells which process sent each datagram.
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Control(func(fd uintptr) { err = passCred(int(fd)) })
	if err != nil {
		t.Fatal(err)
	}
	return &fakeSystemd{t: t, c: c, path: path}
}

// next returns the next datagram, failing the test after d.
func (s *fakeSystemd) next(d time.Duration) string {
	s.t.Helper()
	m, _ := s.nextFrom(d)
	return m
}

// nextFrom returns the next datagram and the pid of its sender.
func (s *fakeSystemd) nextFrom(d time.Duration) (string, int) {
	s.t.Helper()
	buf, oob := make([]byte, 4096), make([]byte, 256)
	s.c.SetReadDeadline(time.Now().Add(d))
	n, oobn, _, _, err := s.c.ReadMsgUnix(buf, oob)
	if err != nil {
		s.t.Fatalf("no notify datagram within %v: %v", d, err)
	}
	return string(buf[:n]), senderPID(oob[:oobn])
}

// waitAll reads datagrams until each of wants was in one, and returns when
// each was first seen.
func (s *fakeSystemd) waitAll(d time.Duration, wants ...string) map[string]time.Time {
	s.t.Helper()
	seen := map[string]time.Time{}
	deadline := time.Now().Add(d)
	for len(seen) < len(wants) {
		left := time.Until(deadline)
		if left <= 0 {
			s.t.Fatalf("notify datagrams: saw %v of %q within %v", seen, wants, d)
		}
		m := s.next(left)
		for _, w := range wants {
			if _, ok := seen[w]; !ok && strings.Contains(m, w) {
				seen[w] = time.Now()
			}
		}
	}
	return seen
}

// waitFor reads datagrams until one contains want, returning it.
func (s *fakeSystemd) waitFor(want string, d time.Duration) string {
	s.t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			s.t.Fatalf("no notify datagram with %q within %v", want, d)
		}
		if m := s.next(left); strings.Contains(m, want) {
			return m
		}
	}
}

// Type=notify: READY=1 once the socket accepts (a worker connecting right
// then is served), STATUS= lines that follow the hub, WATCHDOG=1 every
// WATCHDOG_USEC/2 from the hub's loop, and STOPPING=1 on SIGTERM.
func TestServeSystemdNotify(t *testing.T) {
	sd := newFakeSystemd(t)
	path := sockPath(t)
	needDB(t)
	hubBinary(t) // built before the clock starts
	start := time.Now()
	p := serve(t, path, []string{"NOTIFY_SOCKET=" + sd.path, "WATCHDOG_USEC=400000"})
	sd.waitFor("READY=1", timeout)
	ready := time.Since(start)
	w := dialWorker(t, path) // accepting the moment READY=1 is sent
	w.sub("notify")
	sd.waitFor("STATUS=serving 1 worker, postgres healthy", timeout)
	// Watchdog pings every 200 ms: ten in well under the 15 s deadline,
	// and never more than the 400 ms timeout apart on an idle machine
	// (not asserted: the machine is shared).
	pings, first := 0, time.Now()
	for pings < 10 {
		if strings.Contains(sd.next(timeout), "WATCHDOG=1") {
			pings++
		}
	}
	perPing := time.Since(first) / time.Duration(pings)
	p.cmd.Process.Signal(syscall.SIGTERM)
	m := sd.waitFor("STOPPING=1", timeout)
	if !strings.Contains(m, "STATUS=stopping") {
		t.Fatalf("stop datagram %q, want STATUS=stopping with it", m)
	}
	if code := p.exit(); code != 0 {
		t.Fatalf("exit %d", code)
	}
	t.Logf("exec to READY=1: %v; watchdog pings every %v (WATCHDOG_USEC=400000)", ready, perPing)
}

// activated starts `listenhub serve` the way systemd does with a socket
// unit: the listening socket as fd 3, LISTEN_FDS=1 and LISTEN_PID (and
// WATCHDOG_PID, used when WATCHDOG_USEC is set) naming the hub's own pid (sh
// sets them, then execs the hub in its place).
func activated(t *testing.T, ln *os.File, env []string, args ...string) *proc {
	t.Helper()
	c := needDB(t)
	p := &proc{t: t, app: testApp(t), stderr: &syncBuf{}, done: make(chan struct{})}
	full := append([]string{"-c", `LISTEN_PID=$$ WATCHDOG_PID=$$ exec "$0" "$@"`, hubBinary(t),
		"serve", "--log-format", "json", "--log-level", "debug", "--application-name", p.app}, args...)
	if !hasFlag(args, "--database-url") {
		full = append(full, "--database-url", c.URL())
	}
	p.cmd = exec.Command("/bin/sh", full...)
	p.cmd.Env = append(cleanEnv(), append([]string{"LISTEN_FDS=1", "LISTEN_FDNAMES=listenhub.socket"}, env...)...)
	p.cmd.ExtraFiles = []*os.File{ln}
	p.cmd.Stderr = p.stderr
	p.cmd.Stdout = p.stderr
	p.start()
	return p
}

// Socket activation: a worker that connects before the hub exists is
// served once it runs; the socket file belongs to systemd and stays after
// SIGTERM; a worker connecting between two hubs waits in the backlog and is
// served by the next one: a restart refuses nobody.
func TestServeSocketActivation(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	path := sockPath(t)
	ln := testutil.ListenUnixFile(t, path)
	early := connectWorker(t, path) // before any hub: queued by the kernel
	p := activated(t, ln, nil)
	early.expect("status")
	early.sub("act")
	late := subscribedWorker(t, path, "act")
	notify(t, "NOTIFY act, 'one'")
	for _, w := range []*worker{early, late} {
		if m := w.expect("wake"); m.Payload != "one" {
			t.Fatalf("wake %+v", m)
		}
	}
	// The line is copied from the hub's stderr by another goroutine: it
	// may trail the wakes.
	testutil.WaitFor(t, timeout, "the hub saying it was socket-activated", func() bool {
		return strings.Contains(p.stderr.String(), `"socket_activated":true`)
	})
	p.cmd.Process.Signal(syscall.SIGTERM)
	early.eofWithin(timeout)
	if code := p.exit(); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.stderr.String())
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the activated socket's file is gone after SIGTERM: %v", err)
	}
	between := connectWorker(t, path) // no hub now: connect still succeeds
	p2 := activated(t, ln, nil)
	between.expect("status")
	between.sub("act")
	notify(t, "NOTIFY act, 'two'")
	if m := between.expect("wake"); m.Payload != "two" {
		t.Fatalf("wake %+v", m)
	}
	p2.cmd.Process.Signal(syscall.SIGTERM)
	if code := p2.exit(); code != 0 {
		t.Fatalf("second hub: exit %d", code)
	}
}

// A socket unit with the wrong kind of socket (TCP here) or a --socket
// naming another file: one line, exit 1.
func TestServeSocketActivationRefused(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	tcp := testutil.ListenTCP(t)
	defer tcp.Close()
	f, err := tcp.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	path := sockPath(t)
	for _, c := range []struct {
		name string
		ln   *os.File
		args []string
		want string
	}{
		{"tcp", f, nil, "not a listening Unix stream socket"},
		{"other path", testutil.ListenUnixFile(t, path), []string{"--socket", path + ".other"}, "not the configured socket"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := activated(t, c.ln, nil, c.args...)
			if code := p.exit(); code != 1 {
				t.Fatalf("exit %d, want 1:\n%s", code, p.stderr.String())
			}
			out := p.stderr.String()
			if !strings.Contains(out, c.want) || strings.Count(out, "\n") != 1 {
				t.Fatalf("said %q, want one line with %q", out, c.want)
			}
		})
	}
}

// SIGHUP does not kill the hub (Go's default would, with exit 129 and the
// socket file left behind): it is logged and the hub keeps serving.
func TestServeSIGHUP(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, nil)
	p.ready()
	w := subscribedWorker(t, path, "hup")
	p.cmd.Process.Signal(syscall.SIGHUP)
	testutil.WaitFor(t, timeout, "SIGHUP logged", func() bool {
		return strings.Contains(p.stderr.String(), "SIGHUP ignored; send SIGUSR2 to upgrade")
	})
	notify(t, "NOTIFY hup, 'still'")
	if m := w.expect("wake"); m.Payload != "still" {
		t.Fatalf("wake %+v", m)
	}
	dialWorker(t, path).sub("hup")
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.exit(); code != 0 {
		t.Fatalf("exit %d after SIGHUP then SIGTERM", code)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file after SIGTERM: %v", err)
	}
}

// TestHubUnitsNoStartLimit: the shipped hub units restart a hub that
// failed for as long as it takes and never stop at systemd's start limit
// (5 starts in 10 s by default), which leaves the unit and its socket
// failed after the cause is gone: serve exits 1 at once on a role,
// database or password the server refuses, and RestartSec=1 would reach
// the limit in about 5 s. StartLimitIntervalSec= counts only in [Unit].
func TestHubUnitsNoStartLimit(t *testing.T) {
	for _, name := range []string{"listenhub.service", "listenhub@.service"} {
		b := testutil.ReadFile(t, filepath.Join("..", "..", "deploy", "systemd", name))
		section := ""
		keys := map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "[") {
				section = line
				continue
			}
			if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
				keys[section+k] = v
			}
		}
		for k, want := range map[string]string{
			"[Unit]StartLimitIntervalSec": "0",
			"[Service]Restart":            "always",
		} {
			if got, ok := keys[k]; !ok || got != want {
				t.Errorf("%s: %s=%q, want %q", name, k, got, want)
			}
		}
		if d, err := time.ParseDuration(keys["[Service]RestartSec"] + "s"); err != nil || d < time.Second {
			t.Errorf("%s: RestartSec=%s: a hub that keeps failing restarts more than once a second", name, keys["[Service]RestartSec"])
		}
	}
}

// A hot upgrade under systemd: a socket-activated, Type=notify hub with the
// watchdog on gets SIGUSR2 (ExecReload=); the new process tells systemd
// MAINPID= and READY=1, pings the watchdog itself (WATCHDOG_PID named the
// old one), serves the worker that never saw EOF, and on SIGTERM leaves
// systemd's socket file in place.
func TestServeUpgradeUnderSystemd(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	sd := newFakeSystemd(t)
	path := sockPath(t)
	ln := testutil.ListenUnixFile(t, path)
	pidFile := filepath.Join(t.TempDir(), "hub.pid")
	p := activated(t, ln, []string{"NOTIFY_SOCKET=" + sd.path, "WATCHDOG_USEC=400000"}, "--pid-file", pidFile)
	old := p.pid()
	sd.waitFor("READY=1", timeout)
	w := subscribedWorker(t, path, "upg")
	p.cmd.Process.Signal(syscall.SIGUSR2)
	var newPID int
	t.Cleanup(func() {
		// Before p's cleanup, which waits for the shared stderr: the new
		// process, also when the test gave up before it learned its pid.
		if b, err := os.ReadFile(pidFile); err == nil && newPID == 0 {
			if n, _ := strconv.Atoi(strings.TrimSpace(string(b))); n != old {
				newPID = n
			}
		}
		if newPID > 0 {
			syscall.Kill(newPID, syscall.SIGKILL)
		}
	})
	saw := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for !(saw["MAINPID"] && saw["READY"] && saw["WATCHDOG"]) {
		if time.Now().After(deadline) {
			t.Fatalf("after SIGUSR2: saw %v; want MAINPID=, READY=1 and WATCHDOG=1 from the new process", saw)
		}
		m, from := sd.nextFrom(time.Until(deadline))
		if newPID == 0 {
			if b, err := os.ReadFile(pidFile); err == nil {
				if n, _ := strconv.Atoi(strings.TrimSpace(string(b))); n != old {
					newPID = n
				}
			}
		}
		if newPID == 0 || from == old {
			continue
		}
		if from != newPID {
			t.Fatalf("datagram %q from pid %d, neither the old (%d) nor the new (%d) hub", m, from, old, newPID)
		}
		saw["MAINPID"] = saw["MAINPID"] || strings.Contains(m, fmt.Sprintf("MAINPID=%d", newPID))
		saw["READY"] = saw["READY"] || strings.Contains(m, "READY=1")
		saw["WATCHDOG"] = saw["WATCHDOG"] || strings.Contains(m, "WATCHDOG=1")
		if strings.Contains(m, "STOPPING=1") {
			t.Fatalf("the new hub says %q", m)
		}
	}
	testutil.WaitFor(t, timeout, "the old process to exit", func() bool { return !alive(old) })
	notify(t, "NOTIFY upg, 'after'")
	if m := w.expect("wake"); m.Payload != "after" {
		t.Fatalf("wake %+v", m)
	}
	syscall.Kill(newPID, syscall.SIGTERM)
	sd.waitFor("STOPPING=1", timeout)
	w.eofWithin(timeout)
	testutil.WaitFor(t, timeout, "the new process to exit", func() bool { return !alive(newPID) })
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("systemd's socket file after the upgraded hub stopped: %v", err)
	}
}

// Postgres down when the hub starts (docs/design.md, Lifecycle: Start): the
// hub accepts at once, workers are told healthy:false and their subs wait;
// once the server is up they get healthy:true, then their acks, and a
// NOTIFY arrives. One backend in the end.
func TestServePostgresDownAtStart(t *testing.T) {
	c := ownDB(t, "external database: cannot stop it")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Start(context.Background()) }) // for the tests after this one
	sd := newFakeSystemd(t)
	path := sockPath(t)
	start := time.Now()
	p := serve(t, path, []string{"NOTIFY_SOCKET=" + sd.path})
	// The first STATUS= (from the hub's loop) and READY=1 (from serve
	// once Start returned) may come in either order.
	ready := sd.waitAll(timeout, "READY=1", "STATUS=serving 0 workers, waiting for postgres")["READY=1"].Sub(start)
	ws := []*worker{dialWhenListening(t, p), dialWhenListening(t, p)}
	for i, w := range ws {
		if m := w.expect("status"); m.Healthy {
			t.Fatal("healthy:true with Postgres down")
		}
		w.c.Write(frame.AppendSub(nil, "early"))
		w.c.Write(frame.AppendSub(nil, fmt.Sprint("early", i)))
	}
	// Nothing but status while the server is down.
	for _, w := range ws {
		if m, err := w.read(300 * time.Millisecond); err == nil && m.Type != "status" {
			t.Fatalf("got %+v while Postgres is down", m)
		}
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	var worst time.Duration
	for i, w := range ws {
		healthy := false
		acks := map[string]bool{}
		for len(acks) < 2 {
			m, err := w.read(timeout)
			if err != nil {
				t.Fatalf("worker %d: %v after Postgres came up", i, err)
			}
			switch m.Type {
			case "status":
				healthy = m.Healthy
			case "ack":
				if !healthy {
					t.Fatalf("worker %d: ack %q before healthy:true", i, m.Name)
				}
				acks[m.Name] = true
			default:
				t.Fatalf("worker %d: got %+v, want status and acks", i, m)
			}
		}
		worst = max(worst, time.Since(up))
	}
	notify(t, "NOTIFY early, 'after'")
	for _, w := range ws {
		if m := w.expect("wake"); m.Name != "early" || m.Payload != "after" {
			t.Fatalf("wake %+v", m)
		}
	}
	sd.waitFor("postgres healthy", timeout)
	if n := census(t, p.app); n != 1 {
		t.Fatalf("census %d, want 1", n)
	}
	t.Logf("exec to READY=1 with Postgres down: %v; Postgres accepting to the last ack: %v", ready, worst)
}

// A configuration the server refuses is fatal (docs/design.md, Lifecycle:
// Start): a wrong password (a role that must authenticate, through a
// pg_hba.conf line this test adds) or a database that does not exist makes
// serve exit 1 within seconds with one line naming the reason and never
// the password, and removes the socket.
func TestServeConfigErrors(t *testing.T) {
	c := ownDB(t, "external database: cannot edit pg_hba.conf")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hba := filepath.Join(c.Dir(), "data", "pg_hba.conf")
	orig := testutil.ReadFile(t, hba)
	const role = "lh_pw_role"
	line := fmt.Sprintf("host all %s 127.0.0.1/32 scram-sha-256\nhost all %s ::1/128 scram-sha-256\n", role, role)
	if err := os.WriteFile(hba, append([]byte(line), orig...), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.WriteFile(hba, orig, 0)
		c.Exec(context.Background(), "SELECT pg_reload_conf()")
	})
	for _, sql := range []string{
		"DROP ROLE IF EXISTS " + role,
		"SET password_encryption = 'scram-sha-256'; CREATE ROLE " + role + " LOGIN PASSWORD 'right'",
		"SELECT pg_reload_conf()",
	} {
		if err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	cc, err := pgconn.ParseConfig(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	hostPort := fmt.Sprintf("127.0.0.1:%d", cc.Port)
	for _, tc := range []struct {
		name, url, want string
	}{
		{"wrong password", "postgres://" + role + ":sekrit@" + hostPort + "/postgres?sslmode=disable", "28P01"},
		{"unknown database", "postgres://postgres:sekrit@" + hostPort + "/no_such_db?sslmode=disable", "3D000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := sockPath(t)
			pidFile := filepath.Join(t.TempDir(), "hub.pid")
			start := time.Now()
			p := serve(t, path, nil, "--database-url", tc.url, "--log-format", "text", "--log-level", "error",
				"--pid-file", pidFile)
			if code := p.exit(); code != 1 {
				t.Fatalf("exit %d, want 1", code)
			}
			took := time.Since(start)
			out := p.stderr.String()
			var mine []string
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				if strings.HasPrefix(l, "listenhub serve:") {
					mine = append(mine, l)
				}
			}
			if len(mine) != 1 || !strings.Contains(mine[0], tc.want) {
				t.Fatalf("want one line with %s, got:\n%s", tc.want, out)
			}
			if strings.Contains(out, "sekrit") {
				t.Fatalf("password in the output:\n%s", out)
			}
			if took > 10*time.Second {
				t.Fatalf("exit after %v, want within seconds", took)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("socket file left: %v", err)
			}
			if _, err := os.Stat(pidFile); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("pid file of the exited process left: %v", err)
			}
			t.Logf("exit 1 after %v: %s", took, mine[0])
		})
	}
}

// The STATUS= line says where the hub stands: before the first connection,
// connected, and lost after having been connected; an unchanged line is not
// sent again, but every report pings the watchdog when it is on.
func TestSDReporterStatus(t *testing.T) {
	sd := newFakeSystemd(t)
	t.Setenv("NOTIFY_SOCKET", sd.path)
	t.Setenv("WATCHDOG_USEC", "10000000")
	t.Setenv("WATCHDOG_PID", "")
	r := newSDReporter(slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer r.close()
	if r.hook() == nil || r.interval != time.Second {
		t.Fatalf("hook %v, interval %v; want a hook every 1s (the watchdog's 5s is longer)", r.hook() != nil, r.interval)
	}
	for _, c := range []struct {
		s    hub.Stats
		want string
	}{
		{hub.Stats{}, "WATCHDOG=1\nSTATUS=serving 0 workers, waiting for postgres"},
		{hub.Stats{Workers: 1}, "WATCHDOG=1\nSTATUS=serving 1 worker, waiting for postgres"},
		{hub.Stats{Workers: 1}, "WATCHDOG=1"},
		{hub.Stats{Workers: 3, PostgresHealthy: true}, "WATCHDOG=1\nSTATUS=serving 3 workers, postgres healthy"},
		{hub.Stats{Workers: 3}, "WATCHDOG=1\nSTATUS=serving 3 workers, postgres down; reconnecting"},
	} {
		r.report(c.s)
		if got := sd.next(timeout); got != c.want {
			t.Fatalf("report(%+v) sent %q, want %q", c.s, got, c.want)
		}
	}
	r.stopping("stopping")
	if got := sd.next(timeout); got != "STOPPING=1\nSTATUS=stopping" {
		t.Fatalf("stopping sent %q", got)
	}
	r.report(hub.Stats{Workers: 9, PostgresHealthy: true}) // after STOPPING=1: nothing
	r.ready()
	if got := sd.next(timeout); got != "READY=1" {
		t.Fatalf("after stopping, a report sent %q", got)
	}
}
