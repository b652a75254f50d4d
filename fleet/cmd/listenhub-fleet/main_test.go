package main_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
)

var db *pgtest.Cluster

func TestMain(m *testing.M) { pgtesting.Main(m, pgtest.Options{}, &db) }

const wait = 30 * time.Second

// build builds this command into the test's temporary directory.
func build(t *testing.T) string {
	t.Helper()
	binary := filepath.Join(t.TempDir(), "listenhub-fleet")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return binary
}

// proc is a running listenhub-fleet whose stderr lines are kept.
type proc struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
}

func start(t *testing.T, binary string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			p.mu.Lock()
			t.Logf("%s:\n%s", strings.Join(args[:1], " "), strings.Join(p.lines, "\n"))
			p.mu.Unlock()
		}
	})
	return p
}

func (p *proc) said(s string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SIGKILL the active bridge while a writer commits a numbered NOTIFY every
// millisecond: the standby takes over; the worker hears healthy:false, then
// true and a durable wake; no payload arrives twice, and NOTIFYs flow through
// the new bridge. The password in the NATS URL is never printed.
func TestBridgeSIGKILLUnderLoad(t *testing.T) {
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Username: "fleet", Password: "s3cret-pw"})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(wait) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(ns.Shutdown)
	addr := ns.Addr().(*net.TCPAddr)
	natsURL := fmt.Sprintf("nats://fleet:s3cret-pw@127.0.0.1:%d", addr.Port)

	bin := build(t)
	a := start(t, bin, "bridge", "--database-url", db.URL(), "--nats", natsURL, "--database", "app")
	waitFor(t, "an active bridge", func() bool { return a.said("fleet bridge: active") })
	b := start(t, bin, "bridge", "--database-url", db.URL(), "--nats", natsURL, "--database", "app")
	waitFor(t, "the standby", func() bool { return b.said("standing by") })
	sock := filepath.Join(t.TempDir(), "hub.sock")
	h := start(t, bin, "serve", "--socket", sock, "--upstream", natsURL, "--database", "app")
	var c net.Conn
	waitFor(t, "the hub's socket", func() bool {
		c, err = net.Dial("unix", sock)
		return err == nil
	})
	defer c.Close()
	frames := make(chan frame.Message, 1<<16)
	go func() {
		var dec frame.Decoder
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				close(frames)
				return
			}
			dec.Feed(buf[:n])
			for m, ok, _ := dec.Next(); ok; m, ok, _ = dec.Next() {
				frames <- m
			}
		}
	}()
	next := func(what string, f func(frame.Message) bool, seen func(frame.Message)) {
		t.Helper()
		timer := time.After(wait)
		for {
			select {
			case m, ok := <-frames:
				if !ok {
					t.Fatalf("hub closed the worker, waiting for %s", what)
				}
				if f(m) {
					return
				}
				if seen != nil {
					seen(m)
				}
			case <-timer:
				t.Fatalf("no %s", what)
			}
		}
	}
	next("healthy", func(m frame.Message) bool { return m.Type == frame.TypeStatus && m.Healthy }, nil)
	c.Write(frame.AppendSub(nil, "load"))
	next("ack", func(m frame.Message) bool { return m.Type == frame.TypeAck }, nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sent atomic.Int64
	writer := make(chan struct{})
	go func() {
		defer close(writer)
		conn, err := pgx.Connect(ctx, db.URL())
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		for i := 1; ctx.Err() == nil; i++ {
			if _, err := conn.Exec(ctx, "SELECT pg_notify('load', $1)", fmt.Sprint(i)); err != nil {
				return
			}
			sent.Store(int64(i))
			time.Sleep(time.Millisecond)
		}
	}()
	got := map[string]int{}
	count := func(m frame.Message) {
		if m.Type == frame.TypeWake && m.HasPayload {
			got[m.Payload]++
		}
	}
	next("wakes under load", func(m frame.Message) bool { count(m); return len(got) >= 200 }, nil)
	killed := time.Now()
	a.cmd.Process.Signal(syscall.SIGKILL)
	next("healthy:false", func(m frame.Message) bool { return m.Type == frame.TypeStatus && !m.Healthy }, count)
	next("healthy:true", func(m frame.Message) bool { return m.Type == frame.TypeStatus && m.Healthy }, count)
	back := time.Since(killed)
	next("the durable wake", func(m frame.Message) bool { return m.Type == frame.TypeWake && !m.HasPayload }, count)
	after := sent.Load()
	next("a wake committed after the takeover", func(m frame.Message) bool {
		count(m)
		var n int64
		fmt.Sscan(m.Payload, &n)
		return m.HasPayload && n > after
	}, nil)
	cancel()
	<-writer
	for p, n := range got {
		if n > 1 {
			t.Fatalf("payload %s delivered %d times", p, n)
		}
	}
	if !b.said("fleet bridge: active") {
		t.Fatal("the standby never said it is active")
	}
	for _, p := range []*proc{a, b, h} {
		if p.said("s3cret-pw") {
			t.Fatal("the NATS password was printed")
		}
	}
	t.Logf("SIGKILL of the active bridge under %d NOTIFYs: healthy again %v later; %d payloads delivered, none twice; the gap is covered by the durable wake",
		sent.Load(), back.Round(time.Millisecond), len(got))
}

// The demo: one listening backend for every hub, and wakes at every worker.
func TestDemo(t *testing.T) {
	bin := build(t)
	out, err := exec.Command(bin, "demo", "--hubs", "3", "--duration", "4s", "--database-url", db.URL()).CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	lines := strings.Split(string(out), "\n")
	woke := false
	for _, l := range lines {
		if strings.Contains(l, "backends") && !strings.Contains(l, "backends 1 (3 with direct LISTEN)") {
			t.Fatalf("a line without the one backend: %q", l)
		}
		if strings.Contains(l, "wakes/s") && !strings.Contains(l, "wakes/s 0 ") {
			woke = true
		}
	}
	if !woke {
		t.Fatalf("no wakes:\n%s", out)
	}
}

// `listenhub serve --upstream` is listenhub-fleet's serve when that is
// installed beside it: the same command line, the database's name taken
// from --database-url, no Postgres connection; without it, exit 2 and
// what to install.
func TestListenhubServeUpstream(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "listenhub-fleet"), ".").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	alone := t.TempDir()
	for _, d := range []string{dir, alone} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(d, "listenhub"), "github.com/listenhub/listenhub/cmd/listenhub").CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(wait) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(ns.Shutdown)

	cmd := exec.Command(filepath.Join(alone, "listenhub"), "serve", "--upstream", ns.ClientURL(), "--socket", filepath.Join(alone, "s"))
	cmd.Env = append(cmd.Environ(), "PATH=/usr/bin:/bin")
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), "listenhub-fleet") {
		t.Fatalf("without listenhub-fleet: exit %d (%v)\n%s", code, err, out)
	}

	start(t, filepath.Join(dir, "listenhub-fleet"), "bridge", "--database-url", db.URL(), "--nats", ns.ClientURL())
	sock := filepath.Join(dir, "hub.sock")
	start(t, filepath.Join(dir, "listenhub"), "serve", "--upstream", ns.ClientURL(), "--database-url", db.URL(), "--socket", sock)
	var c net.Conn
	waitFor(t, "the hub's socket", func() bool {
		c, err = net.Dial("unix", sock)
		return err == nil
	})
	defer c.Close()
	c.Write(frame.AppendSub(nil, "via"))
	var dec frame.Decoder
	buf := make([]byte, 4096)
	acked := false
	for !acked {
		c.SetReadDeadline(time.Now().Add(wait))
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("no ack: %v", err)
		}
		dec.Feed(buf[:n])
		for m, ok, _ := dec.Next(); ok; m, ok, _ = dec.Next() {
			acked = acked || m.Type == frame.TypeAck && m.Name == "via"
		}
	}
}
