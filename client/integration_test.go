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
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

// The integration tests share one throwaway cluster (pgtesting); the
// scripted-hub tests do not use it.
var db *pgtest.Cluster

func TestMain(m *testing.M) {
	// A Failover without a Logger logs on slog.Default(): keep the test
	// output to the tests' own lines.
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if os.Getenv(peerHelperEnv) != "" {
		os.Exit(m.Run()) // TestDialRefusesForeignHub's helper: no cluster
	}
	pgtesting.Main(m, pgtest.Options{}, &db)
}

func needDB(t testing.TB) *pgtest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test (-short)")
	}
	return db
}

// SharedTestDatabase is the test binary's throwaway cluster (or
// LISTENHUB_TEST_DATABASE_URL's server). Exported, in a test file, for the
// examples of package client_test.
func SharedTestDatabase() *pgtest.Cluster { return db }

// listenhubBinary builds cmd/listenhub once per test binary.
func listenhubBinary(t testing.TB) string {
	t.Helper()
	return testutil.Binary(t, "github.com/listenhub/listenhub/cmd/listenhub")
}

// logBuf collects logs, shown only when the test fails.
type logBuf struct{ testutil.SyncBuffer }

func (l *logBuf) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

var appSafe = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// pgEnv is one integration test's names: its own application_names (so
// that backend counts are its own) and its own channel prefix (so that
// NOTIFYs of other tests never reach it).
type pgEnv struct {
	t        testing.TB
	db       *pgtest.Cluster
	hubApp   string // the hub's application_name
	localApp string // the local listeners'
	prefix   string // channel prefix, hub and local alike
	socket   string
	logs     *logBuf
}

func newPGEnv(t testing.TB) *pgEnv {
	t.Helper()
	c := needDB(t)
	name := appSafe.ReplaceAllString(strings.TrimPrefix(t.Name(), "Test"), "-")
	if len(name) > 40 {
		name = name[:40]
	}
	e := &pgEnv{
		t: t, db: c,
		hubApp:   "lhh-" + name,
		localApp: "lhl-" + name,
		prefix:   strings.ToLower(name) + ".",
		socket:   filepath.Join(shortDir(t), "hub.sock"),
		logs:     &logBuf{},
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", e.logs.String())
		}
	})
	return e
}

// startHub runs a hub in this process.
func (e *pgEnv) startHub(mutate func(*hub.Config)) *hub.Hub {
	e.t.Helper()
	cfg := hub.Config{
		SocketPath:      e.socket,
		DatabaseURL:     e.db.URL(),
		ApplicationName: e.hubApp,
		ChannelPrefix:   e.prefix,
		Logger:          e.logs.logger().With("side", "hub"),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	h, err := hub.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		h.Stop(ctx)
	})
	return h
}

// startHubProcess runs `listenhub serve` as a child process.
func (e *pgEnv) startHubProcess(args ...string) *exec.Cmd {
	e.t.Helper()
	cmd := exec.Command(listenhubBinary(e.t), append([]string{"serve",
		"--database-url", e.db.URL(), "--socket", e.socket,
		"--application-name", e.hubApp, "--channel-prefix", e.prefix, "--log-level", "debug"}, args...)...)
	cmd.Stdout, cmd.Stderr = e.logs, e.logs
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	testutil.WaitFor(e.t, waitLong, "the hub process to accept", func() bool {
		c, err := net.Dial("unix", e.socket)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	return cmd
}

func (e *pgEnv) failover(rec *recorder, mutate func(*foSetup)) *Failover {
	e.t.Helper()
	opts := foSetup{FailoverOptions: FailoverOptions{
		Hub:    Options{SocketPath: e.socket},
		Local:  LocalOptions{DatabaseURL: e.db.URL(), ApplicationName: e.localApp, ChannelPrefix: e.prefix},
		Logger: e.logs.logger().With("side", "client"),
	}}
	if rec != nil {
		opts.OnWake, opts.OnStatus = rec.onWake, rec.onStatus
	}
	if mutate != nil {
		mutate(&opts)
	}
	f, err := NewFailover(context.Background(), opts.FailoverOptions, opts.FailoverHandlers)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { f.Close() })
	return f
}

func (e *pgEnv) notify(q, payload string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := e.db.Notify(ctx, e.prefix+q, payload); err != nil {
		e.t.Fatal(err)
	}
}

func (e *pgEnv) backends(app string) int {
	e.t.Helper()
	pids, err := e.db.BackendPIDs(context.Background(), app)
	if err != nil {
		e.t.Fatal(err)
	}
	return len(pids)
}

// waitBackends waits until the hub and local backend counts are as given.
func (e *pgEnv) waitBackends(hubN, localN int) {
	e.t.Helper()
	testutil.WaitFor(e.t, waitLong, fmt.Sprintf("%d hub and %d local backends", hubN, localN), func() bool {
		return e.backends(e.hubApp) == hubN && e.backends(e.localApp) == localN
	})
}

// notifier sends NOTIFY q, "seq N" with N = 1, 2, ... every few
// milliseconds until stopped, so that a failover happens mid-stream.
type notifier struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	last int

	paused atomic.Bool
	sendMu sync.Mutex // held while a NOTIFY is in flight
}

// pause stops the sending; on return no NOTIFY is in flight.
func (n *notifier) pause() {
	n.paused.Store(true)
	n.sendMu.Lock()
	n.sendMu.Unlock() //nolint:staticcheck // waits for the NOTIFY in flight
}

func (n *notifier) resume() { n.paused.Store(false) }

func (e *pgEnv) startNotifier(q string) *notifier { return e.startNotifierAt(q, 500) }

// startNotifierAt is startNotifier at up to perSecond NOTIFYs a second.
func (e *pgEnv) startNotifierAt(q string, perSecond int) *notifier {
	n := &notifier{stop: make(chan struct{}), done: make(chan struct{})}
	tick := time.NewTicker(time.Second / time.Duration(perSecond))
	go func() {
		defer close(n.done)
		for i := 1; ; {
			select {
			case <-n.stop:
				tick.Stop()
				return
			case <-tick.C:
			}
			n.sendMu.Lock()
			if n.paused.Load() {
				n.sendMu.Unlock()
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			err := e.db.Notify(ctx, e.prefix+q, "seq "+strconv.Itoa(i))
			cancel()
			if err == nil {
				n.mu.Lock()
				n.last = i
				n.mu.Unlock()
			}
			n.sendMu.Unlock()
			if err != nil {
				return
			}
			i++
		}
	}()
	e.t.Cleanup(n.halt)
	return n
}

func (n *notifier) sent() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last
}

func (n *notifier) halt() {
	select {
	case <-n.stop:
	default:
		close(n.stop)
	}
	<-n.done
}

// maxSeq returns the highest "seq N" payload rec has seen for q.
func (r *recorder) maxSeq(q string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := 0
	for _, w := range r.wakes {
		if w.Name != q {
			continue
		}
		if s, ok := strings.CutPrefix(w.Payload, "seq "); ok {
			if n, err := strconv.Atoi(s); err == nil && n > m {
				m = n
			}
		}
	}
	return m
}

func (r *recorder) hasPayload(q, p string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.wakes {
		if w.Name == q && w.Payload == p && !w.Durable {
			return true
		}
	}
	return false
}

// waitFlowing sends NOTIFYs until one arrives: wakes flow on q now.
func (e *pgEnv) waitFlowing(rec *recorder, q string) {
	e.t.Helper()
	i := 0
	testutil.WaitFor(e.t, waitLong, "a NOTIFY on "+q+" to arrive", func() bool {
		i++
		p := fmt.Sprintf("probe %d", i)
		e.notify(q, p)
		for range 50 {
			if rec.hasPayload(q, p) {
				return true
			}
			time.Sleep(2 * time.Millisecond)
		}
		return false
	})
}

func TestPGClientWakesAndPayloads(t *testing.T) {
	e := newPGEnv(t)
	e.startHub(func(c *hub.Config) { c.ChannelSuffix = ".ins" })
	rec := &recorder{}
	c, err := Dial(context.Background(), Options{SocketPath: e.socket}, Handlers{OnWake: rec.onWake, OnStatus: rec.onStatus})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if err := c.Subscribe(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, waitLong, "status healthy", c.Healthy)

	payloads := []string{
		`{"id":1,"quote":"\"","tab":"` + "\t" + `","é":"ü","emoji":"🚀"}`,
		strings.Repeat("x", 7999), // near NOTIFY's 8000-byte limit
		"",                        // durable
		"last",
	}
	for _, p := range payloads {
		if err := e.db.Notify(ctx, e.prefix+"jobs.ins", p); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, waitLong, "4 wakes", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.wakes) == 4
	})
	for i, w := range rec.wakes {
		if w.Name != "jobs" || w.Payload != payloads[i] || w.Durable != (payloads[i] == "") {
			t.Errorf("wake %d: %+v, want payload %.40q", i, w, payloads[i])
		}
	}

	// Unsubscribe, then a round trip (the ack of "other" comes after the
	// hub has handled the unsub): jobs no longer arrives, other does.
	c.Unsubscribe("jobs")
	if err := c.Subscribe(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	e.db.Notify(ctx, e.prefix+"jobs.ins", "after unsub")
	e.db.Notify(ctx, e.prefix+"other.ins", "other")
	testutil.WaitFor(t, waitLong, "other", func() bool { return rec.hasPayload("other", "other") })
	if rec.hasPayload("jobs", "after unsub") {
		t.Fatal("wake after Unsubscribe")
	}

	// A name too long once prefixed and suffixed: refused, client alive.
	long := strings.Repeat("n", 63-len(e.prefix)-len(".ins")+1)
	if err := c.Subscribe(ctx, long); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("Subscribe(long) = %v, want ErrInvalidName", err)
	}
	if c.Err() != nil {
		t.Fatal(c.Err())
	}
	if n := e.backends(e.hubApp); n != 1 {
		t.Fatalf("%d hub backends", n)
	}
}

// Failover when the hub process is SIGKILLed while NOTIFYs stream in: the
// local listener takes over, wakes keep flowing, a durable wake marks the
// gap, and the host's backends go from the hub's one to this process's own.
func TestPGFailoverHubKilled(t *testing.T) {
	e := newPGEnv(t)
	proc := e.startHubProcess()
	e.waitBackends(1, 0)
	rec := &recorder{}
	f := e.failover(rec, nil)
	mustSubscribe(t, f, "a")
	if f.Mode() != ModeHub {
		t.Fatalf("Mode %v, Reason %v", f.Mode(), f.Reason())
	}
	n := e.startNotifier("a")
	testutil.WaitFor(t, waitLong, "wakes through the hub", func() bool { return rec.maxSeq("a") >= 20 })
	e.waitBackends(1, 0)

	killed := time.Now()
	proc.Process.Kill() // SIGKILL: no goodbye
	proc.Wait()
	testutil.WaitFor(t, waitLong, "local mode", func() bool { return f.Mode() == ModeLocal })
	var ce *ConnError
	if !errors.As(f.Reason(), &ce) || ce.Op != "read" {
		t.Fatalf("Reason %v, want a read *ConnError", f.Reason())
	}
	atSwap := n.sent()
	swapTook := time.Since(killed)
	testutil.WaitFor(t, waitLong, "wakes through the local listener", func() bool { return rec.maxSeq("a") > atSwap+20 })
	testutil.WaitFor(t, waitLong, "the durable wake after the swap", func() bool { return rec.has("durable a") })
	n.halt()
	// The hub's backend is gone with it; this process has its own.
	e.waitBackends(0, 1)
	if !f.Healthy() {
		t.Fatal("not healthy in local mode")
	}
	t.Logf("sent %d NOTIFYs, received up to seq %d; local mode %v after the SIGKILL, at seq %d: %v",
		n.sent(), rec.maxSeq("a"), swapTook, atSwap, f.Reason())
}

func TestPGFailoverHubNeverStarted(t *testing.T) {
	e := newPGEnv(t)
	rec := &recorder{}
	f := e.failover(rec, nil)
	if f.Mode() != ModeLocal {
		t.Fatalf("Mode %v", f.Mode())
	}
	var ce *ConnError
	if !errors.As(f.Reason(), &ce) || ce.Op != "dial" {
		t.Fatalf("Reason %v", f.Reason())
	}
	e.waitBackends(0, 1)
	mustSubscribe(t, f, "a")
	e.notify("a", "hello")
	testutil.WaitFor(t, waitLong, "local wake", func() bool { return rec.hasPayload("a", "hello") })
	e.notify("a", "")
	testutil.WaitFor(t, waitLong, "local durable wake", func() bool { return rec.has("durable a") })
	// Local mode applies the channel mapping: too long once prefixed.
	if err := f.Subscribe(context.Background(), strings.Repeat("n", 64-len(e.prefix))); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("Subscribe(long) = %v", err)
	}
	f.Unsubscribe("a")
	f.Close()
	e.waitBackends(0, 0)
}

// A hub that accepts and never acks (scripted): the ack timeout fails over.
func TestPGFailoverHubNeverAcks(t *testing.T) {
	e := newPGEnv(t)
	fh := newFakeHub(t, false)
	e.socket = fh.path
	rec := &recorder{}
	f := e.failover(rec, func(o *foSetup) { o.Hub.AckTimeout = 200 * time.Millisecond })
	fc := fh.accept()
	e.waitBackends(0, 0)
	if err := f.Subscribe(context.Background(), "a"); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	fc.expect(t, "sub", "a")
	if f.Mode() != ModeLocal || !errors.Is(f.Reason(), ErrAckTimeout) {
		t.Fatalf("Mode %v Reason %v", f.Mode(), f.Reason())
	}
	fc.waitEOF(t)
	e.waitBackends(0, 1)
	e.waitFlowing(rec, "a")
}

// A worker that stops reading is evicted by the hub; its Failover then
// listens on its own connection: 1 backend becomes 2 (the hub's stays for
// the other workers, whom the wedged one does not slow down).
func TestPGFailoverEviction(t *testing.T) {
	e := newPGEnv(t)
	h := e.startHub(nil) // default limits: 1024 frames
	release := make(chan struct{})
	var once sync.Once
	wedged := make(chan struct{})
	rec := &recorder{}
	f := e.failover(nil, func(o *foSetup) {
		o.OnWake = func(w Wake) {
			if w.Payload == "wedge" {
				once.Do(func() { close(wedged) })
				<-release // a handler that blocks: what the docs say not to do
			}
			rec.onWake(w)
		}
	})
	sibling := &recorder{}
	sc, err := Dial(context.Background(), Options{SocketPath: e.socket}, Handlers{OnWake: sibling.onWake})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	ctx := context.Background()
	for _, l := range []Listener{f, sc} {
		if err := l.Subscribe(ctx, "a"); err != nil {
			t.Fatal(err)
		}
	}
	e.waitBackends(1, 0)
	e.notify("a", "wedge")
	<-wedged
	// Enough ephemeral wakes to fill the socket buffers and then the
	// hub's hard limit for the wedged worker; in transactions of 100, so
	// that the sibling, which reads, never has a backlog near the limit.
	// The sibling is let catch up after each batch: this test is about
	// the wedged worker, not about how fast a -race build decodes.
	const batches, per = 30, 100
	for i := range batches {
		if err := e.db.Exec(ctx, `SELECT pg_notify($1, repeat('x', 1000) || g) FROM generate_series(1, $2::int) g`, e.prefix+"a", per); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, waitLong, "the sibling to catch up", func() bool {
			sibling.mu.Lock()
			defer sibling.mu.Unlock()
			return len(sibling.wakes) >= 1+(i+1)*per
		})
		if h.Stats().Evictions > 0 {
			break
		}
	}
	testutil.WaitFor(t, waitLong, "the eviction", func() bool { return h.Stats().Evictions == 1 })
	if f.Mode() != ModeHub {
		t.Fatal("failed over before the handler returned")
	}
	close(release)
	testutil.WaitFor(t, waitLong, "local mode", func() bool { return f.Mode() == ModeLocal })
	var ce *ConnError
	if !errors.As(f.Reason(), &ce) {
		t.Fatalf("Reason %v", f.Reason())
	}
	e.waitBackends(1, 1)
	e.waitFlowing(rec, "a")
	if !rec.has("durable a") {
		t.Fatal("no durable wake after the swap")
	}
	if sc.Err() != nil || h.Stats().Evictions != 1 {
		t.Fatalf("sibling: %v; evictions %d", sc.Err(), h.Stats().Evictions)
	}
	e.waitFlowing(sibling, "a")
}

// One Subscribe per process whatever the number of in-process subscribers.
func TestPGMuxFanout1000(t *testing.T) {
	e := newPGEnv(t)
	h := e.startHub(nil)
	m, err := NewMux(MuxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Attach(e.failover(nil, func(o *foSetup) { o.OnWake = m.OnWake })); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	subs := make([]*Subscription, 1000)
	for i := range subs {
		s, err := m.Subscribe(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		subs[i] = s
	}
	if s := h.Stats(); s.Workers != 1 || s.Channels != 1 {
		t.Fatalf("hub stats %+v, want 1 worker, 1 channel", s)
	}
	for i := range 5 {
		e.notify("a", fmt.Sprint(i))
	}
	eachReadsInOrder(t, subs, 5)
	for _, s := range subs {
		s.Close()
	}
	testutil.WaitFor(t, waitLong, "the hub to UNLISTEN", func() bool { return h.Stats().Channels == 0 })
}

func TestPGLocal(t *testing.T) {
	e := newPGEnv(t)
	rec := &recorder{}
	l, err := NewLocal(context.Background(), LocalOptions{
		DatabaseURL: e.db.URL(), ApplicationName: e.localApp,
		ChannelPrefix: e.prefix, ChannelSuffix: ".s",
	}, Handlers{OnWake: rec.onWake, OnStatus: rec.onStatus})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	e.waitBackends(0, 1)
	ctx := context.Background()
	for range 2 { // the second is a no-op
		if err := l.Subscribe(ctx, "a"); err != nil {
			t.Fatal(err)
		}
	}
	e.db.Notify(ctx, e.prefix+"a.s", "p")
	e.db.Notify(ctx, e.prefix+"a", "unmapped") // not ours: no suffix
	e.db.Notify(ctx, e.prefix+"a.s", "")
	testutil.WaitFor(t, waitLong, "wakes", func() bool { return rec.has("wake a p") && rec.has("durable a") })
	if rec.has("wake a unmapped") {
		t.Fatal("a channel outside the mapping was delivered")
	}
	// Unsubscribe is queued in order with later Subscribes.
	l.Unsubscribe("a")
	l.Subscribe(ctx, "b")
	l.Subscribe(ctx, "a")
	l.Unsubscribe("a")
	if err := l.Subscribe(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	e.db.Notify(ctx, e.prefix+"a.s", "late")
	e.db.Notify(ctx, e.prefix+"c.s", "c")
	testutil.WaitFor(t, waitLong, "c", func() bool { return rec.has("wake c c") })
	if rec.has("wake a late") {
		t.Fatal("wake after the last Unsubscribe")
	}
	if !l.Healthy() {
		t.Fatal("not healthy")
	}
	l.Close()
	if err := l.Subscribe(ctx, "a"); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	e.waitBackends(0, 0)
}

// The local listener survives a Postgres restart by itself: status false,
// then true, and NOTIFYs flow again.
func TestPGLocalSurvivesRestart(t *testing.T) {
	e := newPGEnv(t)
	if e.db.External() {
		t.Skip("needs a throwaway cluster")
	}
	rec := &recorder{}
	f := e.failover(rec, nil) // no hub: local
	mustSubscribe(t, f, "a")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.db.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, waitLong, "status false then true", func() bool {
		ev := rec.snapshot()
		i := slicesIndex(ev, "status false")
		return i >= 0 && slicesIndex(ev[i:], "status true") >= 0
	})
	e.waitFlowing(rec, "a")
	if f.Err() != nil || f.Mode() != ModeLocal {
		t.Fatal(f.Err(), f.Mode())
	}
}

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
