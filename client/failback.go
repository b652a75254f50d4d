package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Defaults of the fail-back (see FailoverOptions).
const (
	// defaultFailbackDelay is the least time a Failover stays on its local
	// listener before it tries the hub again: a hub that crashes again at
	// once, or keeps evicting this process, costs at most one round trip
	// hub → local → hub per this much time.
	defaultFailbackDelay = 5 * time.Second
	// defaultProbeInterval is the wait after a failed fail-back attempt;
	// it doubles after each further one, up to defaultProbeMaxInterval.
	defaultProbeInterval    = 1 * time.Second
	defaultProbeMaxInterval = 30 * time.Second
)

// probeJitter scales each wait between fail-back attempts by a random
// factor in [1-probeJitter, 1+probeJitter], so that the processes of a host,
// which all failed over in the same millisecond, do not all knock on the
// restarted hub in the same millisecond too.
const probeJitter = 0.2

// failbackParallel bounds the sub frames a fail-back has in flight: enough
// for the hub to LISTEN them in batches, few enough that a large set does
// not wait in the hub's queue past the ack timeout.
const failbackParallel = 64

// failbackLoop tries to return from local to the hub: FailbackDelay after the
// swap, then with jittered exponential backoff, until an attempt succeeds,
// local is no longer current, or the Failover dies.
func (f *Failover) failbackLoop(local Listener) {
	// Up to 20% past FailbackDelay, never before it: the processes of a host
	// failed over together and should not all come back together.
	first := f.opts.FailbackDelay + time.Duration(probeJitter*rand.Float64()*float64(f.opts.FailbackDelay))
	t := time.NewTimer(first)
	defer t.Stop()
	next := f.opts.ProbeInterval
	for attempt := 1; ; attempt++ {
		select {
		case <-f.done:
			return
		case <-t.C:
		}
		if f.failback(local, attempt) {
			return
		}
		t.Reset(jitter(next))
		next = min(2*next, f.opts.ProbeMaxInterval)
	}
}

// jitter returns d scaled by a random factor in [1-probeJitter, 1+probeJitter].
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (1 - probeJitter + 2*probeJitter*rand.Float64()))
}

// failback is one attempt to return to the hub from local; true means
// stop trying (back on the hub, local no longer current, or dead).
func (f *Failover) failback(local Listener, attempt int) (stop bool) {
	hc := newHubConn()
	f.mu.Lock()
	if f.err != nil || f.swapping || f.mode != ModeLocal || f.local != local {
		f.mu.Unlock()
		return true
	}
	f.cand = hc
	since := f.localSince
	f.mu.Unlock()
	swapped := false
	defer func() {
		if swapped {
			return
		}
		f.mu.Lock()
		if f.cand == hc {
			f.cand = nil
		}
		c := hc.c
		f.mu.Unlock()
		if c != nil {
			c.Close()
		}
	}()
	giveUp := func(why string, err error) bool {
		// No hub yet is the common case, every probe: debug. A hub that
		// answers and is refused (not healthy, a nack, an ack timeout,
		// EOF, a peer not allowed) is worth an operator's eye.
		level := slog.LevelInfo
		var peer *PeerError
		if why == "connect" && !errors.As(err, &peer) {
			level = slog.LevelDebug
		}
		f.log.Log(context.Background(), level, "listenhub: fail-back attempt failed, staying local",
			"socket", f.opts.Hub.SocketPath, "attempt", attempt, "why", why, "reason", err)
		return false
	}

	ctx, cancel := context.WithTimeout(context.Background(), f.opts.Hub.AckTimeout)
	c, err := f.dialHub(ctx, hc)
	cancel()
	if err != nil {
		return giveUp("connect", err)
	}
	f.mu.Lock()
	hc.c = c // from now on Close closes it too
	dead := f.err != nil
	f.mu.Unlock()
	if dead {
		return true
	}
	if err := f.awaitHealthy(hc); err != nil {
		return giveUp("health", err)
	}
	f.log.Info("listenhub: hub is back, subscribing it before leaving the local listener", "socket", f.opts.Hub.SocketPath)

	// The cut (cut.go): both listeners LISTEN a private marker name
	// before anything else.
	var mark *cut
	lo, _ := local.(*Local)
	if lo != nil && cutFits(f.opts.Local.ChannelPrefix, f.opts.Local.ChannelSuffix) {
		mark = newCut(hc)
		f.setCut(mark)
		defer func() {
			if !swapped {
				if f.abandon(mark) {
					f.mu.Lock()
					names := keys(f.subs)
					f.mu.Unlock()
					f.durableWakes(names)
				}
				local.Unsubscribe(mark.q)
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), f.opts.Hub.AckTimeout)
		err := local.Subscribe(ctx, mark.q)
		if err == nil {
			err = c.Subscribe(ctx, mark.q)
		}
		cancel()
		if err != nil {
			return giveUp("marker", err)
		}
	}
	markedAt := -1 // len(acked) when the marker went round

	acked := make(map[string]struct{})
	drained := false
	for {
		f.mu.Lock()
		if f.err != nil {
			f.mu.Unlock()
			return true
		}
		todo := missing(f.subs, acked)
		if len(todo) == 0 && !drained {
			f.mu.Unlock()
			// A NOTIFY committed just before the hub's LISTEN of its
			// name reaches only the local listener: let it arrive
			// before the local listener is closed.
			if s, ok := local.(interface{ sync(context.Context) error }); ok {
				ctx, cancel := context.WithTimeout(context.Background(), f.opts.Hub.AckTimeout)
				if err := s.sync(ctx); err != nil {
					f.log.Debug("listenhub: local listener not drained before the fail-back", "reason", err)
				}
				cancel()
			}
			drained = true
			continue // names subscribed meanwhile need their acks first
		}
		if len(todo) == 0 && mark != nil && markedAt < 0 {
			f.mu.Unlock()
			if stop, err := f.sendMarker(lo, mark); stop || err != nil {
				return stop || giveUp("marker", err)
			}
			markedAt = len(acked)
			continue
		}
		if len(todo) == 0 {
			if mark != nil && len(acked) != markedAt {
				// A name acked after the marker: what was committed for
				// it in between reached neither side of the cut.
				f.mu.Unlock()
				return giveUp("marker", errors.New("subscriptions changed during the fail-back"))
			}
			if !c.Healthy() {
				f.mu.Unlock()
				return giveUp("health", c.Err())
			}
			// Make: every recorded name is acked by the hub. Swap
			// under f.mu, dropping the names unsubscribed meanwhile
			// (queued before any later Unsubscribe or Subscribe).
			for _, q := range missing(acked, f.subs) {
				c.Unsubscribe(q)
			}
			recorded := keys(f.subs)
			f.mode, f.reason, f.hub, f.local, f.cand = ModeHub, nil, hc, nil, nil
			if f.localLive != nil {
				f.localLive.Store(false) // before the cut goes: see localLive
				f.localLive = nil
			}
			hc.current.Store(true)
			f.mu.Unlock()
			swapped = true
			go f.watchHub(hc)
			// Break: the hub delivers from here on.
			local.Close()
			if mark != nil {
				f.setCut(nil)
				c.Unsubscribe(mark.q)
			}
			f.log.Info("listenhub: back on the hub, local listener closed", "socket", f.opts.Hub.SocketPath,
				"subscriptions", len(recorded), "local_for", time.Since(since).Round(time.Millisecond), "attempts", attempt)
			if h := f.h.OnFailback; h != nil {
				f.deliver(h)
			}
			if h := f.h.OnStatus; h != nil {
				healthy := c.Healthy()
				f.deliver(func() { h(healthy) })
			}
			f.durableWakes(recorded)
			return true
		}
		f.mu.Unlock()
		if err := f.subscribeAll(c, todo, acked); err != nil {
			return giveUp("subscribe", err)
		}
		drained = false
	}
}

// sendMarker commits the cut's marker and waits, up to the ack timeout,
// until both listeners delivered it. A marker the hub does not deliver
// means a hub on another database (or cluster): said once at ERROR, since
// every worker of the host is then off the hub for good.
func (f *Failover) sendMarker(local *Local, mark *cut) (stop bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), f.opts.Hub.AckTimeout)
	defer cancel()
	if err := local.notify(ctx, mark.q, mark.token); err != nil {
		return false, err
	}
	select {
	case <-mark.both:
		return false, nil
	case <-f.done:
		return true, nil
	case <-ctx.Done():
	}
	f.dispatch.Lock()
	hubPast := mark.hubPast
	f.dispatch.Unlock()
	if hubPast {
		return false, fmt.Errorf("listenhub client: the local listener did not deliver the fail-back marker within %v", f.opts.Hub.AckTimeout)
	}
	db := "this database"
	if cc := f.localCfg.ConnConfig; cc != nil {
		db = fmt.Sprintf("%s at %s:%d", cc.Database, cc.Host, cc.Port)
	}
	err = fmt.Errorf("listenhub client: the hub does not deliver this database's notifications (a marker sent on %s did not come back through it within %v): it serves another database or cluster; staying on the local listener",
		db, f.opts.Hub.AckTimeout)
	level := slog.LevelDebug
	if f.wrongDatabase.CompareAndSwap(false, true) {
		level = slog.LevelError
	}
	f.log.Log(context.Background(), level, "listenhub: not failing back to a hub on another database", "socket", f.opts.Hub.SocketPath, "reason", err)
	return false, err
}

// awaitHealthy waits, up to the ack timeout, for hc's hub to report its
// Postgres connection healthy (it sends a status on connect).
func (f *Failover) awaitHealthy(hc *hubConn) error {
	t := time.NewTimer(f.opts.Hub.AckTimeout)
	defer t.Stop()
	for !hc.c.Healthy() {
		select {
		case <-hc.status:
		case <-hc.c.Done():
			return hc.c.Err()
		case <-f.done:
			return ErrClosed
		case <-t.C:
			return fmt.Errorf("listenhub client: hub not healthy within %v", f.opts.Hub.AckTimeout)
		}
	}
	return nil
}

// subscribeAll subscribes c to todo, failbackParallel at a time, adding
// the acked names to acked. A name refused as invalid is forgotten (as
// Subscribe does); any other failure is returned, and means c is dead.
func (f *Failover) subscribeAll(c *Conn, todo []string, acked map[string]struct{}) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, failbackParallel)
	for _, q := range todo {
		sem <- struct{}{}
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			// Bounded by the ack timeout; Close of c (Failover.Close)
			// ends it at once.
			err := c.Subscribe(context.Background(), q)
			if errors.Is(err, ErrInvalidName) {
				f.forget(q)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				acked[q] = struct{}{}
			case first == nil:
				first = err
			}
		}()
	}
	wg.Wait()
	return first
}
