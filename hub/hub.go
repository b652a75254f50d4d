// Package hub is the listenhub state machine: one Postgres LISTEN connection
// shared by every worker process of a host, which connect over a Unix socket
// and speak the length-prefixed JSON protocol of package frame.
//
// All state lives on one loop goroutine (package loop): workers, the
// refcounted channel union, outbound buffers, timers. Nothing in this package
// takes a lock: the exported methods hand their work to the loop and wait
// for its answer, and Stats reads atomics.
//
// What the hub guarantees (docs/design.md):
//
//   - a worker is in the routing table before LISTEN is issued and is acked
//     only after Postgres confirmed the LISTEN;
//   - the hub LISTENs to the refcounted union of all subscriptions;
//   - ephemeral wakes (NOTIFY with a payload) are never dropped while the
//     worker is connected: a worker whose backlog passes the hard limit is
//     evicted instead;
//   - durable wakes (empty payload) are coalesced per worker and channel,
//     capped by DurableQueueLimit, and never cause an eviction;
//   - frames to one worker leave in the order they were produced;
//   - status is sent on connect, on every change and every 5 status
//     intervals; after a reconnect every subscriber gets one durable wake
//     per channel;
//   - malformed input severs only the connection that sent it.
//
// The hard limits (HardQueueLimit frames, HardQueueBytes bytes) bound what
// the hub holds for a worker beyond what the kernel took: frames of one loop
// iteration are written once at its end, but a worker that would pass a
// limit mid-iteration (one read of the Postgres socket can bring thousands
// of NOTIFYs) is written to first and judged on what the kernel refused. A
// worker is therefore evicted only when it falls behind by more than its
// socket buffer plus the limit, whether it stopped reading or reads slower
// than a sustained burst of payloads; the hub never slows its Postgres
// reader for it. Durable wakes are bounded separately (coalesced, then
// DurableQueueLimit), do not count against the hard limits, and never
// evict.
package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/fdreserve"
	"github.com/listenhub/listenhub/internal/histogram"
	"github.com/listenhub/listenhub/internal/pglisten"
	"github.com/listenhub/listenhub/latency"
	"github.com/listenhub/listenhub/loop"
)

// postgres is the hub's view of its LISTEN connection (pglisten.Conn in
// production, a fake in unit tests). Every method is called on the loop
// goroutine, and every callback must run there too, after the call
// returned: the hub never expects a done callback from inside Listen.
// Notifications and health changes arrive through Hub.onNotification and
// Hub.onHealth, also on the loop goroutine.
type postgres interface {
	// Listen makes ch part of the connection's LISTEN set; done runs once
	// Postgres confirmed it (CommandComplete and ReadyForQuery) or with the
	// reason it could not be.
	Listen(ch string, done func(error))
	// Unlisten removes ch from the set.
	Unlisten(ch string, done func(error))
	// Healthy reports whether the connection is up and its set LISTENed.
	Healthy() bool
	// Close UNLISTENs everything and closes the connection; done runs on
	// the loop when it is closed.
	Close(done func())
}

// pgOpener connects the Postgres side. It runs in Start, before the loop
// runs, on Start's goroutine (loop methods may be called then).
type pgOpener func(ctx context.Context, l *loop.Loop, h *Hub) (postgres, error)

// stopper is a running timer.
type stopper interface{ Stop() bool }

// clock schedules the hub's repeating timers. Production uses the loop's;
// unit tests inject one they advance by hand, so status timing is tested
// without waiting for real seconds.
type clock interface {
	Every(d time.Duration, f func()) stopper
}

type loopClock struct{ l *loop.Loop }

// seams are what a test hub replaces (export_test.go's setHooks); the zero
// value is production. openPG connects the Postgres side, clock schedules
// the repeating timers, and precopied runs on an upgrade's handover
// goroutine between the pre-copy and the freeze.
type seams struct {
	openPG    pgOpener
	clock     clock
	precopied func(*precopy)
}

// openPostgres connects h's Postgres side.
func (h *Hub) openPostgres(ctx context.Context, l *loop.Loop) (postgres, error) {
	switch {
	case h.seams.openPG != nil:
		return h.seams.openPG(ctx, l, h)
	case h.cfg.Upstream != nil:
		return openUpstream(ctx, l, h)
	}
	return openListener(ctx, l, h)
}

// newClock is the clock of h's repeating timers.
func (h *Hub) newClock(l *loop.Loop) clock {
	if h.seams.clock != nil {
		return h.seams.clock
	}
	return loopClock{l}
}

func (c loopClock) Every(d time.Duration, f func()) stopper { return c.l.Every(d, f) }

// statusEvery is how many status intervals pass between two periodic
// re-sends of the status to every worker (docs/design.md rule 6).
const statusEvery = 5

// readSize is the size of the one read buffer shared by all workers: the
// decoder copies what it is fed, so the buffer is free again after a read.
// It also bounds the work one worker's readiness costs a loop pass: 4 KiB
// is about 130 sub frames (well under a millisecond of handling), and what
// the kernel still holds brings the level-triggered handler back on the
// next pass, after every other ready descriptor had its turn. With 64 KiB,
// a few workers flooding subs held the loop for tens of milliseconds.
const readSize = 4 << 10

// Hub is one listenhub. Create it with New, and run it with Run (or Start,
// then Stop). Stats and Done are safe from any goroutine.
type Hub struct {
	// cfg is the loop's configuration (SetLive replaces it on the loop);
	// published is a copy of it for Config, safe from any goroutine.
	cfg       Config
	published atomic.Pointer[Config]
	log       *slog.Logger
	stats     counters
	// fanoutLatency and ackLatency are the latency histograms
	// (histogram.go): written on the loop, read from anywhere.
	fanoutLatency, ackLatency *histogram.Recorder

	started  atomic.Bool
	stopOnce sync.Once
	done     chan struct{} // closed when the loop has exited
	err      error         // Run's result; written before done closes
	// fatal is why the hub stopped itself (a Postgres configuration
	// error). Written on the loop goroutine before Run returns, read
	// after done closed.
	fatal error

	// Set once in Start, before the loop goroutine starts.
	loop  *loop.Loop
	pg    postgres
	clk   clock
	seams seams // tests' replacements (export_test.go); zero in production

	sockPerm socketPerm // the socket file's mode and group (Config)

	// Everything below belongs to the loop goroutine.
	sock      listenSocket
	accepting accepting // paused accepting, and when it resumes (accept.go)
	allow     map[uint32]struct{}
	fds       fdBudget // the worker cap and the descriptors (fdbudget.go)

	logBuckets [numLogKinds]logBucket

	partial partialFrames // the workers mid-frame (frametimeout.go)
	stall   stalls        // the workers past HardQueueLimit (stall.go)

	workers  workerSet
	nextID   uint64
	channels map[string]*channel // by Postgres channel name (prefix+Q+suffix)
	healthy  bool                // last health broadcast to workers
	stopping bool
	closed   bool // OnClose ran: every fd is gone

	// notDelivered is the last failed delivery check logged (see
	// onNotDelivered).
	notDelivered struct {
		reason string
		at     time.Time
	}

	// connected: Postgres was healthy at least once. Until then no
	// worker was acked, so the first healthy is no reconnect: nothing to
	// resync, nothing to count.
	connected bool

	dirty []*worker // workers with frames appended this iteration
	// closedWorkers were closed in this iteration; flush recycles them
	// into freeWorkers. freeTracked are tracked structs to reuse.
	closedWorkers []*worker
	out           outbound // the bytes queued for every worker (outbudget.go)
	freeWorkers   []*worker
	freeTracked   []*tracked
	rbuf          []byte       // shared read buffer
	scratch       []byte       // one encoded wake, copied to each subscriber
	iov           [][]byte     // writev vectors, reused
	writers       writers      // the helper threads of a large flush (fanout.go)
	iter          iterNotifs   // this iteration's notifications, for the latency
	status        statusRounds // the status timer and its re-send rounds
	// socketChecked is when the socket's directories were last checked
	// (sockcheck.go).
	socketChecked time.Time
	stopTimer     *loop.Timer

	up *upgrade // a hot upgrade in progress, either side (upgrade.go)

	snaps snapshots // Workers and Channels (pages.go)
}

// New validates cfg and returns a hub that is not running yet.
func New(cfg Config) (*Hub, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	h := &Hub{
		cfg:      c,
		log:      c.Logger,
		done:     make(chan struct{}),
		allow:    make(map[uint32]struct{}, len(c.AllowUIDs)),
		channels: make(map[string]*channel),
		iov:      make([][]byte, 2),
		sock:     listenSocket{fd: -1},
		// maxWorkers is lowered by Start to what the descriptor limit
		// allows.
		fds: fdBudget{spareFD: -1, maxWorkers: c.MaxWorkers},

		fanoutLatency: histogram.New(fanoutBounds),
		ackLatency:    histogram.New(ackBounds),
	}
	for _, uid := range c.AllowUIDs {
		h.allow[uint32(uid)] = struct{}{}
	}
	h.sockPerm = socketPerm{mode: c.SocketMode, gid: -1}
	if c.SocketGroup != "" {
		if h.sockPerm.gid, err = lookupGroup(c.SocketGroup); err != nil {
			return nil, err
		}
	}
	h.publishConfig()
	h.initSnapshots()
	return h, nil
}

// publishConfig makes h.cfg what Config returns. On the loop (or before it
// runs).
func (h *Hub) publishConfig() {
	c := h.cfg
	c.AllowUIDs = slices.Clone(c.AllowUIDs)
	h.published.Store(&c)
}

// Config returns the configuration in force, defaults filled in. It is safe
// from any goroutine at any time, SetLive included: it returns a copy made
// when the configuration last changed.
func (h *Hub) Config() Config {
	c := *h.published.Load()
	c.AllowUIDs = slices.Clone(c.AllowUIDs)
	return c
}

// Start binds the socket (or takes over Config.ListenerFile), starts the loop
// goroutine and returns: from then on workers are accepted and told the
// Postgres health. The Postgres side is opened by then too, and connects
// in the background (healthy:false until it is up). A
// socket path held by a running hub is an error and leaves that hub
// untouched; a stale socket file is replaced. Start may be called once.
func (h *Hub) Start(ctx context.Context) (err error) {
	if !h.started.CompareAndSwap(false, true) {
		return errors.New("hub: Start called twice")
	}
	defer func() {
		if err != nil {
			close(h.done)
		}
	}()
	if err := ctx.Err(); err != nil {
		return err
	}
	l, err := loop.New(loop.Options{Logger: h.log})
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	h.loop = l
	h.clk = h.newClock(l)
	// The socket first: a second hub started by mistake is refused before
	// it opens a backend, and workers can connect while Postgres is still
	// being reached.
	var sock listenSocket
	if h.cfg.ListenerFile != nil {
		sock, err = adoptSocket(h.cfg.ListenerFile, h.cfg.SocketPath)
		h.cfg.SocketPath = sock.path
		h.publishConfig()
	} else if u := h.checkSocketDirs(); u != nil && !h.cfg.ServeRefusableSocket {
		err = h.refusableSocketError(u)
	} else {
		sock, err = bindSocketAs(h.cfg.SocketPath, h.sockPerm)
	}
	if err == nil && h.cfg.ListenerFile != nil {
		if u := h.checkSocketDirs(); u != nil && !h.cfg.ServeRefusableSocket {
			sock.close()
			err = h.refusableSocketError(u)
		}
	}
	if err != nil {
		discardLoop(l)
		return err
	}
	if sock.tok, err = l.Register(sock.fd, loop.Readable, h.onAcceptable); err != nil {
		sock.close()
		discardLoop(l)
		return fmt.Errorf("hub: %w", err)
	}
	pg, err := h.openPostgres(ctx, l)
	if err != nil {
		sock.close()
		discardLoop(l)
		return fmt.Errorf("hub: connect to postgres: %w", err)
	}
	h.pg = pg
	h.sock = sock
	h.rbuf = make([]byte, readSize)
	h.budgetFDs()
	// The listener's OnHealth(true), once its connection is installed on
	// the loop with the set LISTENed, is a change only if it was not
	// healthy already.
	h.healthy = pg.Healthy()
	h.connected = h.healthy
	h.stats.healthy.Store(h.healthy)
	l.AfterIteration(h.flush)
	l.OnClose(h.onLoopClose)
	h.status.timer = h.clk.Every(h.cfg.StatusInterval, h.onStatusTick)
	h.startReports()
	h.socketChecked = time.Now()
	h.onSocketCheck()
	h.log.Info("hub started", "socket", h.cfg.SocketPath, "inherited", sock.adopted,
		"application_name", h.cfg.ApplicationName, "healthy", h.healthy, "max_workers", h.fds.maxWorkers,
		"max_outbound_bytes", h.cfg.MaxOutboundBytes)
	go func() {
		h.err = l.Run()
		close(h.done)
	}()
	if h.cfg.ReleaseMemory {
		go h.returnMemory(memCheckEvery)
	}
	return nil
}

// startReports starts Config.OnReport: once now (on the loop, soon) and every
// ReportInterval. Before the loop runs or on it.
func (h *Hub) startReports() {
	if h.cfg.OnReport != nil {
		h.loop.Post(h.report)
		h.loop.Every(h.cfg.ReportInterval, h.report)
	}
}

// report hands the current Stats to Config.OnReport, on the loop goroutine.
func (h *Hub) report() {
	if h.cfg.OnReport != nil && !h.closed {
		h.cfg.OnReport(h.stats.snapshot())
	}
}

// onFatal is called by the Postgres side, on the loop goroutine, for an
// error no retry can fix (authentication failed, no such database): the
// hub stops as Stop would, and Wait returns err.
func (h *Hub) onFatal(err error) {
	if h.stopping {
		return
	}
	h.fatal = fmt.Errorf("hub: postgres: %w", err)
	h.shutdown() // the listener logged the reason
}

// onNotDelivered is called by the Postgres side, on the loop goroutine,
// every time a connection fails the delivery check (notifications do not
// arrive on it: a transaction pooler, most likely). It is logged as one
// line, the reason first, for all the hub's connections together, and
// again at most every notDeliveredLogEvery while the reason stays the
// same; the connection stays unhealthy and is retried meanwhile.
func (h *Hub) onNotDelivered(err error) {
	msg := err.Error()
	now := time.Now()
	if msg == h.notDelivered.reason && now.Sub(h.notDelivered.at) < notDeliveredLogEvery {
		return
	}
	h.notDelivered.reason, h.notDelivered.at = msg, now
	h.log.Error(msg)
}

// notDeliveredLogEvery bounds the repeats of onNotDelivered's line.
const notDeliveredLogEvery = 30 * time.Second

// discardLoop releases a loop that never ran.
func discardLoop(l *loop.Loop) {
	l.Stop()
	_ = l.Run()
}

// Stop stops accepting, closes every worker (they see EOF), UNLISTENs,
// closes the Postgres connection and removes the socket file. It waits for
// all that until ctx is done; then it stops the loop anyway, closing every
// descriptor, and returns ctx's error. A hub that stopped itself on a
// Postgres configuration error is stopped already: Stop returns nil, and
// Wait the reason. The socket file is not removed when the socket was
// inherited (Config.ListenerFile). Safe from any goroutine, more than once.
func (h *Hub) Stop(ctx context.Context) error {
	if !h.started.Load() || h.loop == nil {
		return nil
	}
	h.stopOnce.Do(func() {
		if err := h.loop.Post(h.shutdown); err != nil {
			h.loop.Stop()
		}
	})
	select {
	case <-h.done:
		return h.err
	case <-ctx.Done():
		h.loop.Stop()
		<-h.done
		return ctx.Err()
	}
}

// stopGrace bounds Run's Stop once its ctx is done.
const stopGrace = 10 * time.Second

// Run starts the hub and runs it until ctx is done, then stops it (giving
// Stop up to 10 s) and returns nil; or until the hub stops itself, and
// returns why (Wait). A Start error is returned at once. It is the relay's
// shape (relay.Relay.Run); Start, Stop and Wait remain for a program that
// must act once the socket is bound (systemd readiness, a hot upgrade).
func (h *Hub) Run(ctx context.Context) error {
	if err := h.Start(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), stopGrace)
		defer cancel()
		if err := h.Stop(sctx); err != nil {
			return err
		}
		return nil
	case <-h.done:
		return h.Wait()
	}
}

// Done is closed when the hub has stopped (or failed to start).
func (h *Hub) Done() <-chan struct{} { return h.done }

// Wait blocks until the hub has stopped and returns why: nil after a clean
// Stop, the loop's error, or the Postgres configuration error (bad
// password, no such database) that made the hub stop itself.
func (h *Hub) Wait() error {
	<-h.done
	if h.err != nil {
		return h.err
	}
	return h.fatal
}

// Stats returns the current gauges and counters. Safe from any goroutine.
func (h *Hub) Stats() Stats { return h.stats.snapshot() }

// FanoutLatency returns the histogram of the time from reading a
// notification from the Postgres socket (the start of the loop iteration
// that read it) to the end of the write that handed its frames to the
// workers' sockets, one observation per notification routed to at least one
// worker. Frames a full socket refused are not waited for: this is the
// hub's own delay, not a slow worker's. Safe from any goroutine.
func (h *Hub) FanoutLatency() latency.Histogram { return h.fanoutLatency.Snapshot() }

// AckLatency returns the histogram of the time from reading a sub to
// queuing its ack: microseconds for a channel already LISTENed, a Postgres
// round trip for a new one, longer while the connection is down. Safe from
// any goroutine.
func (h *Hub) AckLatency() latency.Histogram { return h.ackLatency.Snapshot() }

// shutdown is Stop on the loop goroutine.
func (h *Hub) shutdown() {
	if h.stopping {
		return
	}
	h.stopping = true
	h.log.Info("hub stopping", "workers", h.workers.len(), "channels", len(h.channels))
	h.closeSocket()
	if h.status.timer != nil {
		h.status.timer.Stop()
	}
	if h.accepting.timer != nil {
		h.accepting.timer.Stop()
	}
	if h.partial.timer != nil {
		h.partial.timer.Stop()
	}
	if h.stall.timer != nil {
		h.stall.timer.Stop()
	}
	for w := range h.workers.all() {
		// One last try for frames already produced; never wait for it.
		if !w.armed {
			h.write(w)
		}
		if !w.closed {
			h.closeWorker(w, reasonHubStopping, nil)
		}
	}
	// Closing the Postgres side is asynchronous (UNLISTEN *, Terminate);
	// bound it, so that a dead server cannot hold the stop.
	h.stopTimer = h.loop.AfterFunc(5*time.Second, func() {
		h.log.Warn("postgres close did not finish in 5s; stopping anyway")
		h.loop.Stop()
	})
	h.pg.Close(func() {
		h.stopTimer.Stop()
		h.loop.Stop()
	})
}

// onLoopClose runs when the loop stops, whatever the cause: every
// descriptor the hub owns is closed here at the latest.
func (h *Hub) onLoopClose() {
	if h.closed {
		return
	}
	h.closed = true
	h.stopping = true
	if h.writers.fan != nil {
		h.writers.fan.stop()
		h.writers.fan = nil
	}
	h.closeSocket()
	if h.fds.spareFD >= 0 {
		unix.Close(h.fds.spareFD)
		h.fds.spareFD = -1
	}
	if h.fds.reserved {
		fdreserve.Drop()
		h.fds.reserved = false
	}
	for w := range h.workers.all() {
		if !w.closed {
			h.closeWorker(w, reasonHubStopping, nil)
		}
	}
	h.stats.healthy.Store(false)
	h.log.Info("hub stopped")
}

// onStatusTick runs every StatusInterval; every statusEvery ticks it
// re-sends the status to every worker.
func (h *Hub) onStatusTick() {
	if h.up != nil && h.up.handed {
		return // the workers are the new process's now
	}
	h.status.ticks++
	h.rebudgetFDs()
	h.shedNewest()
	for w := range h.workers.all() {
		w.out.Retain = w.active && w.wasActive
		w.wasActive, w.active = w.active, false
		if !w.out.Retain {
			w.out.Release() // no-op while bytes are pending
			w.dec.Release() // likewise while a frame is partial
		}
	}
	h.flushSuppressed()
	if now := h.now(); now.Sub(h.socketChecked) >= socketCheckEvery {
		h.socketChecked = now
		h.onSocketCheck()
	}
	if h.status.ticks%statusEvery != 0 || h.status.resendAt > 0 {
		return // not this tick, or the last round is still going out
	}
	h.status.resendAt = h.workers.len()
	h.resendStatus()
}

// statusSlice is how many workers one loop iteration re-sends the status
// to. The re-send is the largest burst of work the loop does on its own
// (a write to every worker); in one piece it held the loop for seconds at
// 10,000 workers on a loaded machine, and every wake and ack with it. In
// slices, the events that arrive meanwhile are served between two.
const statusSlice = 128

// resendStatus re-sends the status to the next statusSlice workers below
// resendAt and posts itself for the rest. The index walks down: a worker
// removed meanwhile hands its index to the last one, which was already
// served (at worst it is served twice, and a status is idempotent), and a
// worker that connects meanwhile got its status when it connected.
func (h *Hub) resendStatus() {
	if h.stopping || h.closed || (h.up != nil && h.up.handed) {
		h.status.resendAt = 0
		return
	}
	for n := 0; n < statusSlice; n++ {
		h.status.resendAt = min(h.status.resendAt, h.workers.len())
		if h.status.resendAt == 0 {
			return
		}
		h.status.resendAt--
		w := h.workers.list[h.status.resendAt]
		// A status frame still wholly unsent says the same thing: the
		// re-send would only add to the backlog of a worker that is
		// not reading.
		if w.hasStatus && w.out.Written() <= w.tr.statusAt {
			continue
		}
		h.sendStatus(w)
	}
	if h.status.resendAt > 0 && h.loop.Post(h.resendStatus) != nil {
		h.status.resendAt = 0
	}
}

// onHealth is called by the Postgres side, on the loop goroutine, when the
// connection is lost (false) and when it is back with the whole union
// LISTENed again (true).
func (h *Hub) onHealth(healthy bool) {
	if h.up != nil && h.up.onHealth(h, healthy) {
		return
	}
	if h.stopping || healthy == h.healthy {
		return
	}
	h.healthy = healthy
	h.stats.healthy.Store(healthy)
	h.report()
	if !healthy {
		h.log.Warn("postgres connection lost; workers told healthy:false")
		// The reconnect needs descriptors: a limit lowered since the
		// last status tick is read now, and workers past it are shed
		// before the first attempt.
		h.rebudgetFDs()
		h.shedNewest()
		for w := range h.workers.all() {
			h.sendStatus(w)
		}
		return
	}
	first := !h.connected
	h.connected = true
	if first {
		h.log.Info("postgres connected", "channels", len(h.channels), "workers", h.workers.len())
	} else {
		h.stats.postgresReconnects.Add(1)
		h.log.Info("postgres connection back; resyncing", "channels", len(h.channels))
	}
	for w := range h.workers.all() {
		h.sendStatus(w)
	}
	// NOTIFYs during the gap are gone: acks held back while down go out
	// now that the union is LISTENed again, then every subscriber gets
	// one durable wake per channel so that durable readers re-read.
	for _, ch := range h.channels {
		switch {
		case ch.state == stateListening:
			h.ackWaiters(ch)
		case ch.unlistenFailed && len(ch.subs) == 0:
			ch.unlistenFailed = false
			h.unlisten(ch)
		}
	}
	if first {
		return // nobody was acked before: no NOTIFY can have been missed
	}
	for _, ch := range h.channels {
		if len(ch.subs) == 0 {
			continue
		}
		h.scratch = frame.AppendWake(h.scratch[:0], ch.q, nil, false)
		for w := range lastFirst(&ch.subs) {
			if h.enqueueDurable(w, ch.q, h.scratch) {
				ch.wakesDelivered++
			}
		}
	}
}

// onNotification is called by the Postgres side for every NOTIFY, on the
// loop goroutine. channel and payload are valid only during the call.
func (h *Hub) onNotification(channel, payload []byte) {
	h.stats.wakesReceived.Add(1)
	if h.stopping {
		return
	}
	ch := h.channels[string(channel)]
	if ch == nil {
		return // an UNLISTEN crossed this NOTIFY
	}
	ch.wakesReceived++
	if len(ch.subs) == 0 {
		return
	}
	if h.iter.notifs == 0 {
		h.iter.notifAt = h.loop.Now()
	}
	h.iter.notifs++
	// Encode once; every subscriber gets a copy of the same bytes.
	durable := len(payload) == 0
	h.scratch = frame.AppendWake(h.scratch[:0], ch.q, payload, !durable)
	// enqueue may evict the worker at hand (see lastFirst).
	for w := range lastFirst(&ch.subs) {
		if durable {
			if h.enqueueDurable(w, ch.q, h.scratch) {
				ch.wakesDelivered++
			}
		} else if h.enqueue(w, h.scratch) {
			ch.wakesDelivered++
		}
	}
}

// run runs the loop and closes done when it stops.
func (h *Hub) run() {
	err := h.loop.Run()
	h.err = err
	close(h.done)
}

// listenerConfig is the listener configuration Start's opener uses. New
// has parsed DatabaseURL into ConnConfig, so it cannot fail.
func (h *Hub) listenerConfig() pglisten.Config {
	return pglisten.Config{
		ConnConfig:          h.cfg.ConnConfig,
		HealthCheckInterval: h.cfg.HealthCheckInterval,
		HealthCheckTimeout:  h.cfg.HealthCheckTimeout,
		ReconnectMin:        h.cfg.ReconnectMin,
		ReconnectMax:        h.cfg.ReconnectMax,
		CommandTimeout:      h.cfg.CommandTimeout,
		OnNotification:      h.onNotification,
		OnHealth:            h.onHealth,
		OnNotDelivered:      h.onNotDelivered,
		Logger:              h.log,
	}
}

// writers write a large flush over several threads (fanout.go).
type writers struct {
	// fan is nil until the first such flush; pwork is its list of
	// workers, reused.
	fan   *fanout
	pwork []*worker
	load  loopLoad // whether the helpers may write
}

// iterNotifs counts the notifications of this iteration that were routed
// to a subscriber; notifAt is when the iteration began (the Postgres socket
// was readable by then). flush records their latency, once per iteration
// however many there were.
type iterNotifs struct {
	notifs  uint64
	notifAt time.Time
}

// statusRounds is the status timer: ticks counts them, and resendAt is the
// index below which workers still wait for this round's status re-send
// (resendStatus); 0 when no round is going.
type statusRounds struct {
	ticks    uint64
	timer    stopper
	resendAt int
}
