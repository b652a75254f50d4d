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
	"strings"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/systemd"
	"github.com/listenhub/listenhub/listener"
	"github.com/listenhub/listenhub/relay"
)

// connectTimeout bounds the one-shot connections of the tools (census):
// an unreachable address must end in one clear line, not a two-minute TCP
// timeout. (serve retries in the background instead.)
const connectTimeout = 15 * time.Second

// stopTimeout bounds the graceful stop; past it descriptors are closed
// anyway.
const stopTimeout = 10 * time.Second

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("serve")
	var (
		databaseURL   = fs.String("database-url", "", "PostgreSQL URL or key=value DSN of a direct (or session-pooled) connection (env "+envName("database-url")+", then DATABASE_URL, then the libpq PG* variables)")
		socket        = fs.String("socket", "", "Unix socket the workers connect to; created with --socket-mode and --socket-group, or the one systemd passes (LISTEN_FDS), whose path this must then be (required unless socket-activated)")
		prefix        = fs.String("channel-prefix", "", "Postgres channel = prefix + Q + suffix (pgbus: pgmq.q_)")
		suffix        = fs.String("channel-suffix", "", "Postgres channel suffix (pgbus: .INSERT)")
		appName       = fs.String("application-name", hub.DefaultApplicationName, "application_name of the hub's backend, counted by census")
		durableLimit  = fs.Int("durable-queue-limit", hub.DefaultDurableQueueLimit, "pending durable wakes per worker before new ones are dropped")
		hardLimit     = fs.Int("hard-queue-limit", hub.DefaultHardQueueLimit, "pending frames per worker, durable wakes aside, before it is evicted")
		hardBytes     = fs.Int("hard-queue-bytes", hub.DefaultHardQueueBytes, "pending bytes per worker, durable wakes aside, before it is evicted")
		maxOutbound   = fs.Int("max-outbound-bytes", 0, "bytes queued for all workers together; past it the worker holding the most is evicted (default: an eighth of the memory, physical or the cgroup's limit, 64 MiB to 4 GiB)")
		statusIvl     = durationFlag(fs, "status-interval", hub.DefaultStatusInterval, "status is re-sent to every worker every 5 intervals")
		hcInterval    = durationFlag(fs, "health-check-interval", hub.DefaultHealthCheckInterval, "probe an idle Postgres connection this often")
		hcTimeout     = durationFlag(fs, "health-check-timeout", hub.DefaultHealthCheckTimeout, "a probe unanswered this long means the connection is dead")
		maxWorkers    = fs.Int("max-workers", hub.DefaultMaxWorkers, "connected workers; past it a connection is accepted and closed at once (lowered to what RLIMIT_NOFILE leaves)")
		maxSubs       = fs.Int("max-subscriptions", hub.DefaultMaxSubscriptions, "subscriptions per worker; past it a sub is nacked \"too many subscriptions\"")
		maxChannels   = fs.Int("max-channels", hub.DefaultMaxChannels, "channels LISTENed by the hub; past it a sub is nacked \"too many channels\"")
		frameTimeout  = durationFlag(fs, "frame-timeout", hub.DefaultFrameTimeout, "a worker's frame still incomplete this long after its first byte severs the connection")
		metricsAddr   = fs.String("metrics-addr", "", "serve /metrics, /healthz and the JSON endpoints of listenhub status on this address, e.g. 127.0.0.1:9064 (off when empty)")
		metricsToken  = fs.String("metrics-token-file", "", "require \"Authorization: Bearer TOKEN\" on the metrics address (all but /healthz), TOKEN read from this file (not readable by other users)")
		logFormat     = fs.String("log-format", "text", "log format: text or json")
		logLevel      = fs.String("log-level", "info", "log level: debug, info, warn or error")
		pidFile       = fs.String("pid-file", "", "file holding the pid of the process serving, which changes with every upgrade (written atomically, never through a link; in a directory others can write to, only if it is sticky, else exit 1; removed on a normal stop)")
		upTimeout     = durationFlag(fs, "upgrade-timeout", defaultUpgradeTimeout, "SIGUSR2 upgrade: the new process must take over within this, or the old one serves on")
		pgConns       = fs.Int("postgres-connections", 1, "LISTEN connections the channel union is spread over (by a hash of each name), at most 64; more than 1 only for tens of thousands of channels")
		writeThreads  = fs.Int("write-threads", 0, "threads writing a large fanout (32 or more workers in one loop iteration) while the loop has been idle more than busy lately; 1 keeps every write on the loop's thread; 0 means min(GOMAXPROCS, 4)")
		relayOn       = fs.Bool("relay", false, "also run the relay (listenhub relay) in this process, on connections of its own; the relay flags (see relay -h) apply")
		configPath    = fs.String("config", "", "file of settings, one key = value per line, the keys being these flags' names; flags and LISTENHUB_ variables override it; re-read by the new process of every upgrade (SIGUSR2), and on SIGHUP for the log level and format, the caps, the timeouts, the status interval and --allow-uid")
		allowUIDs     uidList
		databaseGiven bool
		rf            relayFlags
	)
	rf.register(fs)
	socketMode := modeValue(hub.DefaultSocketMode)
	fs.Var(&socketMode, "socket-mode", "permission bits of the socket file the hub creates, in octal; 0660 with --socket-group lets that group connect (--allow-uid still decides whom the hub serves)")
	socketGroup := fs.String("socket-group", "", "group (name or gid) given to the socket file before it accepts (default: the hub's)")
	fs.Var(&allowUIDs, "allow-uid", "uids allowed to connect (checked with SO_PEERCRED), comma-separated or repeated (default: the hub's uid and root)")
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, "serve", true)
		}
		return flagError(stderr, "serve", err)
	}
	fromArgs, confEntries, err := loadConfig(fs, *configPath)
	if err != nil {
		fmt.Fprintf(stderr, "listenhub serve: %v\n", err)
		return 2
	}
	// SIGHUP is never fatal (Go's default would exit 129 and leave the
	// socket file): it re-reads --config and applies what can change
	// live (configReloader); SIGUSR2 is the upgrade, whose new process
	// reads the file afresh, SIGTERM the stop. Caught before anything
	// else can take time.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	databaseGiven = isSet(fs, "database-url")
	if !databaseGiven && os.Getenv("DATABASE_URL") != "" {
		*databaseURL = os.Getenv("DATABASE_URL")
	}
	bad := func(err error) int { return flagError(stderr, "serve", err) }
	// Socket activation: systemd bound the socket and passes it as fd 3.
	activated, err := systemd.Listeners()
	if err != nil {
		fmt.Fprintf(stderr, "listenhub serve: %v\n", err)
		return 1
	}
	if len(activated) > 1 {
		fmt.Fprintf(stderr, "listenhub serve: systemd passed %d sockets (LISTEN_FDS); the hub takes one ListenStream=\n", len(activated))
		return 1
	}
	var listenFile *os.File
	if len(activated) == 1 {
		listenFile = activated[0].File
		defer listenFile.Close()
	}
	if *socket == "" && listenFile == nil {
		return bad(errors.New("--socket is required"))
	}
	for _, err := range []error{
		checkLiveFlags(fs),
		positiveInt("postgres-connections", *pgConns),
		nonNegativeInt("write-threads", *writeThreads),
		positiveDuration("health-check-interval", *hcInterval),
		positiveDuration("health-check-timeout", *hcTimeout),
		positiveDuration("upgrade-timeout", *upTimeout),
	} {
		if err != nil {
			return bad(err)
		}
	}
	logs, err := newLogSwitch(stderr, *logFormat, *logLevel) // SIGHUP may switch them
	if err != nil {
		return bad(err)
	}
	log := slog.New(logs)
	logOverridden(log, *configPath, confEntries, fromArgs, fs, args)
	if *pidFile != "" {
		if err := checkPIDFile(*pidFile); err != nil {
			fmt.Fprintf(stderr, "listenhub serve: --pid-file: %v\n", err)
			return 1
		}
	}
	if *databaseURL == "" && !pgEnvNamesServer() {
		// libpq's defaults alone (the local socket, the OS user's
		// name) are rarely what a hub is meant for, and retrying a
		// server nobody named would look like an outage, not a
		// missing setting.
		fmt.Fprintf(stderr, "listenhub serve: no database named: give --database-url URL (or set %s, DATABASE_URL, or libpq's PGHOST, PGPORT, PGDATABASE, PGUSER…; PGHOST=/var/run/postgresql is the local server's socket)\n", envName("database-url"))
		return 1
	}
	var token string
	if *metricsToken != "" {
		if token, err = readTokenFile(*metricsToken); err != nil {
			return bad(fmt.Errorf("--metrics-token-file: %w", err))
		}
	}
	cc, err := listener.ParseConfig(*databaseURL, *appName)
	if err != nil {
		// A configuration error like a refused password or an unknown
		// database (docs/design.md, Lifecycle): exit 1, not the usage
		// status of a mistyped flag.
		fmt.Fprintf(stderr, "listenhub serve: --database-url: %s\n", oneLine(err))
		return 1
	}
	if isSet(fs, "application-name") {
		cc.RuntimeParams["application_name"] = *appName // explicit wins over the URL
	}
	app := cc.RuntimeParams["application_name"]
	var rl *relay.Relay
	if *relayOn {
		ropts, err := rf.options(cc)
		if err != nil {
			return bad(err)
		}
		ropts.Logger = log.With("component", "relay")
		if rl, err = relay.New(ropts); err != nil {
			return bad(err)
		}
	}

	sd := newSDReporter(log)
	defer sd.close()

	var sockMode os.FileMode // 0: the hub's default, and nothing to refuse with a socket unit
	if isSet(fs, "socket-mode") {
		sockMode = os.FileMode(socketMode)
	}
	h, err := hub.New(hub.Config{
		SocketPath:          *socket,
		SocketMode:          sockMode,
		SocketGroup:         *socketGroup,
		ConnConfig:          cc,
		ChannelPrefix:       *prefix,
		ChannelSuffix:       *suffix,
		ApplicationName:     app,
		DurableQueueLimit:   *durableLimit,
		HardQueueLimit:      *hardLimit,
		HardQueueBytes:      *hardBytes,
		MaxOutboundBytes:    *maxOutbound,
		StatusInterval:      *statusIvl,
		HealthCheckInterval: *hcInterval,
		HealthCheckTimeout:  *hcTimeout,
		MaxWorkers:          *maxWorkers,
		MaxSubscriptions:    *maxSubs,
		MaxChannels:         *maxChannels,
		FrameTimeout:        *frameTimeout,
		ReleaseMemory:       true,
		AllowUIDs:           allowUIDs,
		Logger:              log,
		Listener:            listenFile,
		Report:              sd.hook(),
		ReportInterval:      sd.interval,
		PostgresConnections: *pgConns,
		WriteThreads:        *writeThreads,
		// The metrics server's descriptors (an upgrade may hand over the
		// listener even without --metrics-addr).
		ReservedFDs: metricsFDs,
	})
	if err != nil {
		return bad(err)
	}

	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	// SIGUSR2 (hot upgrade) is caught from the start: its default action
	// would kill the hub.
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	defer signal.Stop(usr2)
	exe := upgradePath() // its links are followed at each upgrade
	inherited, err := inheritedUpgrade()
	if err != nil {
		fmt.Fprintf(stderr, "listenhub serve: upgrade: %v\n", err)
		return 1
	}
	predecessor := 0
	if inherited != nil {
		predecessor = os.Getppid() // the old process: it waits for us
	}

	// The metrics address is bound before the hub starts, so that a port
	// in use is a startup error like the others. (An upgrade hands the
	// bound listener over.)
	var srv *http.Server
	var metricsLn net.Listener
	serveMetrics := func(ln net.Listener) {
		metricsLn = ln
		srv = newMetricsServer(h, rl, token)
		log.Info("metrics listening", "addr", ln.Addr().String(), "token", token != "")
		go serveCapped(srv, ln)
	}
	defer func() {
		if srv != nil {
			srv.Close()
		}
	}()
	if inherited != nil {
		ln, err := takeover(ctx, h, inherited, *upTimeout, *pidFile, log)
		if err != nil {
			fmt.Fprintf(stderr, "listenhub serve: upgrade: %s\n", oneLine(err))
			return 1
		}
		if ln != nil {
			serveMetrics(ln)
		}
	} else if *metricsAddr != "" {
		ln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			fmt.Fprintf(stderr, "listenhub serve: --metrics-addr: %v\n", err)
			return 1
		}
		serveMetrics(ln)
	}

	// Start returns once the socket accepts; Postgres is reached in the
	// background (retried while unreachable; a refused configuration
	// stops the hub, below).
	if inherited != nil {
		// Started by the take-over above.
	} else if err := h.Start(ctx); err != nil {
		if ctx.Err() != nil {
			log.Info("signal received while starting; stopped")
			return 0
		}
		fmt.Fprintf(stderr, "listenhub serve: %s\n", oneLine(err))
		return 1
	}
	sd.ready()
	log.Info("listenhub serving", "version", versionString(), "socket", h.Config().SocketPath,
		"socket_activated", listenFile != nil, "host", cc.Host,
		"port", cc.Port, "database", cc.Database, "user", cc.User, "application_name", app,
		"channel_prefix", *prefix, "channel_suffix", *suffix)
	if *pidFile != "" && inherited == nil {
		if err := writePIDFile(*pidFile); err != nil {
			log.Error("pid file", "reason", err)
		}
	}
	// The relay runs on goroutines of its own, never on the hub's loop.
	relayDone := make(chan error, 1)
	rctx, stopRelay := context.WithCancel(context.Background())
	defer stopRelay()
	if rl != nil {
		go func() { relayDone <- rl.Run(rctx) }()
	}
	reloader := newConfigReloader(fs, *configPath, fromArgs, confEntries)
	reloader.h, reloader.log, reloader.logs = h, log, logs
	up := &upgrader{exe: exe, args: append([]string{"serve"}, args...), timeout: *upTimeout, log: log,
		stdout: stdout, stderr: stderr, h: h}
	up.predecessor = predecessor

wait:
	for {
		select {
		case <-ctx.Done():
			log.Info("signal received; stopping")
			break wait
		case <-usr2:
			up.metrics = metricsLn
			if up.run(ctx) {
				// The new process serves; the pid file is its. Nothing
				// here may keep this process: the deferred Close of the
				// metrics server is bounded, and so is the rest.
				time.AfterFunc(stopTimeout, func() { os.Exit(0) })
				if rl != nil {
					// The new process's relay stands by until this
					// one has NOTIFYed and confirmed what it decoded
					// and let go of the slot.
					stopRelay()
					<-relayDone
				}
				return 0
			}
		case <-hup:
			reloader.reload(ctx)
		case err := <-relayDone:
			// Only a misconfiguration ends the relay (it retries
			// everything else): the hub stops with it, so that it is
			// seen and fixed.
			why := "relay stopped unexpectedly"
			if err != nil {
				why = "relay: " + oneLine(err)
			}
			sd.stopping("stopped: " + why)
			fmt.Fprintf(stderr, "listenhub serve: %s\n", why)
			if *pidFile != "" {
				removePIDFile(*pidFile)
			}
			sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
			h.Stop(sctx)
			cancel()
			return 1
		case <-h.Done():
			// A Postgres configuration error (Wait says which), or the
			// loop failed.
			why := "hub stopped unexpectedly"
			if err := h.Wait(); err != nil {
				why = oneLine(err)
			}
			sd.stopping("stopped: " + why)
			fmt.Fprintf(stderr, "listenhub serve: %s\n", why)
			if *pidFile != "" {
				removePIDFile(*pidFile) // it would name a dead process
			}
			return 1
		}
	}
	if *pidFile != "" {
		defer removePIDFile(*pidFile)
	}
	sd.stopping("stopping")
	if rl != nil {
		stopRelay()
		<-relayDone
	}
	sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if srv != nil {
		srv.Shutdown(sctx)
	}
	if err := h.Stop(sctx); err != nil {
		fmt.Fprintf(stderr, "listenhub serve: stop: %v\n", err)
		return 1
	}
	return 0
}

// pgServerVars are the libpq variables that name a server, a database or
// a role: with any of them set, an empty URL means "libpq's defaults plus
// these" (docs/design.md: the PG* fallback), as psql would read it.
var pgServerVars = []string{"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE"}

func pgEnvNamesServer() bool {
	for _, v := range pgServerVars {
		if os.Getenv(v) != "" {
			return true
		}
	}
	return false
}

// oneLine flattens a multi-line error (pgconn joins one line per host it
// tried) into the single line a failed start prints.
func oneLine(err error) string {
	s := strings.ReplaceAll(err.Error(), ":\n", ": ")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}
