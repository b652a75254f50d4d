package main

// listenhub demo: the whole picture on one machine in one command. A
// throwaway PostgreSQL (or --database-url), a hub, N worker processes that
// subscribe through it, and a notifier; one line a second with the number
// that matters (Postgres backends: 1 instead of N) and the ones that say it
// costs nothing (wakes/s, latency, evictions).
//
// The workers are real processes: this binary re-executed as the hidden
// `listenhub demo-worker`, each with a client.Failover, exactly what an
// application embeds. They report to the demo over their stdout, one line
// per 100 ms:
//
//	ready hub           subscribed (acked); "hub" or "local"
//	mode local          failed over to its own LISTEN connection
//	mode hub            failed back to the hub once it was back
//	l 412034 398201     receive latencies in nanoseconds since the last line
//
// The notifier's payload is "SEQ UNIXNANO": each worker computes the latency
// from the timestamp (same host, same clock).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/pgtest"
)

const (
	// demoReadyTimeout bounds the start of the cluster, the hub and the
	// workers' subscriptions.
	demoReadyTimeout = 2 * time.Minute
	// demoStopTimeout bounds each step of the teardown; past it the
	// workers are killed.
	demoStopTimeout = 10 * time.Second
	// demoTick is the notifier's pace: rate/100 NOTIFYs every 10 ms, in
	// one statement each, so that the rate is smooth at any --rate.
	demoTick = 10 * time.Millisecond
	// demoMaxBatch caps the NOTIFYs of one statement, so that a notifier
	// that fell behind catches up in steps.
	demoMaxBatch = 1000
	// workerReportInterval is how often a worker sends its latencies.
	workerReportInterval = 100 * time.Millisecond
)

// demoConfig is the command line of `listenhub demo`.
type demoConfig struct {
	databaseURL string
	workers     int
	rate        int
	duration    time.Duration
	relay       bool // demo --relay (demo_relay.go)
	writers     int
}

// runDemo is `listenhub demo`: parse, then run the demo (or the relay's,
// demo_relay.go) until Ctrl-C or --duration, and clean up.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, code := parseDemoFlags(args, stdout, stderr)
	if cfg == nil {
		return code
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// `listenhub demo | head -3`: once the reader is gone, a write to
	// stdout would kill the process with SIGPIPE, leaving the cluster and
	// the socket directory behind. With SIGPIPE caught the write fails
	// with EPIPE instead, and a failed write to stdout ends the run like
	// Ctrl-C does: through the cleanup.
	sigpipe := make(chan os.Signal, 1)
	signal.Notify(sigpipe, syscall.SIGPIPE)
	defer signal.Stop(sigpipe)
	ctx, gone := context.WithCancel(ctx)
	defer gone()
	out := &stopOnError{w: stdout, stop: gone}
	if cfg.relay {
		if err := runRelayDemo(ctx, *cfg, out, stderr); err != nil {
			fmt.Fprintf(stderr, "listenhub demo: %s\n", oneLine(err))
			return 1
		}
		return 0
	}
	d := &demo{cfg: *cfg, out: out, errw: stderr}
	err := d.run(ctx)
	if ctx.Err() != nil {
		// Ctrl-C (or the reader gone) during a step of the start: the
		// step failed because it was cancelled, which is no error.
		err = nil
	}
	if cerr := d.cleanup(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(stderr, "listenhub demo: %s\n", oneLine(err))
		return 1
	}
	return 0
}

// parseDemoFlags parses and checks demo's flags; nil and the exit status when
// they are wrong (or -h was asked).
func parseDemoFlags(args []string, stdout, stderr io.Writer) (*demoConfig, int) {
	fs := newFlagSet("demo")
	var cfg demoConfig
	fs.StringVar(&cfg.databaseURL, "database-url", "", "use this PostgreSQL server (default: start a throwaway cluster, removed on exit)")
	fs.IntVar(&cfg.workers, "workers", 8, "worker processes subscribing through the hub")
	fs.IntVar(&cfg.rate, "rate", 200, "NOTIFYs per second")
	fs.Var((*durationValue)(&cfg.duration), "duration", "stop after this long, counted from the first report (default: run until Ctrl-C)")
	fs.BoolVar(&cfg.relay, "relay", false, "instead: writers' commits/s with pgmq's per-row NOTIFY trigger and with the relay, side by side (needs wal_level=logical with --database-url)")
	fs.IntVar(&cfg.writers, "writers", 16, "with --relay: writer connections, one row per transaction")
	// The demo reads no environment variables: with DATABASE_URL set in
	// a shell, a demo must still not write to that database unasked.
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, "demo", false)
		}
		return nil, flagError(stderr, "demo", err)
	}
	if fs.NArg() > 0 {
		return nil, flagError(stderr, "demo", fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if err := positiveInt("workers", cfg.workers); err != nil {
		return nil, flagError(stderr, "demo", err)
	}
	if err := positiveInt("rate", cfg.rate); err != nil {
		return nil, flagError(stderr, "demo", err)
	}
	if cfg.duration < 0 {
		return nil, flagError(stderr, "demo", fmt.Errorf("--duration must not be negative (got %v)", cfg.duration))
	}
	if err := positiveInt("writers", cfg.writers); err != nil {
		return nil, flagError(stderr, "demo", err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if cfg.relay && set["rate"] {
		return nil, flagError(stderr, "demo", errors.New("--rate does not apply to --relay (the writers write as fast as they can)"))
	}
	if !cfg.relay && set["writers"] {
		return nil, flagError(stderr, "demo", errors.New("--writers needs --relay"))
	}
	return &cfg, 0
}

// stopOnError is the demo's stdout: the first failed write (the reader went
// away) calls stop, and later writes are dropped.
type stopOnError struct {
	w    io.Writer
	stop func()
	mu   sync.Mutex
	err  error
}

func (s *stopOnError) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.w.Write(p)
	if err != nil {
		s.err = err
		s.stop()
	}
	return n, err
}

// demo is one run of `listenhub demo`. Everything it starts is recorded as
// it starts, so that cleanup removes exactly that, whatever step failed.
type demo struct {
	cfg  demoConfig
	out  io.Writer
	errw io.Writer

	dir      string // temp dir holding the hub socket
	cluster  *pgtest.Cluster
	hub      *hub.Hub
	census   *pgx.Conn
	workers  []*demoWorker
	notifier *demoNotifier

	url    string           // of the database
	exited chan *demoWorker // a worker process ended

	hubApp, localApp string // application_names counted by the census
	channel          string

	lastNotified int64 // the notifier's count at the last report

	mu        sync.Mutex
	latencies []int64 // this second's, from all workers
}

// run sets the demo up, then reports every second until Ctrl-C or
// --duration.
func (d *demo) run(ctx context.Context) error {
	// Names carry our pid, so that two demos on one server (or a demo on
	// a server in use) count and hear only their own.
	pid := os.Getpid()
	d.hubApp = fmt.Sprintf("listenhub-demo-%d", pid)
	d.localApp = d.hubApp + "-local"
	d.channel = fmt.Sprintf("listenhub_demo_%d", pid)

	readyCtx, cancel := context.WithTimeout(ctx, demoReadyTimeout)
	defer cancel()

	sock, err := d.setUp(ctx, readyCtx)
	if sock == "" || err != nil {
		return err
	}
	if d.notifier, err = startNotifier(readyCtx, d.url, d.channel, d.cfg.rate); err != nil {
		return fmt.Errorf("notifier: %w", err)
	}
	plural := "es"
	if d.cfg.workers == 1 {
		plural = ""
	}
	fmt.Fprintf(d.out, "listenhub demo: hub on %s; %d worker process%s subscribed to %q; notifying %d/s. Ctrl-C to stop.\n",
		sock, d.cfg.workers, plural, d.channel, d.cfg.rate)
	return d.reportEverySecond(ctx)
}

// setUp starts the cluster (or connects to --database-url), the hub, the
// census connection and the worker processes, and waits, within readyCtx, for
// the workers to subscribe. It returns the hub's socket, or "" when
// ctx ended meanwhile (Ctrl-C: no error).
func (d *demo) setUp(ctx, readyCtx context.Context) (sock string, err error) {
	url, cluster, err := demoDatabase(readyCtx, d.out, d.cfg.databaseURL, pgtest.Options{}, "")
	if err != nil {
		return "", err
	}
	d.cluster, d.url = cluster, url

	dir, err := os.MkdirTemp("", "listenhub-demo-")
	if err != nil {
		return "", err
	}
	d.dir = dir
	sock = filepath.Join(dir, "hub.sock")
	h, err := hub.New(hub.Config{
		SocketPath:      sock,
		DatabaseURL:     url,
		ApplicationName: d.hubApp,
		Logger:          slog.New(slog.NewTextHandler(d.errw, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return "", err
	}
	if err := h.Start(readyCtx); err != nil {
		return "", err
	}
	d.hub = h

	if d.census, err = connectAs(readyCtx, url, "listenhub-demo-census"); err != nil {
		return "", fmt.Errorf("census connection: %w", err)
	}

	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find this binary to start the workers: %w", err)
	}
	ready := make(chan string, d.cfg.workers)
	d.exited = make(chan *demoWorker, d.cfg.workers)
	for i := range d.cfg.workers {
		w, err := startDemoWorker(exe, i, []string{
			"--socket", sock,
			"--channel", d.channel,
			"--application-name", d.localApp,
		}, url, d.errw, ready, d.exited, d.addLatencies)
		if err != nil {
			return "", err
		}
		d.workers = append(d.workers, w)
	}
	for range d.cfg.workers {
		select {
		case <-ready:
		case w := <-d.exited:
			return "", fmt.Errorf("worker %d exited before subscribing: %v", w.id, w.err)
		case <-readyCtx.Done():
			if ctx.Err() != nil {
				return "", nil // Ctrl-C during start-up
			}
			return "", fmt.Errorf("workers not subscribed within %v", demoReadyTimeout)
		}
	}

	return sock, nil
}

// reportEverySecond prints a report a second until ctx ends, the notifier
// fails or --duration has passed.
func (d *demo) reportEverySecond(ctx context.Context) error {
	// --duration counts from here, in report lines: start-up (initdb,
	// mostly) takes a few seconds that nobody asked to watch, and a run
	// of 3s prints 3 lines.
	reports := 0
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-d.notifier.failed:
			return fmt.Errorf("notifier: %w", err)
		case w := <-d.exited:
			fmt.Fprintf(d.out, "listenhub demo: worker %d (pid %d) exited: %v\n", w.id, w.cmd.Process.Pid, w.err)
		case now := <-tick.C:
			if err := d.report(ctx, now.Sub(start)); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			reports++
			if d.cfg.duration > 0 && time.Duration(reports)*time.Second >= d.cfg.duration {
				return nil
			}
		}
	}
}

// report prints one line: the census against what the workers would cost
// without the hub, and the last second's wakes and latencies.
func (d *demo) report(ctx context.Context, elapsed time.Duration) error {
	d.mu.Lock()
	lat := d.latencies
	d.latencies = nil
	d.mu.Unlock()
	slices.Sort(lat)

	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var hubBackends, localBackends int
	err := d.census.QueryRow(qctx, `SELECT
			count(*) FILTER (WHERE application_name = $1)::int,
			count(*) FILTER (WHERE application_name = $2)::int
		FROM pg_stat_activity WHERE backend_type = 'client backend'`,
		d.hubApp, d.localApp).Scan(&hubBackends, &localBackends)
	if err != nil {
		return fmt.Errorf("census: %w", err)
	}
	modes := map[string]int{}
	for _, w := range d.workers {
		modes[w.mode()]++
	}
	workers := fmt.Sprintf("%d hub/%d local", modes["hub"], modes["local"])
	if n := modes["exited"]; n > 0 {
		workers += fmt.Sprintf("/%d exited", n)
	}
	notified := d.notifier.sent.Load()
	fmt.Fprintf(d.out, "%5ds  backends %d (%d with direct LISTEN)  notify/s %d  wakes/s %d  p50 %s  p99 %s  evictions %d  workers %s\n",
		int(elapsed.Round(time.Second).Seconds()),
		hubBackends+localBackends, d.cfg.workers,
		notified-d.lastNotified, len(lat), percentile(lat, 50), percentile(lat, 99),
		d.hub.Stats().Evictions, workers)
	d.lastNotified = notified
	return nil
}

// percentile formats the p-th percentile of sorted latencies (ns).
func percentile(sorted []int64, p int) string {
	if len(sorted) == 0 {
		return "-"
	}
	i := (len(sorted)*p + 99) / 100 // nearest rank
	d := time.Duration(sorted[max(i-1, 0)])
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
	return d.Round(time.Millisecond).String()
}

func (d *demo) addLatencies(ns []int64) {
	d.mu.Lock()
	d.latencies = append(d.latencies, ns...)
	d.mu.Unlock()
}

// cleanup stops everything run started, newest first: notifier, workers,
// hub, connections, cluster, temp dir. It reports the first error and
// carries on with the rest.
func (d *demo) cleanup() error {
	var errs []error
	if d.notifier != nil {
		errs = append(errs, d.notifier.stop())
	}
	werrs := make([]error, len(d.workers))
	var wg sync.WaitGroup
	for i, w := range d.workers {
		wg.Go(func() { werrs[i] = w.stop() })
	}
	wg.Wait()
	errs = append(errs, werrs...)
	if d.hub != nil {
		ctx, cancel := context.WithTimeout(context.Background(), demoStopTimeout)
		errs = append(errs, d.hub.Stop(ctx))
		cancel()
	}
	if d.census != nil {
		ctx, cancel := context.WithTimeout(context.Background(), demoStopTimeout)
		d.census.Close(ctx)
		cancel()
	}
	err := errors.Join(append(errs, removeDemoFiles(d.cluster, d.dir))...)
	if d.hub != nil || d.cluster != nil {
		what := "workers and hub stopped"
		if d.cluster != nil && !d.cluster.External() {
			what += ", throwaway cluster removed"
		}
		if err == nil {
			fmt.Fprintf(d.out, "listenhub demo: %s\n", what)
		}
	}
	return err
}

// connectAs opens a pgx connection tagged with applicationName.
func connectAs(ctx context.Context, url, applicationName string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = applicationName
	return pgx.ConnectConfig(ctx, cfg)
}

// redactURL drops the password from a URL for printing.
func redactURL(u string) string {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return "the given server"
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// demoDatabase is the demo's server: url when given, else a throwaway
// cluster started with opts (what, when not empty, tells how it differs
// from a default one), announced on out either way. The caller owns the
// cluster (nil for a given url) and closes it.
func demoDatabase(ctx context.Context, out io.Writer, url string, opts pgtest.Options, what string) (string, *pgtest.Cluster, error) {
	if url != "" {
		fmt.Fprintf(out, "listenhub demo: using %s\n", redactURL(url))
		return url, nil, nil
	}
	c, err := pgtest.Start(ctx, opts)
	if err != nil {
		return "", nil, fmt.Errorf("start a throwaway PostgreSQL: %w (or pass --database-url)", err)
	}
	if c.External() {
		fmt.Fprintf(out, "listenhub demo: using %s from %s\n", redactURL(c.URL()), pgtest.EnvURL)
	} else {
		if what != "" {
			what += "; "
		}
		fmt.Fprintf(out, "listenhub demo: started a throwaway PostgreSQL on 127.0.0.1:%d in %s (%sremoved on exit)\n", c.Port(), c.Dir(), what)
	}
	return c.URL(), c, nil
}

// removeDemoFiles closes the demo's cluster (removing a throwaway one) and
// removes its temporary directory; either may be absent.
func removeDemoFiles(cluster *pgtest.Cluster, dir string) error {
	var errs []error
	if cluster != nil {
		errs = append(errs, cluster.Close())
	}
	if dir != "" {
		errs = append(errs, os.RemoveAll(dir))
	}
	return errors.Join(errs...)
}
