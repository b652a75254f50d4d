//go:build linux || darwin || freebsd

package peercred_test

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/peercred"
)

// The peer of one end of a socket pair is this process.
func TestGetIsThisProcess(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	c, err := peercred.Get(fds[0])
	if err != nil {
		t.Fatalf("%s: %v", peercred.Call, err)
	}
	if int(c.UID) != os.Geteuid() {
		t.Fatalf("uid %d, want %d", c.UID, os.Geteuid())
	}
	if c.PID != 0 && int(c.PID) != os.Getpid() {
		t.Fatalf("pid %d, want %d (or 0 where unknown)", c.PID, os.Getpid())
	}
	if _, err := peercred.Get(-1); err == nil {
		t.Fatal("no error for a bad descriptor")
	}
}
