package gohub_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/listenhub/listenhub/benchmarks/gnethub"
	"github.com/listenhub/listenhub/benchmarks/gohub"
	"github.com/listenhub/listenhub/benchmarks/internal/wire"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
)

var cluster *pgtest.Cluster

func TestMain(m *testing.M) { pgtesting.Main(m, pgtest.Options{MaxConnections: 50}, &cluster) }

type client struct {
	t *testing.T
	c *net.UnixConn
	r *wire.Reader
}

func dial(t *testing.T, path string) *client {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return &client{t: t, c: c, r: wire.NewReader(c, 64<<10)}
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (c *client) next() wire.Message {
	c.t.Helper()
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	body, err := c.r.Next()
	if err != nil {
		c.t.Fatal(err)
	}
	m, err := wire.Decode(body)
	if err != nil {
		c.t.Fatal(err)
	}
	return m
}

func (c *client) expect(t string) wire.Message {
	c.t.Helper()
	for {
		m := c.next()
		if m.T == t {
			return m
		}
		if m.T != "status" {
			c.t.Fatalf("got %+v, want %s", m, t)
		}
	}
}

func notify(t *testing.T, db *pgx.Conn, ch, p string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), "select pg_notify($1, $2)", ch, p); err != nil {
		t.Fatal(err)
	}
}

// TestBaselines runs the same protocol checks against both baselines, so
// that their figures compare like with like.
func TestBaselines(t *testing.T) {
	for _, name := range []string{"gohub", "gnet"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "hub.sock")
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				if name == "gohub" {
					done <- gohub.Run(ctx, gohub.Config{SocketPath: path, DatabaseURL: cluster.URL(), HardQueueLimit: 256})
				} else {
					done <- gnethub.Run(ctx, gnethub.Config{SocketPath: path, DatabaseURL: cluster.URL(), HardQueueLimit: 256})
				}
			}()
			defer func() { cancel(); <-done }()
			db, err := pgx.Connect(ctx, cluster.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close(context.Background())

			// Statuses until the first healthy one: a baseline may accept
			// before its Postgres connection is up (and says so).
			a := dial(t, path)
			for m := a.next(); !m.Healthy; m = a.next() {
				if m.T != "status" {
					t.Fatalf("before the first healthy status: %+v", m)
				}
			}
			a.c.Write(wire.AppendSub(nil, "q1"))
			a.expect("ack")
			notify(t, db, "q1", "hello")
			if m := a.expect("wake"); !m.HasP || m.P != "hello" || m.Q != "q1" {
				t.Fatalf("wake %+v", m)
			}
			notify(t, db, "q1", "")
			if m := a.expect("wake"); m.HasP {
				t.Fatalf("durable wake %+v", m)
			}
			// A second subscriber of a listening channel is acked at once.
			b := dial(t, path)
			b.c.Write(wire.AppendSub(nil, "q1"))
			b.expect("ack")
			// An invalid name is refused.
			b.c.Write(wire.AppendSub(nil, strings.Repeat("x", 64)))
			b.expect("nack")

			// Unsubscribe everyone, then subscribe again: a fresh LISTEN, and
			// NOTIFYs after the ack arrive.
			a.c.Write(wire.AppendUnsub(nil, "q1"))
			b.c.Write(wire.AppendUnsub(nil, "q1"))
			a.c.Write(wire.AppendSub(nil, "q1"))
			a.expect("ack")
			notify(t, db, "q1", "again")
			if m := a.expect("wake"); m.P != "again" {
				t.Fatalf("wake %+v", m)
			}

			// A worker that stops reading is evicted by ephemeral wakes
			// and its sibling still gets every one.
			w := dial(t, path)
			w.c.SetReadBuffer(4096)
			w.c.Write(wire.AppendSub(nil, "q1"))
			w.expect("ack")
			const n = 3000
			pad := strings.Repeat("p", 1000)
			// The sender stays at most a window ahead of the sibling, so a
			// sibling descheduled on a loaded machine is never the one
			// that overflows; the wedged worker, which reads nothing,
			// overflows all the same.
			const window = 64
			var read atomic.Int64
			got := make(chan int, 1)
			go func() {
				k := 0
				a.c.SetReadDeadline(time.Now().Add(60 * time.Second))
				for k < n {
					body, err := a.r.Next()
					if err != nil {
						break
					}
					if m, _ := wire.Decode(body); m.T == "wake" && strings.HasPrefix(m.P, pad) {
						k++
						read.Store(int64(k))
					}
				}
				got <- k
			}()
			deadline := time.Now().Add(30 * time.Second)
			for i := range n {
				for int64(i)-read.Load() > window && time.Now().Before(deadline) {
					time.Sleep(100 * time.Microsecond)
				}
				notify(t, db, "q1", pad+string(rune('a'+i%26)))
			}
			if k := <-got; k != n {
				t.Fatalf("sibling got %d of %d wakes", k, n)
			}
			w.c.SetReadDeadline(time.Now().Add(10 * time.Second))
			for {
				if _, err := w.r.Next(); err != nil {
					if ne, ok := err.(net.Error); ok && ne.Timeout() {
						t.Fatal("the wedged worker was not evicted")
					}
					break
				}
			}
		})
	}
}
