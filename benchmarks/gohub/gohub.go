// Package gohub is the goroutine-per-connection baseline: the listenhub wire
// protocol and semantics written the way a Go programmer writes a hub first.
//
// A net.UnixListener accepts workers; each worker gets a reader goroutine
// (bufio.Reader, length + encoding/json) and a writer goroutine draining a
// buffered channel into a bufio.Writer (everything queued is written before
// one Flush, so bursts are batched). One goroutine owns a pgx.Conn and sits
// in WaitForNotification; a subscription that needs a LISTEN or UNLISTEN
// interrupts the wait by cancelling its context. The routing table is a map
// under a sync.RWMutex: the notification goroutine fans out under the read
// lock, encoding each wake once and handing the same *frame to every
// subscriber's channel without blocking.
//
// Semantics match docs/design.md: a worker is routed before LISTEN is issued and
// acked only after Postgres confirmed it; refcounted LISTEN/UNLISTEN, a sub
// during an in-flight UNLISTEN waits for a fresh LISTEN; an ephemeral wake
// that finds the worker's channel full (HardQueueLimit frames) evicts it;
// durable wakes coalesce per (worker, Q) while unsent and beyond
// DurableQueueLimit are dropped, never evicting; status on connect, on
// change and every 5 intervals; after a lost connection, re-LISTEN, healthy
// and one durable wake per subscription.
//
// Deliberate simplifications (they do not change the measured paths): no
// peer-uid check, no byte cap besides the frame cap, no metrics endpoint.
package gohub

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/listenhub/listenhub/benchmarks/internal/wire"
)

// Config configures a Hub.
type Config struct {
	SocketPath        string
	DatabaseURL       string
	ApplicationName   string        // default "lhbench-gohub"
	HardQueueLimit    int           // default 1024 frames
	DurableQueueLimit int           // default 256 frames
	StatusInterval    time.Duration // default 1s
	Logger            *slog.Logger
}

// frame is one encoded frame; a fanned-out wake is encoded once and the same
// *frame goes to every subscriber (8 bytes per channel slot).
type frame struct {
	b       []byte
	durable string // the Q of a durable wake, for coalescing; "" otherwise
}

type channel struct {
	subs      map[*worker]struct{}
	listening bool      // Postgres confirmed LISTEN (and no UNLISTEN since)
	busy      bool      // a LISTEN/UNLISTEN for it is queued or in flight
	waiters   []*worker // subscribed, waiting for the ack
}

// Stats are counters, read with atomic loads.
type Stats struct {
	Accepts, Evictions, DurableCoalesced, DurableDropped, Wakes, Frames atomic.Uint64
}

// Hub is a running baseline hub.
type Hub struct {
	cfg Config
	log *slog.Logger
	ln  *net.UnixListener

	mu       sync.RWMutex
	channels map[string]*channel
	workers  map[*worker]struct{}
	healthy  bool

	cmds     chan string // channel names to reconcile with Postgres
	cancelMu sync.Mutex
	cancel   context.CancelFunc // interrupts the current WaitForNotification
	pg       *pgx.Conn          // handed to the Postgres goroutine by Serve

	Stats Stats
}

// New listens on cfg.SocketPath and connects to Postgres.
func New(ctx context.Context, cfg Config) (*Hub, error) {
	if cfg.ApplicationName == "" {
		cfg.ApplicationName = "lhbench-gohub"
	}
	if cfg.HardQueueLimit == 0 {
		cfg.HardQueueLimit = 1024
	}
	if cfg.DurableQueueLimit == 0 {
		cfg.DurableQueueLimit = 256
	}
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &Hub{
		cfg:      cfg,
		log:      cfg.Logger,
		channels: make(map[string]*channel),
		workers:  make(map[*worker]struct{}),
		cmds:     make(chan string, 4096),
	}
	pg, err := h.connect(ctx)
	if err != nil {
		return nil, err
	}
	h.pg = pg
	os.Remove(cfg.SocketPath)
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.SocketPath, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		pg.Close(ctx)
		return nil, fmt.Errorf("gohub: listen %s: %w", cfg.SocketPath, err)
	}
	h.ln = ln
	return h, nil
}

func (h *Hub) connect(ctx context.Context) (*pgx.Conn, error) {
	pc, err := pgx.ParseConfig(h.cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("gohub: database url: %w", err)
	}
	pc.RuntimeParams["application_name"] = h.cfg.ApplicationName
	c, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("gohub: connect: %w", err)
	}
	return c, nil
}

// Serve runs the hub until ctx is done.
func (h *Hub) Serve(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); h.pgLoop(ctx, h.pg) }()
	go func() { defer wg.Done(); h.statusLoop(ctx) }()
	go func() { <-ctx.Done(); h.ln.Close() }()
	for {
		c, err := h.ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				h.log.Warn("gohub: accept", "err", err)
				time.Sleep(10 * time.Millisecond)
				continue
			}
			h.log.Error("gohub: accept", "err", err)
			break
		}
		h.Stats.Accepts.Add(1)
		h.startWorker(c)
	}
	h.mu.Lock()
	for w := range h.workers {
		w.close("hub stopping")
	}
	h.mu.Unlock()
	wg.Wait()
	return nil
}

// Run connects, listens and serves until ctx is done.
func Run(ctx context.Context, cfg Config) error {
	h, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	return h.Serve(ctx)
}

type worker struct {
	h    *Hub
	conn *net.UnixConn
	out  chan *frame

	mu        sync.Mutex
	subs      map[string]struct{}
	durable   map[string]bool // Q → a durable wake is queued and unsent
	ndurable  int
	closeOnce sync.Once
	done      chan struct{}
}

func (h *Hub) startWorker(c *net.UnixConn) {
	w := &worker{
		h:       h,
		conn:    c,
		out:     make(chan *frame, h.cfg.HardQueueLimit),
		subs:    make(map[string]struct{}),
		durable: make(map[string]bool),
		done:    make(chan struct{}),
	}
	h.mu.Lock()
	h.workers[w] = struct{}{}
	healthy := h.healthy
	h.mu.Unlock()
	w.send(&frame{b: wire.AppendStatus(nil, healthy)})
	go w.writeLoop()
	go w.readLoop()
}

// send queues f without blocking; a full queue evicts the worker.
func (w *worker) send(f *frame) {
	select {
	case <-w.done:
		return
	default:
	}
	select {
	case w.out <- f:
	default:
		w.h.Stats.Evictions.Add(1)
		w.close(fmt.Sprintf("outbound queue full (%d frames)", cap(w.out)))
	}
}

// sendDurable queues a durable wake for q, coalescing with an unsent one.
func (w *worker) sendDurable(f *frame) {
	w.mu.Lock()
	if w.durable[f.durable] {
		w.mu.Unlock()
		w.h.Stats.DurableCoalesced.Add(1)
		return
	}
	if w.ndurable >= w.h.cfg.DurableQueueLimit {
		w.mu.Unlock()
		w.h.Stats.DurableDropped.Add(1)
		return
	}
	select {
	case w.out <- f:
		w.durable[f.durable] = true
		w.ndurable++
	default:
		w.h.Stats.DurableDropped.Add(1)
	}
	w.mu.Unlock()
}

func (w *worker) close(reason string) {
	w.closeOnce.Do(func() {
		close(w.done)
		w.conn.Close()
		if reason != "eof" && reason != "hub stopping" {
			w.h.log.Info("gohub: worker closed", "reason", reason)
		}
	})
}

func (w *worker) writeLoop() {
	bw := bufio.NewWriter(w.conn)
	take := func(f *frame) {
		if f.durable != "" {
			w.mu.Lock()
			delete(w.durable, f.durable)
			w.ndurable--
			w.mu.Unlock()
		}
		bw.Write(f.b)
	}
	for {
		select {
		case f := <-w.out:
			take(f)
			n := 1
		drain:
			for bw.Buffered() < 64<<10 {
				select {
				case f := <-w.out:
					take(f)
					n++
				default:
					break drain
				}
			}
			if err := bw.Flush(); err != nil {
				w.close("write: " + err.Error())
				return
			}
			w.h.Stats.Frames.Add(uint64(n))
		case <-w.done:
			return
		}
	}
}

func (w *worker) readLoop() {
	defer w.h.removeWorker(w)
	br := bufio.NewReader(w.conn)
	var hdr [4]byte
	body := make([]byte, 0, 64)
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			w.close(readReason(err))
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > wire.MaxLen {
			w.close(fmt.Sprintf("protocol error: frame length %d above 4 MiB", n))
			return
		}
		if cap(body) < int(n) {
			body = make([]byte, n)
		}
		body = body[:n]
		if _, err := io.ReadFull(br, body); err != nil {
			w.close(readReason(err))
			return
		}
		m, err := wire.Decode(body)
		if err != nil {
			w.close("protocol error: " + err.Error())
			return
		}
		switch m.T {
		case "sub", "unsub":
			if !m.HasQ {
				w.close("protocol error: " + m.T + " without a string q")
				return
			}
			if m.T == "sub" {
				w.h.subscribe(w, m.Q)
			} else {
				w.h.unsubscribe(w, m.Q)
			}
		default:
			w.h.log.Info("gohub: unknown frame type skipped", "t", m.T)
		}
	}
}

func readReason(err error) string {
	if err == io.EOF {
		return "eof"
	}
	return "read: " + err.Error()
}

func validChannel(ch string) error {
	if len(ch) > 63 {
		return fmt.Errorf("channel %q is longer than 63 bytes", ch)
	}
	if strings.IndexByte(ch, 0) >= 0 {
		return errors.New("channel contains NUL")
	}
	return nil
}

func (h *Hub) subscribe(w *worker, q string) {
	if err := validChannel(q); err != nil {
		w.send(&frame{b: wire.AppendNack(nil, q, err.Error())})
		return
	}
	w.mu.Lock()
	w.subs[q] = struct{}{}
	w.mu.Unlock()
	h.mu.Lock()
	ch := h.channels[q]
	if ch == nil {
		ch = &channel{subs: make(map[*worker]struct{})}
		h.channels[q] = ch
	}
	ch.subs[w] = struct{}{}
	if ch.listening && !ch.busy {
		h.mu.Unlock()
		w.send(&frame{b: wire.AppendAck(nil, q)})
		return
	}
	ch.waiters = append(ch.waiters, w)
	kick := !ch.busy
	ch.busy = true
	h.mu.Unlock()
	if kick {
		h.reconcile(q)
	}
}

func (h *Hub) unsubscribe(w *worker, q string) {
	w.mu.Lock()
	_, ok := w.subs[q]
	delete(w.subs, q)
	w.mu.Unlock()
	if !ok {
		return
	}
	h.mu.Lock()
	kick := h.dropSubLocked(w, q)
	h.mu.Unlock()
	if kick {
		h.reconcile(q)
	}
}

// dropSubLocked removes w from q; it reports whether a reconcile is needed.
func (h *Hub) dropSubLocked(w *worker, q string) bool {
	ch := h.channels[q]
	if ch == nil {
		return false
	}
	delete(ch.subs, w)
	if len(ch.subs) > 0 || ch.busy {
		return false
	}
	if !ch.listening {
		delete(h.channels, q)
		return false
	}
	ch.busy = true
	return true
}

func (h *Hub) removeWorker(w *worker) {
	w.mu.Lock()
	qs := make([]string, 0, len(w.subs))
	for q := range w.subs {
		qs = append(qs, q)
	}
	clear(w.subs)
	w.mu.Unlock()
	var kicks []string
	h.mu.Lock()
	delete(h.workers, w)
	for _, q := range qs {
		if h.dropSubLocked(w, q) {
			kicks = append(kicks, q)
		}
	}
	h.mu.Unlock()
	for _, q := range kicks {
		h.reconcile(q)
	}
}

// reconcile asks the Postgres goroutine to bring q's LISTEN state in line
// with its subscribers, interrupting a WaitForNotification in progress.
func (h *Hub) reconcile(q string) {
	h.cmds <- q
	h.cancelMu.Lock()
	if h.cancel != nil {
		h.cancel()
	}
	h.cancelMu.Unlock()
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// runCommand executes the LISTEN or UNLISTEN that q needs, if any, and
// answers its waiters. It runs on the Postgres goroutine only.
func (h *Hub) runCommand(ctx context.Context, conn *pgx.Conn, q string) error {
	for {
		h.mu.Lock()
		ch := h.channels[q]
		if ch == nil {
			h.mu.Unlock()
			return nil
		}
		want := len(ch.subs) > 0
		if want == ch.listening {
			waiters := ch.waiters
			ch.waiters = nil
			ch.busy = false
			if !want {
				delete(h.channels, q)
			}
			h.mu.Unlock()
			for _, w := range waiters {
				if w.subscribed(q) {
					w.send(&frame{b: wire.AppendAck(nil, q)})
				}
			}
			return nil
		}
		h.mu.Unlock()
		sql := "UNLISTEN " + quoteIdent(q)
		if want {
			sql = "LISTEN " + quoteIdent(q)
		}
		if _, err := conn.Exec(ctx, sql); err != nil {
			if conn.IsClosed() || ctx.Err() != nil {
				return err
			}
			// The server refused it (not a lost connection): nack waiters.
			h.mu.Lock()
			waiters := ch.waiters
			ch.waiters = nil
			ch.busy = false
			if !ch.listening {
				delete(h.channels, q)
			}
			h.mu.Unlock()
			for _, w := range waiters {
				w.send(&frame{b: wire.AppendNack(nil, q, err.Error())})
			}
			return nil
		}
		h.mu.Lock()
		ch.listening = want
		h.mu.Unlock()
	}
}

func (w *worker) subscribed(q string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.subs[q]
	return ok
}

func (h *Hub) setHealthy(v bool) {
	h.mu.Lock()
	if h.healthy == v {
		h.mu.Unlock()
		return
	}
	h.healthy = v
	ws := make([]*worker, 0, len(h.workers))
	for w := range h.workers {
		ws = append(ws, w)
	}
	h.mu.Unlock()
	f := &frame{b: wire.AppendStatus(nil, v)}
	for _, w := range ws {
		w.send(f)
	}
}

func (h *Hub) statusLoop(ctx context.Context) {
	t := time.NewTicker(5 * h.cfg.StatusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.mu.RLock()
			f := &frame{b: wire.AppendStatus(nil, h.healthy)}
			for w := range h.workers {
				w.send(f)
			}
			h.mu.RUnlock()
		}
	}
}

// pgLoop owns the Postgres connection: it runs queued LISTEN/UNLISTEN
// commands, otherwise waits for a notification and fans it out.
func (h *Hub) pgLoop(ctx context.Context, conn *pgx.Conn) {
	h.setHealthy(true)
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := h.serveConn(ctx, conn)
		conn.Close(context.Background())
		if ctx.Err() != nil {
			return
		}
		h.log.Warn("gohub: postgres connection lost", "err", err)
		h.setHealthy(false)
		for ctx.Err() == nil {
			time.Sleep(backoff)
			backoff = min(2*backoff, 5*time.Second)
			if conn, err = h.connect(ctx); err == nil {
				break
			}
		}
		if ctx.Err() != nil {
			return
		}
		backoff = 50 * time.Millisecond
		if err := h.resync(ctx, conn); err != nil {
			continue
		}
		h.setHealthy(true)
	}
}

// resync re-LISTENs the union and sends each subscriber one durable wake.
func (h *Hub) resync(ctx context.Context, conn *pgx.Conn) error {
	h.mu.RLock()
	var qs []string
	for q, ch := range h.channels {
		if ch.listening {
			qs = append(qs, q)
		}
	}
	h.mu.RUnlock()
	for _, q := range qs {
		if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(q)); err != nil {
			return err
		}
	}
	h.mu.RLock()
	for _, q := range qs {
		if ch := h.channels[q]; ch != nil {
			f := &frame{b: wire.AppendWake(nil, q, nil, false), durable: q}
			for w := range ch.subs {
				w.sendDurable(f)
			}
		}
	}
	h.mu.RUnlock()
	return nil
}

func (h *Hub) serveConn(ctx context.Context, conn *pgx.Conn) error {
	for {
		select {
		case q := <-h.cmds:
			if err := h.runCommand(ctx, conn, q); err != nil {
				return err
			}
			continue
		default:
		}
		wctx, cancel := context.WithCancel(ctx)
		h.cancelMu.Lock()
		h.cancel = cancel
		h.cancelMu.Unlock()
		if len(h.cmds) > 0 { // queued before h.cancel was set
			cancel()
		}
		n, err := conn.WaitForNotification(wctx)
		h.cancelMu.Lock()
		h.cancel = nil
		h.cancelMu.Unlock()
		cancel()
		if n != nil {
			h.fanout(n.Channel, n.Payload)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if wctx.Err() != nil && !conn.IsClosed() {
				continue // interrupted for a command
			}
			return err
		}
	}
}

func (h *Hub) fanout(channel, payload string) {
	h.Stats.Wakes.Add(1)
	durable := payload == ""
	f := &frame{b: wire.AppendWake(nil, channel, []byte(payload), !durable)}
	if durable {
		f.durable = channel
	}
	h.mu.RLock()
	if ch := h.channels[channel]; ch != nil {
		for w := range ch.subs {
			if durable {
				w.sendDurable(f)
			} else {
				w.send(f)
			}
		}
	}
	h.mu.RUnlock()
}
