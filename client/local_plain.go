package client

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/listener"
)

// openPlain connects the listener.Conn under l. Its callbacks run on its
// own goroutine; Local serializes them with its dispatch lock.
func openPlain(ctx context.Context, cc *pgconn.Config, l *Local) (plain, error) {
	return listener.Connect(ctx, listener.Config{
		ConnConfig:     cc,
		OnNotification: l.onNotification,
		OnHealth:       l.onHealth,
		Logger:         l.opts.Logger,
	})
}
