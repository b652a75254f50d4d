package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/testutil"
)

// laterProxy is a TCP address where nothing listens yet (Postgres down, as
// a refused connection); up starts forwarding it to target.
type laterProxy struct {
	t      *testing.T
	addr   string
	target string
}

func newLaterProxy(t *testing.T, target string) *laterProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused until up
	return &laterProxy{t: t, addr: addr, target: target}
}

func (p *laterProxy) up() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("the proxy's port: %v", err)
	}
	p.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s, err := net.Dial("tcp", p.target)
				if err != nil {
					return
				}
				defer s.Close()
				go func() { io.Copy(s, c); s.Close() }()
				io.Copy(c, s)
			}()
		}
	}()
}

// via returns rawURL with its host and port replaced by the proxy's.
func (p *laterProxy) via(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		p.t.Fatal(err)
	}
	u.Host = p.addr
	return u.String()
}

// Postgres down when the workers start (the hub up, its server not): a
// Failover stays on the hub, is told healthy:false, and its Subscribe
// waits, past its ack timeout and the hub's old command timeout (5 s),
// instead of failing over to a local listener that cannot connect either.
// Once Postgres is up, the sub is acked and a NOTIFY arrives through the
// hub.
func TestPGPostgresDownAtStartWorkerStays(t *testing.T) {
	e := newPGEnv(t)
	u, err := url.Parse(e.db.URL())
	if err != nil {
		t.Fatal(err)
	}
	p := newLaterProxy(t, u.Host)
	down := p.via(e.db.URL())
	e.startHub(func(c *hub.Config) { c.DatabaseURL = down })
	rec := &recorder{}
	var failovers atomic.Int64
	f := e.failover(rec, func(o *foSetup) {
		o.Local.DatabaseURL = down
		o.Hub.AckTimeout = time.Second
		o.OnFailover = func(error) { failovers.Add(1) }
	})
	if f.Mode() != ModeHub {
		t.Fatalf("mode %v with the hub up and Postgres down, want hub (reason %v)", f.Mode(), f.Reason())
	}
	subscribed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*waitLong)
		defer cancel()
		subscribed <- f.Subscribe(ctx, "a")
	}()
	// Seven ack timeouts, past the hub's old 5 s command timeout too:
	// the sub waits, the worker stays on the hub, unhealthy.
	window := time.NewTimer(7 * time.Second)
	select {
	case err := <-subscribed:
		t.Fatalf("Subscribe returned %v while Postgres is down, want it waiting", err)
	case <-window.C:
	}
	if f.Mode() != ModeHub || f.Err() != nil || failovers.Load() != 0 {
		t.Fatalf("mode %v, err %v, %d failovers while Postgres is down: want the hub", f.Mode(), f.Err(), failovers.Load())
	}
	if !rec.has("status false") || rec.has("status true") {
		t.Fatalf("events %v: want healthy:false told, and only that", rec.snapshot())
	}
	up := time.Now()
	p.up()
	select {
	case err := <-subscribed:
		if err != nil {
			t.Fatalf("Subscribe once Postgres is up: %v", err)
		}
	case <-time.After(waitLong):
		t.Fatal("no ack after Postgres came up")
	}
	t.Logf("acked %v after Postgres came up", time.Since(up).Round(time.Millisecond))
	e.notify("a", "after")
	testutil.WaitFor(t, waitLong, "the wake through the hub", func() bool { return rec.has("wake a after") })
	if f.Mode() != ModeHub {
		t.Fatalf("mode %v, want hub", f.Mode())
	}
}

// A hub on another database whose Postgres is down when the Failover
// starts cannot be checked then: it is not trusted either. Its wakes wait
// until it says healthy and the check runs; the check finds the other
// database, so the Failover listens on its own connection (the reason
// wraps ErrOtherDatabase), delivers this database's NOTIFYs and none of
// the other's.
func TestPGUnverifiedHubOnAnotherDatabaseRefusedOnceUp(t *testing.T) {
	e := newPGEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	other := "lhc_unverified_" + strconv.Itoa(os.Getpid())
	if err := e.db.Exec(ctx, "CREATE DATABASE "+other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.db.Exec(context.Background(), "DROP DATABASE IF EXISTS "+other+" WITH (FORCE)") })
	u, err := url.Parse(e.db.URL())
	if err != nil {
		t.Fatal(err)
	}
	p := newLaterProxy(t, u.Host)
	ou := *u
	ou.Path = "/" + other
	e.startHub(func(c *hub.Config) { c.DatabaseURL = p.via(ou.String()) })
	rec := &recorder{}
	f := e.failover(rec, func(o *foSetup) { o.Hub.AckTimeout = time.Second })
	if f.Mode() != ModeHub {
		t.Fatalf("mode %v at start, want hub (unverified)", f.Mode())
	}
	subscribed := make(chan error, 1)
	go func() { subscribed <- f.Subscribe(context.Background(), "a") }()
	p.up()
	testutil.WaitFor(t, waitLong, "local mode once the check ran", func() bool { return f.Mode() == ModeLocal })
	if !errors.Is(f.Reason(), ErrOtherDatabase) {
		t.Fatalf("reason %v, want ErrOtherDatabase", f.Reason())
	}
	if err := <-subscribed; err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	// The other database's NOTIFY is not ours: never delivered.
	oc, err := pgconn.Connect(ctx, ou.String())
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close(context.Background())
	if _, err := oc.Exec(ctx, "NOTIFY \""+e.prefix+"a\", 'foreign'").ReadAll(); err != nil {
		t.Fatal(err)
	}
	e.notify("a", "ours")
	testutil.WaitFor(t, waitLong, "our NOTIFY", func() bool { return rec.has("wake a ours") })
	if rec.has("wake a foreign") {
		t.Fatalf("the other database's NOTIFY was delivered: %v", rec.snapshot())
	}
}

// A frozen hub (SIGSTOPped: its socket open, nothing read or written) is a
// dead hub: the Failover hears no frame for its SilenceTimeout, though the
// hub re-sends its status every 5 status intervals, fails over to its own
// connection, and a NOTIFY committed during the freeze arrives through it.
func TestPGFrozenHubFailsOver(t *testing.T) {
	e := newPGEnv(t)
	proc := e.startHubProcess("--status-interval", "200ms") // status re-sent every second
	e.waitBackends(1, 0)
	rec := &recorder{}
	f := e.failover(rec, func(o *foSetup) { o.Hub.SilenceTimeout = 3 * time.Second })
	mustSubscribe(t, f, "a")
	if f.Mode() != ModeHub {
		t.Fatalf("mode %v, want hub", f.Mode())
	}
	if err := proc.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Process.Signal(syscall.SIGCONT) })
	stopped := time.Now()
	testutil.WaitFor(t, waitLong, "local mode after the hub froze", func() bool { return f.Mode() == ModeLocal })
	t.Logf("failed over %v after SIGSTOP (silence timeout 3s)", time.Since(stopped).Round(time.Millisecond))
	if r := f.Reason(); r == nil || !strings.Contains(r.Error(), "no frame from the hub") {
		t.Fatalf("reason %v, want the silence named", r)
	}
	e.notify("a", "during the freeze")
	testutil.WaitFor(t, waitLong, "the wake through the local listener", func() bool { return rec.has("wake a during the freeze") })
}
