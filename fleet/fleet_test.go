package fleet_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/listenhub/listenhub/fleet"
	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
)

var db *pgtest.Cluster

func TestMain(m *testing.M) { pgtesting.Main(m, pgtest.Options{}, &db) }

const wait = 20 * time.Second

// startNATS runs a real nats-server in this process, on port (0: any).
func startNATS(t *testing.T, port int) *natsserver.Server {
	t.Helper()
	if port == 0 {
		port = -1
	}
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(wait) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s
}

func natsConn(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func subjects(t *testing.T) fleet.Subjects {
	s, err := fleet.NewSubjects("test", "app")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startBridge runs a bridge until the returned stop (or the test's end).
func startBridge(t *testing.T, url string) (*fleet.Bridge, func()) {
	t.Helper()
	cc, err := pgconn.ParseConfig(db.URL())
	if err != nil {
		t.Fatal(err)
	}
	b, err := fleet.NewBridge(fleet.BridgeOptions{ConnConfig: cc, NATS: natsConn(t, url), Subjects: subjects(t),
		HeartbeatInterval: 100 * time.Millisecond, StandbyRetry: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Run(ctx)
	}()
	stop := sync.OnceFunc(func() {
		cancel()
		<-done
	})
	t.Cleanup(stop)
	return b, stop
}

// startHub runs a hub fed by an Upstream on url; its socket path is
// returned.
func startHub(t *testing.T, url string) (string, *fleet.Upstream) {
	t.Helper()
	var up *fleet.Upstream
	nc := natsConn(t, url,
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) { d, _ := up.Watch(); d(c, err) }),
		nats.ReconnectHandler(func(c *nats.Conn) { _, r := up.Watch(); r(c) }))
	var err error
	up, err = fleet.NewUpstream(fleet.UpstreamOptions{NATS: nc, Subjects: subjects(t), HubID: t.Name(),
		HeartbeatTimeout: 400 * time.Millisecond, InterestTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "hub.sock")
	h, err := hub.New(hub.Config{SocketPath: sock, Upstream: up})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		h.Stop(ctx)
	})
	return sock, up
}

// worker is a raw protocol client of the hub.
type worker struct {
	t   *testing.T
	c   net.Conn
	dec frame.Decoder
	buf []byte
}

func dialWorker(t *testing.T, sock string) *worker {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &worker{t: t, c: c, buf: make([]byte, 64<<10)}
}

func (w *worker) next() frame.Message {
	w.t.Helper()
	for {
		m, ok, err := w.dec.Next()
		if err != nil {
			w.t.Fatal(err)
		}
		if ok {
			return m
		}
		w.c.SetReadDeadline(time.Now().Add(wait))
		n, err := w.c.Read(w.buf)
		if err != nil {
			w.t.Fatalf("read: %v", err)
		}
		w.dec.Feed(w.buf[:n])
	}
}

// until reads frames until one satisfies f, returning the ones before it.
func (w *worker) until(what string, f func(frame.Message) bool) []frame.Message {
	w.t.Helper()
	var seen []frame.Message
	for {
		m := w.next()
		if f(m) {
			return seen
		}
		seen = append(seen, m)
		if len(seen) > 100000 {
			w.t.Fatalf("no %s in %d frames", what, len(seen))
		}
	}
}

func (w *worker) subscribe(name string) {
	w.t.Helper()
	if _, err := w.c.Write(frame.AppendSub(nil, name)); err != nil {
		w.t.Fatal(err)
	}
	w.until("ack "+name, func(m frame.Message) bool {
		if m.Type == frame.TypeNack {
			w.t.Fatalf("nack %s: %s", m.Name, m.Error)
		}
		return m.Type == frame.TypeAck && m.Name == name
	})
}

func isWake(name, payload string) func(frame.Message) bool {
	return func(m frame.Message) bool {
		return m.Type == frame.TypeWake && m.Name == name && m.Payload == payload && m.HasPayload == (payload != "")
	}
}

func isStatus(healthy bool) func(frame.Message) bool {
	return func(m frame.Message) bool { return m.Type == frame.TypeStatus && m.Healthy == healthy }
}

func notify(t *testing.T, channel, payload string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload); err != nil {
		t.Fatal(err)
	}
}

// listeners counts the backends that LISTEN: the bridge's one, whatever
// the number of hubs.
func listeners(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'listenhub-bridge'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Three hubs on one NATS, one bridge: every worker's subscribe is acked
// only through the bridge's LISTEN, every NOTIFY reaches every worker once
// and in order, payload and all, and Postgres sees one listening backend.
func TestFleetDeliversThroughOneListen(t *testing.T) {
	ns := startNATS(t, 0)
	startBridge(t, ns.ClientURL())
	var ws []*worker
	for range 3 {
		sock, _ := startHub(t, ns.ClientURL())
		w := dialWorker(t, sock)
		w.until("healthy", isStatus(true))
		w.subscribe("orders")
		ws = append(ws, w)
	}
	const n = 200
	for i := range n {
		notify(t, "orders", fmt.Sprint("p", i))
	}
	notify(t, "orders", "")
	for wi, w := range ws {
		for i := range n {
			if m := w.next(); !isWake("orders", fmt.Sprint("p", i))(m) {
				t.Fatalf("worker %d: frame %d is %+v, want the wake p%d", wi, i, m, i)
			}
		}
		w.until("the durable wake", isWake("orders", ""))
	}
	if got := listeners(t); got != 1 {
		t.Fatalf("%d listening bridge backends for 3 hubs, want 1", got)
	}
}

// The active bridge stops (its lease ends); the standby takes over within
// the heartbeat timeout. Every worker hears healthy:false, then true and a
// durable wake per channel, and NOTIFYs flow through the new bridge.
func TestFleetBridgeTakeover(t *testing.T) {
	ns := startNATS(t, 0)
	a, stopA := startBridge(t, ns.ClientURL())
	deadline := time.Now().Add(wait)
	for !a.Active() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	b, _ := startBridge(t, ns.ClientURL())
	sock, up := startHub(t, ns.ClientURL())
	w := dialWorker(t, sock)
	w.until("healthy", isStatus(true))
	w.subscribe("jobs")
	notify(t, "jobs", "before")
	w.until("the wake before", isWake("jobs", "before"))
	if b.Active() {
		t.Fatal("two bridges active")
	}
	start := time.Now()
	stopA()
	w.until("healthy:false", isStatus(false))
	w.until("healthy:true", isStatus(true))
	w.until("the resync's durable wake", isWake("jobs", ""))
	took := time.Since(start)
	if !b.Active() {
		t.Fatal("the standby did not take over")
	}
	notify(t, "jobs", "after")
	w.until("the wake after", isWake("jobs", "after"))
	t.Logf("takeover: workers healthy again %v after the active bridge stopped; gaps seen %d", took.Round(time.Millisecond), up.Gaps())
}

// A message on the subjects that the bridge did not write (no epoch or
// sequence) is dropped and counted, never delivered.
func TestFleetForeignMessagesDropped(t *testing.T) {
	ns := startNATS(t, 0)
	startBridge(t, ns.ClientURL())
	sock, up := startHub(t, ns.ClientURL())
	w := dialWorker(t, sock)
	w.until("healthy", isStatus(true))
	w.subscribe("chat")
	nc := natsConn(t, ns.ClientURL())
	s := subjects(t)
	nc.Publish(s.Notify("chat"), []byte("forged"))
	m := nats.NewMsg(s.Notify("chat"))
	m.Header.Set("Lh-Epoch", "x")
	m.Header.Set("Lh-Seq", "1")
	m.Data = []byte("forged too")
	nc.PublishMsg(m)
	nc.Flush()
	notify(t, "chat", "real")
	for _, f := range w.until("the real wake", isWake("chat", "real")) {
		if f.Type == frame.TypeWake {
			t.Fatalf("delivered %+v", f)
		}
	}
	if up.Malformed() != 2 {
		t.Fatalf("malformed %d, want 2", up.Malformed())
	}
}

// NATS down entirely: the workers hear healthy:false (the hub says why in
// its log); when it is back, healthy:true and a durable wake per channel,
// and NOTIFYs flow again.
func TestFleetNATSDownAndBack(t *testing.T) {
	ns := startNATS(t, 0)
	port := ns.Addr().(*net.TCPAddr).Port
	startBridge(t, ns.ClientURL())
	sock, up := startHub(t, ns.ClientURL())
	w := dialWorker(t, sock)
	w.until("healthy", isStatus(true))
	w.subscribe("feed")
	ns.Shutdown()
	w.until("healthy:false", isStatus(false))
	if r := up.Reason(); r == "" {
		t.Fatal("unhealthy without a reason")
	}
	t.Logf("while NATS is down: %s", up.Reason())
	startNATS(t, port)
	w.until("healthy:true", isStatus(true))
	w.until("the resync's durable wake", isWake("feed", ""))
	notify(t, "feed", "back")
	w.until("the wake after NATS returned", isWake("feed", "back"))
}
