package riverhub

import (
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/listenhub/listenhub/client"
)

// Options configure a Driver.
type Options struct {
	// Failover configures each listener's hub client and its local
	// fallback: Failover.Hub.SocketPath is required (the hub's --socket).
	// Failover.Local's connection settings default to the pool's (its
	// ApplicationName to "listenhub-local"); set Failover.Local.DatabaseURL
	// to a direct URL when the pool goes through a transaction pooler, whose
	// connections cannot LISTEN.
	Failover client.FailoverOptions
	// Logger defaults to Failover.Logger, then slog.Default().
	Logger *slog.Logger
}

// Driver is riverpgxv5's driver whose listener goes through the hub. Pass it
// to river.NewClient as a riverpgxv5 driver.
type Driver struct {
	*riverpgxv5.Driver
	pool *pgxpool.Pool
	opts Options
}

// New returns a Driver on pool, which River uses as riverpgxv5.New(pool)
// would; the listeners it hands out use opts.
func New(pool *pgxpool.Pool, opts Options) *Driver {
	if opts.Logger == nil {
		opts.Logger = opts.Failover.Logger
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Failover.Logger == nil {
		opts.Failover.Logger = opts.Logger
	}
	return &Driver{Driver: riverpgxv5.New(pool), pool: pool, opts: opts}
}

// GetListener returns a listener for River's notifier that goes through
// the hub, for the schema River asks for (empty: the pool's current
// schema, looked up at Connect).
func (d *Driver) GetListener(params *riverdriver.GetListenenerParams) riverdriver.Listener {
	return newListener(d.pool, d.opts, params.Schema)
}

// River takes a Driver as a riverpgxv5 driver.
var _ riverdriver.Driver[pgx.Tx] = (*Driver)(nil)
