package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/monitor"
	"github.com/listenhub/listenhub/relay"
)

// relayFlags are the relay's own flags: `listenhub relay` has them, and so
// has `serve`, which runs a relay in the hub's process with --relay.
type relayFlags struct {
	publication, createPublication, slot string
	temporarySlot, recreateInvalidSlot   bool
	channelTemplate, ops                 string
	window, standbyRetry, maxLag         *time.Duration
	maxLagBytes                          int64
}

func (f *relayFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.publication, "publication", relay.DefaultOptions().Publication, "the publication whose tables are relayed")
	fs.StringVar(&f.createPublication, "create-publication", "", "create a missing publication FOR this, e.g. 'TABLES IN SCHEMA pgmq'; without it a missing publication is an error that names the SQL")
	fs.StringVar(&f.slot, "slot", relay.DefaultOptions().Slot, "the logical replication slot, created when missing; two relays on one slot are active and standby")
	fs.BoolVar(&f.temporarySlot, "temporary-slot", false, "a slot that lives as long as the relay's connection: no WAL held while it is down, a resync at every start instead")
	fs.BoolVar(&f.recreateInvalidSlot, "recreate-invalid-slot", false, "drop and create again a slot that can no longer decode (invalidated past max_slot_wal_keep_size, or older than its publication), with a resync; without it the relay names the fix and stops")
	fs.StringVar(&f.channelTemplate, "channel-template", relay.DefaultOptions().ChannelTemplate, "the channel of a change: {schema}, {table}, {op} (INSERT, UPDATE, DELETE, TRUNCATE); the default is pgmq's")
	fs.StringVar(&f.ops, "ops", relay.DefaultOptions().Ops.String(), "the changes NOTIFYed: insert, update, delete, truncate, comma-separated, or all")
	f.window = durationFlag(fs, "window", relay.DefaultOptions().Window, "transactions decoded within this are NOTIFYed in one transaction, each channel once (at once when nothing more waits); 0: one per transaction")
	f.standbyRetry = durationFlag(fs, "standby-retry", relay.DefaultOptions().StandbyRetry, "while another relay has the slot, try to take it this often")
	f.maxLag = durationFlag(fs, "max-lag", relay.DefaultOptions().MaxLag, "warn when the NOTIFYs are further behind the commits than this")
	fs.Int64Var(&f.maxLagBytes, "max-lag-bytes", relay.DefaultOptions().MaxLagBytes, "warn when the slot holds more WAL than this")
}

// options turns the flags into relay options; the error names the flag.
func (f *relayFlags) options(cc *pgconn.Config) (relay.Options, error) {
	ops, err := relay.ParseOps(f.ops)
	if err != nil {
		return relay.Options{}, fmt.Errorf("--ops: %w", err)
	}
	if *f.window < 0 {
		return relay.Options{}, fmt.Errorf("--window must not be negative (got %v)", *f.window)
	}
	for _, err := range []error{
		positiveDuration("standby-retry", *f.standbyRetry),
		positiveDuration("max-lag", *f.maxLag),
	} {
		if err != nil {
			return relay.Options{}, err
		}
	}
	if f.maxLagBytes < 1 {
		return relay.Options{}, fmt.Errorf("--max-lag-bytes must be at least 1 (got %d)", f.maxLagBytes)
	}
	if _, err := relay.ParseTemplate(f.channelTemplate); err != nil {
		return relay.Options{}, fmt.Errorf("--channel-template: %w", err)
	}
	return relay.Options{
		ConnConfig:          cc,
		Publication:         f.publication,
		CreatePublication:   f.createPublication,
		Slot:                f.slot,
		TemporarySlot:       f.temporarySlot,
		RecreateInvalidSlot: f.recreateInvalidSlot,
		ChannelTemplate:     f.channelTemplate,
		Ops:                 ops,
		Window:              *f.window,
		StandbyRetry:        *f.standbyRetry,
		MaxLag:              *f.maxLag,
		MaxLagBytes:         f.maxLagBytes,
	}, nil
}

// relayProcs gives `listenhub relay` one P (GOMAXPROCS=1) unless the
// environment sets GOMAXPROCS. The relay does little work per message, on
// two goroutines (the reader and the batcher) that hand each commit from
// one to the other; with a P per core the runtime spends more CPU waking
// and parking threads for those hand-offs than the relay spends on the
// work. At 16 writers and ~20k commits/s on 2 cores the relay process
// used 33-54 µs of CPU per commit with 2 Ps and 14-17 µs with one, and it
// caught up with the writers 2-2.4 times sooner: the CPU it no longer
// burns goes to its walsender, which decodes every commit for it and is
// what a busy server starves first (docs/relay.md). In-process tests
// call runRelay and keep their own setting.
func relayProcs() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}

// runRelay is `listenhub relay`: the relay on its own. Parse, configure,
// run.
func runRelay(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, code := parseRelay(args, stdout, stderr)
	if c == nil {
		return code
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if code, ok := c.configure(); !ok {
		return code
	}
	return c.run(ctx, hup)
}

// relayCmd is one run of `listenhub relay`: its flags, then what
// configure makes of them.
type relayCmd struct {
	fs                                *flag.FlagSet
	rf                                relayFlags
	databaseURL, appName, metricsAddr *string
	logFormat, logLevel               *string
	stderr                            io.Writer
	log                               *slog.Logger
	cc                                *pgconn.Config
	opts                              relay.Options
	rl                                *relay.Relay
}

// parseRelay parses the relay's flags; nil and the exit status when they
// are wrong (or -h was asked).
func parseRelay(args []string, stdout, stderr io.Writer) (*relayCmd, int) {
	c := &relayCmd{fs: newFlagSet("relay"), stderr: stderr}
	fs := c.fs
	c.databaseURL = fs.String("database-url", "", "PostgreSQL URL or key=value DSN of a direct connection to the primary (env "+envName("database-url")+", then DATABASE_URL, then the libpq PG* variables)")
	c.appName = fs.String("application-name", relay.DefaultOptions().ApplicationName, "application_name of the relay's two backends")
	c.rf.register(fs)
	c.metricsAddr = fs.String("metrics-addr", "", "serve /metrics, /healthz and /relay on this address, e.g. 127.0.0.1:9188 (off when empty)")
	c.logFormat = fs.String("log-format", "text", "log format: text or json")
	c.logLevel = fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, "relay", true)
		}
		return nil, flagError(stderr, "relay", err)
	}
	return c, 0
}

// configure checks the flags and builds the relay, without starting it;
// ok false with the exit status if they are wrong.
func (c *relayCmd) configure() (code int, ok bool) {
	if !isSet(c.fs, "database-url") && os.Getenv("DATABASE_URL") != "" {
		*c.databaseURL = os.Getenv("DATABASE_URL")
	}
	if *c.databaseURL == "" && !pgEnvNamesServer() {
		// As serve: retrying libpq's defaults (the local socket) forever
		// would look like an outage, not a missing setting.
		fmt.Fprintf(c.stderr, "listenhub relay: no database named: give --database-url URL (or set %s, DATABASE_URL, or libpq's PGHOST, PGPORT, PGDATABASE, PGUSER…; PGHOST=/var/run/postgresql is the local server's socket)\n", envName("database-url"))
		return 1, false
	}
	bad := func(err error) (int, bool) { return flagError(c.stderr, "relay", err), false }
	var err error
	if c.log, err = newLogger(c.stderr, *c.logFormat, *c.logLevel); err != nil {
		return bad(err)
	}
	if c.cc, err = pgconn.ParseConfig(*c.databaseURL); err != nil {
		fmt.Fprintf(c.stderr, "listenhub relay: --database-url: %s\n", oneLine(err))
		return 1, false
	}
	if c.opts, err = c.rf.options(c.cc); err != nil {
		return bad(err)
	}
	c.opts.ApplicationName = *c.appName
	c.opts.Logger = c.log
	if c.rl, err = relay.New(c.opts); err != nil {
		return bad(err)
	}
	return 0, true
}

// run serves the metrics address, if any, and runs the relay until a
// signal (0) or a misconfiguration (1) ends it.
func (c *relayCmd) run(ctx context.Context, hup <-chan os.Signal) int {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *c.metricsAddr != "" {
		ln, err := net.Listen("tcp", *c.metricsAddr)
		if err != nil {
			fmt.Fprintf(c.stderr, "listenhub relay: --metrics-addr: %v\n", err)
			return 1
		}
		b := readBuildInfo()
		srv := &http.Server{Handler: monitor.Handler(nil, monitor.Options{Relay: c.rl, Version: b.version, Revision: b.revision}),
			ReadHeaderTimeout: 5 * time.Second}
		c.log.Info("metrics listening", "addr", ln.Addr().String())
		go srv.Serve(ln)
		defer srv.Close()
	}
	sd := newSDReporter(c.log)
	defer sd.close()
	sd.ready()
	c.log.Info("listenhub relay starting", "version", versionString(), "host", c.cc.Host, "port", c.cc.Port,
		"database", c.cc.Database, "user", c.cc.User, "publication", c.opts.Publication, "slot", c.opts.Slot,
		"gomaxprocs", runtime.GOMAXPROCS(0))
	done := make(chan error, 1)
	go func() { done <- c.rl.Run(ctx) }()
	for {
		select {
		case <-hup:
			c.log.Warn("SIGHUP ignored; send SIGTERM to stop")
			continue
		case err := <-done:
			if err != nil {
				sd.stopping("stopped: " + oneLine(err))
				fmt.Fprintf(c.stderr, "listenhub relay: %s\n", oneLine(err))
				return 1
			}
			sd.stopping("stopping")
			c.log.Info("relay stopped")
			return 0
		}
	}
}
