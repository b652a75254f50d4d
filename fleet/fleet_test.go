package fleet_test

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
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
	"github.com/listenhub/listenhub/monitor"
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
func startHub(t *testing.T, url string, opts ...nats.Option) (string, *fleet.Upstream, *hub.Hub) {
	t.Helper()
	var up *fleet.Upstream
	nc := natsConn(t, url, append(opts,
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) { d, _ := up.Watch(); d(c, err) }),
		nats.ReconnectHandler(func(c *nats.Conn) { _, r := up.Watch(); r(c) }))...)
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
	return sock, up, h
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
	deadline := time.Now().Add(wait)
	for {
		m := w.next()
		if f(m) {
			return seen
		}
		seen = append(seen, m)
		if time.Now().After(deadline) {
			w.t.Fatalf("no %s within %v (%d other frames)", what, wait, len(seen))
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
		sock, _, _ := startHub(t, ns.ClientURL())
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
			m := w.next()
			for m.Type == frame.TypeStatus && m.Healthy { // the hub's periodic re-send
				m = w.next()
			}
			if !isWake("orders", fmt.Sprint("p", i))(m) {
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
	sock, up, _ := startHub(t, ns.ClientURL())
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
	sock, up, _ := startHub(t, ns.ClientURL())
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
	sock, up, h := startHub(t, ns.ClientURL())
	w := dialWorker(t, sock)
	w.until("healthy", isStatus(true))
	w.subscribe("feed")
	ns.Shutdown()
	w.until("healthy:false", isStatus(false))
	if r := up.Reason(); r == "" {
		t.Fatal("unhealthy without a reason")
	}
	rec := httptest.NewRecorder()
	monitor.Handler(h, monitor.Options{}).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "upstream unhealthy: NATS disconnected") {
		t.Fatalf("/healthz: %d %q", rec.Code, rec.Body.String())
	}
	t.Logf("while NATS is down: %s", up.Reason())
	startNATS(t, port)
	w.until("healthy:true", isStatus(true))
	w.until("the resync's durable wake", isWake("feed", ""))
	notify(t, "feed", "back")
	w.until("the wake after NATS returned", isWake("feed", "back"))
}

// startCluster runs n nats-servers routed into one cluster on loopback.
func startCluster(t *testing.T, n int) []*natsserver.Server {
	t.Helper()
	var servers []*natsserver.Server
	var routes []*url.URL
	for i := range n {
		opts := &natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, ServerName: fmt.Sprint("n", i),
			Cluster: natsserver.ClusterOpts{Name: "fleet", Host: "127.0.0.1", Port: -1}, Routes: routes}
		s, err := natsserver.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(wait) {
			t.Fatal("nats-server not ready")
		}
		t.Cleanup(s.Shutdown)
		servers = append(servers, s)
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: s.ClusterAddr().String()})
	}
	deadline := time.Now().Add(wait)
	for _, s := range servers {
		for s.NumRoutes() < n-1 {
			if time.Now().After(deadline) {
				t.Fatalf("server %s has %d routes, want %d", s.Name(), s.NumRoutes(), n-1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return servers
}

// Kill the NATS node a hub is connected to, in a cluster of three: the hub
// moves to another node, says healthy:false, then true with a durable wake
// per channel (what was published meanwhile may be gone), and NOTIFYs flow
// through the node it moved to.
func TestFleetClusterNodeLost(t *testing.T) {
	ns := startCluster(t, 3)
	startBridge(t, ns[0].ClientURL())
	all := ns[1].ClientURL() + "," + ns[2].ClientURL() + "," + ns[0].ClientURL()
	sock, up, _ := startHub(t, all, nats.DontRandomize()) // on ns[1], the first
	w := dialWorker(t, sock)
	w.until("healthy", isStatus(true))
	w.subscribe("news")
	notify(t, "news", "one")
	w.until("the first wake", isWake("news", "one"))
	ns[1].Shutdown() // the hub's node (first in its list)
	w.until("healthy:false", isStatus(false))
	w.until("healthy:true", isStatus(true))
	w.until("the resync's durable wake", isWake("news", ""))
	notify(t, "news", "two")
	w.until("the wake through another node", isWake("news", "two"))
	if up.Gaps() == 0 {
		t.Fatal("no gap counted for the node lost")
	}
}

// Interest is leased: a dead host's channel is UNLISTENed once its lease
// runs out; a live hub whose interest the bridge dropped finds out at its
// next renewal, and resyncs rather than miss what was published meanwhile.
func TestFleetInterestLease(t *testing.T) {
	ns := startNATS(t, 0)
	b, _ := startBridge(t, ns.ClientURL())
	sock, up, _ := startHub(t, ns.ClientURL())
	w := dialWorker(t, sock)
	w.until("healthy", isStatus(true))
	w.subscribe("kept")
	nc := natsConn(t, ns.ClientURL())
	s := subjects(t)
	ask := func(req string) {
		t.Helper()
		if _, err := nc.Request(s.Interest(), []byte(req), wait); err != nil {
			t.Fatal(err)
		}
	}
	ask(`{"hub":"ghost","listen":["ghost-ch"],"ttl_ms":300}`)
	if n := b.Channels()["ghost-ch"]; n != 1 {
		t.Fatalf("ghost-ch held by %d hubs, want 1", n)
	}
	deadline := time.Now().Add(wait)
	for b.Channels()["ghost-ch"] != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a dead hub's interest never expired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	gaps := up.Gaps()
	ask(fmt.Sprintf(`{"hub":%q,"unlisten":["kept"],"ttl_ms":1000}`, t.Name())) // as if its lease ran out
	if n := b.Channels()["kept"]; n != 0 {
		t.Fatalf("kept still held by %d hubs", n)
	}
	w.until("healthy:false", isStatus(false))
	w.until("healthy:true", isStatus(true))
	w.until("the resync's durable wake", isWake("kept", ""))
	if n := b.Channels()["kept"]; n != 1 || up.Gaps() <= gaps {
		t.Fatalf("after the renewal: kept held by %d hubs, gaps %d (were %d)", n, up.Gaps(), gaps)
	}
	notify(t, "kept", "again")
	w.until("the wake after the renewal", isWake("kept", "again"))
}

// A subscribe before any bridge is active waits for one (as a hub's waits
// for Postgres), and is acked once the bridge LISTENs.
func TestFleetSubscribeBeforeTheBridge(t *testing.T) {
	ns := startNATS(t, 0)
	sock, _, _ := startHub(t, ns.ClientURL())
	w := dialWorker(t, sock)
	if _, err := w.c.Write(frame.AppendSub(nil, "early")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // no bridge for a while: the sub must not be refused meanwhile
	startBridge(t, ns.ClientURL())
	for _, m := range w.until("ack early", func(m frame.Message) bool { return m.Type == frame.TypeAck && m.Name == "early" }) {
		if m.Type == frame.TypeNack {
			t.Fatalf("refused before the bridge came: %+v", m)
		}
	}
	notify(t, "early", "x")
	w.until("the wake", isWake("early", "x"))
}
