package hub

import (
	"context"
	"sync"

	"github.com/listenhub/listenhub/loop"
)

// Upstream is where a hub takes its notifications from instead of a LISTEN
// connection of its own: the seam a fleet plugs into (a hub fed through
// NATS by a bridge that holds the fleet's one LISTEN). With
// Config.Upstream set the hub opens no Postgres connection; its workers see
// the same protocol, statuses and metrics, and every rule holds as long as
// the Upstream keeps its side of the contract below.
//
// The hub calls Listen, Unlisten and Close from its loop goroutine; they
// must not block. An Upstream with a method Reason() string (why it is not
// healthy, "" when it is) has it said on monitor's /healthz. The Upstream calls their done functions, and the
// UpstreamSink's methods, from any goroutine.
type Upstream interface {
	// Open starts the upstream, which reports to sink until Close.
	// Called once, by Start; an error fails Start.
	Open(sink UpstreamSink) error
	// Listen asks for channel's notifications. done(nil) means that
	// every NOTIFY on channel committed from now on will reach the sink
	// while the upstream stays healthy: the hub acks its workers on it.
	// done(err) refuses the channel (the hub nacks).
	Listen(channel string, done func(error))
	// Unlisten gives channel up; done runs when it is given up.
	Unlisten(channel string, done func(error))
	// Close stops the upstream; done runs once it is stopped.
	Close(done func())
}

// UpstreamSink is how an Upstream reports to its hub. Safe from any
// goroutine; calls are handled in the order they are made.
type UpstreamSink interface {
	// Notify is one notification: its channel and payload (empty for a
	// NOTIFY without one, a durable wake).
	Notify(channel, payload string)
	// Health says whether every notification is reaching the sink.
	// false, then true is a gap: the hub resyncs as after a Postgres
	// reconnect (one durable wake per channel to every subscriber).
	Health(healthy bool)
}

// upstreamSide adapts an Upstream to the hub's postgres interface: its
// reports and done calls are posted to the loop.
type upstreamSide struct {
	up Upstream
	l  *loop.Loop
	h  *Hub

	mu      sync.Mutex
	healthy bool
	// pending are the notifications not handed to the loop yet: the
	// first of a batch posts the drain, the others join it, so a burst
	// costs the loop one wake, not one per notification.
	pending []upNote
}

type upNote struct{ ch, payload []byte }

// openUpstream is the pgOpener of a hub with Config.Upstream.
func openUpstream(_ context.Context, l *loop.Loop, h *Hub) (postgres, error) {
	s := &upstreamSide{up: h.cfg.Upstream, l: l, h: h}
	if err := s.up.Open(s); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *upstreamSide) Notify(channel, payload string) {
	s.mu.Lock()
	first := len(s.pending) == 0
	s.pending = append(s.pending, upNote{[]byte(channel), []byte(payload)})
	s.mu.Unlock()
	if first {
		_ = s.l.Post(s.drain)
	}
}

// drain hands the pending notifications to the hub, on the loop.
func (s *upstreamSide) drain() {
	s.mu.Lock()
	notes := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, n := range notes {
		s.h.onNotification(n.ch, n.payload)
	}
}

// Health is ordered with the notifications: those reported before it are
// handed to the hub first.
func (s *upstreamSide) Health(healthy bool) {
	s.mu.Lock()
	s.healthy = healthy
	s.mu.Unlock()
	_ = s.l.Post(func() {
		s.drain()
		s.h.onHealth(healthy)
	})
}

func (s *upstreamSide) Listen(ch string, done func(error)) {
	s.up.Listen(ch, func(err error) { _ = s.l.Post(func() { done(err) }) })
}

func (s *upstreamSide) Unlisten(ch string, done func(error)) {
	s.up.Unlisten(ch, func(err error) { _ = s.l.Post(func() { done(err) }) })
}

func (s *upstreamSide) Healthy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.healthy
}

func (s *upstreamSide) Close(done func()) {
	s.up.Close(func() { _ = s.l.Post(done) })
}
