package hub

import (
	"context"

	"github.com/listenhub/listenhub/listener"
	"github.com/listenhub/listenhub/loop"
)

// openListener is the production pgOpener: a listener.Conn driven by the
// hub's loop, reporting notifications and health to the hub.
func openListener(ctx context.Context, l *loop.Loop, h *Hub) (postgres, error) {
	cc := h.cfg.ConnConfig
	if cc == nil {
		var err error
		if cc, err = listener.ParseConfig(h.cfg.DatabaseURL, h.cfg.ApplicationName); err != nil {
			return nil, err
		}
	}
	c, err := listener.Open(ctx, l, listener.Config{
		ConnConfig:          cc,
		HealthCheckInterval: h.cfg.HealthCheckInterval,
		HealthCheckTimeout:  h.cfg.HealthCheckTimeout,
		ReconnectMin:        h.cfg.ReconnectMin,
		ReconnectMax:        h.cfg.ReconnectMax,
		CommandTimeout:      h.cfg.CommandTimeout,
		OnNotification:      h.onNotification,
		OnHealth:            h.onHealth,
		Logger:              h.log,
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}
