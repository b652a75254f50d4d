package hub

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/channame"
	"github.com/listenhub/listenhub/internal/pglisten"
)

// DefaultConfig returns a Config with every field that has a default set
// to it: what a zero field means (as nats.go's GetDefaultOptions). The
// connection (SocketPath, DatabaseURL) is left empty. MaxOutboundBytes
// depends on this machine's memory (see Config.MaxOutboundBytes).
func DefaultConfig() Config {
	return Config{
		ApplicationName:     defaultApplicationName,
		DurableQueueLimit:   defaultDurableQueueLimit,
		HardQueueLimit:      defaultHardQueueLimit,
		HardQueueBytes:      defaultHardQueueBytes,
		MaxOutboundBytes:    defaultMaxOutboundBytes(),
		StatusInterval:      defaultStatusInterval,
		HealthCheckInterval: defaultHealthCheckInterval,
		HealthCheckTimeout:  defaultHealthCheckTimeout,
		AcceptBatch:         defaultAcceptBatch,
		MaxWorkers:          defaultMaxWorkers,
		MaxSubscriptions:    defaultMaxSubscriptions,
		MaxChannels:         defaultMaxChannels,
		FrameTimeout:        defaultFrameTimeout,
		StallTimeout:        defaultStallTimeout,
		SocketMode:          defaultSocketMode,
	}
}

// The defaults of a Config's zero fields (DefaultConfig); docs/design.md's.
const (
	defaultApplicationName     = "listenhub"
	defaultDurableQueueLimit   = 256
	defaultHardQueueLimit      = 1024
	defaultStatusInterval      = time.Second
	defaultHealthCheckInterval = 250 * time.Millisecond
	defaultHealthCheckTimeout  = time.Second
	defaultAcceptBatch         = 64
	defaultMaxWorkers          = 10000
	defaultMaxSubscriptions    = 10000
	defaultMaxChannels         = 50000
	defaultFrameTimeout        = 10 * time.Second
	defaultStallTimeout        = 2 * time.Second

	// maxInboundFrame (64 KiB) is the largest frame body the hub reads
	// from a worker. A worker only ever sends sub and unsub, a few hundred
	// bytes at most (a name that fits a Postgres channel, fully escaped),
	// so the protocol's 4 MiB (frame.MaxLen, which the client side keeps
	// for wakes) would only let a peer make the hub hold megabytes of a
	// partial frame. A larger length header severs the connection before
	// its body is buffered.
	maxInboundFrame = 64 << 10

	// smallFrame is the partial frame size maxPartialBytes never cuts.
	smallFrame = 4 << 10

	// fdReserve is how many descriptors below RLIMIT_NOFILE the hub never
	// spends on workers: the Postgres reconnect (a socket, DNS), the
	// metrics server and its scrapes, log files and an upgrade's handover
	// need them, and none of those may fail with EMFILE because workers
	// took every descriptor. One more is kept per Postgres connection
	// (Config.PostgresConnections).
	fdReserve = 64

	// defaultHardQueueBytes (8 MiB) is the byte half of the hard limit.
	// A NOTIFY payload is at most 8000 bytes, so a frame is at most about
	// 8100 bytes unless the payload needs JSON escapes; 1024 such frames
	// (8.3 MB) fit under 8 MiB (8.39 MB). The frame cap is therefore the one
	// that normally bites, and the byte cap only stops payloads that escape
	// heavily from pinning more than 8 MiB of hub memory per worker.
	defaultHardQueueBytes = 8 << 20

	// maxDurableFrame bounds one durable wake frame: the header and
	// {"t":"wake","q":"…","p":null} with a name of at most channame.MaxLen
	// bytes, each of which JSON may spell in 6 (\u00XX, \ufffd).
	maxDurableFrame = 4 + len(`{"t":"wake","q":""`) + 6*channame.MaxLen + len(`,"p":null}`)

	// maxAckFrame bounds one ack frame the same way: every acked name is
	// a valid channel name.
	maxAckFrame = 4 + len(`{"t":"ack","q":""}`) + 6*channame.MaxLen
)

// Config configures a Hub. The zero value of every field but SocketPath (and
// a database to connect to) means the default documented on the field.
type Config struct {
	// SocketPath is where the hub listens for workers. Required unless
	// Listener is set.
	SocketPath string

	// ListenerFile, when set, is a Unix stream socket bound and listening
	// already, accepted on instead of binding SocketPath: the socket a
	// systemd socket unit passes (LISTEN_FDS), so that workers can connect
	// before the hub runs and between two hubs. The hub accepts on a
	// duplicate of it (the caller may close ListenerFile after Start) and
	// never removes its file, which belongs to whoever bound it. An empty
	// SocketPath is filled in from the socket's address; a SocketPath that
	// names another file is an error.
	ListenerFile *os.File

	// SocketMode is the permission bits of the socket file the hub
	// creates at SocketPath. Default 0600 (defaultSocketMode): only the
	// hub's uid (and root) can connect. 0660 with SocketGroup lets a
	// group's members connect; AllowUIDs still decides whom the hub
	// serves. Not for a Listener, whose file belongs to whoever bound it
	// (a socket unit's SocketMode=).
	SocketMode os.FileMode
	// SocketGroup, when set, is the group (a name or a numeric gid) the
	// socket file is given before it accepts. Not for a Listener (a
	// socket unit's SocketGroup=).
	SocketGroup string

	// DatabaseURL is a libpq connection string or URL. Empty means the
	// libpq PG* environment variables (pgconn.ParseConfig("")).
	// Ignored when ConnConfig is set; otherwise New parses it into
	// ConnConfig.
	DatabaseURL string
	// ConnConfig, when set, is used as is (its application_name included).
	ConnConfig *pgconn.Config
	// Upstream, when set, is where the hub takes its notifications from
	// instead of a Postgres connection of its own (DatabaseURL, ConnConfig
	// and PostgresConnections are then unused): a fleet's NATS.
	Upstream Upstream

	// ChannelPrefix and ChannelSuffix map a subscription name Q to the
	// Postgres channel Prefix+Q+Suffix (pgbus: "pgmq.q_" and ".INSERT").
	ChannelPrefix, ChannelSuffix string

	// ApplicationName tags the hub's backend in pg_stat_activity, which is
	// what `listenhub census` counts. Default "listenhub".
	ApplicationName string

	// DurableQueueLimit caps the pending (not yet written) durable wake
	// frames of one worker; a durable wake beyond it is dropped and
	// counted, never a reason to evict. Default 256.
	DurableQueueLimit int
	// HardQueueLimit bounds the pending frames of one worker other than
	// durable wakes (those have DurableQueueLimit) and answers. A worker
	// past it is evicted once its socket took nothing for StallTimeout:
	// one that keeps reading stays through a burst of any number of
	// frames, as its own LISTEN connection would. Default 1024.
	HardQueueLimit int
	// HardQueueBytes caps the pending bytes of one worker, durable wakes
	// and answers again not counted: past it the worker is evicted at
	// once, reading or not. It is what bounds the hub's memory for one
	// worker. Default defaultHardQueueBytes.
	HardQueueBytes int
	// StallTimeout is how long a worker past HardQueueLimit may go
	// without its socket taking a byte before it is evicted. Default 2s:
	// a worker that reads takes bytes every few milliseconds, even on a
	// loaded machine.
	StallTimeout time.Duration

	// MaxOutboundBytes bounds the bytes queued for all workers together
	// (wakes, answers, status) and not yet taken by the kernel. Past it
	// the worker holding the most is evicted (see outbudget.go): a hub
	// whose workers all fall behind at once holds at most this much for
	// them, not MaxWorkers times HardQueueBytes. Default
	// defaultMaxOutboundBytes(), sized to the machine; at least
	// HardQueueBytes.
	MaxOutboundBytes int

	// StatusInterval is the status period: every worker is re-sent the
	// current status every 5 intervals. Default 1s.
	StatusInterval time.Duration
	// HealthCheckInterval and HealthCheckTimeout drive the Postgres
	// health check (docs/design.md rule 8). Defaults 250ms and 1s.
	HealthCheckInterval, HealthCheckTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the reconnect backoff.
	// Zero leaves the listener's defaults.
	ReconnectMin, ReconnectMax time.Duration
	// CommandTimeout, when set, bounds a LISTEN or UNLISTEN issued while
	// Postgres is down: after it the sub is nacked. Zero, the default,
	// waits for Postgres however long: the sub is acked once Postgres is
	// back and LISTEN ran, which is what a worker started during an
	// outage needs (its client does not time the ack out while the hub
	// says healthy:false).
	CommandTimeout time.Duration

	// AllowUIDs lists the peer uids allowed to connect. Empty means the
	// hub's own uid and root.
	AllowUIDs []int

	// ServeRefusableSocket serves a socket whose directories the clients
	// refuse (owned by a uid other than root, the hub's and AllowUIDs, or
	// writable by group or other without the sticky bit), with a warning
	// every minute and Stats.SocketRefusable, instead of failing Start
	// with ErrRefusableSocket. For a set-up whose clients name the
	// directory's owner in their own allowed uids.
	ServeRefusableSocket bool

	// Logger receives the hub's logs. Nil means slog.Default().
	Logger *slog.Logger

	// AcceptBatch bounds the connections accepted per readiness of the
	// listening socket, so an accept storm cannot starve fanout.
	// Default 64.
	AcceptBatch int

	// MaxWorkers caps the connected workers. A connection past it is
	// accepted and closed at once (the worker falls back to its own
	// LISTEN), counted in Stats.ConnectionsRefused and logged. The cap in
	// force is lower when RLIMIT_NOFILE is: the descriptors open at Start
	// and fdReserve (plus Hub.ReserveFDs) more are never spent on workers,
	// so that neither the Postgres reconnect nor the metrics server fails
	// with EMFILE. The limit is read again on every status tick and when
	// accept fails with EMFILE, so a limit lowered on the running hub
	// (prlimit) lowers the cap too.
	// Default 10,000.
	MaxWorkers int
	// MaxSubscriptions caps the subscriptions of one worker (and its subs
	// still waiting for an answer). A sub past it is refused with
	// nack "too many subscriptions"; the connection stays. Default 10,000.
	MaxSubscriptions int
	// MaxChannels caps the channels the hub LISTENs to (the union, with
	// those whose LISTEN or UNLISTEN is in flight). A sub that would add
	// one past it is refused with nack "too many channels"; the
	// connection stays. Default 50,000.
	MaxChannels int
	// ReleaseMemory makes the hub give memory a burst took back to the OS
	// once the burst is over (see memory.go): a goroutine off the loop
	// forces a collection and debug.FreeOSMemory when the process is quiet
	// and its heap holds far more than its live data. It acts on the whole
	// process, so it is off unless asked for; listenhub serve turns it on.
	ReleaseMemory bool

	// FrameTimeout bounds how long a worker may take to send one frame:
	// a frame still incomplete after it severs the connection, so that a
	// peer cannot hold a partial frame (up to maxInboundFrame bytes) for
	// ever. Default 10s.
	FrameTimeout time.Duration

	// OnReport, when set, is called on the loop goroutine with the hub's
	// Stats once the socket accepts, on every change of Postgres health,
	// and every ReportInterval until the hub stops. It must not block.
	// Running on the loop is the point: a wedged loop stops the reports,
	// so the systemd watchdog can be pinged from here (serve does).
	OnReport func(Stats)
	// ReportInterval is the period of Report. Default StatusInterval.
	ReportInterval time.Duration

	// PostgresConnections is how many LISTEN connections the channel
	// union is spread over, each channel on one of them (by a hash of its
	// name). PostgreSQL scans a backend's channel list for every
	// notification, so one backend holding tens of thousands of channels
	// delivers far fewer NOTIFYs per second; a few connections each hold
	// a share. The hub is healthy when all are. Default 1, at most
	// MaxPostgresConnections.
	PostgresConnections int

	// WriteThreads is how many threads write a large fanout: when one
	// loop iteration has frames for many workers (32 or more), their
	// write(2) calls are split between the loop's thread and
	// WriteThreads-1 helper threads, so that the last worker of a NOTIFY
	// to hundreds is written sooner. 1 keeps every write on the loop's
	// thread. The helpers write only while the loop has been idle more
	// than busy lately (see loopLoad). Default min(GOMAXPROCS, 4).
	WriteThreads int
}

// maxPartialBytes is a variable so that tests can lower it.
var (
	// maxPartialBytes (64 MiB) bounds the partial inbound frames all
	// workers hold together. Without it the bound would be MaxWorkers
	// times maxInboundFrame (640 MiB at the defaults). Past it, a worker
	// whose partial frame is larger than 4 KiB is severed: the frames
	// workers need (sub, unsub: a name of at most 63 bytes, escaped) are
	// far below that, so the budget costs only peers that send what no
	// worker has to. The worst case is then maxPartialBytes plus
	// MaxWorkers times smallFrame (64 MiB + 40 MiB at the defaults), on
	// top of what each read brings.
	maxPartialBytes = 64 << 20
)

// MaxPostgresConnections bounds Config.PostgresConnections: each is a
// backend, and the point of the hub is to use few.
const MaxPostgresConnections = 64

// withDefaults returns a copy of c with zero fields defaulted, or an error
// naming the first invalid field.
func (c Config) withDefaults() (Config, error) {
	if c.SocketPath == "" && c.ListenerFile == nil {
		return c, errors.New("hub: config: SocketPath (or Listener) is required")
	}
	if c.ApplicationName == "" {
		c.ApplicationName = defaultApplicationName
	}
	if c.SocketMode&^os.ModePerm != 0 {
		return c, fmt.Errorf("hub: config: SocketMode %#o has more than permission bits", uint32(c.SocketMode))
	}
	if c.ListenerFile != nil && (c.SocketMode != 0 || c.SocketGroup != "") {
		return c, errors.New("hub: config: SocketMode and SocketGroup are for a socket the hub creates; an inherited socket has its unit's SocketMode= and SocketGroup=")
	}
	if c.SocketMode == 0 {
		c.SocketMode = defaultSocketMode
	}
	outboundDefault := c.MaxOutboundBytes == 0
	defInt := func(v *int, def int, name string) error {
		if *v < 0 {
			return fmt.Errorf("hub: config: %s must not be negative (got %d)", name, *v)
		}
		if *v == 0 {
			*v = def
		}
		return nil
	}
	defDur := func(v *time.Duration, def time.Duration, name string) error {
		if *v < 0 {
			return fmt.Errorf("hub: config: %s must not be negative (got %v)", name, *v)
		}
		if *v == 0 {
			*v = def
		}
		return nil
	}
	for _, err := range []error{
		defInt(&c.DurableQueueLimit, defaultDurableQueueLimit, "DurableQueueLimit"),
		defInt(&c.HardQueueLimit, defaultHardQueueLimit, "HardQueueLimit"),
		defInt(&c.HardQueueBytes, defaultHardQueueBytes, "HardQueueBytes"),
		defInt(&c.MaxOutboundBytes, defaultMaxOutboundBytes(), "MaxOutboundBytes"),
		defInt(&c.AcceptBatch, defaultAcceptBatch, "AcceptBatch"),
		defInt(&c.MaxWorkers, defaultMaxWorkers, "MaxWorkers"),
		defInt(&c.MaxSubscriptions, defaultMaxSubscriptions, "MaxSubscriptions"),
		defInt(&c.MaxChannels, defaultMaxChannels, "MaxChannels"),
		defDur(&c.FrameTimeout, defaultFrameTimeout, "FrameTimeout"),
		defDur(&c.StallTimeout, defaultStallTimeout, "StallTimeout"),
		defInt(&c.PostgresConnections, 1, "PostgresConnections"),
		defInt(&c.WriteThreads, defaultWriteThreads(), "WriteThreads"),
		defDur(&c.StatusInterval, defaultStatusInterval, "StatusInterval"),
		defDur(&c.HealthCheckInterval, defaultHealthCheckInterval, "HealthCheckInterval"),
		defDur(&c.HealthCheckTimeout, defaultHealthCheckTimeout, "HealthCheckTimeout"),
		defDur(&c.CommandTimeout, 0, "CommandTimeout"),
		defDur(&c.ReconnectMin, 0, "ReconnectMin"),
		defDur(&c.ReconnectMax, 0, "ReconnectMax"),
		defDur(&c.ReportInterval, 0, "ReportInterval"),
	} {
		if err != nil {
			return c, err
		}
	}
	if c.ReportInterval == 0 {
		c.ReportInterval = c.StatusInterval
	}
	if outboundDefault {
		// The machine's share, but never below one worker's cap.
		c.MaxOutboundBytes = max(c.MaxOutboundBytes, c.HardQueueBytes)
	}
	if c.PostgresConnections > MaxPostgresConnections {
		return c, fmt.Errorf("hub: config: PostgresConnections %d is above the maximum %d", c.PostgresConnections, MaxPostgresConnections)
	}
	if c.HardQueueBytes < 64<<10 {
		// One frame may carry an 8000-byte payload; a cap below a few
		// of those would evict healthy workers on an ordinary burst.
		return c, fmt.Errorf("hub: config: HardQueueBytes %d is below the 64 KiB minimum", c.HardQueueBytes)
	}
	if c.MaxOutboundBytes < c.HardQueueBytes {
		// One worker could never reach its own cap: the budget would
		// evict where the hard limit is meant to.
		return c, fmt.Errorf("hub: config: MaxOutboundBytes %d is below HardQueueBytes %d", c.MaxOutboundBytes, c.HardQueueBytes)
	}
	if n := len(c.ChannelPrefix) + len(c.ChannelSuffix); n >= channame.MaxLen {
		return c, fmt.Errorf("hub: config: channel prefix and suffix are %d bytes; no subscription name fits in %d", n, channame.MaxLen)
	}
	for _, uid := range c.AllowUIDs {
		if uid < 0 {
			return c, fmt.Errorf("hub: config: AllowUIDs: invalid uid %d", uid)
		}
	}
	if len(c.AllowUIDs) == 0 {
		c.AllowUIDs = []int{os.Getuid()}
		if os.Getuid() != 0 {
			c.AllowUIDs = append(c.AllowUIDs, 0)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ConnConfig == nil && c.Upstream == nil {
		// Parsed here, not at connect time: the connection is made in
		// the background after Start, and a string that cannot parse
		// is a mistake to report at once.
		cc, err := pglisten.ParseConfig(c.DatabaseURL, c.ApplicationName)
		if err != nil {
			return c, fmt.Errorf("hub: config: DatabaseURL: %w", err)
		}
		c.ConnConfig = cc
	}
	return c, nil
}
