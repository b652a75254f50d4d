package main

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

const tailWait = 10 * time.Second

// lockedBuffer is a bytes.Buffer safe for the tail goroutine to write while
// the test reads it.
type lockedBuffer = testutil.SyncBuffer

// tailSocket returns a socket path short enough for AF_UNIX.
func tailSocket(t *testing.T) string {
	dir, err := os.MkdirTemp("", "lht")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "hub.sock")
}

// scriptedHub accepts one connection and returns it with the frames the
// peer sends, decoded.
func scriptedHub(t *testing.T, path string) (accept func() (net.Conn, <-chan frame.Message)) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return func() (net.Conn, <-chan frame.Message) {
		t.Helper()
		ln.(*net.UnixListener).SetDeadline(time.Now().Add(tailWait))
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		msgs := make(chan frame.Message, 100)
		go func() {
			var dec frame.Decoder
			buf := make([]byte, 4096)
			for {
				n, err := c.Read(buf)
				dec.Feed(buf[:n])
				for {
					m, ok, err := dec.Next()
					if err != nil || !ok {
						break
					}
					msgs <- m
				}
				if err != nil {
					close(msgs)
					return
				}
			}
		}()
		return c, msgs
	}
}

func body(s string) []byte {
	n := len(s)
	return append([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, s...)
}

func TestTailPrintsEveryFrame(t *testing.T) {
	path := tailSocket(t)
	accept := scriptedHub(t, path)
	var stdout, stderr lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- runTail(context.Background(), []string{"--socket", path, "jobs", "bad\x00"}, &stdout, &stderr)
	}()

	c, msgs := accept()
	for _, want := range []string{"jobs", "bad\x00"} {
		select {
		case m := <-msgs:
			if m.Type != "sub" || m.Name != want {
				t.Fatalf("got %s %q, want sub %q", m.Type, m.Name, want)
			}
		case <-time.After(tailWait):
			t.Fatal("no sub from tail")
		}
	}
	var out []byte
	out = frame.AppendStatus(out, true)
	out = frame.AppendAck(out, "jobs")
	out = frame.AppendWake(out, "jobs", []byte(`{"id":7}`), true)
	out = frame.AppendWake(out, "jobs", nil, false)
	out = append(out, body(`{ "t" : "hello", "q":"jobs", "n": [1, 2] }`)...) // unknown type, spaced
	c.Write(out)

	want := `{"t":"status","healthy":true}
{"t":"ack","q":"jobs"}
{"t":"wake","q":"jobs","p":"{\"id\":7}"}
{"t":"wake","q":"jobs","p":null}
{"t":"hello","q":"jobs","n":[1,2]}
`
	testutil.WaitFor(t, tailWait, "five lines", func() bool { return stdout.String() == want })

	// A refused subscription: the line is printed, the reason goes to
	// stderr, and tail exits 1 (it used to carry on, silent about it).
	c.Write(frame.AppendNack(nil, "bad\x00", "invalid channel: contains NUL"))
	select {
	case n := <-code:
		if n != 1 {
			t.Fatalf("exit %d on a nack, want 1", n)
		}
	case <-time.After(tailWait):
		t.Fatal("tail did not exit on a nack")
	}
	want += `{"t":"nack","q":"bad\u0000","error":"invalid channel: contains NUL"}` + "\n"
	if stdout.String() != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s", stdout.String(), want)
	}
	if got := stderr.String(); got != "listenhub tail: the hub refused \"bad\\x00\": invalid channel: contains NUL\n" {
		t.Fatalf("stderr %q", got)
	}
	if stdout.String() != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s", stdout.String(), want)
	}
}

func TestTailFlagAfterNames(t *testing.T) {
	path := tailSocket(t)
	accept := scriptedHub(t, path)
	var stdout, stderr lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() {
		code <- runTail(ctx, []string{"a", "--socket", path, "b", "--", "-c", "--d"}, &stdout, &stderr)
	}()
	_, msgs := accept()
	for _, want := range []string{"a", "b", "-c", "--d"} {
		if m := <-msgs; m.Name != want {
			t.Fatalf("sub %q, want %q", m.Name, want)
		}
	}
	cancel() // SIGINT, as main maps it
	select {
	case n := <-code:
		if n != 0 {
			t.Fatalf("exit %d after ctx end, want 0 (stderr %q)", n, stderr.String())
		}
	case <-time.After(tailWait):
		t.Fatal("tail did not exit when ctx ended")
	}
}

func TestTailMalformedFrame(t *testing.T) {
	tailBadFrame(t, body(`{"t":"wake"}`), "malformed") // wake without q
}

func TestTailTooLargeFrame(t *testing.T) {
	tailBadFrame(t, []byte{0xff, 0xff, 0xff, 0xff}, "limit")
}

// tailBadFrame has the hub write b to tail, which must exit 1 with a
// stderr that says want.
func tailBadFrame(t *testing.T, b []byte, want string) {
	t.Helper()
	path := tailSocket(t)
	accept := scriptedHub(t, path)
	var stdout, stderr lockedBuffer
	code := make(chan int, 1)
	go func() { code <- runTail(context.Background(), []string{"--socket", path, "a"}, &stdout, &stderr) }()
	c, _ := accept()
	c.Write(b)
	if n := <-code; n != 1 {
		t.Fatalf("exit %d", n)
	}
	if !strings.Contains(stderr.String(), want) {
		t.Fatalf("stderr %q", stderr.String())
	}
}

func TestTailUsageAndDialErrors(t *testing.T) {
	t.Setenv("LISTENHUB_SOCKET", "")
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"jobs"}, 2, "--socket is required"},
		{[]string{"--socket", "/x"}, 2, "at least one"},
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
		{[]string{"--socket", filepath.Join(t.TempDir(), "absent.sock"), "jobs"}, 1, "cannot connect"},
	} {
		var stdout, stderr lockedBuffer
		if n := runTail(context.Background(), tc.args, &stdout, &stderr); n != tc.code {
			t.Errorf("%q: exit %d, want %d", tc.args, n, tc.code)
		}
		if !strings.Contains(stderr.String(), tc.msg) {
			t.Errorf("%q: stderr %q, want %q", tc.args, stderr.String(), tc.msg)
		}
		if stdout.String() != "" {
			t.Errorf("%q: stdout %q", tc.args, stdout.String())
		}
	}
}

func TestTailSocketFromEnv(t *testing.T) {
	path := tailSocket(t)
	accept := scriptedHub(t, path)
	t.Setenv("LISTENHUB_SOCKET", path)
	var stdout, stderr lockedBuffer
	code := make(chan int, 1)
	go func() { code <- runTail(context.Background(), []string{"a"}, &stdout, &stderr) }()
	c, msgs := accept()
	if m := <-msgs; m.Type != "sub" || m.Name != "a" {
		t.Fatalf("%+v", m)
	}
	c.Close()
	if n := <-code; n != 1 {
		t.Fatalf("exit %d", n)
	}
}

// End to end: `listenhub serve` and `listenhub tail` as real processes on a
// real Postgres.
func TestTailRealHub(t *testing.T) {
	c := needDB(t)
	socket := tailSocket(t)
	hubProc := serve(t, socket, nil, "--channel-prefix", "tailtest.")
	hubProc.ready()

	cmd := exec.Command(hubBinary(t), "tail", "--socket", socket, "jobs")
	cmd.Env = cleanEnv()
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	stdout := testutil.StartPiped(t, cmd)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := testutil.Lines(stdout, 100)
	// nextLine skips the periodic status re-sends after the first.
	seenStatus := false
	nextLine := func() string {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("tail's stdout ended; stderr %q", stderr.String())
				}
				if strings.HasPrefix(l, `{"t":"status"`) {
					if seenStatus {
						continue
					}
					seenStatus = true
				}
				return l
			case <-time.After(tailWait):
				t.Fatalf("no line from tail; stderr %q", stderr.String())
			}
		}
	}
	got := []string{nextLine(), nextLine()}
	want := []string{
		`{"t":"status","healthy":true}`,
		`{"t":"ack","q":"jobs"}`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("first lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	ctx := context.Background()
	if err := c.Notify(ctx, "tailtest.jobs", `{"id":1}`); err != nil {
		t.Fatal(err)
	}
	if err := c.Notify(ctx, "tailtest.jobs", ""); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"t":"wake","q":"jobs","p":"{\"id\":1}"}`, `{"t":"wake","q":"jobs","p":null}`} {
		if l := nextLine(); l != want {
			t.Fatalf("line %s, want %s", l, want)
		}
	}
	hubProc.cmd.Process.Signal(syscall.SIGTERM) // the hub stops: tail sees EOF
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("tail exit: %v, want status 1", err)
	}
	if !strings.Contains(stderr.String(), "the hub closed the connection") {
		t.Fatalf("stderr %q", stderr.String())
	}
}
