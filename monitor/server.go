package monitor

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/fdreserve"
)

// The bounds of a Server. Anyone who can connect to its address can open
// connections, so each is timed and their number capped; the descriptors
// they take are reserved in the hub's budget (Hub.ReserveFDs), so that a
// flood of them can take neither the workers' descriptors nor the Postgres
// reconnect's.
const (
	// maxConns caps a Server's connections. Past it, one more is
	// accepted and waits (so at most maxConns+1 plus the listener are
	// open), and the connection idle longest is closed to make room for
	// it; with none idle it waits for one to end, which the timeouts
	// below bound.
	maxConns = 16
	// reservedFDs is the most descriptors a Server holds: the capped
	// connections, the one waiting past the cap, and the listener. A
	// Server keeps them out of its hub's worker budget while it runs
	// (Hub.ReserveFDs).
	reservedFDs = maxConns + 2
)

const (
	// readHeaderTimeout and readTimeout bound the reading of a request,
	// writeTimeout its answer (a page of 10,000 workers included, after
	// introspectTimeout at most), idleTimeout a keep-alive connection
	// between requests.
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = introspectTimeout + 10*time.Second
	idleTimeout       = 30 * time.Second
	// acceptEvery and acceptBurst pace the accepting of connections:
	// 1,000 a second, 64 at once. A scrape, a probe or a `listenhub
	// status` needs a handful; a flood of short requests (each answered
	// 503 past the introspection cap) otherwise spent more than a core of
	// the hub's CPU on accepting, parsing and answering, which the loop's
	// thread then waited for. Paced, the flood waits in the kernel's
	// listen backlog, where it costs nothing, and a probe that arrives
	// behind it waits for at most the flood's connections (one per
	// client) at this rate.
	acceptEvery = time.Millisecond
	acceptBurst = 64
)

// Server serves a Handler on a listener of its own, within the bounds
// above: what `listenhub serve --metrics-addr` runs. Like nats-server's
// monitoring port, it is started once and runs in the background until
// Shutdown or Close.
type Server struct {
	srv  *http.Server
	cl   *connLimiter
	done chan struct{} // closed when Serve has returned
	// release gives the hub back the descriptors the server reserved.
	release func()
}

// Start listens on addr (host:port, TCP) and serves h and o there in the
// background. ctx bounds the listening only: the server runs until
// Shutdown or Close. A port in use is an error here, so that it can be
// reported at start like any other setting.
func Start(ctx context.Context, addr string, h *hub.Hub, o Options) (*Server, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return StartListener(ln, h, o), nil
}

// StartListener serves h and o on ln, already bound (a listener handed
// over by a hot upgrade, or passed by a service manager), in the
// background; the Server owns ln from now on.
func StartListener(ln net.Listener, h *hub.Hub, o Options) *Server {
	s := &Server{srv: newHTTPServer(Handler(h, o)), cl: newConnLimiter(ln, maxConns), done: make(chan struct{})}
	s.release = h.ReserveFDs(reservedFDs)
	s.cl.log = o.Logger
	if s.cl.log == nil {
		s.cl.log = slog.Default()
	}
	s.srv.ConnState = s.cl.track
	go func() {
		defer close(s.done)
		s.srv.Serve(s.cl)
	}()
	return s
}

// Addr is the address the server listens on (with the port chosen when
// Start was given port 0).
func (s *Server) Addr() net.Addr { return s.cl.Addr() }

// Shutdown stops accepting, waits for the requests being served to end,
// within ctx, and closes the listener; past ctx it returns ctx's error
// and the connections left are the caller's to Close.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	s.cl.Close() // in case Serve had not begun
	if err == nil {
		s.release()
	}
	return err
}

// Close closes the listener and every connection at once.
func (s *Server) Close() error {
	err := s.srv.Close()
	s.cl.Close()
	s.release()
	return err
}

// newHTTPServer is the HTTP server of a Server, with its timeouts.
func newHTTPServer(handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    16 << 10,
	}
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

	// every and burst pace Accept (see acceptEvery); tat is the
	// time the next accept is due at the steady rate (the generic cell
	// rate algorithm). Accept is called by one goroutine: no lock.
	every time.Duration
	burst int
	tat   time.Time

	// log gets the lines of accepting out of descriptors; short counts
	// the accepts that failed so since the last line (shortLogged).
	log         *slog.Logger
	short       int
	shortLogged time.Time
}

func newConnLimiter(ln net.Listener, max int) *connLimiter {
	return &connLimiter{Listener: ln, slots: make(chan struct{}, max), closed: make(chan struct{}),
		idle: make(map[net.Conn]time.Time), every: acceptEvery, burst: acceptBurst}
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
		if c, err = l.accept(); err != nil {
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

// Out of descriptors, accept is retried with a growing pause (the
// listener stays readable, and http.Server's own retry starts at 5 ms
// and logs each one): from shortPauseMin to shortPauseMax, with one log
// line per shortLogEvery saying how many failed.
const (
	shortPauseMin = 10 * time.Millisecond
	shortPauseMax = time.Second
	shortLogEvery = 10 * time.Second
	// reserveAccept bounds the accept made on the descriptor reserve:
	// the connection that failed is waiting, so it is at once.
	reserveAccept = 50 * time.Millisecond
)

// accept is the listener's Accept that rides out a lack of descriptors
// (RLIMIT_NOFILE lowered under the process, EMFILE): the waiting
// connection is taken on the process's descriptor reserve (package
// fdreserve; a /healthz probe is how the operator sees the hub), else
// accepting pauses, longer each time, instead of failing at once again.
func (l *connLimiter) accept() (net.Conn, error) {
	pause := time.Duration(0)
	for {
		c, err := l.Listener.Accept()
		if err == nil || !fdreserve.Exhausted(err) {
			return c, err
		}
		if dl, ok := l.Listener.(interface{ SetDeadline(time.Time) error }); ok {
			var rc net.Conn
			rerr := fdreserve.Retry(func() (err error) {
				_ = dl.SetDeadline(time.Now().Add(reserveAccept))
				rc, err = l.Listener.Accept()
				_ = dl.SetDeadline(time.Time{})
				return err
			})
			if rerr == nil {
				return rc, nil
			}
		}
		pause = min(max(2*pause, shortPauseMin), shortPauseMax)
		l.short++
		if now := time.Now(); now.Sub(l.shortLogged) >= shortLogEvery {
			l.log.Warn("metrics server: out of file descriptors; accepting paused",
				"reason", err, "failed", l.short, "pause", pause)
			l.short, l.shortLogged = 0, now
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-l.closed:
			t.Stop()
			return nil, net.ErrClosed
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
	rc.Control(func(fd uintptr) { gone = shutDown(int(fd)) })
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
// secret) when token is not empty. The comparison takes the same time
// whatever the token sent, so that it cannot be guessed byte by byte.
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

// ReadTokenFile reads a bearer token for Options.Token from a file, as
// --metrics-token-file does: the file's content, surrounding white space
// trimmed. A file other users can read is refused (like ssh's keys), and
// so is an empty one, a token over 4096 bytes and one with spaces.
func ReadTokenFile(path string) (string, error) {
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
