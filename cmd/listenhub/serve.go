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
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/fdpass"
	"github.com/listenhub/listenhub/internal/systemd"
	"github.com/listenhub/listenhub/listener"
	"github.com/listenhub/listenhub/monitor"
	"github.com/listenhub/listenhub/relay"
)

// connectTimeout bounds the one-shot connections of the tools (census):
// an unreachable address must end in one clear line, not a two-minute TCP
// timeout. (serve retries in the background instead.)
const connectTimeout = 15 * time.Second

// stopTimeout bounds the graceful stop; past it descriptors are closed
// anyway.
const stopTimeout = 10 * time.Second

// runServe is `listenhub serve`: parse the flags (and --config), configure
// the hub (and the relay of --relay), then run it until a signal stops it,
// an upgrade replaces it or a misconfiguration ends it.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if _, ok := upstreamArg(args); ok {
		return serveUpstream(args, stderr)
	}
	f, code := parseServe(args, stdout, stderr)
	if f == nil {
		return code
	}
	// SIGHUP is never fatal (Go's default would exit 129 and leave the
	// socket file): it re-reads --config and applies what can change
	// live (configReloader); SIGUSR2 is the upgrade, whose new process
	// reads the file afresh, SIGTERM the stop. Caught before anything
	// else can take time.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	s := &server{serveFlags: f, stdout: stdout, stderr: stderr, hup: hup}
	defer s.close()
	if code, ok := s.configure(); !ok {
		return code
	}
	return s.run(ctx)
}

// serveFlags are serve's flags, as given and as --config completed them.
type serveFlags struct {
	fs          *flag.FlagSet
	args        []string        // as given: an upgrade's new process gets them again
	fromArgs    map[string]bool // set by flag or environment (the file cannot change them)
	confEntries []configEntry   // what --config said

	databaseURL, socket, prefix, suffix, appName                 *string
	durableLimit, hardLimit, hardBytes, maxOutbound              *int
	statusIvl, hcInterval, hcTimeout, frameTimeout, stallTimeout *time.Duration
	maxWorkers, maxSubs, maxChannels, pgConns, writeThreads      *int
	metricsAddr, metricsToken, logFormat, logLevel, pidFile      *string
	upTimeout                                                    *time.Duration
	relayOn, allowRefusable                                      *bool
	configPath, socketGroup                                      *string
	socketMode                                                   modeValue
	allowUIDs                                                    uidList
	rf                                                           relayFlags
}

// parseServe parses serve's flags and reads --config; nil and the exit
// status when they are wrong (or -h was asked).
func parseServe(args []string, stdout, stderr io.Writer) (*serveFlags, int) {
	f := &serveFlags{fs: newFlagSet("serve"), args: args}
	f.define()
	if err := parseFlags(f.fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, f.fs, "serve", true)
		}
		return nil, flagError(stderr, "serve", err)
	}
	var err error
	if f.fromArgs, f.confEntries, err = loadConfig(f.fs, *f.configPath); err != nil {
		fmt.Fprintf(stderr, "listenhub serve: %v\n", err)
		return nil, 2
	}
	return f, 0
}

// define declares serve's flags on f.fs.
func (f *serveFlags) define() {
	fs := f.fs
	f.databaseURL = fs.String("database-url", "", "PostgreSQL URL or key=value DSN of a direct (or session-pooled) connection (env "+envName("database-url")+", then DATABASE_URL, then the libpq PG* variables)")
	f.socket = fs.String("socket", "", socketHelp)
	// Read before parsing (runServe): a hub fed through NATS is
	// listenhub-fleet's. Here for -h and the docs' checks.
	fs.String("upstream", "", "a hub fed through NATS, not Postgres: runs listenhub-fleet serve (beside this binary or on PATH; exit 2 without it) with these arguments")
	f.prefix = fs.String("channel-prefix", "", "Postgres channel = prefix + Q + suffix (pgbus: pgmq.q_)")
	f.suffix = fs.String("channel-suffix", "", "Postgres channel suffix (pgbus: .INSERT)")
	f.appName = fs.String("application-name", hub.DefaultConfig().ApplicationName, "application_name of the hub's backend, counted by census")
	f.durableLimit = fs.Int("durable-queue-limit", hub.DefaultConfig().DurableQueueLimit, "pending durable wakes per worker before new ones are dropped")
	f.hardLimit = fs.Int("hard-queue-limit", hub.DefaultConfig().HardQueueLimit, "pending frames per worker, durable wakes aside, past which it must keep reading: it is evicted once its socket takes nothing for --stall-timeout")
	f.hardBytes = fs.Int("hard-queue-bytes", hub.DefaultConfig().HardQueueBytes, "pending bytes per worker, durable wakes aside, past which it is evicted at once, reading or not")
	f.stallTimeout = durationFlag(fs, "stall-timeout", hub.DefaultConfig().StallTimeout, "a worker past --hard-queue-limit whose socket takes nothing this long is evicted")
	f.maxOutbound = fs.Int("max-outbound-bytes", 0, "bytes queued for all workers together; past it the worker holding the most is evicted (default: an eighth of the memory, physical or the cgroup's limit, 64 MiB to 4 GiB)")
	f.statusIvl = durationFlag(fs, "status-interval", hub.DefaultConfig().StatusInterval, "status is re-sent to every worker every 5 intervals")
	f.hcInterval = durationFlag(fs, "health-check-interval", hub.DefaultConfig().HealthCheckInterval, "probe an idle Postgres connection this often")
	f.hcTimeout = durationFlag(fs, "health-check-timeout", hub.DefaultConfig().HealthCheckTimeout, "a probe unanswered this long means the connection is dead")
	f.maxWorkers = fs.Int("max-workers", hub.DefaultConfig().MaxWorkers, "connected workers; past it a connection is accepted and closed at once (lowered to what RLIMIT_NOFILE leaves)")
	f.maxSubs = fs.Int("max-subscriptions", hub.DefaultConfig().MaxSubscriptions, "subscriptions per worker; past it a sub is nacked \"too many subscriptions\"")
	f.maxChannels = fs.Int("max-channels", hub.DefaultConfig().MaxChannels, "channels LISTENed by the hub; past it a sub is nacked \"too many channels\"")
	f.frameTimeout = durationFlag(fs, "frame-timeout", hub.DefaultConfig().FrameTimeout, "a worker's frame still incomplete this long after its first byte severs the connection")
	f.metricsAddr = fs.String("metrics-addr", "", "serve /metrics, /healthz and the JSON endpoints of listenhub status on this address, e.g. 127.0.0.1:9064 (off when empty)")
	f.metricsToken = fs.String("metrics-token-file", "", "require \"Authorization: Bearer TOKEN\" on the metrics address (all but /healthz), TOKEN read from this file (not readable by other users)")
	f.logFormat = fs.String("log-format", "text", "log format: text or json")
	f.logLevel = fs.String("log-level", "info", "log level: debug, info, warn or error")
	f.pidFile = fs.String("pid-file", "", "file holding the pid of the process serving, which changes with every upgrade (written atomically, never through a link; a directory others can write to must be sticky; removed on a normal stop)")
	f.upTimeout = durationFlag(fs, "upgrade-timeout", defaultUpgradeTimeout, upgradeTimeoutHelp)
	f.pgConns = fs.Int("postgres-connections", 1, "LISTEN connections the channels are spread over (by a hash of the name), at most 64; more than 1 only for tens of thousands of channels; a client's fail-back is exact with 1 only")
	f.writeThreads = fs.Int("write-threads", 0, "threads writing a fanout to 32 or more workers while the loop has lately been idle more than busy; 1: every write on the loop's thread; 0: min(GOMAXPROCS, 4)")
	f.relayOn = fs.Bool("relay", false, "also run the relay (listenhub relay) in this process, on connections of its own; the relay flags (see relay -h) apply")
	f.configPath = fs.String("config", "", configHelp)
	f.rf.register(fs)
	f.socketMode = modeValue(hub.DefaultConfig().SocketMode)
	fs.Var(&f.socketMode, "socket-mode", "permission bits of the socket file the hub creates, in octal; 0660 with --socket-group lets that group connect (--allow-uid still applies)")
	f.socketGroup = fs.String("socket-group", "", "group (name or gid) given to the socket file before it accepts (default: the hub's)")
	fs.Var(&f.allowUIDs, "allow-uid", allowUIDHelp)
	f.allowRefusable = fs.Bool("allow-refusable-socket", false, "serve a socket whose directories the clients refuse (another uid's than root's and the hub's, or than the --allow-uid when it is the only one, or writable by others without the sticky bit), with a WARN every minute and listenhub_socket_refusable 1, instead of exiting 1")
}

// server is one run of `listenhub serve`: what configure builds from the
// flags, and what run starts, watches and stops.
type server struct {
	*serveFlags
	stdout, stderr io.Writer
	hup            chan os.Signal // SIGHUP, caught from the start

	listenFile *os.File // the socket systemd passed, or nil
	logs       *logSwitch
	log        *slog.Logger
	token      string // of --metrics-token-file
	cc         *pgconn.Config
	app        string // the hub's application_name
	rl         *relay.Relay
	sd         *sdReporter
	h          *hub.Hub

	metrics   *monitor.Server
	metricsLn net.Listener // handed over by an upgrade, when set
	relayDone chan error   // the relay's Run returned
	stopRelay context.CancelFunc
	inherited *fdpass.Conn // the old process, when this one takes over
	// predecessor is the old process's pid, read before the take-over
	// (after it, the old process may be gone and the parent another).
	predecessor int
	upgradeExe  string // the path an upgrade starts (upgradePath)
}

// close releases what configure and run took, whatever stopped them.
func (s *server) close() {
	if s.stopRelay != nil {
		s.stopRelay()
	}
	if s.metrics != nil {
		s.metrics.Close()
	}
	if s.sd != nil {
		s.sd.close()
	}
	if s.listenFile != nil {
		s.listenFile.Close()
	}
}

// bad reports a wrong setting: exit status 2, as for a mistyped flag.
func (s *server) bad(err error) (int, bool) { return flagError(s.stderr, "serve", err), false }

// fail reports what keeps the hub from starting: exit status 1.
func (s *server) fail(format string, args ...any) (int, bool) {
	fmt.Fprintf(s.stderr, "listenhub serve: "+format+"\n", args...)
	return 1, false
}

// configure checks the flags and builds the hub (and relay) they ask for,
// without starting anything; ok false with the exit status if they are
// wrong.
func (s *server) configure() (code int, ok bool) {
	if !isSet(s.fs, "database-url") && os.Getenv("DATABASE_URL") != "" {
		*s.databaseURL = os.Getenv("DATABASE_URL")
	}
	if code, ok := s.checkFlags(); !ok {
		return code, false
	}
	if *s.databaseURL == "" && !pgEnvNamesServer() {
		// libpq's defaults alone (the local socket, the OS user's
		// name) are rarely what a hub is meant for, and retrying a
		// server nobody named would look like an outage, not a
		// missing setting.
		return s.fail("no database named: give --database-url URL (or set %s, DATABASE_URL, or libpq's PGHOST, PGPORT, PGDATABASE, PGUSER…; PGHOST=/var/run/postgresql is the local server's socket)", envName("database-url"))
	}
	if *s.metricsToken != "" {
		var err error
		if s.token, err = monitor.ReadTokenFile(*s.metricsToken); err != nil {
			return s.bad(fmt.Errorf("--metrics-token-file: %w", err))
		}
	}
	cc, err := listener.ParseConfig(*s.databaseURL, *s.appName)
	if err != nil {
		// A configuration error like a refused password or an unknown
		// database (docs/design.md, Lifecycle): exit 1, not the usage
		// status of a mistyped flag.
		return s.fail("--database-url: %s", oneLine(err))
	}
	if isSet(s.fs, "application-name") {
		cc.RuntimeParams["application_name"] = *s.appName // explicit wins over the URL
	}
	s.cc, s.app = cc, cc.RuntimeParams["application_name"]
	if *s.relayOn {
		ropts, err := s.rf.options(cc)
		if err != nil {
			return s.bad(err)
		}
		ropts.Logger = s.log.With("component", "relay")
		// A guest: no relay error ends the hub. A misconfigured relay
		// is down (listenhub_relay_up 0, its error in listenhub status
		// and on /healthz) and sets itself up again every 30 s.
		ropts.RetryConfigErrors = true
		if s.rl, err = relay.New(ropts); err != nil {
			return s.bad(err)
		}
	}
	s.sd = newSDReporter(s.log)
	if s.h, err = hub.New(s.hubConfig()); err != nil {
		return s.bad(err)
	}
	return 0, true
}

// checkFlags takes the socket systemd passes, if any, checks the flags'
// values and sets up the log and the pid file's directory check.
func (s *server) checkFlags() (int, bool) {
	// Socket activation: systemd bound the socket and passes it as fd 3.
	activated, err := systemd.Listeners()
	if err != nil {
		return s.fail("%v", err)
	}
	if len(activated) > 1 {
		return s.fail("systemd passed %d sockets (LISTEN_FDS); the hub takes one ListenStream=", len(activated))
	}
	if len(activated) == 1 {
		s.listenFile = activated[0].File
	}
	if *s.socket == "" && s.listenFile == nil {
		return s.bad(errors.New("--socket is required"))
	}
	if errNoHotUpgrade != nil && isSet(s.fs, "upgrade-timeout") {
		return s.bad(fmt.Errorf("--upgrade-timeout: %w", errNoHotUpgrade))
	}
	for _, err := range []error{
		checkLiveFlags(s.fs),
		positiveInt("postgres-connections", *s.pgConns),
		nonNegativeInt("write-threads", *s.writeThreads),
		positiveDuration("health-check-interval", *s.hcInterval),
		positiveDuration("health-check-timeout", *s.hcTimeout),
		positiveDuration("upgrade-timeout", *s.upTimeout),
	} {
		if err != nil {
			return s.bad(err)
		}
	}
	if s.logs, err = newLogSwitch(s.stderr, *s.logFormat, *s.logLevel); err != nil { // SIGHUP may switch them
		return s.bad(err)
	}
	s.log = slog.New(s.logs)
	logOverridden(s.log, *s.configPath, s.confEntries, s.fromArgs, s.fs, s.args)
	if *s.pidFile != "" {
		if err := checkPIDFile(*s.pidFile); err != nil {
			return s.fail("--pid-file: %v", err)
		}
	}
	return 0, true
}

// hubConfig is the hub's configuration from the flags.
func (s *server) hubConfig() hub.Config {
	var sockMode os.FileMode // 0: the hub's default, and nothing to refuse with a socket unit
	if isSet(s.fs, "socket-mode") {
		sockMode = os.FileMode(s.socketMode)
	}
	return hub.Config{
		SocketPath:           *s.socket,
		SocketMode:           sockMode,
		SocketGroup:          *s.socketGroup,
		ServeRefusableSocket: *s.allowRefusable,
		ConnConfig:           s.cc,
		ChannelPrefix:        *s.prefix,
		ChannelSuffix:        *s.suffix,
		ApplicationName:      s.app,
		DurableQueueLimit:    *s.durableLimit,
		HardQueueLimit:       *s.hardLimit,
		HardQueueBytes:       *s.hardBytes,
		MaxOutboundBytes:     *s.maxOutbound,
		StatusInterval:       *s.statusIvl,
		HealthCheckInterval:  *s.hcInterval,
		HealthCheckTimeout:   *s.hcTimeout,
		MaxWorkers:           *s.maxWorkers,
		MaxSubscriptions:     *s.maxSubs,
		MaxChannels:          *s.maxChannels,
		FrameTimeout:         *s.frameTimeout,
		StallTimeout:         *s.stallTimeout,
		ReleaseMemory:        true,
		AllowUIDs:            s.allowUIDs,
		Logger:               s.log,
		ListenerFile:         s.listenFile,
		OnReport:             s.sd.hook(),
		ReportInterval:       s.sd.interval,
		PostgresConnections:  *s.pgConns,
		WriteThreads:         *s.writeThreads,
		// The metrics server's descriptors (an upgrade may hand over the
		// listener even without --metrics-addr).
	}
}

// run starts the hub (or takes over from the process it upgrades), serves
// until a signal, an upgrade or a failure, and stops; it returns the exit
// status.
func (s *server) run(ctx context.Context) int {
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	// SIGUSR2 (hot upgrade) is caught from the start: its default action
	// would kill the hub.
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	defer signal.Stop(usr2)
	s.upgradeExe = upgradePath() // its links are followed at each upgrade
	var err error
	if s.inherited, err = inheritedUpgrade(); err != nil {
		fmt.Fprintf(s.stderr, "listenhub serve: upgrade: %v\n", err)
		return 1
	}
	if s.inherited != nil {
		s.predecessor = os.Getppid() // the old process: it waits for us
	}
	if code, ok := s.start(ctx); !ok {
		return code
	}
	// The relay runs on goroutines of its own, never on the hub's loop.
	s.relayDone = make(chan error, 1)
	var rctx context.Context
	rctx, s.stopRelay = context.WithCancel(context.Background())
	if s.rl != nil {
		go func() { s.relayDone <- s.rl.Run(rctx) }()
	}
	if code, graceful := s.wait(ctx, usr2); !graceful {
		return code
	}
	return s.stop()
}

// start binds the metrics address (or takes the one handed over) and
// starts the hub, or takes over from the old process of an upgrade.
func (s *server) start(ctx context.Context) (int, bool) {
	// The metrics address is bound before the hub starts, so that a port
	// in use is a startup error like the others. (An upgrade hands the
	// bound listener over.)
	if s.inherited != nil {
		ln, err := takeover(ctx, s.h, s.inherited, *s.upTimeout, *s.pidFile, s.log)
		if err != nil {
			return s.fail("upgrade: %s", oneLine(err))
		}
		if ln != nil {
			s.serveMetrics(ln)
		}
	} else if *s.metricsAddr != "" {
		ln, err := net.Listen("tcp", *s.metricsAddr)
		if err != nil {
			return s.fail("--metrics-addr: %v", err)
		}
		s.serveMetrics(ln)
	}
	// Start returns once the socket accepts; Postgres is reached in the
	// background (retried while unreachable; a refused configuration
	// stops the hub, in wait).
	if s.inherited == nil {
		if err := s.h.Start(ctx); err != nil {
			if ctx.Err() != nil {
				s.log.Info("signal received while starting; stopped")
				return 0, false
			}
			if errors.Is(err, hub.ErrRefusableSocket) {
				return s.fail("%s (or --allow-refusable-socket, for clients that allow the directory's owner)", oneLine(err))
			}
			return s.fail("%s", oneLine(err))
		}
	}
	s.sd.ready()
	s.log.Info("listenhub serving", "version", versionString(), "socket", s.h.Config().SocketPath,
		"socket_activated", s.listenFile != nil, "host", s.cc.Host,
		"port", s.cc.Port, "database", s.cc.Database, "user", s.cc.User, "application_name", s.app,
		"channel_prefix", *s.prefix, "channel_suffix", *s.suffix)
	if *s.pgConns > 1 {
		// A client's fail-back switches from its own LISTEN to the hub at
		// a marker both deliver at one place in commit order; spread over
		// several connections, the hub's stream to a worker is in commit
		// order per connection only.
		s.log.Warn("fail-backs are not exact with more than one Postgres connection: a worker returning to the hub may get a wake twice or miss one committed during the switch (use --postgres-connections 1 unless tens of thousands of channels need more)",
			"postgres_connections", *s.pgConns)
	}
	if *s.pidFile != "" && s.inherited == nil {
		if err := writePIDFile(*s.pidFile); err != nil {
			s.log.Error("pid file", "reason", err)
		}
	}
	return 0, true
}

// serveMetrics serves the metrics address on ln.
func (s *server) serveMetrics(ln net.Listener) {
	s.metricsLn = ln
	b := readBuildInfo()
	s.metrics = monitor.StartListener(ln, s.h, monitor.Options{Relay: s.rl, Token: s.token, Logger: s.log,
		Version: b.version, Revision: b.revision})
	s.log.Info("metrics listening", "addr", ln.Addr().String(), "token", s.token != "")
}

// wait serves until a signal asks the hub to stop (graceful: stop it), or
// an upgrade hands it over or the hub fails (not graceful: the exit
// status); never for the relay, a guest. SIGHUP re-reads --config meanwhile.
func (s *server) wait(ctx context.Context, usr2 <-chan os.Signal) (code int, graceful bool) {
	reloader := newConfigReloader(s.fs, *s.configPath, s.fromArgs, s.confEntries)
	reloader.h, reloader.log, reloader.logs = s.h, s.log, s.logs
	up := &upgrader{exe: s.upgradeExe, args: append([]string{"serve"}, s.args...), timeout: *s.upTimeout, log: s.log,
		stdout: s.stdout, stderr: s.stderr, h: s.h, predecessor: s.predecessor}
	relayDone := s.relayDone
	for {
		select {
		case <-ctx.Done():
			s.log.Info("signal received; stopping")
			return 0, true
		case <-usr2:
			up.metrics = s.metricsLn
			if up.run(ctx) {
				// The new process serves; the pid file is its. Nothing
				// here may keep this process: the deferred Close of the
				// metrics server is bounded, and so is the rest.
				time.AfterFunc(stopTimeout, func() { os.Exit(0) })
				if s.rl != nil {
					// The new process's relay stands by until this
					// one has NOTIFYed and confirmed what it decoded
					// and let go of the slot.
					s.stopRelay()
					<-s.relayDone
				}
				return 0, false
			}
		case <-s.hup:
			reloader.reload(ctx)
		case err := <-relayDone:
			// A guest relay returns only when stopped; whatever it
			// says otherwise never takes the hub (and every worker's
			// connection) down with it. (Put back for the stop's wait.)
			relayDone = nil
			s.relayDone <- err
			if err != nil {
				s.log.Error("relay stopped; the hub serves on", "err", oneLine(err))
			}
		case <-s.h.Done():
			// A Postgres configuration error (Wait says which), or the
			// loop failed.
			why := "hub stopped unexpectedly"
			if err := s.h.Wait(); err != nil {
				why = oneLine(err)
			}
			s.stopFailed(why)
			return 1, false
		}
	}
}

// stopFailed says why the hub stops on a failure, and removes the pid
// file, which would name a dead process.
func (s *server) stopFailed(why string) {
	s.sd.stopping("stopped: " + why)
	fmt.Fprintf(s.stderr, "listenhub serve: %s\n", why)
	if *s.pidFile != "" {
		removePIDFile(*s.pidFile)
	}
}

// stop is the graceful stop of SIGTERM: the relay, then the metrics
// server and the hub within stopTimeout.
func (s *server) stop() int {
	if *s.pidFile != "" {
		defer removePIDFile(*s.pidFile)
	}
	s.sd.stopping("stopping")
	if s.rl != nil {
		s.stopRelay()
		<-s.relayDone
	}
	sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if s.metrics != nil {
		s.metrics.Shutdown(sctx)
	}
	if err := s.h.Stop(sctx); err != nil {
		fmt.Fprintf(s.stderr, "listenhub serve: stop: %v\n", err)
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
