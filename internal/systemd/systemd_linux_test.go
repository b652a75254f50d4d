package systemd

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// recvSocket binds a datagram socket standing in for the service manager's
// and returns its address for NOTIFY_SOCKET and a function reading the next
// datagram.
func recvSocket(t *testing.T, name string) (string, func() string) {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return name, func() string {
		t.Helper()
		buf := make([]byte, 4096)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _, err := c.ReadFromUnix(buf)
		if err != nil {
			t.Fatalf("no datagram: %v", err)
		}
		return string(buf[:n])
	}
}

func TestNotifyPathAndAbstract(t *testing.T) {
	for _, c := range []struct{ name, addr string }{
		{"path", filepath.Join(t.TempDir(), "notify.sock")},
		{"abstract", fmt.Sprintf("@listenhub-test-%d", os.Getpid())},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr, recv := recvSocket(t, c.addr)
			t.Setenv("NOTIFY_SOCKET", addr)
			n, err := NewNotifier()
			if err != nil || n == nil {
				t.Fatalf("NewNotifier: %v, %v", n, err)
			}
			defer n.Close()
			if err := n.Notify("READY=1\nSTATUS=up"); err != nil {
				t.Fatal(err)
			}
			if got := recv(); got != "READY=1\nSTATUS=up" {
				t.Fatalf("got %q", got)
			}
			if err := Notify("MAINPID=42"); err != nil {
				t.Fatal(err)
			}
			if got := recv(); got != "MAINPID=42" {
				t.Fatalf("got %q", got)
			}
		})
	}
}

// Without NOTIFY_SOCKET everything is a no-op; a malformed one is an error,
// and a manager that is gone is an error from Notify, not a block.
func TestNotifyUnsetAndBad(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n, err := NewNotifier()
	if n != nil || err != nil {
		t.Fatalf("unset: %v, %v", n, err)
	}
	if err := n.Notify("READY=1"); err != nil {
		t.Fatalf("nil Notifier: %v", err)
	}
	if err := Notify("READY=1"); err != nil {
		t.Fatalf("Notify unset: %v", err)
	}
	t.Setenv("NOTIFY_SOCKET", "relative/path")
	if _, err := NewNotifier(); err == nil {
		t.Fatal("relative NOTIFY_SOCKET accepted")
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "nobody"))
	if err := Notify("READY=1"); err == nil {
		t.Fatal("Notify to a missing socket returned nil")
	}
}

func TestWatchdogInterval(t *testing.T) {
	for _, c := range []struct {
		usec, pid string
		want      time.Duration
		bad       bool
	}{
		{"", "", 0, false},
		{"3000000", "", 3 * time.Second, false},
		{"3000000", fmt.Sprint(os.Getpid()), 3 * time.Second, false},
		{"3000000", "1", 0, false}, // for another process
		{"soon", "", 0, true},
		{"0", "", 0, true},
	} {
		t.Setenv("WATCHDOG_USEC", c.usec)
		t.Setenv("WATCHDOG_PID", c.pid)
		got, err := WatchdogInterval()
		if got != c.want || (err != nil) != c.bad {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: %v, %v", c.usec, c.pid, got, err)
		}
	}
}

// LISTEN_PID naming another process: not ours, and the variables stay for
// the process they are meant for.
func TestListenersOtherPID(t *testing.T) {
	t.Setenv("LISTEN_PID", "1")
	t.Setenv("LISTEN_FDS", "1")
	ls, err := Listeners()
	if ls != nil || err != nil {
		t.Fatalf("%v, %v", ls, err)
	}
	if os.Getenv("LISTEN_FDS") != "1" {
		t.Fatal("LISTEN_FDS removed although meant for another process")
	}
	t.Setenv("LISTEN_PID", fmt.Sprint(os.Getpid()))
	t.Setenv("LISTEN_FDS", "many")
	if _, err := Listeners(); err == nil {
		t.Fatal("LISTEN_FDS=many accepted")
	}
}

// The real hand-over: a child process gets two descriptors from 3 up with
// LISTEN_PID set to its own pid (by sh, before exec) and reports what
// Listeners found.
func TestListenersInChild(t *testing.T) {
	if os.Getenv("SYSTEMD_TEST_CHILD") == "1" {
		ls, err := Listeners()
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		for _, l := range ls {
			fi, _ := l.File.Stat()
			fmt.Printf("%d %s %v\n", l.File.Fd(), l.Name, fi.Mode()&os.ModeSocket != 0)
		}
		fmt.Printf("env %q %q %q\n", os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_FDNAMES"))
		os.Exit(0)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	var files []*os.File
	for i := range 2 {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), fmt.Sprint(i)), Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		f, err := ln.File()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
	}
	cmd := exec.Command(sh, "-c", `LISTEN_PID=$$ exec "$0" -test.run='^TestListenersInChild$'`, os.Args[0])
	cmd.Env = append(os.Environ(), "SYSTEMD_TEST_CHILD=1", "LISTEN_FDS=2", "LISTEN_FDNAMES=a:b")
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := "3 a true\n4 b true\nenv \"\" \"\" \"\"\n"
	if got := string(out); !strings.HasPrefix(got, want) {
		t.Fatalf("child said %q, want %q", got, want)
	}
}
