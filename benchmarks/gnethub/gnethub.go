// Package gnethub is the event-loop baseline: the listenhub fanout on
// panjf2000/gnet v2, to compare event loops.
//
// One gnet event loop (NumEventLoop 1, like the hub's single loop) owns every
// worker connection and the routing table. A goroutine owns a pgx.Conn in
// WaitForNotification (as in gohub) and hands each notification to the loop
// with EventLoop.Execute; on the loop the wake is encoded once and written to
// each subscriber with Conn.Write, which writes at once and keeps only what
// the kernel refused in gnet's elastic outbound buffer. LISTEN and UNLISTEN
// are queued to the Postgres goroutine; their results come back through
// Execute, so acks are sent on the loop after Postgres confirmed the LISTEN.
//
// Differences from the hub, all due to gnet's API: gnet does not report
// when buffered bytes are written, so the hard limit is a byte cap
// (HardQueueLimit frames of the frame being sent) and durable wakes are not
// coalesced (they are dropped beyond DurableQueueLimit frames' worth of
// pending bytes); every Conn.Write is its own write(2) — no end-of-iteration
// flush; no peer-uid check, no periodic status.
package gnethub

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/listenhub/listenhub/benchmarks/internal/wire"
	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/logging"
)

// Config configures the gnet hub.
type Config struct {
	SocketPath        string
	DatabaseURL       string
	ApplicationName   string // default "lhbench-gnet"
	HardQueueLimit    int    // default 1024 frames
	DurableQueueLimit int    // default 256 frames
	Logger            *slog.Logger
}

type channel struct {
	subs      map[*worker]struct{}
	listening bool
	busy      bool
	waiters   []*worker
}

type worker struct {
	c      gnet.Conn
	subs   map[string]struct{}
	closed bool
}

type hub struct {
	gnet.BuiltinEventEngine
	cfg  Config
	log  *slog.Logger
	eng  gnet.Engine
	loop atomic.Value // gnet.EventLoop, from the first OnOpen

	// Loop-owned.
	channels map[string]*channel
	healthy  bool

	// The Postgres goroutine's command queue.
	mu     sync.Mutex
	cmds   []string
	kick   chan struct{}
	cancel context.CancelFunc
	umask  int
}

// Run serves until ctx is done.
func Run(ctx context.Context, cfg Config) error {
	if cfg.ApplicationName == "" {
		cfg.ApplicationName = "lhbench-gnet"
	}
	if cfg.HardQueueLimit == 0 {
		cfg.HardQueueLimit = 1024
	}
	if cfg.DurableQueueLimit == 0 {
		cfg.DurableQueueLimit = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &hub{cfg: cfg, log: cfg.Logger, channels: make(map[string]*channel), kick: make(chan struct{}, 1), healthy: true}
	pc, err := pgx.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return err
	}
	pc.RuntimeParams["application_name"] = cfg.ApplicationName
	conn, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("gnethub: connect: %w", err)
	}
	defer conn.Close(context.Background())
	os.Remove(cfg.SocketPath)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h.eng.Stop(sctx)
	}()
	pgDone := make(chan struct{})
	go func() { defer close(pgDone); h.pgLoop(ctx, conn) }()
	h.umask = syscall.Umask(0o177)
	err = gnet.Run(h, "unix://"+cfg.SocketPath,
		gnet.WithMulticore(false), gnet.WithNumEventLoop(1), gnet.WithLockOSThread(true),
		gnet.WithLogLevel(logging.ErrorLevel))
	h.kickPG()
	<-pgDone
	os.Remove(cfg.SocketPath)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (h *hub) OnBoot(eng gnet.Engine) gnet.Action {
	syscall.Umask(h.umask)
	h.eng = eng
	return gnet.None
}

func (h *hub) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if h.loop.Load() == nil {
		h.loop.Store(c.EventLoop())
	}
	c.SetContext(&worker{c: c, subs: make(map[string]struct{})})
	return wire.AppendStatus(nil, h.healthy), gnet.None
}

func (h *hub) OnClose(c gnet.Conn, _ error) gnet.Action {
	w, _ := c.Context().(*worker)
	if w == nil {
		return gnet.None
	}
	w.closed = true
	for q := range w.subs {
		h.dropSub(w, q)
	}
	return gnet.None
}

func (h *hub) OnTraffic(c gnet.Conn) gnet.Action {
	w := c.Context().(*worker)
	for {
		hdr, err := c.Peek(4)
		if err != nil || len(hdr) < 4 {
			return gnet.None
		}
		n := int(binary.BigEndian.Uint32(hdr))
		if n > wire.MaxLen {
			h.log.Info("gnethub: protocol error: frame above 4 MiB")
			return gnet.Close
		}
		if c.InboundBuffered() < 4+n {
			return gnet.None
		}
		buf, err := c.Peek(4 + n)
		if err != nil {
			return gnet.None
		}
		m, err := wire.Decode(buf[4:])
		c.Discard(4 + n)
		if err != nil {
			h.log.Info("gnethub: protocol error", "err", err)
			return gnet.Close
		}
		switch m.T {
		case "sub", "unsub":
			if !m.HasQ {
				return gnet.Close
			}
			if m.T == "sub" {
				h.subscribe(w, m.Q)
			} else if _, ok := w.subs[m.Q]; ok {
				delete(w.subs, m.Q)
				h.dropSub(w, m.Q)
			}
		}
	}
}

// send writes f to w now (gnet buffers what the kernel refuses); past the
// cap the worker is evicted.
func (h *hub) send(w *worker, f []byte) {
	if w.closed {
		return
	}
	if w.c.OutboundBuffered()+len(f) > h.cfg.HardQueueLimit*len(f) {
		w.closed = true
		w.c.EventLoop().Close(w.c)
		return
	}
	w.c.Write(f)
}

func (h *hub) subscribe(w *worker, q string) {
	if len(q) > 63 || strings.IndexByte(q, 0) >= 0 {
		h.send(w, wire.AppendNack(nil, q, "invalid channel name"))
		return
	}
	w.subs[q] = struct{}{}
	ch := h.channels[q]
	if ch == nil {
		ch = &channel{subs: make(map[*worker]struct{})}
		h.channels[q] = ch
	}
	ch.subs[w] = struct{}{}
	if ch.listening && !ch.busy {
		h.send(w, wire.AppendAck(nil, q))
		return
	}
	ch.waiters = append(ch.waiters, w)
	if !ch.busy {
		ch.busy = true
		h.queue(q)
	}
}

func (h *hub) dropSub(w *worker, q string) {
	ch := h.channels[q]
	if ch == nil {
		return
	}
	delete(ch.subs, w)
	if len(ch.subs) > 0 || ch.busy {
		return
	}
	if !ch.listening {
		delete(h.channels, q)
		return
	}
	ch.busy = true
	h.queue(q)
}

func (h *hub) queue(q string) {
	h.mu.Lock()
	h.cmds = append(h.cmds, q)
	h.mu.Unlock()
	h.kickPG()
}

func (h *hub) kickPG() {
	h.mu.Lock()
	if h.cancel != nil {
		h.cancel()
	}
	h.mu.Unlock()
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// exec runs f on the event loop; false if the loop is not there (yet, or
// any more).
func (h *hub) exec(f func()) bool {
	l, _ := h.loop.Load().(gnet.EventLoop)
	if l == nil {
		return false
	}
	return l.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error { f(); return nil })) == nil
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// runCommand brings q's LISTEN state in line with its subscribers. It runs
// on the Postgres goroutine; the routing table is read and updated on the
// loop through exec.
func (h *hub) runCommand(ctx context.Context, conn *pgx.Conn, q string) error {
	for {
		type st struct{ want, listening, gone bool }
		res := make(chan st, 1)
		if !h.exec(func() {
			ch := h.channels[q]
			if ch == nil {
				res <- st{gone: true}
				return
			}
			want := len(ch.subs) > 0
			if want == ch.listening {
				ch.busy = false
				for _, w := range ch.waiters {
					if _, ok := w.subs[q]; ok {
						h.send(w, wire.AppendAck(nil, q))
					}
				}
				ch.waiters = nil
				if !want {
					delete(h.channels, q)
				}
				res <- st{gone: true}
				return
			}
			res <- st{want: want, listening: ch.listening}
		}) {
			return nil
		}
		var s st
		select {
		case s = <-res:
		case <-ctx.Done():
			return ctx.Err()
		}
		if s.gone {
			return nil
		}
		sql := "UNLISTEN " + quoteIdent(q)
		if s.want {
			sql = "LISTEN " + quoteIdent(q)
		}
		_, err := conn.Exec(ctx, sql)
		if err != nil && (conn.IsClosed() || ctx.Err() != nil) {
			return err
		}
		done := make(chan struct{})
		if !h.exec(func() {
			defer close(done)
			ch := h.channels[q]
			if ch == nil {
				return
			}
			if err != nil {
				for _, w := range ch.waiters {
					h.send(w, wire.AppendNack(nil, q, err.Error()))
				}
				ch.waiters, ch.busy = nil, false
				if !ch.listening {
					delete(h.channels, q)
				}
				return
			}
			ch.listening = s.want
		}) {
			return nil
		}
		<-done
		if err != nil {
			return nil
		}
	}
}

func (h *hub) pgLoop(ctx context.Context, conn *pgx.Conn) {
	for ctx.Err() == nil {
		h.mu.Lock()
		cmds := h.cmds
		h.cmds = nil
		h.mu.Unlock()
		for _, q := range cmds {
			if err := h.runCommand(ctx, conn, q); err != nil {
				if ctx.Err() == nil {
					h.log.Error("gnethub: postgres", "err", err)
				}
				return
			}
		}
		if len(cmds) > 0 {
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		h.mu.Lock()
		h.cancel = cancel
		pending := len(h.cmds) > 0
		h.mu.Unlock()
		if pending {
			cancel()
		}
		n, err := conn.WaitForNotification(wctx)
		h.mu.Lock()
		h.cancel = nil
		h.mu.Unlock()
		cancel()
		if n != nil {
			ch, p := n.Channel, n.Payload
			h.exec(func() { h.fanout(ch, p) })
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if wctx.Err() != nil && !conn.IsClosed() {
				continue
			}
			if errors.Is(err, context.Canceled) {
				continue
			}
			h.log.Error("gnethub: postgres connection lost (no reconnect in this baseline)", "err", err)
			return
		}
	}
}

func (h *hub) fanout(channel, payload string) {
	ch := h.channels[channel]
	if ch == nil {
		return
	}
	durable := payload == ""
	f := wire.AppendWake(nil, channel, []byte(payload), !durable)
	for w := range ch.subs {
		if durable {
			if w.c.OutboundBuffered()+len(f) > h.cfg.DurableQueueLimit*len(f) {
				continue
			}
			w.c.Write(f)
			continue
		}
		h.send(w, f)
	}
}
