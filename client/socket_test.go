package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/testutil"
)

// An empty socket path is an error at construction, for Dial and for a
// Failover (which would otherwise listen locally for good, silently).
func TestEmptySocketPath(t *testing.T) {
	if _, err := Dial(context.Background(), Options{SocketPath: ""}, Handlers{}); err == nil || !strings.Contains(err.Error(), "no socket path") {
		t.Fatalf("Dial(\"\"): %v, want an error saying there is no socket path", err)
	}
	fl := &fakeLocals{}
	setNewLocal(t, fl.newLocal)
	f, err := NewFailover(context.Background(), FailoverOptions{}, FailoverHandlers{})
	if err == nil {
		f.Close()
		t.Fatal("NewFailover without SocketPath: no error")
	}
	if !strings.Contains(err.Error(), "SocketPath is empty") {
		t.Fatalf("NewFailover: %v", err)
	}
	if fl.count() != 0 {
		t.Fatal("a local listener was built")
	}
}

// checkIdentity asserts that err is Dial's refusal of the socket file or
// its directory, saying want.
func checkIdentity(t testing.TB, err error, want string) {
	t.Helper()
	var se *SocketError
	var ce *ConnError
	if !errors.As(err, &se) || !errors.As(err, &ce) || ce.Op != "dial" || !errors.Is(err, ErrNotOurHub) {
		t.Fatalf("Dial err = %v, want a *ConnError (dial) wrapping a *SocketError", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
}

// The socket's identity before the connect: lstat (a symlink is refused,
// not followed), a socket, and a directory by StrictModes' rule; a sticky
// directory (like /tmp) is fine.
func TestDialSocketIdentity(t *testing.T) {
	h := newFakeHub(t, true)
	dir := shortDir(t)

	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(h.path, link); err != nil {
		t.Fatal(err)
	}
	_, err := Dial(context.Background(), Options{SocketPath: link}, Handlers{})
	checkIdentity(t, err, "a symlink (mode 120777): not our hub's socket")

	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Dial(context.Background(), Options{SocketPath: file}, Handlers{})
	checkIdentity(t, err, "not a socket (mode 100644): not our hub's socket")

	hubDir := filepath.Dir(h.path)
	for _, mode := range []os.FileMode{0o777, 0o770, 0o757} {
		if err := os.Chmod(hubDir, mode); err != nil {
			t.Fatal(err)
		}
		_, err = Dial(context.Background(), Options{SocketPath: h.path}, Handlers{})
		checkIdentity(t, err, fmt.Sprintf("directory mode %04o is writable by group or other (and not sticky)", mode))
	}
	// Sticky: only an entry's owner may replace it.
	if err := os.Chmod(hubDir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	c, err := Dial(context.Background(), Options{SocketPath: h.path}, Handlers{})
	if err != nil {
		t.Fatalf("sticky directory: %v", err)
	}
	c.Close()
	if err := os.Chmod(hubDir, 0o700); err != nil {
		t.Fatal(err)
	}

	// A relative path is checked in the working directory.
	if rel, err := filepath.Rel(mustGetwd(t), h.path); err == nil && len(rel) < maxSunPath {
		c, err := Dial(context.Background(), Options{SocketPath: rel}, Handlers{})
		if err != nil {
			t.Fatalf("relative path %s: %v", rel, err)
		}
		c.Close()
	}
}

func mustGetwd(t testing.TB) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

// Another user's socket, or a socket in another user's directory, is not
// our hub's unless Options.AllowUIDs names that user. Needs root to chown.
func TestDialSocketOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	const nobody = 65534
	h := newFakeHub(t, true)
	if err := os.Chown(h.path, nobody, -1); err != nil {
		t.Fatal(err)
	}
	_, err := Dial(context.Background(), Options{SocketPath: h.path}, Handlers{})
	checkIdentity(t, err, "socket owned by uid 65534, not ours (0), root or an allowed uid: not our hub")
	if err := os.Chown(h.path, 0, -1); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Dir(h.path), nobody, -1); err != nil {
		t.Fatal(err)
	}
	_, err = Dial(context.Background(), Options{SocketPath: h.path}, Handlers{})
	checkIdentity(t, err, "directory owned by uid 65534, not ours (0), root or an allowed uid")
	// Naming the uid trusts it (and our own uid stays trusted for files).
	c, err := Dial(context.Background(), Options{SocketPath: h.path, AllowUIDs: []int{nobody, 0}}, Handlers{})
	if err != nil {
		t.Fatalf("AllowUIDs [nobody root]: %v", err)
	}
	c.Close()
}

// Without /proc (or for a name too long to connect through it) Dial
// connects by path and requires the same socket file afterwards.
func TestDialWithoutProc(t *testing.T) {
	h := newFakeHub(t, true)
	old := procFD
	procFD = func() bool { return false }
	t.Cleanup(func() { procFD = old })
	c := dialFake(t, h, nil, Options{})
	res := result(func() error { return c.Subscribe(context.Background(), "a") })
	h.accept().expect(t, "sub", "a")
	if err := await(t, res); err != nil {
		t.Fatal(err)
	}
	_, err := Dial(context.Background(), Options{SocketPath: filepath.Join(filepath.Dir(h.path), "absent.sock")}, Handlers{})
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("absent socket: %v", err)
	}
}

// The hub's refusal of the connection (a nack with an empty q as its first
// frame, then EOF) is the client's error: a *RefusedError, also what the
// next Subscribe returns.
func TestRefusedByHub(t *testing.T) {
	h, c, fc := fakeSession(t, false, nil, Options{})
	fc.nack("", "uid 1000 is not allowed (--allow-uid)")
	fc.c.Close()
	select {
	case <-c.Done():
	case <-time.After(waitLong):
		t.Fatal("client alive after the refusal")
	}
	var re *RefusedError
	if err := c.Err(); !errors.As(err, &re) || !errors.Is(err, ErrRefused) || re.Reason != "uid 1000 is not allowed (--allow-uid)" {
		t.Fatalf("Err = %v, want a *RefusedError", err)
	}
	want := fmt.Sprintf("listenhub client: the hub at %s refused this connection: uid 1000 is not allowed (--allow-uid)", h.path)
	if err := c.Subscribe(context.Background(), "a"); err == nil || err.Error() != want {
		t.Fatalf("Subscribe: %v, want %q", err, want)
	}
}

// A Subscribe sent before the refusal was read meets a closed socket
// (EPIPE): the refusal still wins as its error.
func TestRefusalWinsOverWriteError(t *testing.T) {
	h := newFakeHub(t, false)
	for i := range 20 {
		c, err := Dial(context.Background(), Options{SocketPath: h.path}, Handlers{})
		if err != nil {
			t.Fatal(err)
		}
		fc := h.accept()
		fc.nack("", "too many workers: this hub serves at most 1 (--max-workers)")
		fc.c.Close()
		err = c.Subscribe(context.Background(), fmt.Sprint("q", i))
		if !errors.Is(err, ErrRefused) {
			t.Fatalf("attempt %d: Subscribe: %v, want the refusal", i, err)
		}
		c.Close()
		c.wait()
	}
}

// A nack that answers a pending sub is not a refusal, even first (a
// scripted hub; the real one always sends a status first).
func TestFirstFrameNackForASub(t *testing.T) {
	_, c, fc := fakeSession(t, false, nil, Options{})
	res := result(func() error { return c.Subscribe(context.Background(), "a\x01") })
	fc.expect(t, "sub", "a\x01")
	fc.nack("a\x01", "invalid channel: contains a control character")
	if err := await(t, res); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("Subscribe: %v", err)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("client died: %v", err)
	}
}

// A frame from the hub that stalls half-way kills the client after
// FrameTimeout; an idle connection, or frames arriving in pieces within
// it, do not.
func TestFrameTimeout(t *testing.T) {
	if defaultFrameTimeout != 10*time.Second {
		t.Fatalf("defaultFrameTimeout %v, want the hub's --frame-timeout default, 10s", defaultFrameTimeout)
	}
	const ft = 300 * time.Millisecond
	_, c, fc := fakeSession(t, true, nil, Options{FrameTimeout: ft})
	// Idle for longer than the frame timeout, then a frame in two pieces
	// each within it: alive.
	time.Sleep(2 * ft)
	w := frame.AppendWake(nil, "a", []byte("payload"), true)
	fc.send(w[:3])
	time.Sleep(ft / 3)
	fc.send(w[3:])
	res := result(func() error { return c.Subscribe(context.Background(), "b") })
	fc.expect(t, "sub", "b")
	if err := await(t, res); err != nil {
		t.Fatalf("alive after an idle spell and a split frame: %v", err)
	}
	// Then half a frame and nothing.
	start := time.Now()
	fc.send(w[:5])
	select {
	case <-c.Done():
	case <-time.After(waitLong):
		t.Fatal("a stalled frame did not time out")
	}
	if d := time.Since(start); d < ft*8/10 {
		t.Fatalf("timed out after %v, before the frame timeout %v", d, ft)
	}
	var ce *ConnError
	if err := c.Err(); !errors.As(err, &ce) || ce.Op != "read" ||
		!strings.Contains(err.Error(), "a frame from the hub stalled: 5 bytes of it in 300ms (frame timeout)") {
		t.Fatalf("Err = %v", err)
	}
}

// The real hub's refusal of an uid it does not allow reaches the client as
// a *RefusedError with the hub's words.
func TestPGRefusedByRealHub(t *testing.T) {
	e := newPGEnv(t)
	e.startHub(func(c *hub.Config) { c.AllowUIDs = []int{otherUID()} })
	c, err := Dial(context.Background(), Options{SocketPath: e.socket, Logger: e.logs.logger()}, Handlers{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Subscribe(context.Background(), "a")
	want := fmt.Sprintf("uid %d is not allowed (--allow-uid)", os.Geteuid())
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != want || !errors.Is(c.Err(), ErrRefused) {
		t.Fatalf("Subscribe: %v, want the hub's refusal %q", err, want)
	}
}

// attackConnects is the number of connects per attack run: 1,000 in CI,
// 10,000 with LISTENHUB_TEST_LARGE_SET (the size the attack was first reported at).
func attackConnects() int {
	if os.Getenv("LISTENHUB_TEST_LARGE_SET") != "" {
		return 10000
	}
	return 1000
}

// attacker runs clients/testdata/attacker.py as nobody: it flips the
// socket path (mode "final") or its directory ("dir") between its own
// socket and the real one, and counts the subs it receives.
type attacker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func startAttacker(t *testing.T, mode, shared, target, legit string) *attacker {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the attack needs root (a foreign uid flips the path)")
	}
	runuser, err := exec.LookPath("runuser")
	if err != nil {
		t.Skip("the attack needs runuser")
	}
	// The system's python3: nobody cannot run one under root's home.
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("the attack needs /usr/bin/python3")
	}
	src := testutil.ReadFile(t, filepath.Join("..", "clients", "testdata", "attacker.py"))
	args := []string{"-u", "nobody", "--", py, "-c", string(src), mode, shared, target}
	if legit != "" {
		args = append(args, legit)
	}
	cmd := exec.Command(runuser, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := testutil.StartPiped(t, cmd)
	a := &attacker{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	if !a.out.Scan() || a.out.Text() != "ready" {
		t.Fatalf("attacker did not start: %q", a.out.Text())
	}
	return a
}

// captures stops the attacker and returns the subs it received.
func (a *attacker) captures(t *testing.T) int {
	t.Helper()
	a.stdin.Close()
	for a.out.Scan() {
		var n int
		if _, err := fmt.Sscanf(a.out.Text(), "captures %d", &n); err == nil {
			return n
		}
	}
	t.Fatal("attacker said nothing about captures")
	return 0
}

// attack dials the target n times while a nobody process flips it, and
// returns the connects that reached the real hub and those refused; it
// fails the test on any capture.
func attack(t *testing.T, mode string) (ok, refused int) {
	shared := shortDir(t)
	if err := os.Chmod(shared, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	var target, legit string
	if mode == "final" {
		target = filepath.Join(shared, "hub.sock")
	} else {
		h := newFakeHub(t, true) // the real hub, in a trusted directory
		legit = filepath.Dir(h.path)
		target = filepath.Join(shared, "link", "hub.sock")
	}
	a := startAttacker(t, mode, shared, target, legit)
	n := attackConnects()
	start := time.Now()
	// In "dir" mode the flipper, not the connects, decides which directory
	// a connect meets; on a loaded machine a run of n can meet only one.
	// Go on past n (up to a deadline) until both outcomes were seen, so
	// that the test tests what it says.
	const extra = 15 * time.Second
	for i := 0; i < n || (mode == "dir" && (ok == 0 || refused == 0) && time.Since(start) < extra); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := Dial(ctx, Options{SocketPath: target, AckTimeout: 2 * time.Second}, Handlers{})
		cancel()
		if err != nil {
			refused++
			continue
		}
		if err := c.Subscribe(context.Background(), "probe"); err != nil {
			refused++
		} else {
			ok++
		}
		c.Close()
	}
	captures := a.captures(t)
	t.Logf("attack %s: %d connects in %v, %d captures, %d reached the real hub, %d refused",
		mode, ok+refused, time.Since(start).Round(time.Millisecond), captures, ok, refused)
	if captures != 0 {
		t.Fatalf("the attacker captured %d of %d connects", captures, ok+refused)
	}
	return ok, refused
}

// The symlink-flipping attack: a nobody process flips the
// socket path between /etc/passwd, a symlink to its own socket and a hard
// link of it. No connect reaches it.
func TestAttackFlippingTheSocketPath(t *testing.T) {
	if ok, _ := attack(t, "final"); ok != 0 {
		t.Fatalf("%d connects succeeded, with no real hub there", ok)
	}
}

// The same with the directory flipped between the real hub's and the
// attacker's: the connects that reach the real hub succeed, the others are
// refused, none is captured.
func TestAttackFlippingTheDirectory(t *testing.T) {
	ok, refused := attack(t, "dir")
	if ok == 0 {
		t.Fatal("never reached the real hub: the test did not test")
	}
	if refused == 0 {
		t.Fatal("never refused: the flipping did not happen")
	}
}

// A Failover whose hub refuses the connection goes local, with the hub's
// refusal as its reason, logged.
func TestFailoverRefusedByHub(t *testing.T) {
	h := newFakeHub(t, false)
	fl := &fakeLocals{}
	logs := &testutil.SyncBuffer{}
	f, err := newTestFailover(t, h.path, fl, nil, FailoverOptions{
		DisableFailback: true,
		Logger:          slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	fc := h.accept()
	fc.nack("", "too many workers: this hub serves at most 2 (--max-workers)")
	fc.c.Close()
	testutil.WaitFor(t, waitLong, "local mode", func() bool { return f.Mode() == ModeLocal })
	var re *RefusedError
	if !errors.As(f.Reason(), &re) || re.Reason != "too many workers: this hub serves at most 2 (--max-workers)" {
		t.Fatalf("Reason %v, want the hub's refusal", f.Reason())
	}
	if out := logs.String(); !strings.Contains(out, "refused this connection: too many workers") {
		t.Fatalf("the log does not say why:\n%s", out)
	}
	mustSubscribe(t, f, "a")
}

// A frame near the protocol's 4 MiB limit that arrives in 128-byte pieces
// is reassembled in time linear in its size: a decoder that re-copied or
// re-scanned what it holds on every piece would take minutes of CPU (the
// Node client's once took 8.9 s). The bound is generous for a loaded
// machine; the fake hub's 32,768 writes run in this process too.
func TestBigFrameInSmallPieces(t *testing.T) {
	h := newFakeHub(t, true)
	got := make(chan Wake, 1)
	c := dialFake(t, h, nil, Options{}, Handlers{OnWake: func(w Wake) { got <- w }})
	fc := h.accept()
	if err := await(t, result(func() error { return c.Subscribe(context.Background(), "big") })); err != nil {
		t.Fatal(err)
	}
	payload := strings.Repeat("p", frame.MaxLen-64)
	w := frame.AppendWake(nil, "big", []byte(payload), true)
	if len(w) > 4+frame.MaxLen {
		t.Fatalf("test frame of %d bytes is over the protocol's limit", len(w))
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	for len(w) > 0 {
		n := min(128, len(w))
		fc.send(w[:n])
		w = w[n:]
	}
	select {
	case wk := <-got:
		if wk.Name != "big" || len(wk.Payload) != len(payload) {
			t.Fatalf("wake %q with %d bytes, want %q with %d", wk.Name, len(wk.Payload), "big", len(payload))
		}
	case <-time.After(waitLong):
		t.Fatal("the big frame never arrived whole")
	}
	if used := cpu() - start; used > 3*time.Second {
		t.Fatalf("4 MiB in 128-byte pieces took %v of CPU", used)
	} else {
		t.Logf("4 MiB in 128-byte pieces: %v of CPU (writer and reader)", used)
	}
}

// A uid that may not search the way to the socket gets the fix, not a bare
// "permission denied": this test binary, copied where nobody can run it,
// dials as nobody (root may search anything).
func TestUnreachableDirectoryNamesThePermission(t *testing.T) {
	if sock := os.Getenv("LISTENHUB_TEST_DIAL_AS"); sock != "" {
		_, err := Dial(context.Background(), Options{SocketPath: sock}, Handlers{})
		fmt.Println(err)
		return
	}
	runuser, err := exec.LookPath("runuser")
	if os.Geteuid() != 0 || err != nil {
		t.Skip("needs root and runuser to dial as nobody")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(os.TempDir(), fmt.Sprintf("lh-dial-as-nobody-%d", os.Getpid()))
	if err := os.WriteFile(bin, testutil.ReadFile(t, self), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(bin) })
	top := t.TempDir() // 0700, root's
	sock := filepath.Join(top, "run", "hub.sock")
	out, _ := exec.Command(runuser, "-u", "nobody", "--", "env", "LISTENHUB_TEST_DIAL_AS="+sock, bin,
		"-test.run", "^TestUnreachableDirectoryNamesThePermission$").CombinedOutput()
	if !strings.Contains(string(out), "may not reach the socket") || !strings.Contains(string(out), "search (x) permission") {
		t.Fatalf("dial as nobody said:\n%s", out)
	}
}
