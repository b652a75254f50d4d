package hub

import (
	"context"
	"errors"
	"hash/fnv"

	"github.com/listenhub/listenhub/internal/handoff"
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

// pgSet is the hub's Postgres side: Config.PostgresConnections LISTEN
// connections (pglisten.Conn) over which the channel union is spread, each
// channel on the connection its name hashes to (FNV-1a modulo the count, so
// every process with the same count places it alike: an upgrade hands each
// connection over with its own set).
//
// Why more than one: PostgreSQL (15) scans a backend's list of LISTENed
// channels for every notification it queues for that backend, so one
// backend holding 50,000 channels delivers about half the NOTIFYs per second
// it does with 1,000. K backends each hold a K-th of the union.
//
// Health is the conjunction: the hub is healthy when every connection is up
// with its set LISTENed. A connection lost makes the hub unhealthy (workers
// are told healthy:false, acks wait); when it is back, with every other
// connection up, the hub resyncs as after any reconnect: one durable wake
// per subscribed channel to every subscriber, whichever connection its
// channel was on (over-delivery is harmless; a resync per connection would
// save wakes, not correctness).
//
// Every method runs on the loop goroutine, as the postgres interface says.
type pgSet struct {
	conns []*pglisten.Conn
	// healthy is each connection's last OnHealth; onHealth is told the
	// conjunction on every report (the hub ignores a report that changes
	// nothing).
	healthy  []bool
	onHealth func(bool)
	// listens counts the Listen calls routed to each connection minus its
	// Unlisten calls: how the union is spread (tests, logs).
	listens []int
}

// pgIndex is the connection channel ch lives on among k.
func pgIndex(ch string, k int) int {
	if k <= 1 {
		return 0
	}
	f := fnv.New32a()
	f.Write([]byte(ch))
	return int(f.Sum32() % uint32(k))
}

// newPGSet makes a set of k connections, each from open(cfg) with cfg's
// OnHealth rerouted through the set. healthy is what each connection's
// health is taken to be until it reports. On an error the set holds the
// connections opened before it, for the caller to close (or abandon).
func newPGSet(k int, cfg pglisten.Config, healthy bool, open func(i int, cfg pglisten.Config) (*pglisten.Conn, error)) (*pgSet, error) {
	s := &pgSet{onHealth: cfg.OnHealth, healthy: make([]bool, k), listens: make([]int, k)}
	for i := range k {
		c := cfg
		c.OnHealth = func(v bool) { s.connHealth(i, v) }
		conn, err := open(i, c)
		if err != nil {
			return s, err
		}
		s.conns = append(s.conns, conn)
		s.healthy[i] = healthy
	}
	return s, nil
}

func (s *pgSet) connHealth(i int, v bool) {
	s.healthy[i] = v
	if s.onHealth != nil {
		s.onHealth(s.allHealthy())
	}
}

func (s *pgSet) allHealthy() bool {
	for _, v := range s.healthy {
		if !v {
			return false
		}
	}
	return true
}

func (s *pgSet) conn(ch string) (*pglisten.Conn, int) {
	i := pgIndex(ch, len(s.conns))
	return s.conns[i], i
}

func (s *pgSet) Listen(ch string, done func(error)) {
	c, i := s.conn(ch)
	s.listens[i]++
	c.Listen(ch, done)
}

func (s *pgSet) Unlisten(ch string, done func(error)) {
	c, i := s.conn(ch)
	s.listens[i]--
	c.Unlisten(ch, done)
}

// Healthy reports whether every connection is up with its set LISTENed.
func (s *pgSet) Healthy() bool {
	for _, c := range s.conns {
		if !c.Healthy() {
			return false
		}
	}
	return true
}

// Close closes every connection; done runs once all are closed.
func (s *pgSet) Close(done func()) {
	if len(s.conns) == 0 {
		done()
		return
	}
	f := all(len(s.conns), done)
	for _, c := range s.conns {
		c.Close(f)
	}
}

// all runs done once n callbacks made by it have run.
func all(n int, done func()) func() {
	return func() {
		if n--; n == 0 {
			done()
		}
	}
}

// The hot upgrade (pgHandover, upgrade.go), on every connection.

// pgUp is the listener's upgrade side (not part of its API).
var pgUp = handoff.GetListener[*pglisten.Conn, pglisten.Config]()

func (s *pgSet) CanDetach() bool {
	for _, c := range s.conns {
		if !pgUp.Of(c).CanDetach() {
			return false
		}
	}
	return true
}

// WhenIdle runs done once every connection has reached its quiet point.
// The hub issues no command meanwhile, so a connection stays quiet once it
// is (a connection lost meanwhile fails Detach, which rolls back).
func (s *pgSet) WhenIdle(done func()) {
	f := all(len(s.conns), done)
	for _, c := range s.conns {
		pgUp.Of(c).WhenIdle(f)
	}
}

func (s *pgSet) CancelHold() {
	for _, c := range s.conns {
		pgUp.Of(c).CancelHold()
	}
}

// Detach detaches every connection, in order. On an error the ones
// detached already stay so; Resume puts them back (the rollback does).
func (s *pgSet) Detach() ([]handoff.PG, error) {
	hs := make([]handoff.PG, 0, len(s.conns))
	for _, c := range s.conns {
		h, err := pgUp.Of(c).Detach()
		if err != nil {
			return nil, err
		}
		hs = append(hs, h)
	}
	return hs, nil
}

func (s *pgSet) Resume() error {
	var errs []error
	for _, c := range s.conns {
		errs = append(errs, pgUp.Of(c).Resume())
	}
	return errors.Join(errs...)
}

func (s *pgSet) Abandon() {
	for _, c := range s.conns {
		pgUp.Of(c).Abandon()
	}
}

// ListenMarker LISTENs the upgrade's marker channel on every connection:
// the marker NOTIFY must split each connection's stream.
func (s *pgSet) ListenMarker(marker string, done func(error)) {
	var first error
	f := all(len(s.conns), func() { done(first) })
	for _, c := range s.conns {
		c.Listen(marker, func(err error) {
			if err != nil && first == nil {
				first = err
			}
			f()
		})
	}
}

func (s *pgSet) UnlistenMarker(marker string) {
	for _, c := range s.conns {
		c.Unlisten(marker, nil)
	}
}

// PauseAtMarker pauses each connection at the marker; done runs once all
// have paused there.
func (s *pgSet) PauseAtMarker(marker string, done func()) {
	f := all(len(s.conns), done)
	for _, c := range s.conns {
		pgUp.Of(c).PauseAtMarker(marker, f)
	}
}

// SendMarker NOTIFYs the marker once: every connection LISTENs it.
func (s *pgSet) SendMarker(marker string) error { return pgUp.Of(s.conns[0]).SendMarker(marker) }

// openSetForTakeover opens k connections of this process's own for the
// marker hand-over (handoff.Listener.OpenForTakeover): each LISTENs its share of
// channels and the marker. onMarker runs once the marker reached all.
func openSetForTakeover(ctx context.Context, l *loop.Loop, k int, cfg pglisten.Config, channels []string, marker string, onMarker func()) (*pgSet, error) {
	share := make([][]string, k)
	for _, ch := range channels {
		i := pgIndex(ch, k)
		share[i] = append(share[i], ch)
	}
	seen := all(k, onMarker)
	s, err := newPGSet(k, cfg, false, func(i int, c pglisten.Config) (*pglisten.Conn, error) {
		return pgUp.OpenForTakeover(ctx, l, c, share[i], marker, seen)
	})
	if err != nil {
		s.Close(func() {})
		return nil, err
	}
	return s, nil
}

// Terminate ends every session (the listener's terminate); done runs once
// the server has hung up on all of them.
func (s *pgSet) Terminate(done func()) {
	f := all(len(s.conns), done)
	for _, c := range s.conns {
		pgUp.Of(c).Terminate(f)
	}
}
