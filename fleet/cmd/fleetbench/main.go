// Command fleetbench measures what a fleet's LISTEN costs the primary: H
// hosts each LISTENing directly (H listening backends, as H hubs with a
// connection each) against H hubs fed through one bridge over NATS (one
// listening backend). One writer commits `SELECT pg_notify('bench', ts)`
// as fast as it can for --duration per arm and H; it reports, per H and
// arm, the server's CPU per NOTIFY (every process of a throwaway cluster,
// from /proc), NOTIFY commits/s, the wake latency p50/p99 at the
// receivers, and the deliveries lost.
//
//	go run ./cmd/fleetbench [--hosts 1,16,64,256] [--duration 5s]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/listenhub/listenhub/fleet"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/listener"
)

func main() {
	hostsFlag := flag.String("hosts", "1,16,64,256", "host counts (H)")
	duration := flag.Duration("duration", 5*time.Second, "how long the writer runs per arm and H")
	flag.Parse()
	log.SetFlags(0)
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	var hosts []int
	for _, s := range strings.Split(*hostsFlag, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			log.Fatalf("--hosts: %q", s)
		}
		hosts = append(hosts, n)
	}
	ctx := context.Background()
	db, err := pgtest.Start(ctx, pgtest.Options{MaxConnections: slices.Max(hosts) + 50})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		log.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		log.Fatal("nats-server not ready")
	}
	defer ns.Shutdown()

	host, _ := os.Hostname()
	fmt.Printf("fleetbench: %s, %d CPUs, PostgreSQL %s, %s, one writer, %v per arm\n",
		host, runtime.NumCPU(), db.Version(), time.Now().UTC().Format("2006-01-02"), *duration)
	fmt.Printf("%6s %-7s %14s %12s %10s %10s %6s\n", "H", "arm", "server CPU/op", "commits/s", "wake p50", "wake p99", "lost")
	for _, h := range hosts {
		for _, arm := range []string{"direct", "nats"} {
			r, err := run(ctx, db, ns.ClientURL(), arm, h, *duration)
			if err != nil {
				log.Fatalf("H=%d %s: %v", h, arm, err)
			}
			fmt.Printf("%6d %-7s %12.1fµs %12.0f %10s %10s %6d\n", h, arm, r.cpuPerOp, r.rate,
				r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.lost)
		}
	}
}

type result struct {
	cpuPerOp float64 // µs of server CPU per NOTIFY
	rate     float64
	p50, p99 time.Duration
	lost     int64
}

// receivers count and time the wakes of H hosts.
type receivers struct {
	mu   sync.Mutex
	lat  []time.Duration
	got  atomic.Int64
	want atomic.Int64
}

func (r *receivers) wake(payload string) {
	ns, err := strconv.ParseInt(payload, 10, 64)
	if err != nil {
		return
	}
	d := time.Since(time.Unix(0, ns))
	r.got.Add(1)
	r.mu.Lock()
	if len(r.lat) < 1<<22 {
		r.lat = append(r.lat, d)
	}
	r.mu.Unlock()
}

func run(ctx context.Context, db *pgtest.Cluster, natsURL, arm string, h int, d time.Duration) (result, error) {
	cc, err := pgconn.ParseConfig(db.URL())
	if err != nil {
		return result{}, err
	}
	rec := &receivers{}
	var closers []func()
	defer func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}()
	var setUp func(context.Context, *pgconn.Config, string, int, *receivers) ([]func(), error)
	switch arm {
	case "direct":
		setUp = startDirect
	case "nats":
		setUp = startNATS
	}
	cs, err := setUp(ctx, cc, natsURL, h, rec)
	closers = append(closers, cs...)
	if err != nil {
		return result{}, err
	}
	conn, err := pgx.Connect(ctx, db.URL())
	if err != nil {
		return result{}, err
	}
	defer conn.Close(ctx)
	before, err := serverCPU(db.PID())
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	var sent int64
	for time.Since(start) < d {
		if _, err := conn.Exec(ctx, "SELECT pg_notify('bench', $1)", strconv.FormatInt(time.Now().UnixNano(), 10)); err != nil {
			return result{}, err
		}
		sent++
	}
	elapsed := time.Since(start)
	rec.want.Store(sent * int64(h))
	deadline := time.Now().Add(30 * time.Second)
	for rec.got.Load() < rec.want.Load() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	after, err := serverCPU(db.PID())
	if err != nil {
		return result{}, err
	}
	rec.mu.Lock()
	lat := slices.Clone(rec.lat)
	rec.mu.Unlock()
	slices.Sort(lat)
	q := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	return result{
		cpuPerOp: float64(after-before) / float64(sent),
		rate:     float64(sent) / elapsed.Seconds(),
		p50:      q(0.50),
		p99:      q(0.99),
		lost:     rec.want.Load() - rec.got.Load(),
	}, nil
}

// startDirect opens h listening backends: what h hubs with a connection
// each cost the primary.
func startDirect(ctx context.Context, cc *pgconn.Config, _ string, h int, rec *receivers) (closers []func(), err error) {
	// H listening backends: what H hubs with a connection each cost.
	for range h {
		l, err := listener.Connect(ctx, listener.Config{ConnConfig: cc.Copy(),
			OnNotification: func(_, p string) { rec.wake(p) }})
		if err != nil {
			return closers, err
		}
		if err := l.Listen(ctx, "bench"); err != nil {
			return closers, err
		}
		closers = append(closers, func() { l.Close() })
	}
	return closers, nil
}

// startNATS runs one bridge and h hubs fed by it over NATS, a worker on
// each.
func startNATS(ctx context.Context, cc *pgconn.Config, natsURL string, h int, rec *receivers) (closers []func(), err error) {
	subj, _ := fleet.NewSubjects("bench", "db")
	bnc, err := nats.Connect(natsURL)
	if err != nil {
		return closers, err
	}
	closers = append(closers, bnc.Close)
	b, err := fleet.NewBridge(fleet.BridgeOptions{ConnConfig: cc, NATS: bnc, Subjects: subj})
	if err != nil {
		return closers, err
	}
	bctx, cancel := context.WithCancel(ctx)
	bdone := make(chan struct{})
	go func() { defer close(bdone); b.Run(bctx) }()
	closers = append(closers, func() { cancel(); <-bdone })
	for !b.Active() {
		time.Sleep(10 * time.Millisecond)
	}
	dir, _ := os.MkdirTemp("", "fleetbench")
	closers = append(closers, func() { os.RemoveAll(dir) })
	for i := range h {
		nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
		if err != nil {
			return closers, err
		}
		closers = append(closers, nc.Close)
		up, err := fleet.NewUpstream(fleet.UpstreamOptions{NATS: nc, Subjects: subj, HubID: fmt.Sprint("hub", i)})
		if err != nil {
			return closers, err
		}
		hb, err := hub.New(hub.Config{SocketPath: filepath.Join(dir, fmt.Sprint(i)), Upstream: up,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return closers, err
		}
		if err := hb.Start(ctx); err != nil {
			return closers, err
		}
		closers = append(closers, func() {
			sctx, c := context.WithTimeout(ctx, 10*time.Second)
			defer c()
			hb.Stop(sctx)
		})
		w, err := dialWorker(filepath.Join(dir, fmt.Sprint(i)), "bench", rec.wake)
		if err != nil {
			return closers, err
		}
		closers = append(closers, w)
	}
	return closers, nil
}
