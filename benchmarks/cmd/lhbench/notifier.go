package main

// The notifier: NOTIFYs carrying "RUN:SEQ:SENDNS[:padding]", each its own
// transaction (autocommit), sent with pg_notify through a prepared statement.

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

type notifier struct {
	url   string
	conns []*pgx.Conn
}

func newNotifier(ctx context.Context, url string, n int) (*notifier, error) {
	nt := &notifier{url: url}
	if err := nt.ensure(ctx, n); err != nil {
		nt.close()
		return nil, err
	}
	return nt, nil
}

func (nt *notifier) ensure(ctx context.Context, n int) error {
	for len(nt.conns) < n {
		cfg, err := pgx.ParseConfig(nt.url)
		if err != nil {
			return err
		}
		cfg.RuntimeParams["application_name"] = "lhbench-notifier"
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("notifier: %w", err)
		}
		nt.conns = append(nt.conns, c)
	}
	return nil
}

func (nt *notifier) close() {
	for _, c := range nt.conns {
		c.Close(context.Background())
	}
	nt.conns = nil
}

func payload(buf []byte, run int64, seq int, pad string) []byte {
	buf = strconv.AppendInt(buf[:0], run, 10)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, int64(seq), 10)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
	if pad != "" {
		buf = append(buf, ':')
		buf = append(buf, pad...)
	}
	return buf
}

// sendResult is what a notifier run achieved.
type sendResult struct {
	Sent    int           `json:"sent"`
	Errors  int           `json:"errors"`
	Elapsed time.Duration `json:"elapsed_ns"`
	Conns   int           `json:"conns"`
	Start   int64         `json:"start"` // unix ns of the first send
}

func (r sendResult) rate() float64 { return float64(r.Sent) / r.Elapsed.Seconds() }

const notifySQL = "select pg_notify($1, $2)"

// paced sends rate NOTIFYs per second for dur on conns connections (each
// takes every conns-th slot of one global schedule). A sender behind
// schedule sends at once, without skipping: a system that cannot keep up
// shows it as a rate below target and as latency.
func (nt *notifier) paced(ctx context.Context, channel string, run int64, rate float64, dur time.Duration, conns, padBytes int) (sendResult, error) {
	return nt.pace(ctx, channel, run, rate, int(rate*dur.Seconds()), nil, conns, padBytes)
}

// pacedUntil sends rate NOTIFYs per second on one connection until stop is set.
func (nt *notifier) pacedUntil(ctx context.Context, channel string, run int64, rate float64, stop *atomic.Bool) (sendResult, error) {
	return nt.pace(ctx, channel, run, rate, math.MaxInt, stop, 1, 0)
}

func (nt *notifier) pace(ctx context.Context, channel string, run int64, rate float64, total int, stop *atomic.Bool, conns, padBytes int) (sendResult, error) {
	if err := nt.ensure(ctx, conns); err != nil {
		return sendResult{}, err
	}
	interval := time.Duration(float64(time.Second) / rate)
	pad := strings.Repeat("x", padBytes)
	start := time.Now().Add(2 * time.Millisecond)
	r := nt.onEach(ctx, conns, run, start, func(g int, notify func(channel string, seq int, pad string)) {
		for i := g; i < total; i += conns {
			if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
				time.Sleep(d)
			}
			if ctx.Err() != nil || (stop != nil && stop.Load()) {
				return
			}
			notify(channel, i, pad)
		}
	})
	return r, ctx.Err()
}

// onEach runs send on each of the first conns connections at once, g being
// the connection's index, and waits for them all. send calls notify for
// each NOTIFY (payload seq of the run, padded with pad); the result counts
// them from start.
func (nt *notifier) onEach(ctx context.Context, conns int, run int64, start time.Time, send func(g int, notify func(channel string, seq int, pad string))) sendResult {
	var sent, errs atomic.Int64
	var wg sync.WaitGroup
	for g := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := nt.conns[g]
			var buf []byte
			send(g, func(channel string, seq int, pad string) {
				buf = payload(buf, run, seq, pad)
				if _, err := c.Exec(ctx, notifySQL, channel, string(buf)); err != nil {
					errs.Add(1)
					return
				}
				sent.Add(1)
			})
		}()
	}
	wg.Wait()
	return sendResult{Sent: int(sent.Load()), Errors: int(errs.Load()), Elapsed: time.Since(start), Conns: conns, Start: start.UnixNano()}
}

// flood sends back to back on one connection for dur.
func (nt *notifier) flood(ctx context.Context, channel string, run int64, dur time.Duration) (sendResult, error) {
	if err := nt.ensure(ctx, 1); err != nil {
		return sendResult{}, err
	}
	c := nt.conns[0]
	var buf []byte
	start := time.Now()
	end := start.Add(dur)
	r := sendResult{Conns: 1, Start: start.UnixNano()}
	for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
		buf = payload(buf, run, i, "")
		if _, err := c.Exec(ctx, notifySQL, channel, string(buf)); err != nil {
			r.Errors++
			continue
		}
		r.Sent++
	}
	r.Elapsed = time.Since(start)
	return r, ctx.Err()
}

// floodMany sends back to back on conns connections at once for dur,
// round-robin over the channels prefix+0 … prefix+(n-1) (connection g takes
// every conns-th name from g): one connection's round trips would cap the
// rate below what a listening backend can take.
func (nt *notifier) floodMany(ctx context.Context, prefix string, n, conns int, run int64, dur time.Duration) (sendResult, error) {
	if err := nt.ensure(ctx, conns); err != nil {
		return sendResult{}, err
	}
	names := make([]string, n)
	for i := range names {
		names[i] = prefix + strconv.Itoa(i)
	}
	start := time.Now()
	end := start.Add(dur)
	var seq atomic.Int64
	r := nt.onEach(ctx, conns, run, start, func(g int, notify func(channel string, seq int, pad string)) {
		for i := g; time.Now().Before(end) && ctx.Err() == nil; i += conns {
			notify(names[i%n], int(seq.Add(1)), "")
		}
	})
	return r, ctx.Err()
}
