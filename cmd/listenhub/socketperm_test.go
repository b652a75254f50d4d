package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The multi-user set-up of docs/operations.md without a socket unit: a hub run as
// root with --socket-mode 0660 --socket-group 65534 --allow-uid 0,65534
// serves a worker running as nobody (uid and gid 65534), which the default
// mode 0600 keeps out before the uid check is even reached.
func TestServeSocketModeGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a worker as another user")
	}
	py := "/usr/bin/python3" // the system's: nobody cannot run one under /root
	if _, err := os.Stat(py); err != nil {
		t.Skip("no /usr/bin/python3 to run as the other user")
	}
	dir, err := os.MkdirTemp("", "lh-socket-") // t.TempDir's parent is 0700
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil { // nobody may reach the socket
		t.Fatal(err)
	}
	connect := func(socket string) (string, error) {
		// Connects and prints the first frame's body: the status.
		cmd := exec.Command(py, "-c", `
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect:", e.strerror); sys.exit(0)
n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
print(s.recv(n, socket.MSG_WAITALL).decode())
`, socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}

	open := filepath.Join(dir, "open.sock")
	p := serve(t, open, nil, "--socket-mode", "0660", "--socket-group", "65534", "--allow-uid", "0,65534")
	p.ready()
	fi, err := os.Lstat(open)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || st.Gid != 65534 {
		t.Fatalf("socket %v gid %d", fi.Mode(), st.Gid)
	}
	if out, err := connect(open); err != nil || !strings.Contains(out, `"t":"status"`) {
		t.Fatalf("nobody through --socket-mode 0660 --socket-group 65534: %q, %v", out, err)
	}

	closed := filepath.Join(dir, "closed.sock")
	serve(t, closed, nil, "--allow-uid", "0,65534").ready()
	if out, err := connect(closed); err != nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("nobody through the default mode 0600: %q, %v", out, err)
	}
}
