package main

// The writers scenario's worker: `lhbench wakeworker --socket PATH
// --database-url URL --queues N --index I --workers K`.
//
// It subscribes, on one hub connection, to every queue's channel
// (pgmq.q_<name>.INSERT, what a pgmq consumer LISTENs to) and owns the
// queues whose number is I modulo K: on each wake of an owned queue it
// re-reads that queue on its own database connection (the rows above the
// highest msg_id below which it has seen every row), as a consumer does
// before it reads messages. Re-reads are coalesced: while one is pending for
// a queue, more wakes of that queue do not queue another (the pending one
// starts after them). Wakes of the queues it does not own are counted only.
//
// stdin commands, one JSON line answered each:
//
//	run ID    forget everything (the tables were truncated) → {"ok":true}
//	report    → {"wakes":…}: every owned queue's wake arrival times and, for each
//	          msg_id a re-read saw, when that re-read returned
//	quit      exit

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/listenhub/listenhub/benchmarks/internal/wire"
)

// queueName is the name of queue i (its table is pgmq.q_<name>).
func queueName(i int) string { return fmt.Sprintf("bench%02d", i) }

// queueChannel is the channel pgmq's trigger (and the relay's default
// template) NOTIFYs for an insert into queue i.
func queueChannel(i int) string { return "pgmq.q_" + queueName(i) + ".INSERT" }

// wakeReport is a wakeworker's answer to `report`. Times are nanoseconds
// since Base (unix ns), to keep the line short.
type wakeReport struct {
	Base  int64        `json:"base"`
	Total uint64       `json:"total"` // wakes received, every channel
	Reads int          `json:"reads"` // re-reads done
	Queue []queueWakes `json:"queues"`
	Error string       `json:"error,omitempty"`
}

type queueWakes struct {
	Q     int        `json:"q"`
	Wakes []int64    `json:"wakes"` // arrival times
	Seen  [][2]int64 `json:"seen"`  // msg_id, when the re-read that first saw it returned
}

// ownedQueue is the state of one owned queue.
type ownedQueue struct {
	q       int
	pending bool               // a re-read is queued and not started
	low     int64              // every msg_id ≤ low has been seen
	above   map[int64]struct{} // seen ids above low
	wakes   []int64
	seen    [][2]int64
}

type wakeWorker struct {
	mu    sync.Mutex
	gen   int64 // bumped by run: a re-read of an older generation is ignored
	base  int64
	total uint64
	reads int
	err   string
	owned map[int]*ownedQueue
	work  chan *ownedQueue
	// noReread: wakes are recorded, queues never re-read.
	noReread bool
}

func wakeWorkerMain(args []string) error {
	fs := flag.NewFlagSet("wakeworker", flag.ExitOnError)
	socket := fs.String("socket", "", "hub socket path")
	dbURL := fs.String("database-url", "", "database URL for the re-reads")
	queues := fs.Int("queues", 50, "queues (bench00 …)")
	index := fs.Int("index", 0, "this worker's number")
	workers := fs.Int("workers", 8, "workers in all (queue j is owned by worker j mod workers)")
	reread := fs.Bool("reread", true, "re-read an owned queue after each of its wakes (false: only count the wakes)")
	fs.Parse(args)

	out := json.NewEncoder(os.Stdout)
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(*dbURL)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = "lhbench-wakeworker"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)

	w := &wakeWorker{owned: map[int]*ownedQueue{}, work: make(chan *ownedQueue, *queues), base: time.Now().UnixNano(), noReread: !*reread}
	byName := map[string]int{}
	names := make([]string, *queues)
	for i := range *queues {
		names[i] = queueChannel(i)
		byName[names[i]] = i
		if i%*workers == *index {
			w.owned[i] = &ownedQueue{q: i, above: map[int64]struct{}{}}
		}
	}
	c, r, err := subscribeAll(*socket, names)
	if err != nil {
		return err
	}
	defer c.Close()
	go func() {
		for {
			body, err := r.Next()
			if err != nil {
				w.mu.Lock()
				if w.err == "" {
					w.err = "hub connection: " + err.Error()
				}
				w.mu.Unlock()
				return
			}
			now := time.Now().UnixNano()
			if q, ok := wakeChannel(body); ok {
				w.wake(byName, q, now)
			}
		}
	}()
	go w.reread(ctx, conn)

	out.Encode(map[string]int{"ready": len(names)})
	return serveCommands(func(f []string) (bool, error) {
		switch f[0] {
		case "run":
			w.mu.Lock()
			w.gen++
			w.base, w.total, w.reads, w.err = time.Now().UnixNano(), 0, 0, ""
			for _, o := range w.owned {
				o.low, o.above, o.wakes, o.seen = 0, map[int64]struct{}{}, nil, nil
			}
			w.mu.Unlock()
			out.Encode(map[string]bool{"ok": true})
		case "report":
			w.mu.Lock()
			rep := wakeReport{Base: w.base, Total: w.total, Reads: w.reads, Error: w.err}
			for q := range *queues {
				if o := w.owned[q]; o != nil {
					rep.Queue = append(rep.Queue, queueWakes{Q: q, Wakes: o.wakes, Seen: o.seen})
				}
			}
			b, err := json.Marshal(map[string]wakeReport{"wakes": rep})
			w.mu.Unlock()
			if err != nil {
				return false, err
			}
			os.Stdout.Write(append(b, '\n'))
		case "quit":
			return true, nil
		}
		return false, nil
	})
}

// wake records one wake of channel name received at now.
func (w *wakeWorker) wake(byName map[string]int, name []byte, now int64) {
	q, ok := byName[string(name)]
	w.mu.Lock()
	defer w.mu.Unlock()
	w.total++
	if !ok {
		return
	}
	o := w.owned[q]
	if o == nil {
		return
	}
	o.wakes = append(o.wakes, now-w.base)
	if !o.pending && !w.noReread {
		o.pending = true
		w.work <- o // never blocks: one slot per queue, and pending gates it
	}
}

// reread runs the coalesced re-reads, one at a time on conn.
func (w *wakeWorker) reread(ctx context.Context, conn *pgx.Conn) {
	sqls := map[int]string{}
	var ids []int64
	for o := range w.work {
		w.mu.Lock()
		o.pending = false
		gen, low := w.gen, o.low
		w.mu.Unlock()
		sql, ok := sqls[o.q]
		if !ok {
			sql = "SELECT msg_id FROM pgmq.q_" + queueName(o.q) + " WHERE msg_id > $1"
			sqls[o.q] = sql
		}
		ids = ids[:0]
		rows, err := conn.Query(ctx, sql, low)
		if err == nil {
			var id int64
			_, err = pgx.ForEachRow(rows, []any{&id}, func() error { ids = append(ids, id); return nil })
		}
		done := time.Now().UnixNano()
		w.mu.Lock()
		if err != nil && w.err == "" {
			w.err = "re-read: " + err.Error()
		}
		if gen == w.gen {
			w.reads++
			for _, id := range ids {
				if _, dup := o.above[id]; dup || id <= o.low {
					continue
				}
				o.above[id] = struct{}{}
				o.seen = append(o.seen, [2]int64{id, done - w.base})
			}
			for {
				if _, ok := o.above[o.low+1]; !ok {
					break
				}
				delete(o.above, o.low+1)
				o.low++
			}
		}
		w.mu.Unlock()
	}
}

// wakeChannel returns the channel of a wake frame's body; ok is false for
// any other frame.
func wakeChannel(body []byte) ([]byte, bool) {
	if tail, ok := bytes.CutPrefix(body, []byte(wakePrefix)); ok {
		if i := bytes.IndexAny(tail, `"\`); i >= 0 && tail[i] == '"' {
			return tail[:i], true
		}
	}
	m, err := wire.Decode(body)
	if err != nil || m.T != "wake" {
		return nil, false
	}
	return []byte(m.Q), true
}

const wakePrefix = `{"t":"wake","q":"`

// subscribeAll subscribes names on one hub connection and waits for every
// ack.
func subscribeAll(path string, names []string) (c interface{ Close() error }, r *wire.Reader, err error) {
	conn, err := dialUnix(path, 30*time.Second)
	if err != nil {
		return nil, nil, err
	}
	var buf []byte
	for _, q := range names {
		buf = wire.AppendSub(buf, q)
	}
	if _, err := conn.Write(buf); err != nil {
		conn.Close()
		return nil, nil, err
	}
	r = wire.NewReader(conn, 64<<10)
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	for acks := 0; acks < len(names); {
		body, err := r.Next()
		if err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("waiting for %d acks (%d so far): %w", len(names), acks, err)
		}
		if _, ok := wakeChannel(body); ok {
			continue
		}
		m, err := wire.Decode(body)
		if err != nil {
			conn.Close()
			return nil, nil, err
		}
		switch m.T {
		case "nack":
			conn.Close()
			return nil, nil, fmt.Errorf("nack for %s: %s", m.Q, m.Error)
		case "ack":
			acks++
		}
	}
	conn.SetReadDeadline(time.Time{})
	return conn, r, nil
}
