package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/pgtest/pgtls"
	"github.com/listenhub/listenhub/internal/testutil"
)

type atomicInt = atomic.Int64

// The integration tests share one throwaway cluster, started by the first
// test that needs it; the unit tests above run without Postgres.
var db *pgtest.Cluster

func TestMain(m *testing.M) { pgtesting.Main(m, pgtest.Options{TLS: pgtls.Certificate}, &db) }

func needDB(t testing.TB) *pgtest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test (-short)")
	}
	return db
}

// pgEnv is a real hub on the shared cluster. Every test gets its own
// application_name, so that backend counts and terminations are its own.
type pgEnv struct {
	t    testing.TB
	h    *Hub
	db   *pgtest.Cluster
	app  string
	path string
	logs *logBuf
}

var appSafe = regexp.MustCompile(`[^a-zA-Z0-9]+`)

func newPGEnv(t testing.TB, mutate func(*Config)) *pgEnv {
	t.Helper()
	c := needDB(t)
	app := "lh-" + appSafe.ReplaceAllString(t.Name(), "-")
	if len(app) > 60 {
		app = app[:60]
	}
	logs := &logBuf{}
	cfg := Config{
		SocketPath:      filepath.Join(t.TempDir(), "hub.sock"),
		DatabaseURL:     c.URL(),
		ApplicationName: app,
		Logger:          slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	h := startHub(t, cfg, logs)
	// Start returns once the socket accepts; Postgres is reached in the
	// background. These tests begin from a connected hub.
	testutil.WaitFor(t, timeout, "hub connected to postgres", func() bool { return h.Stats().PostgresHealthy })
	return &pgEnv{t: t, h: h, db: c, app: app, path: cfg.SocketPath, logs: logs}
}

// startHub starts a hub with cfg, whose logger writes to logs, and stops
// it at the end of the test (showing its log if the test failed).
func startHub(t testing.TB, cfg Config, logs *logBuf) *Hub {
	t.Helper()
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, h, logs)
	return h
}

func (e *pgEnv) dial() *tw {
	e.t.Helper()
	w := dialRaw(e.t, e.path)
	w.expect(statusTrue)
	return w
}

func (e *pgEnv) exec(sql string, args ...any) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.db.Exec(ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *pgEnv) backends() int {
	e.t.Helper()
	pids, err := e.db.BackendPIDs(context.Background(), e.app)
	if err != nil {
		e.t.Fatal(err)
	}
	return len(pids)
}

// connect opens a plain connection for a notifier.
func connect(t testing.TB, url string) *pgconn.PgConn {
	t.Helper()
	return pgtesting.Connect(t, url).PgConn()
}

// 64 workers, overlapping subscriptions: exactly one backend, and every
// NOTIFY reaches every subscriber.
func TestPG64WorkersOneBackend(t *testing.T) {
	e := newPGEnv(t, nil)
	ws := make([]*tw, 64)
	for i := range ws {
		ws[i] = e.dial()
		for _, q := range []string{"all", fmt.Sprint("g", i%8)} {
			ws[i].sub(q)
			ws[i].expect(ack(q))
		}
	}
	if n := e.backends(); n != 1 {
		t.Fatalf("%d backends with application_name %s, want 1", n, e.app)
	}
	if s := e.h.Stats(); s.Workers != 64 || s.Channels != 9 {
		t.Fatalf("stats %+v, want 64 workers, 9 channels", s)
	}
	e.exec("SELECT pg_notify('all', 'hello'), pg_notify('g3', '')")
	for i, w := range ws {
		w.expect(wake("all", ptr("hello")))
		if i%8 == 3 {
			w.expect(wake("g3", nil))
		}
	}
}

// The ack contract under a concurrent notifier: every NOTIFY started after a
// worker received its ack reaches that worker. Workers subscribe at
// staggered times (first subscriber: LISTEN; later ones: in flight or
// listening); every fifth unsubscribes and subscribes again right after
// its ack, which exercises the UNLISTEN-in-flight path when it was alone.
func TestPGAckContract(t *testing.T) {
	e := newPGEnv(t, nil)
	const channels, workers = 4, 40
	notifier := connect(t, e.db.URL())

	type result struct {
		ackAt time.Time
		got   map[int]bool
	}
	var (
		mu      sync.Mutex
		started = map[int]time.Time{} // seq -> when its NOTIFY was sent
		stop    = make(chan struct{})
		ndone   = make(chan int)
	)
	go func() { // the notifier: seq i on channel i%channels
		i := 0
		defer func() { ndone <- i }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			started[i] = time.Now()
			mu.Unlock()
			sql := fmt.Sprintf("NOTIFY c%d, '%d'", i%channels, i)
			if err := notifier.Exec(context.Background(), sql).Close(); err != nil {
				t.Error(err)
				return
			}
			i++
		}
	}()

	results := make([]result, workers)
	var wg sync.WaitGroup
	for k := range workers {
		time.Sleep(20 * time.Millisecond) // stagger the subscriptions
		w := e.dial()
		q := fmt.Sprint("c", k%channels)
		resub := k%5 == 0
		w.sub(q)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := result{got: map[int]bool{}}
			for {
				m, err := w.read(30 * time.Second)
				if err != nil {
					t.Errorf("worker %d: %v", k, err)
					return
				}
				switch {
				case m.Type == "ack" && resub:
					resub = false
					w.unsub(q)
					w.sub(q)
				case m.Type == "ack":
					r.ackAt = time.Now()
				case m.Type == "wake" && m.Payload == "end":
					results[k] = r
					return
				case m.Type == "wake":
					n, _ := strconv.Atoi(m.Payload)
					r.got[n] = true
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // let the last subscribers see some traffic
	close(stop)
	sent := <-ndone
	for c := range channels {
		e.exec(fmt.Sprintf("NOTIFY c%d, 'end'", c))
	}
	wg.Wait()
	checked := 0
	for k, r := range results {
		if r.ackAt.IsZero() {
			t.Fatalf("worker %d never acked", k)
		}
		for i := k % channels; i < sent; i += channels {
			if started[i].After(r.ackAt) {
				checked++
				if !r.got[i] {
					t.Errorf("worker %d: NOTIFY %d started %v after its ack was lost", k, i, started[i].Sub(r.ackAt))
				}
			}
		}
	}
	t.Logf("%d NOTIFYs sent; %d (worker, NOTIFY-after-ack) pairs checked", sent, checked)
	if checked < workers {
		t.Fatalf("only %d pairs checked: the notifier was too slow to test anything", checked)
	}
}

// A worker that never reads, with 20,000 durable NOTIFYs (each its own
// transaction): it is not evicted, its sibling is served, and what the hub
// holds for it stays bounded (coalesced into one pending frame).
func TestPGWedgedWorkerDurable(t *testing.T) {
	e := newPGEnv(t, nil)
	wedged, sib := e.dial(), e.dial()
	for _, w := range []*tw{wedged, sib} {
		w.subscribe("d")
	}
	e.exec(`DO $$ BEGIN FOR i IN 1..20000 LOOP PERFORM pg_notify('d', ''); COMMIT; END LOOP; END $$`)
	e.exec(`SELECT pg_notify('d', 'last')`)
	sib.readUntilLast(nil)
	testutil.WaitFor(t, timeout, "all 20,001 NOTIFYs received", func() bool {
		return e.h.Stats().WakesReceived == 20001
	})
	s := e.h.Stats()
	if s.Evictions != 0 || s.Workers != 2 {
		t.Fatalf("stats %+v: the durable-only worker must not be evicted", s)
	}
	var held, frames, pending int
	done := make(chan struct{})
	e.h.loop.Post(func() {
		for _, w := range e.h.workers.list {
			if w.out.Len() > held {
				held, frames, pending = w.out.Len(), w.out.Frames(), w.pendingDurable()
			}
		}
		close(done)
	})
	<-done
	t.Logf("wedged worker: %d bytes, %d frames held; coalesced %d, dropped %d", held, frames, s.DurableCoalesced, s.DurableDropped)
	if pending > 1 || frames > 2 || held > 1024 {
		t.Fatalf("hub holds %d bytes, %d frames (%d durable) for a wedged worker on one channel; want at most one durable wake and the last ephemeral", held, frames, pending)
	}
	if s.DurableCoalesced == 0 {
		t.Fatal("nothing coalesced")
	}
}

// A worker that never reads, with 5,000 ephemeral payloads: it is evicted
// (its socket closed, so its client falls back), and its sibling gets all
// 5,000, in order.
//
// The NOTIFYs go out in transactions of 100, and the notifier stays at most
// 500 ahead of what the sibling has read: the sibling is a healthy worker
// that keeps up, if a little behind, which is what the hard limit protects.
// (A worker that falls behind by more than the kernel buffer plus
// HardQueueLimit frames is evicted too, by design: on a loaded machine with
// the race detector a test reader can be that slow.)
func TestPGWedgedWorkerEphemeral(t *testing.T) {
	e := newPGEnv(t, nil)
	wedged, sib := e.dial(), e.dial()
	for _, w := range []*tw{wedged, sib} {
		w.subscribe("e")
	}
	const total, batch, window = 5000, 100, 500
	var read atomicInt
	got := make(chan error, 1)
	go func() {
		for i := 1; i <= total; i++ {
			m, err := sib.read(timeout)
			if err != nil {
				got <- fmt.Errorf("sibling at %d: %v", i, err)
				return
			}
			if !strings.HasPrefix(m.Payload, fmt.Sprintf("%d:", i)) {
				got <- fmt.Errorf("sibling wake %d: %.12q, out of order", i, m.Payload)
				return
			}
			read.Store(int64(i))
		}
		got <- nil
	}()
	for first := 1; first <= total; first += batch {
		testutil.WaitFor(t, timeout, "sibling within the window", func() bool {
			return int64(first-1-window) <= read.Load()
		})
		e.exec(fmt.Sprintf(`SELECT pg_notify('e', i || ':' || repeat('x', 200)) FROM generate_series(%d, %d) i`,
			first, first+batch-1))
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, timeout, "the wedged worker evicted", func() bool { return e.h.Stats().Evictions == 1 })
	wedged.eof()
	if s := e.h.Stats(); s.Evictions != 1 || s.Workers != 1 {
		t.Fatalf("stats %+v, want 1 eviction and the sibling left", s)
	}
}

// Every malformed input of rule 9 severs that connection only; a sibling on
// the same channel keeps getting real NOTIFYs.
func TestPGBadInput(t *testing.T) {
	e := newPGEnv(t, nil)
	sib := e.dial()
	sib.subscribe("m")
	inputs := [][]byte{
		{0xff, 0xff, 0xff, 0xff},
		rawFrame(`{"t":"sub","q":`),
		rawFrame(`"sub"`),
		rawFrame(`{"q":"m"}`),
		rawFrame(`{"t":"sub"}`),
		rawFrame(`{"t":"unsub","q":["m"]}`),
	}
	for i, in := range inputs {
		bad := e.dial()
		bad.subscribe("m")
		bad.send(in)
		bad.eof()
		e.exec(fmt.Sprintf("NOTIFY m, '%d'", i))
		sib.expect(wake("m", ptr(fmt.Sprint(i))))
	}
	if s := e.h.Stats(); s.ProtocolErrors != uint64(len(inputs)) || s.Channels != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// The backend is terminated: workers see healthy:false, then healthy:true
// and one durable wake per subscribed channel; NOTIFYs flow again.
func TestPGBackendTerminated(t *testing.T) {
	e := newPGEnv(t, nil)
	w := e.dial()
	for _, q := range []string{"r1", "r2"} {
		w.sub(q)
		w.expect(ack(q))
	}
	n, err := e.db.Terminate(context.Background(), e.app)
	if err != nil || n != 1 {
		t.Fatalf("terminated %d backends: %v", n, err)
	}
	w.expect(statusFalse, statusTrue)
	got := []string{w.next(), w.next()}
	if !(got[0] == wake("r1", nil) && got[1] == wake("r2", nil) || got[0] == wake("r2", nil) && got[1] == wake("r1", nil)) {
		t.Fatalf("resync wakes %v", got)
	}
	e.exec("NOTIFY r2, 'after'")
	w.expect(wake("r2", ptr("after")))
	if s := e.h.Stats(); s.PostgresReconnects != 1 || !s.PostgresHealthy {
		t.Fatalf("stats %+v", s)
	}
	if n := e.backends(); n != 1 {
		t.Fatalf("%d backends after the reconnect", n)
	}
}

// Connect, subscribe, close, 10,000 times: the process's descriptor count is
// back where it started, and so are the hub's tables.
func TestPGChurnFDs(t *testing.T) {
	// The cycles take longer than 5 default status intervals: no periodic
	// status between a sub and its ack, which the loop below reads next.
	e := newPGEnv(t, func(c *Config) { c.StatusInterval = time.Hour })
	warm := e.dial()
	warm.subscribe("warm")
	warm.c.Close()
	testutil.WaitFor(t, timeout, "warm-up worker gone", func() bool { return e.h.Stats().Workers == 0 })
	before := testutil.FDCount()
	n := 10000
	if testing.Short() {
		n = 1000
	}
	for i := range n {
		w := e.dial()
		q := fmt.Sprint("churn", i%3)
		w.sub(q)
		w.expect(ack(q))
		w.c.Close()
	}
	testutil.WaitFor(t, timeout, "every worker and channel gone", func() bool {
		s := e.h.Stats()
		return s.Workers == 0 && s.Channels == 0
	})
	testutil.WaitFor(t, timeout, "fd count back to the start", func() bool { return testutil.FDCount() <= before })
	t.Logf("fds: %d before %d cycles, %d after", before, n, testutil.FDCount())
	if s := e.h.Stats(); s.Accepts != uint64(n+1) {
		t.Fatalf("accepts = %d, want %d", s.Accepts, n+1)
	}
}

// A socket that cannot be bound: Start fails before Postgres is touched,
// so no backend is ever opened.
func TestPGBindFailureOpensNoBackend(t *testing.T) {
	c := needDB(t)
	app := "lh-bindfail"
	logs := &logBuf{}
	h, err := New(Config{
		SocketPath:      filepath.Join(t.TempDir(), "missing-dir", "hub.sock"),
		DatabaseURL:     c.URL(),
		ApplicationName: app,
		Logger:          slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "bind") {
		t.Fatalf("Start: %v, want a bind error", err)
	}
	<-h.Done()
	if strings.Contains(logs.String(), "listener: connected") {
		t.Fatalf("the listener connected although the bind failed:\n%s", logs.String())
	}
	pids, err := c.BackendPIDs(context.Background(), app)
	if err != nil || len(pids) != 0 {
		t.Fatalf("backends %v (%v), want none", pids, err)
	}
	if err := h.Stop(context.Background()); err != nil {
		t.Fatalf("Stop after a failed Start: %v", err)
	}
}

// sslmode=require: the listener serves the connection through its TLS
// bridge goroutine; the hub's semantics are the same.
func TestPGOverTLS(t *testing.T) {
	c := needDB(t)
	if c.TLSURL() == "" {
		t.Skip("cluster without TLS")
	}
	e := newPGEnv(t, func(cfg *Config) { cfg.DatabaseURL = c.TLSURL() })
	w := e.dial()
	w.subscribe("tls")
	e.exec("NOTIFY tls, 'secure'")
	w.expect(wake("tls", ptr("secure")))
	n, err := c.QueryInt(context.Background(), "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE ssl AND application_name = $1", e.app)
	if err != nil || n != 1 {
		t.Fatalf("%d TLS backends for the hub (%v), want 1", n, err)
	}
}

// Postgres refuses the configuration (here: no such database): the hub,
// which accepts workers meanwhile, stops itself; a worker that got in sees
// healthy:false then EOF, Wait says why, the socket file is gone and Stop
// has nothing left to do.
func TestPGConfigErrorEndsHub(t *testing.T) {
	c := needDB(t)
	cc, err := pgconn.ParseConfig(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "hub.sock")
	h, err := New(Config{
		SocketPath:  path,
		DatabaseURL: fmt.Sprintf("postgres://postgres@%s:%d/no_such_db?sslmode=disable", cc.Host, cc.Port),
		Logger:      slog.New(slog.NewTextHandler(&logBuf{}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v (a refused configuration is reported by Wait)", err)
	}
	// The server answers within milliseconds: the hub may be gone before
	// this connects, which is fine; if it got in, it is told and closed.
	if conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"}); err == nil {
		w := &tw{t: t, c: conn, buf: make([]byte, 4096)}
		defer conn.Close()
		if m, err := w.read(timeout); err == nil && encode(m) != statusFalse {
			t.Fatalf("first frame %s, want %s", encode(m), statusFalse)
		}
		w.eof()
	}
	err = h.Wait()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "3D000" {
		t.Fatalf("Wait: %v, want SQLSTATE 3D000", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file: %v", err)
	}
	if err := h.Stop(context.Background()); err != nil {
		t.Fatalf("Stop after the hub stopped itself: %v", err)
	}
}

// A worker that subscribes 10,000 names in one write, and reads nothing
// until the hub has answered every one, gets every ack from a real
// Postgres and is not evicted: answers never count toward the hard limit.
func TestPGTenThousandSubsAtOnce(t *testing.T) {
	const n = 10000
	e := newPGEnv(t, func(c *Config) { c.StatusInterval = time.Hour })
	w := e.dial()
	var subs []byte
	for i := range n {
		subs = frame.AppendSub(subs, fmt.Sprint("many_", i))
	}
	w.send(subs)
	testutil.WaitFor(t, 2*time.Minute, "every channel LISTENed", func() bool { return e.h.Stats().Channels == n })
	got := make(map[string]bool, n)
	for len(got) < n {
		m, err := w.read(timeout)
		if err != nil {
			t.Fatalf("after %d acks: %v", len(got), err)
		}
		if m.Type != "ack" || got[m.Name] {
			t.Fatalf("after %d acks: %+v", len(got), m)
		}
		got[m.Name] = true
	}
	if s := e.h.Stats(); s.Evictions != 0 || s.Workers != 1 || s.Nacks != 0 {
		t.Fatalf("stats %+v", s)
	}
	e.exec("NOTIFY many_9999, 'last'")
	w.expect(wake("many_9999", ptr("last")))
}
