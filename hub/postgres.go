package hub

import (
	"context"

	"github.com/listenhub/listenhub/listener"
	"github.com/listenhub/listenhub/loop"
)

// openListener is the production pgOpener: a listener.Conn driven by the
// hub's loop, reporting notifications and health to the hub. It returns at
// once: the connection is made in the background and retried for as long
// as the server is unreachable (the hub serves meanwhile, healthy:false); a
// configuration the server refuses (bad password, no such database) stops
// the hub through onFatal. (A connection string that does not parse was
// refused by New.)
func openListener(_ context.Context, l *loop.Loop, h *Hub) (postgres, error) {
	return listener.Start(l, listener.Config{
		ConnConfig:          h.cfg.ConnConfig,
		HealthCheckInterval: h.cfg.HealthCheckInterval,
		HealthCheckTimeout:  h.cfg.HealthCheckTimeout,
		ReconnectMin:        h.cfg.ReconnectMin,
		ReconnectMax:        h.cfg.ReconnectMax,
		CommandTimeout:      h.cfg.CommandTimeout,
		OnNotification:      h.onNotification,
		OnHealth:            h.onHealth,
		OnFatal:             h.onFatal,
		Logger:              h.log,
	}), nil
}
