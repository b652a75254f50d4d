package hub

import (
	"context"

	"github.com/listenhub/listenhub/internal/pglisten"
	"github.com/listenhub/listenhub/loop"
)

// openListener is the production pgOpener: Config.PostgresConnections
// pglisten.Conns driven by the hub's loop (a pgSet), reporting
// notifications and health to the hub. It returns at once: each connection
// is made in the background and retried for as long as the server is
// unreachable (the hub serves meanwhile, healthy:false until all are up); a
// configuration the server refuses (bad password, no such database) stops
// the hub through onFatal. (A connection string that does not parse was
// refused by New.)
func openListener(_ context.Context, l *loop.Loop, h *Hub) (postgres, error) {
	cfg := h.listenerConfig()
	cfg.OnFatal = h.onFatal
	return newPGSet(h.cfg.PostgresConnections, cfg, false, func(_ int, c pglisten.Config) (*pglisten.Conn, error) {
		return pglisten.Start(l, c), nil
	})
}
