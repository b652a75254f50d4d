package main

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

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
	// metricsAcceptEvery and metricsAcceptBurst pace the accepting of
	// connections: 1,000 a second, 64 at once. A scrape, a probe or a
	// `listenhub status` needs a handful; a flood of short requests
	// (each answered 503 past the introspection cap) otherwise spent
	// more than a core of the hub's CPU on accepting, parsing and
	// answering, which the loop's thread then waited for. Paced, the
	// flood waits in the kernel's listen backlog, where it costs nothing,
	// and a probe that arrives behind it waits for at most the flood's
	// connections (one per client) at this rate.
	metricsAcceptEvery = time.Millisecond
	metricsAcceptBurst = 64
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

	// every and burst pace Accept (see metricsAcceptEvery); tat is the
	// time the next accept is due at the steady rate (the generic cell
	// rate algorithm). Accept is called by one goroutine: no lock.
	every time.Duration
	burst int
	tat   time.Time
}

func newConnLimiter(ln net.Listener, max int) *connLimiter {
	return &connLimiter{Listener: ln, slots: make(chan struct{}, max), closed: make(chan struct{}),
		idle: make(map[net.Conn]time.Time), every: metricsAcceptEvery, burst: metricsAcceptBurst}
}

// due is how long the next accept must wait for the pace.
func (l *connLimiter) due(now time.Time) time.Duration {
	if l.every <= 0 {
		return 0
	}
	return l.tat.Sub(now) - time.Duration(l.burst-1)*l.every
}

// pace takes the next accept's place in the pace, waiting for it if it is
// not due yet. It reports whether it waited, and false for ok if the
// listener was closed meanwhile.
func (l *connLimiter) pace() (ok, waited bool) {
	if l.every <= 0 {
		return true, false
	}
	now := time.Now()
	if l.tat.Before(now) {
		l.tat = now
	}
	wait := l.due(now)
	l.tat = l.tat.Add(l.every)
	if wait <= 0 {
		return true, false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true, true
	case <-l.closed:
		return false, true
	}
}

// Accept accepts the next connection when the pace allows, then waits for
// a slot for it, closing the connection idle longest to make one.
func (l *connLimiter) Accept() (net.Conn, error) {
	var c net.Conn
	for dropped := 1; ; dropped++ {
		// A flood of connections that close at once is dropped at the
		// rate the kernel completes them: let the loop's goroutine at
		// the processor now and then.
		if dropped%64 == 0 {
			runtime.Gosched()
		}
		var err error
		if c, err = l.Listener.Accept(); err != nil {
			return nil, err
		}
		// Past the pace (a flood), a client that gave up while its
		// connection waited in the backlog is let go at the cost of a
		// poll, not of a request and a place in the pace: otherwise a
		// flood leaves a backlog of the abandoned that delays everyone
		// after it for seconds. Within the pace every connection is
		// served, one whose client shut its sending side included.
		if l.due(time.Now()) > 0 && peerGone(c) {
			c.Close()
			continue
		}
		ok, waited := l.pace()
		if !ok {
			c.Close()
			return nil, net.ErrClosed
		}
		if !waited || !peerGone(c) {
			break
		}
		c.Close()
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

// peerGone reports whether the peer of c has shut its side down (a client
// that gave up), without reading from it.
func peerGone(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(p, 0); err == nil && n > 0 {
			gone = p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		}
	})
	return gone
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
