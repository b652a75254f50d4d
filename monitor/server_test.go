package monitor

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/testutil"
)

// timeout bounds every wait of these tests.
const timeout = 15 * time.Second

// The connection cap holds: past it the connection idle longest is closed
// for the newcomer, a newcomer waits while none is idle, and the server
// never holds more than the cap.
func TestMetricsConnectionCap(t *testing.T) {
	ln := testutil.ListenTCP(t)
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		fmt.Fprintln(w, "ok")
	})}
	cl := newConnLimiter(ln, 2)
	srv.ConnState = cl.track
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()

	// Two idle keep-alive connections fill the cap.
	a, code := testutil.IdleHTTP(addr, "/", timeout)
	if code != 200 {
		t.Fatalf("first: %d", code)
	}
	defer a.Close()
	time.Sleep(10 * time.Millisecond) // a is idle longer than b
	b, code := testutil.IdleHTTP(addr, "/", timeout)
	if code != 200 {
		t.Fatalf("second: %d", code)
	}
	defer b.Close()
	// A third is served: the oldest idle one (a) is closed for it.
	c, code := testutil.IdleHTTP(addr, "/", timeout)
	if code != 200 {
		t.Fatalf("third: %d", code)
	}
	defer c.Close()
	closed := func(conn net.Conn) bool {
		conn.SetReadDeadline(time.Now().Add(time.Second))
		_, err := conn.Read(make([]byte, 1))
		return err == io.EOF
	}
	if !closed(a) {
		t.Fatal("the connection idle longest was not closed for the newcomer")
	}
	if n := len(cl.slots); n != 2 {
		t.Fatalf("%d slots taken, want 2", n)
	}

	// Both slots busy with requests that do not end: a newcomer waits
	// (connected in the backlog, not served) until one ends.
	b.Close()
	c.Close()
	testutil.WaitFor(t, timeout, "slots free", func() bool { return len(cl.slots) == 0 })
	slow := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := http.Get("http://" + addr + "/slow")
			if err != nil {
				slow <- 0
				return
			}
			resp.Body.Close()
			slow <- resp.StatusCode
		}()
	}
	testutil.WaitFor(t, timeout, "two slow requests in", func() bool { return len(cl.slots) == 2 })
	got := make(chan int, 1)
	go func() {
		_, code := testutil.IdleHTTP(addr, "/", timeout)
		got <- code
	}()
	select {
	case code := <-got:
		t.Fatalf("served (%d) past the cap while both slots are busy", code)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if code := <-got; code != 200 {
		t.Fatalf("newcomer after a slot freed: %d", code)
	}
	for range 2 {
		if code := <-slow; code != 200 {
			t.Fatalf("slow request: %d", code)
		}
	}
}

// Past introspectInFlight requests, /workers answers 503 with Retry-After
// at once.
func TestIntrospectionInFlightCap(t *testing.T) {
	in := newIntrospection(nil, build{})
	for range introspectInFlight {
		in.slots <- struct{}{}
	}
	rec := httptest.NewRecorder()
	serveList(in, rec, httptest.NewRequest("GET", "/workers?limit=10", nil),
		func(context.Context, hub.ListOptions) (hub.WorkerList, error) {
			t.Fatal("the hub was asked past the cap")
			return hub.WorkerList{}, nil
		}, appendWorkerList)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("past the cap: %d, Retry-After %q: %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	// The refused client's next try is a new connection, which the
	// accept pace bounds.
	if c := rec.Header().Get("Connection"); c != "close" {
		t.Fatalf("past the cap: Connection %q, want close", c)
	}
}

// The server's timeouts: a connection that sends half a header is
// closed after the header timeout, an idle keep-alive one after the idle
// timeout (both shortened here).
func TestMetricsServerTimeouts(t *testing.T) {
	srv := newHTTPServer(nil)
	if srv.ReadHeaderTimeout == 0 || srv.ReadTimeout == 0 || srv.WriteTimeout == 0 || srv.IdleTimeout == 0 {
		t.Fatalf("a timeout is unset: %+v", srv)
	}
	if srv.WriteTimeout <= introspectTimeout {
		t.Fatalf("WriteTimeout %v cuts the introspection wait %v", srv.WriteTimeout, introspectTimeout)
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	srv.ReadHeaderTimeout, srv.IdleTimeout = 200*time.Millisecond, 300*time.Millisecond
	ln := testutil.ListenTCP(t)
	cl := newConnLimiter(ln, maxConns)
	srv.ConnState = cl.track
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Close() })
	half, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	fmt.Fprint(half, "GET / HTTP/1.1\r\nHost: x\r\n")
	idle, code := testutil.IdleHTTP(ln.Addr().String(), "/", timeout)
	if code != 200 {
		t.Fatalf("keep-alive request: %d", code)
	}
	defer idle.Close()
	for name, c := range map[string]net.Conn{"half a header": half, "idle keep-alive": idle} {
		start := time.Now()
		c.SetReadDeadline(time.Now().Add(timeout))
		_, err := bufio.NewReader(c).ReadString('\n')
		for err == nil {
			_, err = bufio.NewReader(c).ReadString('\n')
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: closed after %v", name, d)
		}
	}
}

// Accept keeps to its pace: past the burst, connections come out no faster
// than one per interval, however many wait in the backlog.
// pacedLimiter is a connLimiter (100 connections) on a fresh loopback
// listener that accepts a burst, then one connection per every.
func pacedLimiter(t *testing.T, every time.Duration, burst int) *connLimiter {
	t.Helper()
	ln := testutil.ListenTCP(t)
	cl := newConnLimiter(ln, 100)
	cl.every, cl.burst = every, burst
	t.Cleanup(func() { cl.Close() })
	return cl
}

func TestMetricsAcceptPace(t *testing.T) {
	cl := pacedLimiter(t, 20*time.Millisecond, 3)
	const n = 8
	for range n {
		c, err := net.Dial("tcp", cl.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	start := time.Now()
	for range n {
		c, err := cl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// The first 3 at once, the other 5 one interval apart.
	if took, want := time.Since(start), time.Duration(n-3)*cl.every; took < want-cl.every/2 {
		t.Fatalf("%d connections accepted in %v, want at least %v at one per %v past a burst of %d",
			n, took, want, cl.every, cl.burst)
	}
}

// Past the pace, a client that gave up while its connection waited in the
// backlog is dropped without being served and without a place in the
// pace: the live connection behind it comes out next. Within the pace, a
// client that shut its sending side is served.
func TestMetricsAcceptDropsAbandoned(t *testing.T) {
	cl := pacedLimiter(t, 200*time.Millisecond, 1)

	// Within the pace: a half-closed request is served.
	half, err := net.Dial("tcp", cl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	half.Write([]byte("GET /healthz HTTP/1.0\r\n\r\n"))
	half.(*net.TCPConn).CloseWrite()
	acceptsNext(t, cl, half, "the half-closed client within the pace")

	// Past it (the accept above took the only place for 200 ms): 50
	// clients gone, then a live one.
	for range 50 {
		c, err := net.Dial("tcp", cl.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("GET /workers HTTP/1.1\r\nHost: x\r\n\r\n"))
		c.Close()
	}
	live, err := net.Dial("tcp", cl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	acceptsNext(t, cl, live, "the live client behind 50 abandoned ones")
}

// acceptsNext fails the test unless cl's next Accept, within the timeout,
// is the server side of client.
func acceptsNext(t *testing.T, cl *connLimiter, client net.Conn, what string) {
	t.Helper()
	got := make(chan net.Conn, 1)
	go func() {
		c, err := cl.Accept()
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	select {
	case c := <-got:
		if c == nil {
			t.Fatalf("%s: Accept failed", what)
		}
		c.Close()
		if c.RemoteAddr().String() != client.LocalAddr().String() {
			t.Fatalf("%s: accepted %v, want %v", what, c.RemoteAddr(), client.LocalAddr())
		}
	case <-time.After(timeout):
		t.Fatalf("%s: not accepted within %v", what, timeout)
	}
}

// Under a flood the pages take at most half of one goroutine's time: the
// next page is begun no sooner after the last one ended than it took.
func TestIntrospectionRests(t *testing.T) {
	const work = 60 * time.Millisecond
	var ended, began time.Time
	calls := 0
	list := func(context.Context, hub.ListOptions) (hub.WorkerList, error) {
		calls++
		if calls == 2 {
			began = time.Now()
		}
		time.Sleep(work) // a page that takes this long
		ended = time.Now()
		return hub.WorkerList{}, nil
	}
	in := newIntrospection(nil, build{})
	for range 2 {
		rec := httptest.NewRecorder()
		serveList(in, rec, httptest.NewRequest("GET", "/workers", nil), list, appendWorkerList)
		if rec.Code != 200 {
			t.Fatalf("%d: %s", rec.Code, rec.Body)
		}
		if calls == 1 {
			first := ended
			defer func() {
				if gap := began.Sub(first); gap < work-5*time.Millisecond {
					t.Errorf("the second page began %v after the first ended, want at least %v", gap, work)
				}
			}()
		}
	}
}
