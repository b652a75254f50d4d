// Package listener is the Postgres side of listenhub for a program without a
// hub: Conn, a per-process LISTEN connection owned by one goroutine, with
// the hub's semantics (Listen and Unlisten return once the server confirmed
// them; commands are batched into multi-statement queries; an idle
// connection is health-checked, and on loss it reconnects with capped
// exponential backoff and jitter, re-LISTENs the whole set and only then
// reports healthy again). Healthy means notifications provably arrive: each
// connection NOTIFYs a private channel of its own and waits for it to come
// back.
//
// The hub's own connection, driven by its event loop, shares this code and
// is not part of the API (internal/pglisten).
package listener

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/pglisten"
)

// defaultApplicationName is the application_name a listener's backends
// carry in pg_stat_activity unless the connection string or PGAPPNAME says
// otherwise: `listenhub census` counts backends by it.
const defaultApplicationName = pglisten.DefaultApplicationName

// MaxChannelLen is the longest channel name Postgres keeps: identifiers are
// silently truncated at NAMEDATALEN-1 bytes, and a truncated LISTEN would
// listen to a different channel than the one asked for.
const MaxChannelLen = pglisten.MaxChannelLen

// Defaults applied to the zero fields of a Config.
const (
	defaultHealthCheckInterval = pglisten.DefaultHealthCheckInterval
	defaultHealthCheckTimeout  = pglisten.DefaultHealthCheckTimeout
	defaultReconnectMin        = pglisten.DefaultReconnectMin
	defaultReconnectMax        = pglisten.DefaultReconnectMax
)

var (
	// ErrClosed is returned by the commands still waiting when the
	// listener was closed, and by those issued after Close.
	ErrClosed = pglisten.ErrClosed
	// ErrCommandTimeout: a command issued while the connection was down
	// waited longer than its timeout.
	ErrCommandTimeout = pglisten.ErrCommandTimeout
	// ErrInvalidChannel wraps every reason ValidChannel refuses a name
	// (the hub's nack texts say the same: "invalid channel: …").
	ErrInvalidChannel = pglisten.ErrInvalidChannel
	// ErrHealthCheck is the reason a connection is declared dead when the
	// server sent nothing within the health-check deadline.
	ErrHealthCheck = pglisten.ErrHealthCheck
	// ErrNotDelivered says notifications do not arrive on a connection
	// (a transaction-pooling PgBouncer, most likely).
	ErrNotDelivered = pglisten.ErrNotDelivered
	// ErrURLScheme is returned by ParseConfig for a URL whose scheme is
	// not postgres:// or postgresql:// (a typo such as postgress://).
	ErrURLScheme = pglisten.ErrURLScheme
)

// Config configures a listener Conn (Connect).
type Config struct {
	// ConnConfig is where to connect (ParseConfig makes one). Required.
	ConnConfig *pgconn.Config

	// HealthCheckInterval is how long an idle connection may stay silent
	// before its delivery check runs; HealthCheckTimeout bounds the
	// check's round trip. Defaults defaultHealthCheckInterval and
	// defaultHealthCheckTimeout.
	HealthCheckInterval, HealthCheckTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the backoff between reconnect
	// attempts (doubling, with jitter). Defaults defaultReconnectMin and
	// defaultReconnectMax.
	ReconnectMin, ReconnectMax time.Duration

	// OnNotification is called for every notification, in the order the
	// server sent them, from the listener's goroutine. While it runs
	// nothing is read from the connection: hand slow work off.
	OnNotification func(channel, payload string)
	// OnHealth is called from the listener's goroutine: true right after
	// Connect and after every reconnect once the whole set is LISTENed
	// again, false when the connection is lost.
	OnHealth func(healthy bool)

	// Logger receives the connection's lines (reconnects, notices). Nil
	// means slog.Default(), as everywhere in this module.
	Logger *slog.Logger
}

// Conn is a per-process LISTEN connection for a worker that has no hub:
// one pgconn connection owned by one goroutine. pgconn cannot run a query
// while it waits for a notification, so commands are queued, the wait is
// cut short, and everything queued runs as one multi-statement query. All
// methods are safe for concurrent use.
type Conn struct {
	p *pglisten.Plain
}

// Connect connects with cfg and returns a Conn once the
// connection passed the delivery check; an unreachable server, or one
// through which notifications do not arrive (ErrNotDelivered), is the
// error.
func Connect(ctx context.Context, cfg Config) (*Conn, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p, err := pglisten.NewPlain(ctx, pglisten.PlainConfig(cfg))
	if err != nil {
		return nil, err
	}
	return &Conn{p: p}, nil
}

// Listen starts listening to channel and returns once Postgres has
// confirmed it: every NOTIFY committed after that reaches OnNotification.
// While the connection is down it waits for the reconnect, bounded by ctx.
// A name ValidChannel refuses is an error wrapping ErrInvalidChannel.
func (p *Conn) Listen(ctx context.Context, channel string) error { return p.p.Listen(ctx, channel) }

// Unlisten stops listening to channel and returns once Postgres has
// confirmed it.
func (p *Conn) Unlisten(ctx context.Context, channel string) error {
	return p.p.Unlisten(ctx, channel)
}

// Notify commits NOTIFY channel, payload on this connection, in order with
// the Listen and Unlisten calls before it: a point in commit order that
// this connection and any other listener of the database both see.
func (p *Conn) Notify(ctx context.Context, channel, payload string) error {
	return p.p.Notify(ctx, channel, payload)
}

// Healthy reports whether the connection is up with the whole set
// LISTENed and its last delivery check passed.
func (p *Conn) Healthy() bool { return p.p.Healthy() }

// Close sends UNLISTEN * and Terminate, closes the connection and waits for
// the listener's goroutine to return. Commands still waiting get ErrClosed.
func (p *Conn) Close() error { return p.p.Close() }

// ParseConfig parses a connection string the way libpq does, through
// pgconn.ParseConfig: a postgres:// URL, a key=value DSN, or "" for the PG*
// environment variables alone (which also fill in whatever the string
// leaves out). The application_name is applicationName, or
// defaultApplicationName when that is empty, unless the string or
// PGAPPNAME already sets one.
func ParseConfig(connString, applicationName string) (*pgconn.Config, error) {
	return pglisten.ParseConfig(connString, applicationName)
}

// IsConfigError reports whether err says the server refused the connection
// settings themselves, so that retrying without a change cannot succeed:
// authentication failed (SQLSTATE 28P01, 28000, which also covers an unknown
// role and a missing pg_hba.conf entry), no such database (3D000), or an
// unparsable connection string.
func IsConfigError(err error) bool { return pglisten.IsConfigError(err) }

// ValidChannel reports why ch cannot be LISTENed to as given, or nil (the
// error wraps ErrInvalidChannel). Empty names are a syntax error in
// Postgres; names over MaxChannelLen bytes would be truncated into another
// channel; NUL cannot travel in a query; invalid UTF-8 is refused by the
// server.
func ValidChannel(ch string) error { return pglisten.ValidChannel(ch) }

// QuoteIdentifier returns ch as a quoted SQL identifier: wrapped in double
// quotes with every double quote doubled, so that no channel name can end
// the identifier and inject SQL. Check ValidChannel first (NUL is not
// representable).
func QuoteIdentifier(ch string) string { return pglisten.QuoteIdentifier(ch) }
