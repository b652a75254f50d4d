package main

// listenhub demo --relay: what a NOTIFY trigger costs the writers, and what
// the relay gives back, side by side on one machine. A throwaway PostgreSQL
// with wal_level=logical and fsync on (or --database-url), two sets of
// queue tables, a hub with --workers clients subscribed to every table's
// channel, and --writers connections inserting one row per transaction. The
// writers alternate each second between the tables that carry pgmq's
// per-row NOTIFY trigger and the tables that the relay (in this process,
// on a temporary slot) wakes from the WAL; each line gives the commits/s of
// the last second of each, and the wakes the workers received.
//
// The workers here are hub clients in this process: what is measured is
// the writers, not the fanout (plain `listenhub demo` shows that with
// worker processes).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/client"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/relay"
)

const (
	// relayDemoQueues is the number of queue tables in each set.
	relayDemoQueues = 8
	// relayDemoPhase is how long the writers write to one set before
	// they switch to the other.
	relayDemoPhase = time.Second
)

// relayDemoSources are the two sets, in the order the writers visit them.
var relayDemoSources = [2]string{"trigger", "relay"}

// relayDemo is one run of `listenhub demo --relay`. Like demo, it records
// everything as it starts it, so that cleanup removes exactly that.
type relayDemo struct {
	cfg  demoConfig
	out  io.Writer
	errw io.Writer

	dir     string
	cluster *pgtest.Cluster
	url     string    // of the database
	admin   *pgx.Conn // creates and drops the schema
	schema  string    // also the publication's and the slot's name
	created bool      // the schema and publication exist
	hub     *hub.Hub
	relay   *relay.Relay
	relayC  context.CancelFunc
	relayD  chan struct{} // closed when Run has returned, relayE set
	relayE  error
	clients []*client.Conn
	writers []*pgx.Conn
	wcancel context.CancelFunc
	wdone   sync.WaitGroup
	werr    chan error

	phase   atomic.Int32    // index into relayDemoSources
	commits [2]atomic.Int64 // by source
	wakes   [2]atomic.Int64 // by source, all workers together
}

func runRelayDemo(ctx context.Context, cfg demoConfig, stdout, stderr io.Writer) error {
	d := &relayDemo{cfg: cfg, out: stdout, errw: stderr}
	err := d.run(ctx)
	if cerr := d.cleanup(); err == nil {
		err = cerr
	}
	return err
}

// run sets the demo up, then prints a line per pair of phases until ctx
// ends or --duration has passed.
func (d *relayDemo) run(ctx context.Context) error {
	readyCtx, cancel := context.WithTimeout(ctx, demoReadyTimeout)
	defer cancel()
	sock, err := d.setUp(readyCtx)
	if err != nil {
		return err
	}
	if stopped, err := d.waitRelay(ctx, readyCtx); stopped || err != nil {
		return err
	}
	if err := d.startWriters(readyCtx); err != nil {
		return err
	}
	plural := func(n int, what string) string {
		if n == 1 {
			return "1 " + what
		}
		return fmt.Sprintf("%d %ss", n, what)
	}
	fmt.Fprintf(d.out, "listenhub demo: hub on %s; %s subscribed to %d queues; %s insert one row per transaction, each second in turn into queues with pgmq's per-row NOTIFY trigger and into queues the relay wakes from the WAL. Ctrl-C to stop.\n",
		sock, plural(d.cfg.workers, "worker"), 2*relayDemoQueues, plural(d.cfg.writers, "writer"))

	// One line per pair of phases; --duration counts seconds of writing.
	start := time.Now()
	var total [2]int64
	var phases int
	tick := time.NewTicker(relayDemoPhase)
	defer tick.Stop()
	var last [2]int64
	var lastWakes [2]int64
	var rate, wakeRate [2]int64
	for {
		select {
		case <-ctx.Done():
			d.summary(total, phases)
			return nil
		case err := <-d.werr:
			return fmt.Errorf("writer: %w", err)
		case <-d.relayD:
			return fmt.Errorf("relay stopped: %v", d.relayE)
		case now := <-tick.C:
			src := d.phase.Load()
			d.phase.Store(1 - src)
			c, w := d.commits[src].Load(), d.wakes[src].Load()
			rate[src], wakeRate[src] = c-last[src], w-lastWakes[src]
			last[src], lastWakes[src] = c, w
			total[src] += rate[src]
			phases++
			if src == 1 {
				ratio := "-"
				if rate[0] > 0 {
					ratio = fmt.Sprintf("%.1f×", float64(rate[1])/float64(rate[0]))
				}
				fmt.Fprintf(d.out, "%5ds  commits/s  per-row trigger %d  relay %d (%s)  wakes/s per worker  trigger %d  relay %d\n",
					int(now.Sub(start).Round(time.Second).Seconds()), rate[0], rate[1], ratio,
					wakeRate[0]/int64(d.cfg.workers), wakeRate[1]/int64(d.cfg.workers))
				if d.cfg.duration > 0 && time.Duration(phases)*relayDemoPhase >= d.cfg.duration {
					d.summary(total, phases)
					return nil
				}
			}
		}
	}
}

// setUp starts the cluster (or connects to --database-url), the tables,
// the relay, the hub and its workers; it returns the hub's socket.
func (d *relayDemo) setUp(ctx context.Context) (sock string, err error) {
	pid := os.Getpid()
	d.schema = fmt.Sprintf("listenhub_demo_%d", pid)
	// fsync on: the trigger's cost is a commit queue behind a WAL flush,
	// which a cluster without fsync hides.
	url, cluster, err := demoDatabase(ctx, d.out, d.cfg.databaseURL,
		pgtest.Options{Logical: true, Settings: map[string]string{"fsync": "on"}}, "wal_level=logical, fsync on")
	if err != nil {
		return "", err
	}
	d.cluster, d.url = cluster, url

	if d.admin, err = connectAs(ctx, url, d.schema+"-admin"); err != nil {
		return "", err
	}
	if err := d.createTables(ctx); err != nil {
		return "", err
	}

	// The relay, on a temporary slot: nothing is left on the server if
	// the demo dies.
	cc, err := pgconn.ParseConfig(url)
	if err != nil {
		return "", err
	}
	warn := slog.New(slog.NewTextHandler(d.errw, &slog.HandlerOptions{Level: slog.LevelWarn}))
	d.relay, err = relay.New(relay.Options{ConnConfig: cc, ApplicationName: d.schema + "-relay", Publication: d.schema,
		Slot: d.schema, TemporarySlot: true, Window: relay.DefaultOptions().Window, Logger: warn})
	if err != nil {
		return "", err
	}
	rctx, rcancel := context.WithCancel(context.Background())
	d.relayC, d.relayD = rcancel, make(chan struct{})
	go func() { d.relayE = d.relay.Run(rctx); close(d.relayD) }()

	d.dir, err = os.MkdirTemp("", "listenhub-demo-")
	if err != nil {
		return "", err
	}
	sock = filepath.Join(d.dir, "hub.sock")
	h, err := hub.New(hub.Config{SocketPath: sock, DatabaseURL: url, ApplicationName: d.schema + "-hub", Logger: warn})
	if err != nil {
		return "", err
	}
	if err := h.Start(ctx); err != nil {
		return "", err
	}
	d.hub = h
	for range d.cfg.workers {
		c, err := client.Dial(ctx, client.Options{SocketPath: sock}, client.Handlers{OnWake: d.onWake})
		if err != nil {
			return "", err
		}
		d.clients = append(d.clients, c)
		for _, src := range relayDemoSources {
			for i := range relayDemoQueues {
				if err := c.Subscribe(ctx, d.channel(src, i)); err != nil {
					return "", fmt.Errorf("subscribe: %w", err)
				}
			}
		}
	}
	return sock, nil
}

// waitRelay waits for the relay to stream, which it does once its slot
// exists; stopped when ctx ended meanwhile (Ctrl-C: no error).
func (d *relayDemo) waitRelay(ctx, readyCtx context.Context) (stopped bool, err error) {
	for d.relay.Stats().State != relay.StateActive {
		select {
		case <-d.relayD:
			return false, fmt.Errorf("relay: %w", d.relayE) // a misconfiguration: one line that names the fix
		case <-readyCtx.Done():
			if ctx.Err() != nil {
				return true, nil
			}
			return false, fmt.Errorf("the relay did not start streaming within %v", demoReadyTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return false, nil
}

// startWriters starts the writers, each on a connection of its own.
func (d *relayDemo) startWriters(ctx context.Context) error {
	wctx, wcancel := context.WithCancel(context.Background())
	d.wcancel, d.werr = wcancel, make(chan error, d.cfg.writers)
	for i := range d.cfg.writers {
		conn, err := connectAs(ctx, d.url, d.schema+"-writer")
		if err != nil {
			return fmt.Errorf("writer: %w", err)
		}
		d.writers = append(d.writers, conn)
		d.wdone.Go(func() { d.write(wctx, conn, i) })
	}
	return nil
}

// summary prints the averages over the whole run.
func (d *relayDemo) summary(total [2]int64, phases int) {
	n := int64(phases / 2)
	if n == 0 {
		return
	}
	t, r := total[0]/n, total[1]/n
	ratio := "-"
	if t > 0 {
		ratio = fmt.Sprintf("%.1f×", float64(r)/float64(t))
	}
	w := fmt.Sprintf("%d writers", d.cfg.writers)
	if d.cfg.writers == 1 {
		w = "1 writer"
	}
	fmt.Fprintf(d.out, "listenhub demo: %s, %d s each: per-row trigger %d commits/s, relay %d commits/s (%s)\n", w, n, t, r, ratio)
}

// write is one writer: one row per transaction, into a random queue of
// the current phase's set, until ctx is done.
func (d *relayDemo) write(ctx context.Context, conn *pgx.Conn, i int) {
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(i)))
	var sqls [2][relayDemoQueues]string
	for s, src := range relayDemoSources {
		for q := range relayDemoQueues {
			sqls[s][q] = fmt.Sprintf(`INSERT INTO %s.q_%s_%d (vt, message) VALUES (clock_timestamp(), '{"hello":"world"}')`, d.schema, src, q)
		}
	}
	for ctx.Err() == nil {
		src := d.phase.Load()
		if _, err := conn.Exec(ctx, sqls[src][rng.IntN(relayDemoQueues)]); err != nil {
			if ctx.Err() == nil {
				d.werr <- err
			}
			return
		}
		d.commits[src].Add(1)
	}
}

func (d *relayDemo) onWake(w client.Wake) {
	if strings.Contains(w.Name, ".q_relay_") {
		d.wakes[1].Add(1)
	} else {
		d.wakes[0].Add(1)
	}
}

// channel is the channel of a queue table: what pgmq's trigger and the
// relay's default template both name it.
func (d *relayDemo) channel(src string, i int) string {
	return fmt.Sprintf("%s.q_%s_%d.INSERT", d.schema, src, i)
}

// createTables creates the schema with both sets of pgmq-shaped queue
// tables, the trigger on one set and the publication of the other.
func (d *relayDemo) createTables(ctx context.Context) error {
	s := pgx.Identifier{d.schema}.Sanitize()
	var sb strings.Builder
	fmt.Fprintf(&sb, `CREATE SCHEMA %[1]s;
CREATE FUNCTION %[1]s.notify_queue_listeners() RETURNS trigger AS $$
BEGIN
  PERFORM PG_NOTIFY(TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME || '.' || TG_OP, NULL);
  RETURN NEW;
END;
$$ LANGUAGE plpgsql;
`, s)
	var pub []string
	for _, src := range relayDemoSources {
		for i := range relayDemoQueues {
			t := fmt.Sprintf("%s.q_%s_%d", s, src, i)
			fmt.Fprintf(&sb, `CREATE TABLE %s (
  msg_id BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
  read_ct INT DEFAULT 0 NOT NULL,
  enqueued_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
  vt TIMESTAMP WITH TIME ZONE NOT NULL,
  message JSONB
);
`, t)
			if src == "trigger" {
				// pgmq's own form (pgmq.enable_notify_insert).
				fmt.Fprintf(&sb, "CREATE CONSTRAINT TRIGGER trigger_notify_queue_insert_listeners AFTER INSERT ON %s DEFERRABLE FOR EACH ROW EXECUTE PROCEDURE %s.notify_queue_listeners();\n", t, s)
			} else {
				pub = append(pub, t)
			}
		}
	}
	fmt.Fprintf(&sb, "CREATE PUBLICATION %s FOR TABLE %s;\n", s, strings.Join(pub, ", "))
	if _, err := d.admin.Exec(ctx, "BEGIN;\n"+sb.String()+"COMMIT;"); err != nil {
		d.admin.Exec(context.Background(), "ROLLBACK")
		return fmt.Errorf("create the demo's tables: %w", err)
	}
	d.created = true
	return nil
}

// cleanup stops everything run started, newest first, and drops what it
// created on the server.
func (d *relayDemo) cleanup() error {
	var errs []error
	if d.wcancel != nil {
		d.wcancel()
	}
	d.wdone.Wait()
	for _, c := range d.writers {
		ctx, cancel := context.WithTimeout(context.Background(), demoStopTimeout)
		c.Close(ctx)
		cancel()
	}
	for _, c := range d.clients {
		c.Close()
	}
	if d.hub != nil {
		ctx, cancel := context.WithTimeout(context.Background(), demoStopTimeout)
		errs = append(errs, d.hub.Stop(ctx))
		cancel()
	}
	if d.relayC != nil {
		d.relayC()
		select {
		case <-d.relayD: // its error, if any, is run's
		case <-time.After(demoStopTimeout):
			errs = append(errs, errors.New("the relay did not stop"))
		}
	}
	if d.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), demoStopTimeout)
		if d.created && (d.cluster == nil || d.cluster.External()) {
			// A server the demo does not own: leave it as it was.
			s := pgx.Identifier{d.schema}.Sanitize()
			if _, err := d.admin.Exec(ctx, "DROP PUBLICATION IF EXISTS "+s+"; DROP SCHEMA IF EXISTS "+s+" CASCADE"); err != nil {
				errs = append(errs, fmt.Errorf("drop the demo's schema %s: %w", d.schema, err))
			}
		}
		d.admin.Close(ctx)
		cancel()
	}
	err := errors.Join(append(errs, removeDemoFiles(d.cluster, d.dir))...)
	if err == nil && (d.hub != nil || d.cluster != nil) {
		what := "writers, workers, hub and relay stopped"
		if d.cluster != nil && !d.cluster.External() {
			what += ", throwaway cluster removed"
		} else if d.created {
			what += fmt.Sprintf(", schema %s dropped", d.schema)
		}
		fmt.Fprintf(d.out, "listenhub demo: %s\n", what)
	}
	return err
}
