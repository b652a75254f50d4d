package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

// otherUID is a uid this process does not run as.
func otherUID() int {
	if os.Geteuid() == 54321 {
		return 54322
	}
	return 54321
}

// checkRefused asserts that err is Dial's refusal of a peer running as uid.
func checkRefused(t testing.TB, err error, uid int) {
	t.Helper()
	var pe *PeerError
	var ce *ConnError
	if !errors.Is(err, ErrNotOurHub) || !errors.As(err, &pe) || !errors.As(err, &ce) || ce.Op != "dial" {
		t.Fatalf("Dial err = %v, want a *ConnError (dial) wrapping a *PeerError", err)
	}
	if pe.UID != uid {
		t.Fatalf("PeerError.UID %d, want %d", pe.UID, uid)
	}
	for _, want := range []string{fmt.Sprintf("peer uid %d", uid), "not our hub"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not say %q", err, want)
		}
	}
}

// A hub whose uid is not allowed is refused at Dial: a typed error, and the
// connection closed before a frame was sent. The default (own uid and root)
// and an explicit list naming the uid accept the same socket.
func TestDialRefusesPeerUID(t *testing.T) {
	h := newFakeHub(t, true)
	_, err := Dial(context.Background(), Options{SocketPath: h.path, AllowUIDs: []int{otherUID()}}, Handlers{})
	checkRefused(t, err, os.Geteuid())
	fc := h.accept()
	fc.waitEOF(t)
	select {
	case m := <-fc.msgs:
		t.Fatalf("the refused hub received %+v", m)
	default:
	}

	for _, allow := range [][]int{nil, {otherUID(), os.Geteuid()}} {
		c, err := Dial(context.Background(), Options{SocketPath: h.path, AllowUIDs: allow}, Handlers{})
		if err != nil {
			t.Fatalf("AllowUIDs %v: %v", allow, err)
		}
		fc := h.accept()
		res := result(func() error { return c.Subscribe(context.Background(), "a") })
		fc.expect(t, "sub", "a")
		if err := await(t, res); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}

// A Failover whose hub is refused listens locally from the start and logs
// why.
func TestFailoverPeerRefusedGoesLocal(t *testing.T) {
	h := newFakeHub(t, true)
	fl := &fakeLocals{}
	logs := &testutil.SyncBuffer{}
	f, err := newTestFailover(t, h.path, fl, nil, FailoverOptions{
		Hub:    Options{AllowUIDs: []int{otherUID()}},
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if f.Mode() != ModeLocal || !errors.Is(f.Reason(), ErrNotOurHub) {
		t.Fatalf("Mode %v, Reason %v; want local because not our hub", f.Mode(), f.Reason())
	}
	if out := logs.String(); !strings.Contains(out, "listening locally") || !strings.Contains(out, "not our hub") {
		t.Fatalf("log does not say why it went local:\n%s", out)
	}
	mustSubscribe(t, f, "a")
	if got := fl.get(t).subscribed(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("local subs %v", got)
	}
	h.accept().waitEOF(t)
}

// peerHelperEnv makes the test binary a bare hub-like listener (see
// TestPeerHelperProcess): the socket path to listen on.
const peerHelperEnv = "LISTENHUB_TEST_PEER_SOCKET"

// TestPeerHelperProcess is not a test: run by TestDialRefusesForeignHub as
// another user, it listens on the socket, sends a status frame to each
// connection and prints how many bytes each sent before closing.
func TestPeerHelperProcess(t *testing.T) {
	path := os.Getenv(peerHelperEnv)
	if path == "" {
		t.Skip("helper process for TestDialRefusesForeignHub")
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			c.Write(frame.AppendStatus(nil, true))
			n, _ := io.Copy(io.Discard, c)
			fmt.Printf("closed after %d bytes\n", n)
			c.Close()
		}()
	}
}

// A real process running as nobody listens on the socket: Dial refuses it
// (it is not our uid nor root), the connection carries no byte from us, and
// a Failover goes local. Naming nobody's uid accepts it. Needs root, to
// start a process as another user.
func TestDialRefusesForeignHub(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a listener as another uid")
	}
	const nobody = 65534
	dir := shortDir(t)
	// Sticky, like /tmp: nobody may create its socket here, and the
	// directory passes Dial's StrictModes check.
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	// The test binary lives in go's private work directory; nobody needs
	// a copy it can execute.
	self := testutil.ReadFile(t, os.Args[0])
	bin := filepath.Join(dir, "helper")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "hub.sock")
	cmd := exec.Command(bin, "-test.run=^TestPeerHelperProcess$")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), peerHelperEnv+"="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	cmd.Stderr = os.Stderr
	out := testutil.StartPiped(t, cmd)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := testutil.Lines(out, 16)
	next := func() string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("helper exited")
			}
			return l
		case <-time.After(waitLong):
			t.Fatal("helper said nothing")
		}
		return ""
	}
	if l := next(); l != "ready" {
		t.Fatalf("helper: %s", l)
	}
	// A socket file of ours (root's) with nobody behind it: only the peer
	// check (SO_PEERCRED) can tell.
	if err := os.Chown(path, 0, 0); err != nil {
		t.Fatal(err)
	}

	_, err := Dial(context.Background(), Options{SocketPath: path}, Handlers{})
	checkRefused(t, err, nobody)
	if l := next(); l != "closed after 0 bytes" {
		t.Fatalf("helper: %s, want the refused connection closed without a byte", l)
	}

	fl := &fakeLocals{}
	f, err := newTestFailover(t, path, fl, nil, FailoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if f.Mode() != ModeLocal || !errors.Is(f.Reason(), ErrNotOurHub) {
		t.Fatalf("Mode %v, Reason %v; want local because not our hub", f.Mode(), f.Reason())
	}
	if l := next(); l != "closed after 0 bytes" {
		t.Fatalf("helper: %s", l)
	}

	c, err := Dial(context.Background(), Options{SocketPath: path, AllowUIDs: []int{nobody}}, Handlers{})
	if err != nil {
		t.Fatalf("AllowUIDs [nobody]: %v", err)
	}
	testutil.WaitFor(t, waitLong, "the helper's status frame", c.Healthy)
	c.Close()
}
