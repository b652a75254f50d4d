package hub

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/listenhub/listenhub/internal/sockdir"
)

// The hub checks the directories that hold its socket as its clients do
// (internal/sockdir): a directory someone else could change makes every
// client refuse the socket and fall back to a connection of its own, which
// would leave the hub serving nobody while each worker holds a backend.
// So Start refuses such a socket, naming the directory and the fix, unless
// Config.ServeRefusableSocket asks to serve it anyway; then, and whenever
// the directories change under a running hub, the hub says so every
// socketCheckEvery and in Stats.SocketRefusable.

// ErrRefusableSocket is wrapped by the error Start returns when the
// socket's directories are ones the clients refuse.
var ErrRefusableSocket = errors.New("its clients would refuse it")

// socketCheckEvery is how often a running hub checks its socket's
// directories again, and repeats its warning while they are wrong.
const socketCheckEvery = time.Minute

// socketTrusted reports whether every client the hub serves trusts a
// directory owned by uid. A client trusts root, its own uid and the uids
// it is told to (the hub's, when the hub runs as another user: the socket
// is the hub's). So root and the hub's uid, and an admitted uid only when
// it is the one uid the hub admits: the clients of a second admitted uid
// refuse a directory of the first's.
func (h *Hub) socketTrusted(uid uint32) bool {
	if uid == 0 || int(uid) == os.Geteuid() {
		return true
	}
	others := 0
	for _, u := range h.cfg.AllowUIDs {
		if u != 0 && u != os.Geteuid() {
			others++
		}
	}
	return others == 1 && slices.Contains(h.cfg.AllowUIDs, int(uid))
}

// checkSocketDirs returns what is wrong with the socket's directories (nil
// when nothing is, or when they cannot be examined: then the clients'
// dial says what).
func (h *Hub) checkSocketDirs() *sockdir.Untrusted {
	u, err := sockdir.Chain(filepath.Dir(h.cfg.SocketPath), h.socketTrusted)
	if err != nil {
		return nil
	}
	return u
}

// refusableSocketError is Start's error for u.
func (h *Hub) refusableSocketError(u *sockdir.Untrusted) error {
	return fmt.Errorf("hub: socket %s: %w: %v; fix: %s", h.cfg.SocketPath, ErrRefusableSocket, u, u.Fix)
}

// onSocketCheck checks the directories again (every socketCheckEvery, and
// after an accept error) and warns while clients would refuse the socket.
func (h *Hub) onSocketCheck() {
	u := h.checkSocketDirs()
	h.stats.socketRefusable.Store(u != nil)
	if u != nil {
		h.log.Warn("clients refuse this socket: they fall back to connections of their own", "socket", h.cfg.SocketPath,
			"directory", u.Dir, "problem", u.Problem, "fix", u.Fix)
	}
}
