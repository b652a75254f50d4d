// Package testutil holds small helpers shared by the tests of every package:
// waiting on a condition with a deadline (never sleep-and-hope) and counting
// open file descriptors to catch leaks.
package testutil

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// WaitFor polls cond until it returns true, and fails the test with what if
// that does not happen within timeout. The first check is immediate; the
// polling interval starts at 1 ms and doubles up to 20 ms, so fast conditions
// cost little and slow ones do not burn a core. Like t.Fatal it must be
// called from the goroutine running the test.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	interval := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			// One last look: the deadline may have passed while we slept.
			if cond() {
				return
			}
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(interval)
		interval = min(2*interval, 20*time.Millisecond)
	}
}

// WaitErr waits up to timeout for the error a goroutine sends on ch when it
// ends, and fails the test if none comes or it is not nil; what names the
// goroutine's work in the message.
func WaitErr(t testing.TB, ch <-chan error, timeout time.Duration, what string) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(timeout):
		t.Fatalf("%s: no end within %v", what, timeout)
	}
}

// WaitClosed waits up to timeout for ch to be closed (or to yield), and
// fails the test with what if it is not.
func WaitClosed[T any](t testing.TB, ch <-chan T, timeout time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(timeout):
		t.Fatalf("%s (waited %v)", what, timeout)
	}
}

// Recv returns the next value from ch, or fails the test with what if none
// comes within timeout.
func Recv[T any](t testing.TB, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatal(what)
		panic("unreachable")
	}
}

// StartPiped starts cmd and returns a pipe of its standard output, or
// fails the test. The caller waits for cmd.
func StartPiped(t testing.TB, cmd *exec.Cmd) io.ReadCloser {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	return stdout
}

// Lines sends each line read from r on the channel it returns (buffered
// for n), which is closed at the end of r.
func Lines(r io.Reader, n int) <-chan string {
	lines := make(chan string, n)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return lines
}

// EnvCount returns the positive count in the environment variable name, or
// def when it is unset; any other value fails the test.
func EnvCount(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive count", name, v)
	}
	return n
}

// JSONString is s as an encoding/json Encoder with HTML escaping off
// writes it: the hub's compact output.
func JSONString(s string) string {
	var b strings.Builder
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(s); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// ReadFile is os.ReadFile, or the test fails.
func ReadFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FDCount returns the number of file descriptors open in this process
// (entries of /proc/self/fd, or /dev/fd off Linux, not counting the one used to read it). It panics
// if that cannot be read: leak checks are meaningless without it.
func FDCount() int {
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		panic(fmt.Sprintf("testutil: FDCount: %v", err))
	}
	return len(ents) - 1
}

// fdList describes the open descriptors (fd -> target), for failure messages.
func fdList() string {
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return err.Error()
	}
	var sb strings.Builder
	for _, e := range ents {
		target, err := os.Readlink(fdDir + "/" + e.Name())
		if err != nil {
			continue // the directory's own fd, already closed
		}
		fmt.Fprintf(&sb, "\n  %s -> %s", e.Name(), target)
	}
	return sb.String()
}

// CheckFDs records FDCount now and, when the test ends, waits up to timeout
// for the count to come back to that level, failing with a list of the open
// descriptors if it does not. Call it first in a test: cleanups run last-in
// first-out, so the check then runs after every other cleanup of the test.
func CheckFDs(t testing.TB, timeout time.Duration) {
	t.Helper()
	before := FDCount()
	t.Cleanup(func() {
		deadline := time.Now().Add(timeout)
		for FDCount() > before {
			if time.Now().After(deadline) {
				t.Errorf("file descriptors leaked: %d open, %d before the test:%s", FDCount(), before, fdList())
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// ListenUnixFile makes a listening Unix socket at path as a systemd socket
// unit would, and returns its file: the descriptor a socket-activated
// process inherits. The socket file stays when the listener is closed; the
// returned file is closed when the test ends (closing it earlier is fine).
func ListenUnixFile(t testing.TB, path string) *os.File {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	t.Cleanup(func() { f.Close() })
	return f
}
