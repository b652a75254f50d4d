package main

// The worker process: `lhbench worker --mode socket|direct ...`.
//
// It opens --conns subscriptions (Unix-socket connections to a hub speaking
// the wire protocol, or its own pgx LISTEN connections), prints
// {"ready":K} once every one is acknowledged, then takes line commands on
// stdin and answers each with one JSON line on stdout:
//
//	run ID           reset the counters; from now on count payloads of run ID → {"ok":true}
//	report S MS      wait up to MS ms until every live conn has S wakes of the run, then → {"report":…}
//	reconnect        re-open every conn the server closed → {"ok":true,"reconnected":K}
//	quit             exit
//
// Benchmark payloads are "RUN:SEQ:SENDNS[:padding]"; SENDNS is the
// notifier's wall clock just before its NOTIFY, so receipt − SENDNS is the
// end-to-end latency (one machine, one clock).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/listenhub/listenhub/benchmarks/internal/hist"
	"github.com/listenhub/listenhub/benchmarks/internal/wire"
)

// report is a worker's answer to `report`.
type report struct {
	Conns       int         `json:"conns"`
	Live        int         `json:"live"`
	EOF         int         `json:"eof"` // conns closed by the server (evicted) or lost
	Recv        uint64      `json:"recv"`
	LostLive    uint64      `json:"lost_live"`    // wakes of the run missing on conns still open
	LostEvicted uint64      `json:"lost_evicted"` // missing on conns the server closed
	Stale       uint64      `json:"stale"`        // payloads of other runs
	Durable     uint64      `json:"durable"`      // wakes with p null
	First       int64       `json:"first"`        // first and last receipt of the run (unix ns)
	Last        int64       `json:"last"`
	MinRecv     uint64      `json:"min_recv"`
	Hist        hist.Sparse `json:"hist"`
	Error       string      `json:"error,omitempty"`
}

// addReceipts adds what one conn (or one report) received into r: recv
// wakes of the run, stale and durable ones, the least recv of a conn, and
// the first and last receipt.
func (r *report) addReceipts(recv, stale, durable, minRecv uint64, first, last int64) {
	r.Recv += recv
	r.Stale += stale
	r.Durable += durable
	r.MinRecv = min(r.MinRecv, minRecv)
	if first != 0 && (r.First == 0 || first < r.First) {
		r.First = first
	}
	r.Last = max(r.Last, last)
}

type connStats struct {
	mu      sync.Mutex
	recv    uint64
	stale   uint64
	durable uint64
	first   int64
	last    int64
	eof     bool
	h       hist.H
}

var currentRun atomic.Int64

// parsePayload reads RUN and SENDNS out of "RUN:SEQ:SENDNS[:pad]".
func parsePayload(p []byte) (run, send int64, ok bool) {
	var f [3]int64
	i := 0
	for k := range f {
		start := i
		for i < len(p) && p[i] >= '0' && p[i] <= '9' {
			f[k] = f[k]*10 + int64(p[i]-'0')
			i++
		}
		if i == start || (i < len(p) && p[i] != ':') || (i == len(p) && k < 2) {
			return 0, 0, false
		}
		i++
	}
	return f[0], f[2], true
}

func (s *connStats) wake(p []byte, hasP bool, now int64) {
	s.mu.Lock()
	if !hasP {
		s.durable++
		s.mu.Unlock()
		return
	}
	run, send, ok := parsePayload(p)
	if !ok || run != currentRun.Load() {
		s.stale++
		s.mu.Unlock()
		return
	}
	s.recv++
	if s.first == 0 {
		s.first = now
	}
	s.last = now
	s.h.Record(now - send)
	s.mu.Unlock()
}

func (s *connStats) markEOF() {
	s.mu.Lock()
	s.eof = true
	s.mu.Unlock()
}

func (s *connStats) reset() {
	s.mu.Lock()
	s.recv, s.stale, s.durable, s.first, s.last = 0, 0, 0, 0, 0
	s.h.Reset()
	s.mu.Unlock()
}

func workerMain(args []string) error {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	mode := fs.String("mode", "socket", "socket (a hub on --socket) or direct (own pgx LISTEN)")
	socket := fs.String("socket", "", "hub socket path")
	dbURL := fs.String("database-url", "", "database URL for direct mode")
	channel := fs.String("channel", "bench", "subscription name")
	nconns := fs.Int("conns", 1, "subscriptions held by this process")
	parallel := fs.Int("parallel", 32, "connections opened at once")
	nchannels := fs.Int("channels", 1, "with --conns 1: subscribe this many channels (--channel + 0, 1, …) on the one connection")
	fs.Parse(args)

	out := json.NewEncoder(os.Stdout)
	var outMu sync.Mutex
	emit := func(v any) {
		outMu.Lock()
		out.Encode(v)
		outMu.Unlock()
	}
	stats := make([]*connStats, *nconns)
	for i := range stats {
		stats[i] = &connStats{}
	}
	ctx := context.Background()
	var closers []func()
	var closersMu sync.Mutex
	// One process holding many sockets reads them all from one epoll
	// loop on one thread, not a goroutine each: the 1×N layout is there to
	// isolate the hub's cost, so its receiver must be cheap.
	var pl *poller
	if *mode != "direct" && *nconns > 1 {
		var err error
		if pl, err = newPoller(); err != nil {
			return err
		}
	}
	open := func(s *connStats) (func(), error) {
		if *nchannels > 1 {
			names := make([]string, *nchannels)
			for i := range names {
				names[i] = *channel + strconv.Itoa(i)
			}
			if *mode == "direct" {
				return openDirectMany(ctx, *dbURL, names, s)
			}
			return openSocketMany(*socket, names, s)
		}
		if *mode == "direct" {
			return openDirect(ctx, *dbURL, *channel, s)
		}
		if pl != nil {
			c, r, err := handshake(*socket, *channel)
			if err != nil {
				return nil, err
			}
			return pl.add(c, r, s)
		}
		return openSocket(*socket, *channel, s)
	}
	sem := make(chan struct{}, *parallel)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for i := range *nconns {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			closer, err := open(stats[i])
			if err != nil {
				firstErr.CompareAndSwap(nil, fmt.Errorf("conn %d: %w", i, err))
				return
			}
			closersMu.Lock()
			closers = append(closers, closer)
			closersMu.Unlock()
		}()
		if firstErr.Load() != nil {
			break
		}
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		emit(map[string]string{"error": err.Error()})
		return err
	}
	emit(map[string]int{"ready": *nconns})

	return serveCommands(func(f []string) (bool, error) {
		switch f[0] {
		case "run":
			id, _ := strconv.ParseInt(f[1], 10, 64)
			currentRun.Store(id)
			for _, s := range stats {
				s.reset()
			}
			emit(map[string]bool{"ok": true})
		case "report":
			want, _ := strconv.ParseUint(f[1], 10, 64)
			ms, _ := strconv.Atoi(f[2])
			emit(map[string]report{"report": collect(stats, want, time.Duration(ms)*time.Millisecond)})
		case "reconnect":
			// Re-open the conns the server closed (evicted), so that a
			// fleet survives a failed saturation step without a restart.
			n := 0
			var err error
			for _, s := range stats {
				s.mu.Lock()
				eof := s.eof
				s.eof = false
				s.mu.Unlock()
				if !eof {
					continue
				}
				var closer func()
				if closer, err = open(s); err != nil {
					s.markEOF()
					break
				}
				closers = append(closers, closer)
				n++
			}
			if err != nil {
				emit(map[string]any{"ok": false, "error": err.Error()})
			} else {
				emit(map[string]any{"ok": true, "reconnected": n})
			}
		case "quit":
			for _, c := range closers {
				c()
			}
			return true, nil
		}
		return false, nil
	})
}

// serveCommands reads the harness's line commands from stdin and hands
// each, split into fields (blank lines skipped), to handle until handle
// says to stop or fails, or stdin closes (the harness is gone).
func serveCommands(handle func(f []string) (stop bool, err error)) error {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		if stop, err := handle(f); stop || err != nil {
			return err
		}
	}
	return nil
}

// collect waits until every live conn has want wakes of the run (or the
// wait runs out), then sums the conns' stats.
func collect(stats []*connStats, want uint64, wait time.Duration) report {
	deadline := time.Now().Add(wait)
	for {
		done := true
		for _, s := range stats {
			s.mu.Lock()
			if !s.eof && s.recv < want {
				done = false
			}
			s.mu.Unlock()
			if !done {
				break
			}
		}
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := report{Conns: len(stats), MinRecv: ^uint64(0)}
	var h hist.H
	for _, s := range stats {
		s.mu.Lock()
		if s.eof {
			r.EOF++
			if want > s.recv {
				r.LostEvicted += want - s.recv
			}
		} else {
			r.Live++
			if want > s.recv {
				r.LostLive += want - s.recv
			}
		}
		r.addReceipts(s.recv, s.stale, s.durable, s.recv, s.first, s.last)
		h.Merge(&s.h)
		s.mu.Unlock()
	}
	r.Hist = h.Sparse()
	return r
}

// dialUnix connects, retrying while the hub's accept backlog is full
// (a non-blocking AF_UNIX connect fails with EAGAIN then) or the socket
// is not there yet.
func dialUnix(path string, timeout time.Duration) (*net.UnixConn, error) {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) || !(errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)) {
			return nil, err
		}
		time.Sleep(time.Millisecond)
	}
}

// handshake connects to the hub, subscribes and waits for the ack.
func handshake(path, channel string) (*net.UnixConn, *wire.Reader, error) {
	c, err := dialUnix(path, 30*time.Second)
	if err != nil {
		return nil, nil, err
	}
	if _, err := c.Write(wire.AppendSub(nil, channel)); err != nil {
		c.Close()
		return nil, nil, err
	}
	r := wire.NewReader(c, 64<<10)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		body, err := r.Next()
		if err != nil {
			c.Close()
			return nil, nil, fmt.Errorf("waiting for ack: %w", err)
		}
		if _, _, ok := wire.FastWake(body); ok {
			continue // over-delivery before the ack is allowed
		}
		m, err := wire.Decode(body)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		if m.T == "nack" {
			c.Close()
			return nil, nil, fmt.Errorf("nack: %s", m.Error)
		}
		if m.T == "ack" {
			break
		}
	}
	c.SetReadDeadline(time.Time{})
	return c, r, nil
}

// handleFrame records one frame's body received at now; false means a
// protocol error (the conn is dropped).
func handleFrame(s *connStats, body []byte, now int64) bool {
	p, hasP, ok := wire.FastWake(body)
	if !ok {
		m, err := wire.Decode(body)
		if err != nil {
			return false
		}
		if m.T != "wake" {
			return true
		}
		p, hasP = []byte(m.P), m.HasP
	}
	s.wake(p, hasP, now)
	return true
}

// openSocket subscribes and reads frames in a goroutine until EOF (the
// layout with one subscription per process).
// readFrames counts every frame of c into s until EOF, an error, or a frame
// handleFrame rejects (then it closes c).
func readFrames(c *net.UnixConn, r *wire.Reader, s *connStats) {
	for {
		body, err := r.Next()
		if err != nil {
			s.markEOF()
			return
		}
		if !handleFrame(s, body, time.Now().UnixNano()) {
			s.markEOF()
			c.Close()
			return
		}
	}
}

func openSocket(path, channel string, s *connStats) (func(), error) {
	c, r, err := handshake(path, channel)
	if err != nil {
		return nil, err
	}
	go readFrames(c, r, s)
	return func() { c.Close() }, nil
}

const directAppName = "lhbench-direct"

// openDirect is today's deployment: the worker's own LISTEN connection.
func openDirect(ctx context.Context, url, channel string, s *connStats) (func(), error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = directAppName
	var conn *pgx.Conn
	for attempt := 0; ; attempt++ {
		conn, err = pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			break
		}
		if attempt > 50 { // postgres forks backends one at a time; a storm may be refused briefly
			return nil, err
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	return s.readNotifications(conn), nil
}

// openSocketMany subscribes names on one hub connection (the subs
// pipelined, then every ack awaited) and reads frames in a goroutine.
func openSocketMany(path string, names []string, s *connStats) (func(), error) {
	c, err := dialUnix(path, 30*time.Second)
	if err != nil {
		return nil, err
	}
	werr := make(chan error, 1)
	go func() {
		var buf []byte
		for i, q := range names {
			buf = wire.AppendSub(buf, q)
			if len(buf) > 32<<10 || i == len(names)-1 {
				if _, err := c.Write(buf); err != nil {
					werr <- err
					return
				}
				buf = buf[:0]
			}
		}
		werr <- nil
	}()
	r := wire.NewReader(c, 64<<10)
	c.SetReadDeadline(time.Now().Add(5 * time.Minute))
	for acks := 0; acks < len(names); {
		body, err := r.Next()
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("waiting for %d acks (%d so far): %w", len(names), acks, err)
		}
		if _, _, ok := wire.FastWake(body); ok {
			continue
		}
		m, err := wire.Decode(body)
		if err != nil {
			c.Close()
			return nil, err
		}
		switch m.T {
		case "nack":
			c.Close()
			return nil, fmt.Errorf("nack for %s: %s", m.Q, m.Error)
		case "ack":
			acks++
		}
	}
	if err := <-werr; err != nil {
		c.Close()
		return nil, err
	}
	c.SetReadDeadline(time.Time{})
	go readFrames(c, r, s)
	return func() { c.Close() }, nil
}

// openDirectMany LISTENs names on one pgx connection, 1,000 per query.
func openDirectMany(ctx context.Context, url string, names []string, s *connStats) (func(), error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = directAppName
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var sb strings.Builder
	for i, q := range names {
		sb.WriteString("LISTEN ")
		sb.WriteString(pgx.Identifier{q}.Sanitize())
		sb.WriteString(";")
		if (i+1)%1000 == 0 || i == len(names)-1 {
			if _, err := conn.Exec(ctx, sb.String()); err != nil {
				conn.Close(ctx)
				return nil, err
			}
			sb.Reset()
		}
	}
	return s.readNotifications(conn), nil
}

// readNotifications hands conn's notifications to s on a goroutine of
// their own until conn fails; the returned func closes conn.
func (s *connStats) readNotifications(conn *pgx.Conn) func() {
	go func() {
		for {
			n, err := conn.WaitForNotification(context.Background())
			if err != nil {
				s.markEOF()
				return
			}
			s.wake([]byte(n.Payload), n.Payload != "", time.Now().UnixNano())
		}
	}()
	return func() { conn.Close(context.Background()) }
}
