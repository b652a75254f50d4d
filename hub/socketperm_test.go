package hub

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// testGroup returns a group the test process may give a file: any group
// when it runs as root (nogroup, 65534), else one of its supplementary
// groups other than its primary one; the test skips when there is none.
func testGroup(t *testing.T) int {
	t.Helper()
	if os.Geteuid() == 0 {
		return 65534
	}
	groups, _ := os.Getgroups()
	for _, g := range groups {
		if g != os.Getegid() {
			return g
		}
	}
	t.Skip("not root and in no supplementary group: cannot give a file another group")
	return -1
}

// --socket-mode and --socket-group: the socket file the hub creates has
// that mode and group once it appears, and no temporary name is left.
func TestSocketModeAndGroup(t *testing.T) {
	gid := testGroup(t)
	e := newEnv(t, func(c *Config) {
		c.SocketMode = 0o660
		c.SocketGroup = strconv.Itoa(gid)
	})
	var st syscall.Stat_t
	if err := syscall.Lstat(e.path, &st); err != nil {
		t.Fatal(err)
	}
	if mode := fs.FileMode(st.Mode).Perm(); mode != 0o660 || int(st.Gid) != gid || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		t.Fatalf("socket file mode %#o, gid %d, type %#o; want 0660, %d, a socket", mode, st.Gid, st.Mode&syscall.S_IFMT, gid)
	}
	e.dial().sub("a") // and it serves
	ents, _ := os.ReadDir(filepath.Dir(e.path))
	if len(ents) != 1 {
		t.Fatalf("files next to the socket: %v", ents)
	}
}

// The default stays 0600 and the hub's group.
func TestSocketModeDefault(t *testing.T) {
	e := newEnv(t, nil)
	fi, err := os.Lstat(e.path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || int(fi.Sys().(*syscall.Stat_t).Gid) != os.Getegid() {
		t.Fatalf("socket file %v, gid %d", fi.Mode(), fi.Sys().(*syscall.Stat_t).Gid)
	}
}

func TestSocketPermConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{SocketPath: "x", SocketMode: 0o4660}, "more than permission bits"},
		{Config{SocketPath: "x", SocketGroup: "no-such-group-here"}, "SocketGroup"},
		{Config{ListenerFile: os.Stdin, SocketMode: 0o660}, "inherited socket"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want an error about %q", c.cfg, err, c.want)
		}
	}
}
