package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/listenhub/listenhub/fleet"
	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/pgtest"
)

// runDemo starts a throwaway cluster (or uses --database-url), a local
// nats-server, a bridge and --hubs hubs fed through NATS, a worker on each
// and a notifier, and prints a line a second: the fleet's listening
// backends (1, where direct LISTEN would hold one per hub), NOTIFYs and
// wakes per second, the wake latency.
func runDemo(ctx context.Context, out io.Writer, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	hubs := fs.Int("hubs", 8, "hubs fed through NATS (as many hosts)")
	rate := fs.Int("rate", 200, "NOTIFYs per second")
	duration := fs.Duration("duration", 0, "stop after this long (0: at Ctrl-C)")
	dbURL := fs.String("database-url", "", "a database to use instead of a throwaway cluster")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *hubs < 1 || *rate < 1 {
		return usageError{errors.New("demo: --hubs and --rate must be positive")}
	}
	quiet := slog.New(slog.DiscardHandler)
	url := *dbURL
	if url == "" {
		fmt.Fprintln(out, "starting a throwaway PostgreSQL cluster…")
		db, err := pgtest.Start(ctx, pgtest.Options{})
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		defer db.Close()
		url = db.URL()
	}
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		return err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("demo: nats-server did not start")
	}
	defer ns.Shutdown()
	cc, err := pgconn.ParseConfig(url)
	if err != nil {
		return err
	}
	subj, _ := fleet.NewSubjects("demo", "app")
	bnc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return err
	}
	defer bnc.Close()
	b, err := fleet.NewBridge(fleet.BridgeOptions{ConnConfig: cc, NATS: bnc, Subjects: subj, Logger: quiet})
	if err != nil {
		return err
	}
	bctx, stopBridge := context.WithCancel(context.Background())
	bdone := make(chan struct{})
	go func() { defer close(bdone); b.Run(bctx) }()
	defer func() { stopBridge(); <-bdone }()

	dir, err := os.MkdirTemp("", "listenhub-fleet-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var lat latencies
	var healthy atomic.Int32
	stopHubs, err := startHubs(ctx, *hubs, ns.ClientURL(), subj, dir, &lat, &healthy)
	defer stopHubs()
	if err != nil {
		return err
	}
	pg, err := pgx.Connect(ctx, url) // the notifier's
	if err != nil {
		return err
	}
	defer pg.Close(context.Background())
	probe, err := pgx.Connect(ctx, url) // the report's
	if err != nil {
		return err
	}
	defer probe.Close(context.Background())
	var sent atomic.Int64
	go func() {
		tick := time.NewTicker(time.Second / time.Duration(*rate))
		defer tick.Stop()
		for ctx.Err() == nil {
			<-tick.C
			if _, err := pg.Exec(ctx, "SELECT pg_notify('demo', $1)", strconv.FormatInt(time.Now().UnixNano(), 10)); err == nil {
				sent.Add(1)
			}
		}
	}()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	fmt.Fprintf(out, "%d hubs fed through NATS by one bridge; Ctrl-C stops\n", *hubs)
	for !b.Active() && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	return reportEverySecond(ctx, out, probe, *hubs, &sent, &lat, &healthy)
}

// reportEverySecond prints the demo's line every second until ctx ends.
func reportEverySecond(ctx context.Context, out io.Writer, probe *pgx.Conn, hubs int, sent *atomic.Int64, lat *latencies, healthy *atomic.Int32) error {
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastSent, lastWakes int64
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		backends, err := listening(qctx, probe)
		cancel()
		if err != nil {
			return fmt.Errorf("demo: counting the listening backends: %w", err)
		}
		s, w, p50, p99 := sent.Load(), lat.count(), lat.quantile(0.5), lat.quantile(0.99)
		fmt.Fprintf(out, "%5.0fs  backends %d (%d with direct LISTEN)  notify/s %d  wakes/s %d  p50 %v  p99 %v  hubs healthy %d/%d\n",
			time.Since(start).Seconds(), backends, hubs, s-lastSent, w-lastWakes,
			p50.Round(time.Microsecond), p99.Round(time.Microsecond), healthy.Load(), hubs)
		lastSent, lastWakes = s, w
	}
}

// listening counts the backends that LISTEN for the fleet.
func listening(ctx context.Context, pg *pgx.Conn) (int, error) {
	var n int
	err := pg.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'listenhub-bridge'").Scan(&n)
	return n, err
}

// readWakes times every payload wake of a worker's connection.
func readWakes(c net.Conn, lat *latencies, healthy *atomic.Int32) {
	var dec frame.Decoder
	buf := make([]byte, 64<<10)
	up := false
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		dec.Feed(buf[:n])
		for m, ok, _ := dec.Next(); ok; m, ok, _ = dec.Next() {
			switch {
			case m.Type == frame.TypeStatus && m.Healthy != up:
				up = m.Healthy
				if up {
					healthy.Add(1)
				} else {
					healthy.Add(-1)
				}
			case m.Type == frame.TypeWake && m.HasPayload:
				if ns, err := strconv.ParseInt(m.Payload, 10, 64); err == nil {
					lat.add(time.Since(time.Unix(0, ns)))
				}
			}
		}
	}
}

// latencies keeps the last second's worth of wake latencies.
type latencies struct {
	mu   sync.Mutex
	all  int64
	last []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.all++
	l.last = append(l.last, d)
	if len(l.last) > 100000 {
		l.last = l.last[len(l.last)-50000:]
	}
	l.mu.Unlock()
}

func (l *latencies) count() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all
}

func (l *latencies) quantile(q float64) time.Duration {
	l.mu.Lock()
	s := slices.Clone(l.last)
	l.mu.Unlock()
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// startHubs starts n hubs fed through NATS, each with a worker subscribed
// to "demo" whose wakes lat times; stop undoes what was started.
func startHubs(ctx context.Context, n int, natsURL string, subj fleet.Subjects, dir string, lat *latencies, healthy *atomic.Int32) (stop func(), err error) {
	var closers []func()
	stop = func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}
	quiet := slog.New(slog.DiscardHandler)
	for i := range n {
		nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
		if err != nil {
			return stop, err
		}
		closers = append(closers, nc.Close)
		up, err := fleet.NewUpstream(fleet.UpstreamOptions{NATS: nc, Subjects: subj, HubID: fmt.Sprint("host", i), Logger: quiet})
		if err != nil {
			return stop, err
		}
		sock := filepath.Join(dir, fmt.Sprint(i))
		h, err := hub.New(hub.Config{SocketPath: sock, Upstream: up, Logger: quiet})
		if err != nil {
			return stop, err
		}
		if err := h.Start(ctx); err != nil {
			return stop, err
		}
		closers = append(closers, func() {
			sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
			defer c()
			h.Stop(sctx)
		})
		c, err := net.Dial("unix", sock)
		if err != nil {
			return stop, err
		}
		closers = append(closers, func() { c.Close() })
		go readWakes(c, lat, healthy)
		c.Write(frame.AppendSub(nil, "demo"))
	}
	return stop, nil
}
