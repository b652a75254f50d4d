package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/client"
)

// openDir returns a directory of mode 0777 without the sticky bit: one
// that every client refuses to find its hub's socket in.
func openDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// serve refuses a socket the clients would refuse: exit 1, one line that
// names the directory and the fix, no socket file, no backend.
func TestServeRefusesSocketClientsRefuse(t *testing.T) {
	dir := openDir(t)
	path := filepath.Join(dir, "hub.sock")
	p := serve(t, path, nil)
	if code := p.exit(); code != 1 {
		t.Fatalf("serve in a %s exited %d, want 1", dir, code)
	}
	out := p.stderr.String()
	for _, want := range []string{"clients would refuse", dir, "chmod go-w " + dir, "--allow-refusable-socket"} {
		if !strings.Contains(out, want) || strings.Count(out, "\n") != 1 {
			t.Errorf("serve said %q, want one line with %q", out, want)
		}
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused socket was created (%v)", err)
	}
	if n := census(t, p.app); n != 0 {
		t.Errorf("census %d, want 0: a refused hub connected to Postgres", n)
	}
}

// --allow-refusable-socket serves it anyway and says so: a WARN line,
// listenhub_socket_refusable 1; the Go client refuses the socket (with
// the reason), and doctor --socket fails on it. A hub on a trusted
// socket reports 0.
func TestAllowRefusableSocket(t *testing.T) {
	path := filepath.Join(openDir(t), "hub.sock")
	p, addr := serveMetrics(t, path, "--allow-refusable-socket")
	if got := scrape(t, addr)["listenhub_socket_refusable"]; got != 1 {
		t.Errorf("listenhub_socket_refusable %v, want 1", got)
	}
	if out := p.stderr.String(); !strings.Contains(out, "clients refuse this socket") {
		t.Errorf("no warning in the hub's log:\n%s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{SocketPath: path}, client.Handlers{})
	var se *client.SocketError
	if err == nil {
		c.Close()
	}
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "writable by group or other") {
		t.Errorf("client.Dial: %v, want a SocketError for the open directory", err)
	}
	code, by, out := doctor(t, "--socket", path)
	failed := false
	for _, f := range by["socket"] {
		failed = failed || f.Status == statusFail && strings.Contains(f.Message, "clients refuse it") && strings.Contains(f.Fix, "chmod go-w")
	}
	if code != 1 || !failed {
		t.Errorf("doctor --socket: exit %d, %s; want 1 and a socket failure naming the fix", code, out)
	}

	_, trustedAddr := serveMetrics(t, sockPath(t))
	if got := scrape(t, trustedAddr)["listenhub_socket_refusable"]; got != 0 {
		t.Errorf("listenhub_socket_refusable %v for a trusted socket, want 0", got)
	}
}

// A missing socket directory: the client's error and the doctor's fix
// say to create it.
func TestMissingSocketDirSaysInstall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "hub.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := client.Dial(ctx, client.Options{SocketPath: path}, client.Handlers{}); err == nil || !strings.Contains(err.Error(), "install -d") {
		t.Errorf("client.Dial: %v, want an error saying install -d", err)
	}
	_, by, _ := doctor(t, "--socket", path)
	if f := by["socket"]; len(f) == 0 || !strings.Contains(f[0].Fix, "install -d") {
		t.Errorf("doctor --socket: %+v, want a fix saying install -d", f)
	}
}
