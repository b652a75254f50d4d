package hub

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The socket file appears only once the hub listens on it: a worker or a
// supervisor that connects as soon as the file exists is never refused by
// a hub that is starting fine. (Bound in place, the file exists between
// bind and listen; a watcher connecting in that moment got ECONNREFUSED
// in a few percent of the rounds here.) No temporary name is left behind.
func TestSocketFileAppearsListening(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hub.sock")
	const rounds = 500
	refused := 0
	for range rounds {
		stop := make(chan struct{})
		res := make(chan error, 1)
		go func() {
			for {
				select {
				case <-stop:
					res <- nil
					return
				default:
				}
				if _, err := os.Lstat(path); err == nil {
					c, err := net.Dial("unix", path)
					if err == nil {
						c.Close()
					}
					res <- err
					return
				}
			}
		}()
		s, err := bindSocket(path)
		if err != nil {
			t.Fatal(err)
		}
		close(stop)
		if err := <-res; err != nil {
			refused++
		}
		s.close()
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Fatalf("socket file not removed by close: %v", err)
		}
	}
	if refused > 0 {
		t.Fatalf("%d of %d connects refused right after the socket file appeared", refused, rounds)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("left in the socket directory: %v", ents)
	}
}

// A path with no room for the temporary name next to it is bound in place;
// mode 0600 either way.
func TestSocketLongPath(t *testing.T) {
	dir := t.TempDir()
	long := filepath.Join(dir, strings.Repeat("d", maxSocketPath-len(dir)-4))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(long, "s") // 105 bytes: fits, its neighbour does not
	if tempSocketPath(path) != "" {
		t.Fatalf("test path %q leaves room for %q", path, tempSocketPath(path))
	}
	for _, p := range []string{path, filepath.Join(dir, "short.sock")} {
		s, err := bindSocket(p)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v, want a socket with 0600", p, fi.Mode())
		}
		c, err := net.Dial("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		// A second bind while the first listens: in use.
		if _, err := bindSocket(p); err == nil || !strings.Contains(err.Error(), ErrSocketInUse.Error()) {
			t.Fatalf("second bind: %v, want %v", err, ErrSocketInUse)
		}
		s.close()
	}
}

// A socket that cannot be bound names the path asked for, not the
// temporary name it is bound under first.
func TestSocketBindErrorNamesPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "hub.sock")
	_, err := bindSocket(path)
	if err == nil || !strings.Contains(err.Error(), "bind "+path+":") || strings.Contains(err.Error(), ".tmp") {
		t.Fatalf("bind error %v, want one naming %s", err, path)
	}
}

// Hubs of one process binding sockets in one directory at the same moment
// each get their own temporary name.
func TestSocketConcurrentBinds(t *testing.T) {
	dir := t.TempDir()
	const n = 16
	errs := make(chan error, n)
	socks := make(chan listenSocket, n)
	for i := range n {
		go func() {
			s, err := bindSocket(filepath.Join(dir, fmt.Sprintf("hub%d.sock", i)))
			errs <- err
			socks <- s
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
		s := <-socks
		defer s.close()
	}
}
