package hub

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

// Postgres not reached yet at Start: workers are accepted and told
// healthy:false, a sub issues its LISTEN but is acked only once the
// connection is up; the first healthy is no reconnect (not counted, no
// resync wakes, since nobody was acked before).
func TestStartBeforePostgres(t *testing.T) {
	e := newEnvPG(t, nil, false)
	e.do(func() { e.pg.auto = true })
	if s := e.h.Stats(); s.PostgresHealthy {
		t.Fatal("healthy before Postgres was reached")
	}
	w := dialRaw(t, e.path)
	w.expect(statusFalse)
	w.sub("early")
	e.sync()
	w.none()
	if got := e.issued(); len(got) != 1 || got[0] != "LISTEN early" {
		t.Fatalf("issued %v, want the LISTEN queued", got)
	}
	e.health(true)
	w.expect(statusTrue, ack("early"))
	e.sync()
	w.none() // no resync wake
	w2 := e.dial()
	w2.subscribe("early")
	if s := e.h.Stats(); s.PostgresReconnects != 0 || !s.PostgresHealthy {
		t.Fatalf("stats %+v, want healthy and no reconnect counted", s)
	}
	// A later loss and return is a reconnect, with its resync.
	e.health(false)
	w.expect(statusFalse)
	e.health(true)
	w.expect(statusTrue, wake("early", nil))
	if s := e.h.Stats(); s.PostgresReconnects != 1 {
		t.Fatalf("reconnects %d, want 1", s.PostgresReconnects)
	}
}

// A configuration error from the Postgres side stops the hub: workers see
// EOF, the socket file goes, Wait returns the error.
func TestFatalPostgresErrorStopsHub(t *testing.T) {
	e := newEnvPG(t, nil, false)
	w := dialRaw(t, e.path)
	w.expect(statusFalse)
	cause := errors.New("password authentication failed for user \"x\"")
	e.h.loop.Post(func() { e.h.onFatal(cause) })
	w.eof()
	select {
	case <-e.h.Done():
	case <-time.After(timeout):
		t.Fatal("hub did not stop after a fatal error")
	}
	if err := e.h.Wait(); !errors.Is(err, cause) {
		t.Fatalf("Wait: %v, want the fatal error", err)
	}
	if _, err := os.Stat(e.path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file after a fatal stop: %v", err)
	}
	if !e.pg.closed {
		t.Fatal("Postgres side not closed")
	}
}

// Report runs on the loop at start, on every health change and every
// ReportInterval.
func TestReport(t *testing.T) {
	var mu sync.Mutex
	var got []Stats
	snap := func() []Stats {
		mu.Lock()
		defer mu.Unlock()
		return append([]Stats(nil), got...)
	}
	e := newEnvPG(t, func(c *Config) {
		c.ReportInterval = 20 * time.Millisecond
		c.OnReport = func(s Stats) { mu.Lock(); got = append(got, s); mu.Unlock() }
	}, false)
	testutil.WaitFor(t, timeout, "first report", func() bool { return len(snap()) > 0 })
	if s := snap()[0]; s.PostgresHealthy {
		t.Fatalf("first report %+v, want unhealthy", s)
	}
	dialRaw(t, e.path).expect(statusFalse)
	// The change is reported at once, from onHealth: the report right
	// after the ones before it says healthy, one worker. The count is
	// taken on the loop with the change, so that a periodic report (every
	// 20 ms, also on the loop) cannot slip in between.
	var n int
	e.do(func() {
		n = len(snap())
		e.pg.healthy = true
		e.h.onHealth(true)
	})
	after := snap()
	if len(after) <= n || !after[n].PostgresHealthy || after[n].Workers != 1 {
		t.Fatalf("report after the health change: %+v", after[n:])
	}
	testutil.WaitFor(t, timeout, "periodic reports", func() bool { return len(snap()) >= n+5 })
}

// fakeOpener is a pgOpener giving a fakePG that completes its commands.
func fakeOpener(healthy bool) pgOpener {
	return func(_ context.Context, l *loop.Loop, _ *Hub) (postgres, error) {
		return &fakePG{l: l, healthy: healthy, auto: true}, nil
	}
}

// An inherited listening socket (systemd socket activation) is accepted on
// as is; its path is taken from the socket; a worker that connected before
// the hub started is served; Stop leaves the socket file, which is not the
// hub's.
func TestInheritedListener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "activated.sock")
	f := testutil.ListenUnixFile(t, path)
	early := dialRaw(t, path) // queued in the backlog before any hub runs
	h, err := New(Config{ListenerFile: f, Logger: slog.New(slog.NewTextHandler(&logBuf{}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	setHooks(t, h, hooks{openPG: fakeOpener(true)})
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.Close() // the hub has its own duplicate
	if got := h.Config().SocketPath; got != path {
		t.Fatalf("SocketPath %q, want the inherited socket's %q", got, path)
	}
	early.expect(statusTrue)
	dialRaw(t, path).expect(statusTrue)
	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("inherited socket file after Stop: %v %v", fi, err)
	}
}

// What an inherited descriptor must be: a listening Unix stream socket,
// bound where SocketPath says if it says.
func TestInheritedListenerRefused(t *testing.T) {
	dir := t.TempDir()
	tcp := testutil.ListenTCP(t)
	defer tcp.Close()
	gram, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "g"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer gram.Close()
	stream, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	file := func(c interface{ File() (*os.File, error) }) *os.File {
		f, err := c.File()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	regular, err := os.Create(filepath.Join(dir, "regular"))
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	for _, c := range []struct {
		name string
		f    *os.File
		path string
		want string
	}{
		{"tcp", file(tcp.(*net.TCPListener)), "", "not a listening Unix stream socket"},
		{"datagram", file(gram), "", "not a listening Unix stream socket"},
		{"file", regular, "", "getsockopt"},
		{"other path", file(stream), filepath.Join(dir, "elsewhere"), "not the configured socket"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, err := New(Config{ListenerFile: c.f, SocketPath: c.path, Logger: slog.New(slog.NewTextHandler(&logBuf{}, nil))})
			if err != nil {
				t.Fatal(err)
			}
			setHooks(t, h, hooks{openPG: fakeOpener(true)})
			err = h.Start(context.Background())
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Start: %v, want %q", err, c.want)
			}
			<-h.Done()
		})
	}
}

// Run serves until its context ends, then stops the hub: the socket file
// is removed and Run returns nil.
func TestRunStopsWhenContextEnds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hub.sock")
	h, err := New(Config{SocketPath: path, Logger: slog.New(slog.NewTextHandler(&logBuf{}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	setHooks(t, h, hooks{openPG: fakeOpener(true)})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- h.Run(ctx) }()
	testutil.WaitFor(t, 10*time.Second, "the socket to be served", func() bool {
		_, err := os.Stat(path)
		return err == nil
	})
	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("socket file after Run: %v, want it removed", err)
	}
}

// ReserveFDs takes descriptors out of a running hub's worker budget (a
// server beside the hub holding connections), and release gives them back,
// once however often it is called.
func TestReserveFDsLowersTheWorkerBudget(t *testing.T) {
	e := newEnvPG(t, nil, false)
	budget := func() (n int) {
		e.do(func() { n = e.h.fds.fdWorkers })
		return n
	}
	before := budget()
	if before == maxInt {
		t.Skip("RLIMIT_NOFILE is unlimited: no worker budget to lower")
	}
	release := e.h.ReserveFDs(18)
	if got := budget(); got != before-18 {
		t.Fatalf("worker budget %d after reserving 18, want %d", got, before-18)
	}
	release()
	release()
	if got := budget(); got != before {
		t.Fatalf("worker budget %d after release, want %d back", got, before)
	}
}
