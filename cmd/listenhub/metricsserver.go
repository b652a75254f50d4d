package main

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/relay"
)

// The metrics server's bounds. Anyone who can connect to --metrics-addr
// can open connections, so each is timed and their number capped, and the
// descriptors they take are reserved in the hub's budget
// (hub.Config.ReservedFDs): a flood of them can take neither the workers'
// descriptors nor the Postgres reconnect's.
const (
	// metricsMaxConns caps the metrics server's connections. Past it, one
	// more is accepted and waits (so at most metricsMaxConns+1 plus the
	// listener are open), and the connection idle longest is closed to
	// make room for it; with none idle it waits for one to end, which
	// the timeouts below bound.
	metricsMaxConns = 16
	// metricsReadHeaderTimeout and metricsReadTimeout bound the reading of
	// a request, metricsWriteTimeout its answer (a page of 10,000 workers
	// included, after introspectTimeout at most), metricsIdleTimeout a
	// keep-alive connection between requests.
	metricsReadHeaderTimeout = 5 * time.Second
	metricsReadTimeout       = 10 * time.Second
	metricsWriteTimeout      = introspectTimeout + 10*time.Second
	metricsIdleTimeout       = 30 * time.Second
	// metricsFDs is what the metrics server can hold at most: the capped
	// connections, the one waiting past the cap, and the listener.
	metricsFDs = metricsMaxConns + 2
)

// newMetricsServer is the HTTP server of --metrics-addr, with its
// timeouts. Serve it with serveCapped.
func newMetricsServer(h *hub.Hub, rl *relay.Relay, token string) *http.Server {
	return &http.Server{
		Handler:           withToken(metricsHandler(h, rl), token),
		ReadHeaderTimeout: metricsReadHeaderTimeout,
		ReadTimeout:       metricsReadTimeout,
		WriteTimeout:      metricsWriteTimeout,
		IdleTimeout:       metricsIdleTimeout,
		MaxHeaderBytes:    16 << 10,
	}
}

// serveCapped serves srv on ln with at most metricsMaxConns connections.
func serveCapped(srv *http.Server, ln net.Listener) error {
	cl := newConnLimiter(ln, metricsMaxConns)
	srv.ConnState = cl.track
	return srv.Serve(cl)
}

// connLimiter is a listener that holds at most max accepted connections
// open at once. (golang.org/x/net/netutil.LimitListener does the cap, but
// not the eviction of idle keep-alive connections, without which a client
// that opens max of them and leaves them idle locks everyone else out for
// the idle timeout.)
type connLimiter struct {
	net.Listener
	slots  chan struct{}
	closed chan struct{}
	once   sync.Once

	mu   sync.Mutex
	idle map[net.Conn]time.Time // connections between two requests, since when
}

func newConnLimiter(ln net.Listener, max int) *connLimiter {
	return &connLimiter{Listener: ln, slots: make(chan struct{}, max), closed: make(chan struct{}),
		idle: make(map[net.Conn]time.Time)}
}

// Accept accepts the next connection, then waits for a slot for it,
// closing the connection idle longest to make one.
func (l *connLimiter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	for {
		select {
		case l.slots <- struct{}{}:
			return &cappedConn{Conn: c, l: l}, nil
		default:
		}
		if l.closeIdle() {
			continue
		}
		select {
		case l.slots <- struct{}{}:
			return &cappedConn{Conn: c, l: l}, nil
		case <-l.closed:
			c.Close()
			return nil, net.ErrClosed
		case <-time.After(50 * time.Millisecond):
			// A connection may have gone idle meanwhile.
		}
	}
}

func (l *connLimiter) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// closeIdle closes the connection idle longest, if any.
func (l *connLimiter) closeIdle() bool {
	l.mu.Lock()
	var oldest net.Conn
	var since time.Time
	for c, t := range l.idle {
		if oldest == nil || t.Before(since) {
			oldest, since = c, t
		}
	}
	delete(l.idle, oldest)
	l.mu.Unlock()
	if oldest == nil {
		return false
	}
	oldest.Close()
	return true
}

// track is the server's ConnState hook: it keeps the idle connections.
func (l *connLimiter) track(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s == http.StateIdle {
		l.idle[c] = time.Now()
	} else {
		delete(l.idle, c)
	}
}

// cappedConn gives its slot back when closed (once, however often the
// server and closeIdle close it).
type cappedConn struct {
	net.Conn
	l    *connLimiter
	once sync.Once
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.l.slots })
	return err
}

// withToken requires "Authorization: Bearer TOKEN" on every path but
// /healthz (which says one bit, and which probes must reach without a
// secret) when token is not empty.
func withToken(next http.Handler, token string) http.Handler {
	if token == "" {
		return next
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="listenhub"`)
			writeJSONError(w, http.StatusUnauthorized, errors.New("a bearer token is required (the serve --metrics-token-file's)"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// readTokenFile reads the bearer token of --metrics-token-file: the file's
// content, surrounding white space trimmed. A file other users can read
// is refused (like ssh's keys), and so is an empty one.
func readTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Mode().Perm()&0o007 != 0 {
		return "", fmt.Errorf("%s is accessible to other users (mode %04o); chmod o-rwx it", path, fi.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, 4097))
	if err != nil {
		return "", err
	}
	if len(b) > 4096 {
		return "", fmt.Errorf("%s: a token is at most 4096 bytes", path)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("%s: the token must be one line without spaces", path)
	}
	return tok, nil
}
