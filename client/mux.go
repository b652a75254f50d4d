package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"sync"

	"github.com/listenhub/listenhub/internal/defaults"
)

// defaultMuxBuffer is the default number of ephemeral wakes one Mux
// subscriber may have pending. An SSE stream that falls this far behind has
// a client that is not reading; closing it (it reconnects and re-reads)
// beats holding an unbounded backlog for it.
const defaultMuxBuffer = 64

// MuxOptions configure a Mux. The zero value is valid.
type MuxOptions struct {
	// Buffer is how many ephemeral wakes a subscriber may have pending
	// before it is closed with a *SlowSubscriberError. Durable wakes do
	// not count: at most one is pending per subscriber (later ones merge
	// into it). Default 64.
	Buffer int
	// Logger receives a line per subscriber closed for being slow. Nil
	// means slog.Default().
	Logger *slog.Logger
}

// Mux fans the wakes of one Listener out to many in-process subscribers
// (SSE streams, websockets), each with its own bounded buffer, so that the
// process holds one subscription per name whatever its number of
// subscribers: the first subscriber of a name subscribes the Listener, the
// last one's Close unsubscribes it.
//
// A slow subscriber never blocks the others nor the Listener's reader:
// its handler only appends to buffers. A subscriber's pending durable wakes
// coalesce into one (keeping the position of the first); an ephemeral wake
// that finds its buffer full closes it with a *SlowSubscriberError, which
// its Next and Err return.
//
// The Listener delivers to the Mux's OnWake handler; see NewMux.
type Mux struct {
	buffer int
	log    *slog.Logger

	mu    sync.RWMutex
	l     Listener // set once, by Attach
	chans map[string]*muxChan
	err   error // set when the Mux is closed or its Listener died
	// closed is closed with err set, so that the watcher of the Listener
	// ends with the Mux.
	closed chan struct{}
}

// muxChan is one subscription name of the Mux. Under Mux.mu.
type muxChan struct {
	q          string
	subs       map[*Subscription]struct{}
	subscribed bool          // the Listener is subscribed (acked)
	busy       bool          // a goroutine is reconciling subscribed with subs
	changed    chan struct{} // closed (and replaced) whenever subscribed changes or a Subscribe failed
}

// NewMux returns a Mux with no Listener yet. Give the Listener the Mux's
// OnWake as its wake handler, then Attach it:
//
//	mux, _ := client.NewMux(client.MuxOptions{})
//	f, err := client.NewFailover(ctx, opts, client.FailoverHandlers{OnWake: mux.OnWake})
//	if err != nil { ... }
//	mux.Attach(f)
//
// A negative MuxOptions.Buffer is its only error.
func NewMux(opts MuxOptions) (*Mux, error) {
	if err := defaults.Or(&opts.Buffer, defaultMuxBuffer, "MuxOptions.Buffer"); err != nil {
		return nil, fmt.Errorf("listenhub client: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Mux{buffer: opts.Buffer, log: opts.Logger, chans: make(map[string]*muxChan), closed: make(chan struct{})}, nil
}

// Attach makes l the Listener the Mux subscribes through, once: the Mux
// owns it from here on. Close closes it, and when it dies the Mux closes
// every subscriber with its error. Wakes l delivered before Attach found
// no subscriber (Subscribe needs the Listener). Attach to a closed Mux
// closes l and returns ErrClosed.
func (m *Mux) Attach(l Listener) error {
	m.mu.Lock()
	switch {
	case m.err != nil:
		err := m.err
		m.mu.Unlock()
		l.Close()
		return err
	case m.l != nil:
		m.mu.Unlock()
		return errMuxAttached
	}
	m.l = l
	m.mu.Unlock()
	go func() {
		select {
		case <-l.Done():
			m.fail(l.Err())
		case <-m.closed:
		}
	}()
	return nil
}

var (
	errMuxAttached   = errors.New("listenhub client: the Mux has a Listener already")
	errMuxUnattached = errors.New("listenhub client: the Mux has no Listener yet (Attach)")
)

// Listener returns the Listener the Mux subscribes through (for a
// Failover's Mode, say), nil before Attach.
func (m *Mux) Listener() Listener {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.l
}

// OnWake is the Mux's wake handler, to give its Listener: it delivers w to
// every subscriber of w.Name and never blocks.
func (m *Mux) OnWake(w Wake) { m.handleWake(w) }

// handleWake delivers w to every subscriber of w.Name. It never blocks.
func (m *Mux) handleWake(w Wake) {
	var slow []*Subscription
	m.mu.RLock()
	if ch := m.chans[w.Name]; ch != nil {
		for s := range ch.subs {
			if !s.push(w) {
				slow = append(slow, s)
			}
		}
	}
	m.mu.RUnlock()
	for _, s := range slow {
		m.log.Warn("listenhub mux: closing slow subscriber", "q", w.Name, "buffer", m.buffer)
		m.remove(s)
	}
}

// Subscribe adds an in-process subscriber of q and returns once the
// Listener is subscribed (the first subscriber of q waits for the ack;
// later ones return at once). Wakes arriving before it returns are already
// buffered for it. If the Listener's Subscribe fails, every subscriber that
// was waiting for it gets that error. ctx bounds this caller's wait only.
func (m *Mux) Subscribe(ctx context.Context, q string) (*Subscription, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.err != nil {
		err := m.err
		m.mu.Unlock()
		return nil, err
	}
	if m.l == nil {
		m.mu.Unlock()
		return nil, errMuxUnattached
	}
	ch := m.chans[q]
	if ch == nil {
		ch = &muxChan{q: q, subs: make(map[*Subscription]struct{}), changed: make(chan struct{})}
		m.chans[q] = ch
	}
	s := &Subscription{m: m, ch: ch, q: q, buffer: m.buffer, ready: make(chan struct{}, 1), done: make(chan struct{})}
	ch.subs[s] = struct{}{}
	m.mu.Unlock()

	// The Listener's Subscribe runs on its own goroutine (mayWait false),
	// so that this caller can leave when its ctx ends.
	m.reconcile(ch, false)
	for {
		m.mu.RLock()
		_, member := ch.subs[s]
		subscribed := ch.subscribed
		changed := ch.changed
		m.mu.RUnlock()
		if !member {
			// Removed: the Listener's Subscribe failed, or the Mux closed.
			return nil, s.Err()
		}
		if subscribed {
			return s, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			s.closeWith(ctx.Err())
			m.remove(s)
			return nil, ctx.Err()
		}
	}
}

// Subscribers returns the number of in-process subscribers of q.
func (m *Mux) Subscribers(q string) int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if ch := m.chans[q]; ch != nil {
		return len(ch.subs)
	}
	return 0
}

// Close closes every subscriber with ErrClosed, refuses new ones and
// closes the Listener.
func (m *Mux) Close() error {
	m.fail(ErrClosed)
	if l := m.Listener(); l != nil {
		return l.Close()
	}
	return nil
}

func (m *Mux) fail(err error) {
	if err == nil {
		err = ErrClosed
	}
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return
	}
	m.err = err
	close(m.closed)
	chans := m.chans
	m.chans = make(map[string]*muxChan)
	for _, ch := range chans {
		for s := range ch.subs {
			s.closeWith(err)
		}
		ch.subs = nil
		close(ch.changed)
		ch.changed = make(chan struct{})
	}
	m.mu.Unlock()
}

// remove drops s from its name and unsubscribes the Listener if s was the
// last one. It never waits for an ack.
func (m *Mux) remove(s *Subscription) {
	m.mu.Lock()
	_, member := s.ch.subs[s]
	delete(s.ch.subs, s)
	m.mu.Unlock()
	if member {
		m.reconcile(s.ch, false)
	}
}

// reconcile brings ch.subscribed in line with whether ch has subscribers,
// calling the Listener outside the lock. One goroutine at a time does it
// per name (busy); it re-checks after each call, so a change made while it
// was calling is never lost: whoever changes subs either sees busy (and the
// busy goroutine's re-check sees the change) or does the work itself.
//
// mayWait false (Close, the slow-subscriber path) hands a Subscribe, which
// waits for an ack, to a new goroutine: only an Unsubscribe, which never
// blocks, runs inline there.
func (m *Mux) reconcile(ch *muxChan, mayWait bool) {
	m.mu.Lock()
	if ch.busy {
		m.mu.Unlock()
		return
	}
	ch.busy = true
	m.reconcileBusy(ch, mayWait)
}

// reconcileBusy is reconcile's loop; called with m.mu held and ch.busy set
// by this goroutine; returns with m.mu released and ch.busy cleared (or
// handed to another goroutine).
func (m *Mux) reconcileBusy(ch *muxChan, mayWait bool) {
	for {
		want := len(ch.subs) > 0 && m.err == nil
		if want == ch.subscribed {
			ch.busy = false
			if len(ch.subs) == 0 && !ch.subscribed && m.chans[ch.q] == ch {
				delete(m.chans, ch.q)
			}
			m.mu.Unlock()
			return
		}
		if want && !mayWait {
			go func() {
				m.mu.Lock()
				m.reconcileBusy(ch, true)
			}()
			m.mu.Unlock()
			return
		}
		l := m.l
		m.mu.Unlock()
		var err error
		if want {
			// Not a caller's ctx: the subscription is shared by every
			// waiting subscriber, and Listeners bound Subscribe
			// themselves.
			err = l.Subscribe(context.Background(), ch.q)
		} else {
			l.Unsubscribe(ch.q)
		}
		m.mu.Lock()
		if err == nil {
			ch.subscribed = want
		} else {
			// Every subscriber is still waiting (subscribed was false):
			// they all get the Listener's answer.
			for s := range ch.subs {
				s.closeWith(err)
			}
			clear(ch.subs)
		}
		close(ch.changed)
		ch.changed = make(chan struct{})
	}
}

// Subscription is one in-process subscriber of a Mux: a bounded buffer of
// wakes for one name, read with Next.
type Subscription struct {
	m      *Mux
	ch     *muxChan
	q      string
	buffer int

	mu        sync.Mutex
	queue     []Wake // pending wakes, oldest first, from head
	head      int
	ephemeral int  // ephemeral wakes in queue; at most buffer
	durable   bool // a durable wake is in queue (later ones merge into it)
	err       error
	ready     chan struct{} // cap 1: queue became non-empty
	done      chan struct{} // closed with err
}

// Name returns the subscription name.
func (s *Subscription) Name() string { return s.q }

// push appends w; false means an ephemeral overflow closed s.
func (s *Subscription) push(w Wake) bool {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return true
	}
	if w.Durable {
		if s.durable {
			s.mu.Unlock()
			return true // coalesced into the pending one
		}
		s.durable = true
	} else {
		if s.ephemeral >= s.buffer {
			s.closeLocked(&SlowSubscriberError{Name: s.q, Buffer: s.buffer})
			s.mu.Unlock()
			return false
		}
		s.ephemeral++
	}
	if s.head > 0 && len(s.queue) == cap(s.queue) {
		n := copy(s.queue, s.queue[s.head:])
		clear(s.queue[n:])
		s.queue = s.queue[:n]
		s.head = 0
	}
	s.queue = append(s.queue, w)
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
	return true
}

// Wakes returns an iterator over the subscription's wakes, for a range
// loop (as nats.go's iterators): each wake as Next returns it, then Next's
// first error, after which it ends; breaking out of the loop ends it too.
// Call it from one goroutine, as Next.
//
//	for w, err := range sub.Wakes(ctx) {
//		if err != nil {
//			return err // ctx's, ErrClosed, a *SlowSubscriberError, the Listener's
//		}
//		handle(w)
//	}
func (s *Subscription) Wakes(ctx context.Context) iter.Seq2[Wake, error] {
	return func(yield func(Wake, error) bool) {
		for {
			w, err := s.Next(ctx)
			if err != nil {
				yield(Wake{}, err)
				return
			}
			if !yield(w, nil) {
				return
			}
		}
	}
}

// Next returns the oldest pending wake, waiting for one if none is pending.
// It returns the subscription's error as soon as it is closed (pending
// wakes are discarded: ErrClosed after Close, *SlowSubscriberError after an
// overflow, the Listener's error if it died), or ctx.Err(). Call it from
// one goroutine.
func (s *Subscription) Next(ctx context.Context) (Wake, error) {
	for {
		s.mu.Lock()
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return Wake{}, err
		}
		if s.head < len(s.queue) {
			w := s.queue[s.head]
			s.queue[s.head] = Wake{}
			s.head++
			if s.head == len(s.queue) {
				s.queue, s.head = s.queue[:0], 0
			}
			if w.Durable {
				s.durable = false
			} else {
				s.ephemeral--
			}
			s.mu.Unlock()
			return w, nil
		}
		s.mu.Unlock()
		select {
		case <-s.ready:
		case <-s.done:
		case <-ctx.Done():
			return Wake{}, ctx.Err()
		}
	}
}

// Pending returns the number of wakes waiting in the buffer.
func (s *Subscription) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue) - s.head
}

// Done is closed when the subscription is closed, for whatever reason.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err is nil while the subscription is open, then why it closed.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the subscription (Next returns ErrClosed); the last subscriber
// of a name unsubscribes the Listener. Idempotent; it never waits for the
// hub.
func (s *Subscription) Close() error {
	s.closeWith(ErrClosed)
	s.m.remove(s)
	return nil
}

func (s *Subscription) closeWith(err error) {
	s.mu.Lock()
	s.closeLocked(err)
	s.mu.Unlock()
}

func (s *Subscription) closeLocked(err error) {
	if s.err != nil {
		return
	}
	s.err = err
	s.queue, s.head, s.ephemeral, s.durable = nil, 0, 0, false
	close(s.done)
}
