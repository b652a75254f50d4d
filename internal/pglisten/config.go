// Package pglisten is the Postgres side of listenhub: the LISTEN connection.
// Package listener is its public face (Plain, CheckDelivery and the
// helpers); Conn, the hub's connection, is package hub's alone.
//
// Conn is the hub's connection. Start makes one that connects in the
// background (the hub accepts workers before Postgres is reached; an
// unreachable server is retried forever, a refused configuration is
// reported once through OnFatal); Open connects before it returns. Either
// way the connection is opened and authenticated by pgconn off the loop,
// then hijacked: a plaintext TCP or Unix-socket connection is
// driven from its raw file descriptor by the loop (no goroutine at all), a
// TLS connection by one bridge goroutine that feeds the loop through Post.
// Either way every callback runs on the loop goroutine and every method is
// loop-goroutine only.
//
// Plain is the fallback for a worker without a hub: the same
// Listen/Unlisten-with-confirmation semantics on its own pgconn connection,
// driven by a goroutine.
//
// Both batch the commands they are given into multi-statement simple
// Queries, health-check an idle connection with an empty query, and on loss
// reconnect with capped exponential backoff and jitter, re-LISTEN the whole
// set, and only then report healthy again. Conn bounds each batch so that
// one query stays short however many channels the session listens to
// (see targetBatchTime): a large set becomes healthy, and stays healthy
// under the health check, after start and after every reconnect.
package pglisten

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/channame"
	"github.com/listenhub/listenhub/internal/defaults"
	"github.com/listenhub/listenhub/internal/pgquote"
)

// DefaultApplicationName is the application_name the listener's backends
// carry in pg_stat_activity unless the connection string or PGAPPNAME says
// otherwise: `listenhub census` counts backends by it.
const DefaultApplicationName = "listenhub"

// MaxChannelLen is the longest channel name Postgres keeps: identifiers are
// silently truncated at NAMEDATALEN-1 bytes, and a truncated LISTEN would
// listen to a different channel than the one asked for.
const MaxChannelLen = channame.MaxLen

// Defaults applied to zero Config fields (docs/design.md rule 8 and rule 7).
const (
	DefaultHealthCheckInterval = 250 * time.Millisecond
	DefaultHealthCheckTimeout  = time.Second
	DefaultReconnectMin        = 100 * time.Millisecond
	DefaultReconnectMax        = 5 * time.Second
	// maxRetryWhileWaiting caps the reconnect delay while a command waits
	// for the connection (docs/design.md, Lifecycle: Start): a sub
	// waiting for a server that comes back is served within about this,
	// whatever the backoff has grown to.
	maxRetryWhileWaiting = 500 * time.Millisecond
	// defaultConnectTimeout bounds one reconnect attempt when the
	// connection string sets no connect_timeout: a server that accepts
	// TCP and then hangs during authentication must not stall the
	// reconnect loop forever.
	defaultConnectTimeout = 10 * time.Second
)

var (
	// ErrClosed is passed to the done callbacks (or returned) of commands
	// that were still waiting when the connection was closed, and of
	// commands issued after Close.
	ErrClosed = errors.New("listener: closed")
	// ErrCommandTimeout is passed to done when a command issued while the
	// connection was down waited longer than Config.CommandTimeout.
	ErrCommandTimeout = errors.New("listener: no connection within the command timeout")
	// ErrInvalidChannel wraps every reason ValidChannel refuses a name
	// (the hub's nack texts say the same: "invalid channel: …").
	ErrInvalidChannel = channame.ErrInvalid
	// ErrHealthCheck is the reason a connection is declared dead when the
	// server sent nothing within the health-check deadline.
	ErrHealthCheck = errors.New("listener: health check: no answer from the server")
)

// Config configures a Conn. ConnConfig is required; zero durations take the
// defaults above.
type Config struct {
	// ConnConfig says where and how to connect: use ParseConfig. It is
	// used for every (re)connect and not modified.
	ConnConfig *pgconn.Config

	// HealthCheckInterval is how long the connection may be idle (no
	// byte from the server) before it is probed with an empty query;
	// HealthCheckTimeout is how long the probe, or any command in flight,
	// may go unanswered before the connection is declared dead. Any
	// traffic from the server counts as an answer, so a busy connection
	// is never probed.
	HealthCheckInterval, HealthCheckTimeout time.Duration

	// ReconnectMin and ReconnectMax bound the delay before each reconnect
	// attempt: it starts at ReconnectMin, doubles per failed attempt up to
	// ReconnectMax, and is jittered down by up to half so that the hubs of
	// many hosts do not reconnect in lockstep after a server restart.
	ReconnectMin, ReconnectMax time.Duration

	// CommandTimeout bounds how long a Listen or Unlisten waits for a
	// connection while the connection is down; on expiry its done gets
	// ErrCommandTimeout. Zero means wait for the reconnect however long.
	// A command that was already sent is bounded by the health check.
	CommandTimeout time.Duration

	// OnNotification is called on the loop goroutine for every
	// NotificationResponse. The slices point into the read buffer and are
	// valid only during the call: copy what you keep. It must not block.
	OnNotification func(channel, payload []byte)

	// OnHealth is called on the loop goroutine with false when the
	// connection is lost (or stops delivering notifications), and with
	// true when it is (re)established, has passed the delivery check (a
	// notification on a private channel came back: check.go) and every
	// channel of the current set is LISTENed again. The first
	// OnHealth(true) comes once Open's or Start's connection has passed
	// the check and LISTENed whatever was asked meanwhile.
	OnHealth func(healthy bool)

	// OnFatal is called once, on the loop goroutine, when Start's
	// connection attempts end for good: the server refused the
	// configuration (IsConfigError: authentication failed, no such
	// database or role, bad connection string) before the first
	// successful connect. Retrying cannot fix that, so the Conn stops
	// trying and every command, waiting or later, fails with the same
	// error. The message never carries the password. Once a connection
	// has been made, the same errors during a reconnect are logged and
	// retried instead (a database that goes away after start is
	// survived). Nil means the error is only logged.
	OnFatal func(err error)

	// OnNotDelivered is called on the loop goroutine every time the
	// delivery check fails (err wraps ErrNotDelivered and says what the
	// connection most likely is), before the connection is dropped and
	// retried. Nil means the Conn logs it itself, at most once per 30 s
	// while the reason stays the same; an owner of several Conns sets it
	// to log one line for all of them.
	OnNotDelivered func(err error)

	// Logger receives connection events (keys "pid", "reason", "q"). Nil
	// means slog.Default().
	Logger *slog.Logger
}

func (cfg *Config) withDefaults() Config {
	c := *cfg
	defaults.Set(&c.HealthCheckInterval, DefaultHealthCheckInterval)
	defaults.Set(&c.HealthCheckTimeout, DefaultHealthCheckTimeout)
	defaults.Set(&c.ReconnectMin, DefaultReconnectMin)
	defaults.Set(&c.ReconnectMax, DefaultReconnectMax)
	if c.ReconnectMax < c.ReconnectMin {
		c.ReconnectMax = c.ReconnectMin
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// IsConfigError reports whether err says the server refused the connection
// settings themselves, so that retrying without a change cannot succeed:
// authentication failed (SQLSTATE 28P01, 28000, which also covers an unknown
// role and a missing pg_hba.conf entry), no such database (3D000), or an
// unparsable connection string.
func IsConfigError(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "28P01", "28000", "3D000":
			return true
		}
		return false
	}
	var ce *pgconn.ParseConfigError
	return errors.As(err, &ce) || errors.Is(err, errNoConnConfig) || errors.Is(err, ErrURLScheme)
}

// errNoConnConfig is the configuration error of a Config without ConnConfig.
var errNoConnConfig = errors.New("listener: Config.ConnConfig is nil (use ParseConfig)")

// ParseConfig parses a connection string the way libpq does, through
// pgconn.ParseConfig: a postgres:// URL, a key=value DSN, or "" for the PG*
// environment variables alone (which also fill in whatever the string
// leaves out). The application_name is applicationName, or
// DefaultApplicationName when that is empty, unless the string or
// PGAPPNAME already sets one.
func ParseConfig(connString, applicationName string) (*pgconn.Config, error) {
	if err := checkScheme(connString); err != nil {
		return nil, err
	}
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		// pgconn's ParseConfigError already redacts the password.
		return nil, fmt.Errorf("listener: %w", err)
	}
	if applicationName == "" {
		applicationName = DefaultApplicationName
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = applicationName
	}
	return cfg, nil
}

// ErrURLScheme is returned by ParseConfig for a URL whose scheme is not
// postgres:// or postgresql:// (a typo such as postgress://), which pgconn
// would otherwise try to read as a key=value string and refuse with "failed
// to parse as keyword/value".
var ErrURLScheme = errors.New("listener: not a PostgreSQL URL")

// checkScheme refuses "scheme://…" with a scheme libpq does not know. A
// key=value string has an "=" or a space before any "://".
func checkScheme(s string) error {
	i := strings.Index(s, "://")
	if i <= 0 || strings.ContainsAny(s[:i], "= \t") {
		return nil
	}
	switch scheme := s[:i]; scheme {
	case "postgres", "postgresql":
		return nil
	default:
		return fmt.Errorf("%w: unknown scheme %q (want postgres:// or postgresql://)", ErrURLScheme, scheme+"://")
	}
}

// ValidChannel reports why ch cannot be LISTENed to as given, or nil (the
// error wraps ErrInvalidChannel). Empty names are a syntax error in
// Postgres; names over MaxChannelLen bytes would be truncated into another
// channel; NUL cannot travel in a query; invalid UTF-8 is refused by the
// server for the whole query string, which would make the error impossible
// to pin on one command of a batch.
func ValidChannel(ch string) error { return channame.Check(ch) }

// QuoteIdentifier returns ch as a quoted SQL identifier: wrapped in double
// quotes with every double quote doubled, so that no channel name can end
// the identifier and inject SQL. Check ValidChannel first (NUL is not
// representable).
func QuoteIdentifier(ch string) string { return pgquote.Ident(ch) }
