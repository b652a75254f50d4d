package hub

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/listenhub/listenhub/internal/testutil"
)

// spread returns how many channels each of the hub's Postgres connections
// holds, read on the loop.
func (e *pgEnv) spread() []int {
	e.t.Helper()
	got := make(chan []int, 1)
	if err := e.h.loop.Post(func() { got <- slices.Clone(e.h.pg.(*pgSet).listens) }); err != nil {
		e.t.Fatal(err)
	}
	return <-got
}

// wakes reads n frames and returns them sorted: wakes on channels of
// different connections may arrive in either order.
func (w *tw) wakes(n int) []string {
	w.t.Helper()
	got := make([]string, n)
	for i := range got {
		got[i] = w.next()
	}
	slices.Sort(got)
	return got
}

// TestPGFourConnections: with PostgresConnections 4 the hub holds 4
// backends, spreads the subscriptions over all of them, delivers a NOTIFY on
// every channel, routes an UNLISTEN to the connection that LISTENed, and
// when one backend is terminated it tells the workers healthy:false, comes
// back with 4 backends, resyncs (one durable wake per channel) and delivers
// on every channel again.
func TestPGFourConnections(t *testing.T) {
	e := newPGEnv(t, func(c *Config) { c.PostgresConnections = 4 })
	w := e.dial()
	const n = 32
	var names, want, durable []string
	for i := range n {
		q := fmt.Sprint("k", i)
		names = append(names, q)
		w.sub(q)
		w.expect(ack(q))
		want = append(want, wake(q, ptr("p")))
		durable = append(durable, wake(q, nil))
	}
	slices.Sort(want)
	slices.Sort(durable)
	if got := e.backends(); got != 4 {
		t.Fatalf("%d backends, want 4", got)
	}
	sp := e.spread()
	for i, k := range sp {
		if k == 0 {
			t.Fatalf("connection %d holds no channel: spread %v", i, sp)
		}
	}
	t.Logf("32 channels spread over 4 connections: %v", sp)
	notifyAll := func() {
		t.Helper()
		for _, q := range names {
			e.exec("SELECT pg_notify($1, 'p')", q)
		}
		if got := w.wakes(n); !slices.Equal(got, want) {
			t.Fatalf("wakes %v, want %v", got, want)
		}
	}
	notifyAll()

	// Unsubscribe and subscribe again: the UNLISTEN and the fresh LISTEN
	// go to the connection the channel lives on.
	w.unsub("k5")
	testutil.WaitFor(t, timeout, "k5 UNLISTENed", func() bool { return e.h.Stats().Channels == n-1 })
	w.subscribe("k5")
	e.exec("NOTIFY k5, 'back'")
	w.expect(wake("k5", ptr("back")))
	if sp2 := e.spread(); !slices.Equal(sp, sp2) {
		t.Fatalf("spread %v after unsub and sub, was %v", sp2, sp)
	}

	pids, err := e.db.BackendPIDs(context.Background(), e.app)
	if err != nil {
		t.Fatal(err)
	}
	e.exec("SELECT pg_terminate_backend($1)", pids[1])
	w.expect(statusFalse, statusTrue)
	if got := w.wakes(n); !slices.Equal(got, durable) {
		t.Fatalf("resync wakes %v, want one durable wake per channel", got)
	}
	testutil.WaitFor(t, timeout, "4 backends again", func() bool { return e.backends() == 4 })
	notifyAll()
	if s := e.h.Stats(); s.PostgresReconnects != 1 || !s.PostgresHealthy || s.Channels != n {
		t.Fatalf("stats %+v, want 1 reconnect, healthy, %d channels", s, n)
	}
	w.none()
}
