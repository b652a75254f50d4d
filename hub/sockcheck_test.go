package hub

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/loop"
)

// refusableDirs are socket directories every client refuses, with what the
// hub's refusal must name.
func refusableDirs(t *testing.T) map[string]string {
	t.Helper()
	base := t.TempDir()
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	dirs := map[string]string{open: "chmod go-w " + open}
	// A trusted directory below an open one: the clients check every
	// directory up to /.
	below := filepath.Join(open, "below")
	if err := os.Mkdir(below, 0o755); err != nil {
		t.Fatal(err)
	}
	dirs[below] = "chmod go-w " + open
	if os.Geteuid() == 0 {
		other := filepath.Join(base, "other")
		if err := os.Mkdir(other, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 12345, 12345); err != nil {
			t.Fatal(err)
		}
		dirs[other] = "owned by uid 12345"
	}
	return dirs
}

// Start refuses a socket whose directories the clients refuse, naming the
// directory and the fix, and creates nothing there.
func TestStartRefusesRefusableSocket(t *testing.T) {
	for dir, want := range refusableDirs(t) {
		path := filepath.Join(dir, "hub.sock")
		h, err := New(Config{SocketPath: path})
		if err != nil {
			t.Fatal(err)
		}
		setHooks(t, h, hooks{openPG: func(context.Context, *loop.Loop, *Hub) (postgres, error) {
			t.Fatal("Postgres opened for a refused socket")
			return nil, nil
		}})
		err = h.Start(context.Background())
		if !errors.Is(err, ErrRefusableSocket) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Start: %v, want ErrRefusableSocket naming %q", dir, err, want)
		}
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the refused socket file exists (%v)", dir, err)
		}
	}
}

// With ServeRefusableSocket the hub serves there, and says so in its log
// and its stats.
func TestServeRefusableSocketWarns(t *testing.T) {
	for dir := range refusableDirs(t) {
		e := newEnv(t, func(c *Config) {
			c.SocketPath = filepath.Join(dir, "hub.sock")
			c.ServeRefusableSocket = true
		})
		if !e.h.Stats().SocketRefusable {
			t.Errorf("%s: Stats().SocketRefusable is false", dir)
		}
		if !strings.Contains(e.logs.String(), "clients refuse this socket") {
			t.Errorf("%s: no warning in the log:\n%s", dir, e.logs.String())
		}
	}
}

// A socket in a directory the clients trust is served without a word.
func TestTrustedSocketNotRefusable(t *testing.T) {
	e := newEnv(t, nil)
	if e.h.Stats().SocketRefusable {
		t.Error("Stats().SocketRefusable for a socket in a private temporary directory")
	}
	if strings.Contains(e.logs.String(), "clients refuse") {
		t.Errorf("a warning for a trusted socket:\n%s", e.logs.String())
	}
}

// A directory owned by an admitted uid is trusted by that uid's clients
// only: with one admitted uid the hub serves there, with two it refuses it
// (the second uid's clients would), naming the directory.
func TestDirectoryOfAnAdmittedUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 12345, -1); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "hub.sock")
	one, err := New(Config{SocketPath: path, AllowUIDs: []int{12345}})
	if err != nil {
		t.Fatal(err)
	}
	if u := one.checkSocketDirs(); u != nil {
		t.Fatalf("one admitted uid, its directory: refused (%v)", u)
	}
	two, err := New(Config{SocketPath: path, AllowUIDs: []int{12345, 12346}})
	if err != nil {
		t.Fatal(err)
	}
	u := two.checkSocketDirs()
	if u == nil || u.Dir != dir || !strings.Contains(u.Problem, "owned by uid 12345") {
		t.Fatalf("two admitted uids, the first's directory: %v, want it refused", u)
	}
}
