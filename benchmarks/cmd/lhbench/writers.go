package main

// The writers scenario: what a wake source costs the writers.
//
// W writers insert into pgmq-shaped queue tables (one row per transaction,
// fsync on) while a hub with K worker processes is subscribed to every
// queue's channel, pgmq.q_<name>.INSERT. The wake sources, interleaved
// round by round on one cluster (wal_level=logical for all), after one
// unmeasured round of none at each W:
//
//	none       no trigger, no relay: what the writers do alone
//	trigger    pgmq's per-row trigger (pg_notify in a constraint trigger)
//	throttled  pgmq 1.8's throttled trigger: at most one NOTIFY per queue per
//	           250 ms, decided by an UPDATE of a throttle table
//	relay      no trigger; `listenhub relay` decodes the WAL (pgoutput, a
//	           publication on the schema) and NOTIFYs the queues' channels
//
// Each insert is recorded by its writer (queue, msg_id, the time the
// statement was sent, the time it returned). Each queue is owned by one
// worker, which records the arrival of every wake of that queue and
// re-reads the queue after each (see wakeworker.go). An insert is known to
// its worker at the first wake that arrived after its commit returned, or
// when a re-read after an earlier wake returned it, whichever is first;
// wake latency is that moment minus the commit's return (0 when the wake
// beat the writer's own return). An insert never known is a miss.
//
// With K = 0 (--writers-workers 0) there is no hub and no worker process:
// the rounds measure only what each source costs the writers themselves
// (commits/s, commit latency, PostgreSQL CPU per commit, and the relay's
// own figures), and the wake figures and misses are not measured at all.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/listenhub/listenhub/benchmarks/internal/hist"
	"github.com/listenhub/listenhub/internal/pgtest"
)

// WritersRow is one (source, W): the rounds pooled.
type WritersRow struct {
	Source      string    `json:"source"` // none, trigger, throttled, relay
	W           int       `json:"writers"`
	Rounds      int       `json:"rounds"`
	Commits     int       `json:"commits"`
	Seconds     float64   `json:"seconds"`
	CommitsPerS float64   `json:"commits_per_s"`
	RoundRates  []float64 `json:"round_commits_per_s"`
	// Commit is the insert statement's round trip (autocommit: the
	// commit and its WAL flush are in it).
	Commit hist.Summary `json:"commit_latency"`
	// Wake is commit return → the owning worker knows of the row.
	Wake           hist.Summary `json:"wake_latency"`
	Wakes          uint64       `json:"wakes"` // received by all workers together
	WakesPerInsert float64      `json:"wakes_per_insert"`
	Misses         int          `json:"misses"`
	Reads          int          `json:"rereads"`
	// CPU seconds during the writing: every PostgreSQL process of the
	// cluster, the relay process, the hub process.
	PGCPU    float64 `json:"postgres_cpu_s"`
	RelayCPU float64 `json:"relay_cpu_s,omitempty"`
	HubCPU   float64 `json:"hub_cpu_s"`
	// WorkersCPU is the worker processes' CPU (receiving wakes and
	// re-reading), WritersCPU the harness process's, which is the writers'
	// client side: with the rest, where the machine's cores went.
	WorkersCPU float64 `json:"workers_cpu_s"`
	WritersCPU float64 `json:"writers_client_cpu_s"`
	// Relay is what the relay's own /metrics said about the rounds (nil
	// for the other sources, or when they could not be read).
	Relay *relayFigures `json:"relay_metrics,omitempty"`
	Err   string        `json:"error,omitempty"`
}

// relayFigures are the differences of the relay's counters over the
// rounds, and its commit → NOTIFY histogram (the commit's timestamp to the
// commit of the NOTIFY transaction that covered it; buckets, upper bounds
// in seconds).
type relayFigures struct {
	Transactions    float64            `json:"transactions"`
	Notifies        float64            `json:"notifies"`
	Batches         float64            `json:"batches"`
	VisibilityWaits float64            `json:"visibility_waits"`
	CommitToNotify  map[string]float64 `json:"commit_to_notify_buckets"`
	// CommitToDecode is the part of it spent before the relay had the
	// commit from its walsender (listenhub_relay_commit_to_decode_seconds;
	// empty when the relay does not export it).
	CommitToDecode map[string]float64 `json:"commit_to_decode_buckets,omitempty"`
	// CatchUpS is how long after the writers stopped the relay had
	// decoded all their transactions (the longest of the rounds).
	CatchUpS float64 `json:"catch_up_s"`
	// WalsenderCPU is the CPU time of the relay's walsender (the
	// backend that decodes the WAL), included in the PostgreSQL CPU.
	WalsenderCPU float64 `json:"walsender_cpu_s"`
}

func (f *relayFigures) add(g *relayFigures) {
	f.Transactions += g.Transactions
	f.Notifies += g.Notifies
	f.Batches += g.Batches
	f.VisibilityWaits += g.VisibilityWaits
	f.CatchUpS = max(f.CatchUpS, g.CatchUpS)
	f.WalsenderCPU += g.WalsenderCPU
	if f.CommitToNotify == nil {
		f.CommitToNotify = map[string]float64{}
	}
	for k, v := range g.CommitToNotify {
		f.CommitToNotify[k] += v
	}
	if len(g.CommitToDecode) > 0 && f.CommitToDecode == nil {
		f.CommitToDecode = map[string]float64{}
	}
	for k, v := range g.CommitToDecode {
		f.CommitToDecode[k] += v
	}
}

// fractionWithin is the fraction of the commit → NOTIFY observations at
// or under the bucket bound le (seconds, one of the histogram's bounds);
// -1 when the histogram is empty or has no such bound.
func (f *relayFigures) fractionWithin(le float64) float64 {
	total := f.CommitToNotify["+Inf"]
	for k, v := range f.CommitToNotify {
		if b, err := strconv.ParseFloat(k, 64); err == nil && b == le && total > 0 {
			return v / total
		}
	}
	return -1
}

// quantile is the upper bound (seconds) of the bucket holding quantile q
// of the commit → NOTIFY histogram; +Inf past the last bound, 0 if empty.
func (f *relayFigures) quantile(q float64) float64 { return bucketQuantile(f.CommitToNotify, q) }

// bucketQuantile is quantile for any cumulative histogram by bound.
func bucketQuantile(h map[string]float64, q float64) float64 {
	type b struct{ le, n float64 }
	var bs []b
	for k, v := range h {
		le, err := strconv.ParseFloat(k, 64)
		if k == "+Inf" {
			le, err = math.Inf(1), nil
		}
		if err == nil {
			bs = append(bs, b{le, v})
		}
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return 0
	}
	total := bs[len(bs)-1].n // cumulative buckets: +Inf holds the count
	for _, x := range bs {
		if x.n >= q*total {
			return x.le
		}
	}
	return math.Inf(1)
}

// decodeNote is ", of which commit → decode p50 ≤ …, p99 ≤ …" when the
// relay exports that histogram.
func (f *relayFigures) decodeNote() string {
	if len(f.CommitToDecode) == 0 {
		return ""
	}
	return fmt.Sprintf("; commit → decoded p50 ≤ %s, p99 ≤ %s", bound(bucketQuantile(f.CommitToDecode, 0.5)), bound(bucketQuantile(f.CommitToDecode, 0.99)))
}

// scrapeRelay reads the relay's counters from its /metrics.
func scrapeRelay(addr string) (*relayFigures, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	f := &relayFigures{CommitToNotify: map[string]float64{}}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		switch name {
		case "listenhub_relay_transactions_total":
			f.Transactions = v
		case "listenhub_relay_notifies_total":
			f.Notifies = v
		case "listenhub_relay_batches_total":
			f.Batches = v
		case "listenhub_relay_visibility_waits_total":
			f.VisibilityWaits = v
		}
		if le, ok := strings.CutPrefix(name, `listenhub_relay_commit_to_notify_seconds_bucket{le="`); ok {
			f.CommitToNotify[strings.TrimSuffix(le, `"}`)] = v
		}
		if le, ok := strings.CutPrefix(name, `listenhub_relay_commit_to_decode_seconds_bucket{le="`); ok {
			if f.CommitToDecode == nil {
				f.CommitToDecode = map[string]float64{}
			}
			f.CommitToDecode[strings.TrimSuffix(le, `"}`)] = v
		}
	}
	return f, sc.Err()
}

// sub is f − g, counter by counter.
func (f *relayFigures) sub(g *relayFigures) *relayFigures {
	d := &relayFigures{Transactions: f.Transactions - g.Transactions, Notifies: f.Notifies - g.Notifies,
		Batches: f.Batches - g.Batches, VisibilityWaits: f.VisibilityWaits - g.VisibilityWaits, CommitToNotify: map[string]float64{}}
	for k, v := range f.CommitToNotify {
		d.CommitToNotify[k] = v - g.CommitToNotify[k]
	}
	for k, v := range f.CommitToDecode {
		if d.CommitToDecode == nil {
			d.CommitToDecode = map[string]float64{}
		}
		d.CommitToDecode[k] = v - g.CommitToDecode[k]
	}
	return d
}

// pgCPUPerCommit is the PostgreSQL CPU per commit in µs.
func (r *WritersRow) pgCPUPerCommit() float64 {
	if r.Commits == 0 {
		return 0
	}
	return r.PGCPU * 1e6 / float64(r.Commits)
}

// WritersInfo is the writers scenario's set-up.
type WritersInfo struct {
	// FsyncUS is pg_test_fsync's fdatasync time (one 8 kB write), on the
	// cluster's file system, µs per operation.
	FsyncUS   float64  `json:"pg_test_fsync_fdatasync_us"`
	FsyncLine string   `json:"pg_test_fsync_line"`
	Queues    int      `json:"queues"`
	Workers   int      `json:"workers"`
	Dur       string   `json:"round_duration"`
	Rounds    int      `json:"rounds"`
	Throttle  string   `json:"throttle_interval"`
	Settings  []string `json:"settings"`
	// Autogroup is kernel.sched_autogroup_enabled ("" where there is none).
	// With it on, every session is one scheduling entity, and every
	// PostgreSQL backend is a session of its own: it moves the relay's
	// latency more than anything the relay does (docs/relay.md).
	Autogroup string `json:"sched_autogroup_enabled,omitempty"`
	// NoReread: the workers never re-read their queues
	// (--writers-no-reread).
	NoReread  bool     `json:"workers_no_reread,omitempty"`
	RelayArgv []string `json:"relay_argv,omitempty"`
	LoadStart string   `json:"load_start"`
	LoadEnd   string   `json:"load_end"`
	Notes     []string `json:"notes,omitempty"`
}

const (
	writersPublication = "lhbench"
	writersSlot        = "lhbench_relay"
	writersTrigger     = "trigger_notify_queue_insert_listeners" // pgmq's name
)

var writersSources = []string{"none", "trigger", "throttled", "relay"}

// writersEnv is one writers scenario's cluster, hub, workers and writers.
type writersEnv struct {
	b        *bench
	url      string
	db       *pgx.Conn
	cluster  *pgtest.Cluster
	hub      *system
	workers  []*proc
	writers  []*pgx.Conn
	relayBin string // the listenhub binary, when it has the relay
	logical  bool
	pgPID    int // postmaster (0: external server, CPU not measured)
	queues   int
	nworkers int
}

func (b *bench) writersScenario() error {
	p := b.p
	info := &WritersInfo{Queues: p.WritersQueues, Workers: p.WritersWorkers, Dur: p.WritersDur.String(), Rounds: p.WritersRounds,
		Throttle: p.WritersThrottle.String(), LoadStart: loadavg()}
	b.res.WritersInfo = info
	defer func() { info.LoadEnd = loadavg() }()
	hubSys := b.sys("hub")
	if hubSys == nil {
		hubSys = b.sys("hublib")
	}
	if p.WritersWorkers < 0 {
		return fmt.Errorf("writers: %d workers", p.WritersWorkers)
	}
	if hubSys == nil && p.WritersWorkers > 0 {
		return errors.New("writers: needs the hub among --systems")
	}
	e := &writersEnv{b: b, queues: p.WritersQueues, nworkers: p.WritersWorkers}
	if e.nworkers == 0 {
		info.Notes = append(info.Notes, "no hub and no workers (--writers-workers 0): what each wake source costs the writers alone; wake latency, wakes/insert and misses not measured")
	}
	info.Notes = append(info.Notes, "each W begins with an unmeasured round of none")
	if e.nworkers > 0 && p.WritersNoReread {
		info.NoReread = true
		info.Notes = append(info.Notes, "the workers never re-read their queues (--writers-no-reread): the wakes' cost without the consumers' reads; a row is known at the first wake after its commit returned, and misses are not measured")
	}
	defer e.close()

	binDir, err := pgtest.BinDir()
	if err != nil {
		return err
	}
	fsyncDir := os.TempDir()
	if b.external {
		e.url = b.dbURL
		info.Notes = append(info.Notes, "an external server (--database-url): its settings, and pg_test_fsync run in "+fsyncDir)
	} else {
		b.logf("writers: starting a cluster with fsync on and wal_level=logical")
		if e.cluster, err = startCluster(b.ctx, 200, true, true, b.logf); err != nil {
			return err
		}
		e.url, e.pgPID, fsyncDir = e.cluster.URL(), e.cluster.PID(), e.cluster.Dir()
	}
	if p.WritersFsyncSecs == 0 {
		// not asked for (the smoke test)
	} else if us, line, err := pgTestFsync(b.ctx, binDir, fsyncDir, p.WritersFsyncSecs); err != nil {
		info.Notes = append(info.Notes, "pg_test_fsync: "+err.Error())
	} else {
		info.FsyncUS, info.FsyncLine = us, line
		b.logf("writers: pg_test_fsync: %s", line)
	}
	if e.db, err = connectApp(b.ctx, e.url, "lhbench-harness"); err != nil {
		return err
	}
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes", "wal_level", "wal_sync_method", "shared_buffers", "max_wal_size"} {
		var v string
		if err := e.db.QueryRow(b.ctx, "select current_setting($1)", name).Scan(&v); err == nil {
			info.Settings = append(info.Settings, name+"="+v)
		}
		if name == "wal_level" {
			e.logical = v == "logical"
		}
	}
	if ag, err := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled"); err == nil {
		info.Autogroup = strings.TrimSpace(string(ag))
	}
	if err := e.setup(); err != nil {
		return fmt.Errorf("writers: set-up: %w", err)
	}
	if slices.Contains(p.WritersSources, "relay") {
		e.relayBin = b.relayBin
		if e.relayBin == "" && hubSys != nil {
			e.relayBin = hubSys.argv[0]
		}
		if e.relayBin == "" {
			info.Notes = append(info.Notes, "relay not measured: no listenhub binary (--relay-bin, or the hub among --systems)")
		} else if err := exec.Command(e.relayBin, "relay", "--help").Run(); err != nil {
			info.Notes = append(info.Notes, fmt.Sprintf("relay not measured: %s relay --help: %v", e.relayBin, err))
			e.relayBin = ""
		} else {
			info.RelayArgv = e.relayArgv()
		}
	}

	if e.nworkers > 0 {
		hub := *hubSys
		hub.name, hub.dbURL, hub.cpus, hub.session = "hub-writers", e.url, 0, true
		e.hub = &hub
		if err := e.hub.start(b.dir); err != nil {
			return err
		}
	}
	for i := range e.nworkers {
		w, err := startProc(nil, "wakeworker", "--socket", e.hub.socket, "--database-url", e.url,
			"--queues", strconv.Itoa(e.queues), "--index", strconv.Itoa(i), "--workers", strconv.Itoa(e.nworkers),
			"--reread="+strconv.FormatBool(!p.WritersNoReread))
		if err != nil {
			return err
		}
		e.workers = append(e.workers, w)
		if line, err := w.recv(60 * time.Second); err != nil {
			return err
		} else if !strings.Contains(string(line), `"ready"`) {
			return fmt.Errorf("wakeworker %d: %s", i, line)
		}
	}
	for range slices.Max(p.WritersW) {
		c, err := connectApp(b.ctx, e.url, "lhbench-writer")
		if err != nil {
			return err
		}
		e.writers = append(e.writers, c)
	}

	rows := map[string]*WritersRow{}
	hs := map[string]*[2]hist.H{}
	for _, w := range p.WritersW {
		for _, src := range p.WritersSources {
			k := src + "/" + strconv.Itoa(w)
			rows[k] = &WritersRow{Source: src, W: w}
			hs[k] = &[2]hist.H{}
			if src == "relay" && e.relayBin == "" {
				rows[k].Err = "relay not available (see notes)"
			}
			if src == "relay" && e.relayBin != "" && !e.logical {
				rows[k].Err = "wal_level is not logical"
			}
		}
		// An unmeasured round first: the first round at each W was slower
		// whichever source ran it (none 6.0k commits/s against 8.2k in its
		// second round at W=64, with the relay's two rounds equal), and
		// the turning order below gives that round to one source.
		if _, err := e.round("none", w, -1); err != nil {
			return fmt.Errorf("writers: the unmeasured round at W=%d: %w", w, err)
		}
		b.logf("writers W=%d: the unmeasured round is done", w)
		for round := range p.WritersRounds {
			// Interleaved, and the order turns each round, so that a
			// drift in the machine's load lands on every source.
			srcs := slices.Clone(p.WritersSources)
			k := (round + slices.Index(p.WritersW, w)) % len(srcs)
			srcs = append(srcs[k:], srcs[:k]...)
			for _, src := range srcs {
				key := src + "/" + strconv.Itoa(w)
				row := rows[key]
				if row.Err != "" {
					continue
				}
				rr, err := e.round(src, w, round)
				if err != nil {
					row.Err = err.Error()
					b.logf("writers %s W=%d round %d: %v", src, w, round+1, err)
					if b.ctx.Err() != nil {
						return b.ctx.Err()
					}
					continue
				}
				row.Rounds++
				row.Commits += rr.commits
				row.Seconds += rr.seconds
				row.RoundRates = append(row.RoundRates, float64(rr.commits)/rr.seconds)
				row.Wakes += rr.wakes
				row.Misses += rr.misses
				row.Reads += rr.reads
				row.PGCPU += rr.pgCPU
				row.RelayCPU += rr.relayCPU
				row.HubCPU += rr.hubCPU
				row.WorkersCPU += rr.workersCPU
				row.WritersCPU += rr.writersCPU
				if rr.relay != nil {
					if row.Relay == nil {
						row.Relay = &relayFigures{}
					}
					row.Relay.add(rr.relay)
				}
				hs[key][0].Merge(&rr.commit)
				hs[key][1].Merge(&rr.wake)
				wakes := "no workers: wakes not measured"
				if e.nworkers > 0 {
					wakes = fmt.Sprintf("wake p50 %s p99 %s, %.3f wakes/insert, %d misses", us(rr.wake.Summarize().P50), us(rr.wake.Summarize().P99),
						float64(rr.wakes)/float64(e.nworkers)/float64(max(rr.commits, 1)), rr.misses)
				}
				b.logf("writers %-9s W=%-2d round %d: %6.0f commits/s, commit p99 %s, %s, PG CPU %.1f µs/commit; load %s",
					src, w, round+1, float64(rr.commits)/rr.seconds, us(float64(rr.commit.Summarize().P99)), wakes, rr.pgCPU*1e6/float64(max(rr.commits, 1)), loadavg())
				if rr.relay != nil {
					b.logf("  relay's own figures: %.0f transactions, %.0f NOTIFY transactions, %.0f visibility waits, commit → NOTIFY p50 ≤ %s, p99 ≤ %s; caught up %.1fs after the writers stopped; walsender CPU %.1f µs/commit%s",
						rr.relay.Transactions, rr.relay.Batches, rr.relay.VisibilityWaits, bound(rr.relay.quantile(0.5)), bound(rr.relay.quantile(0.99)), rr.relay.CatchUpS,
						rr.relay.WalsenderCPU*1e6/float64(max(rr.commits, 1)), rr.relay.decodeNote())
				}
			}
		}
		for _, src := range p.WritersSources {
			key := src + "/" + strconv.Itoa(w)
			row := rows[key]
			if row.Rounds > 0 {
				row.CommitsPerS = float64(row.Commits) / row.Seconds
				row.Commit, row.Wake = hs[key][0].Summarize(), hs[key][1].Summarize()
				if e.nworkers > 0 {
					row.WakesPerInsert = float64(row.Wakes) / float64(e.nworkers) / float64(max(row.Commits, 1))
				}
			}
			b.res.Writers = append(b.res.Writers, *row)
		}
	}
	return nil
}

// roundResult is one round of one source.
type roundResult struct {
	commits                 int
	seconds                 float64
	commit, wake            hist.H
	wakes                   uint64
	misses, reads           int
	pgCPU, relayCPU, hubCPU float64
	workersCPU, writersCPU  float64
	relay                   *relayFigures
	catchUp                 time.Duration // writers' end → the relay decoded their last commit
}

func (e *writersEnv) round(src string, w, round int) (*roundResult, error) {
	b := e.b
	ctx := b.ctx
	// The source's trigger, empty tables, a checkpoint: every round starts
	// from the same state.
	if err := e.setSource(src); err != nil {
		return nil, err
	}
	var relay *exec.Cmd
	var relayDone chan struct{}
	var relayLog, relayMetrics string
	if src == "relay" {
		var err error
		relay, relayDone, relayLog, relayMetrics, err = e.startRelay(round)
		if err != nil {
			return nil, err
		}
		defer e.stopRelay(relay, relayDone)
	}
	id := b.nextRun()
	for _, p := range e.workers {
		if err := p.send("run " + strconv.FormatInt(id, 10)); err != nil {
			return nil, err
		}
		if _, err := p.recv(10 * time.Second); err != nil {
			return nil, err
		}
	}
	pg0, relay0, hub0 := e.pgCPU(), procCPU(pidOf(relay)), procCPU(e.hubPID())
	workers0, writers0 := e.workersCPU(), procCPU(os.Getpid())
	var rm0 *relayFigures
	var walsender int
	var ws0 time.Duration
	if relayMetrics != "" {
		rm0, _ = scrapeRelay(relayMetrics)
		e.db.QueryRow(b.ctx, "SELECT coalesce(max(active_pid), 0) FROM pg_replication_slots WHERE slot_name = $1", writersSlot).Scan(&walsender)
		ws0 = procCPU(walsender)
	}

	// The writers.
	sqls := make([]string, e.queues)
	for q := range sqls {
		sqls[q] = "INSERT INTO pgmq.q_" + queueName(q) + ` (vt, message) VALUES (clock_timestamp(), '{"hello":"world"}') RETURNING msg_id`
	}
	type insert struct {
		q    int32
		id   int64
		s, e int64
	}
	recs := make([][]insert, w)
	hists := make([]hist.H, w)
	errs := make([]error, w)
	start := time.Now()
	deadline := start.Add(b.p.WritersDur)
	var wg sync.WaitGroup
	for i := range w {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(id), uint64(i)))
			conn := e.writers[i]
			for time.Now().Before(deadline) {
				q := rng.IntN(e.queues)
				s := time.Now().UnixNano()
				var msgID int64
				if err := conn.QueryRow(ctx, sqls[q]).Scan(&msgID); err != nil {
					errs[i] = err
					return
				}
				t := time.Now().UnixNano()
				recs[i] = append(recs[i], insert{int32(q), msgID, s, t})
				hists[i].Record(t - s)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	rr := &roundResult{seconds: elapsed.Seconds()}
	if rm0 != nil && errors.Join(errs...) == nil {
		// The relay may lag the writers: wait until it has decoded every
		// one of the round's transactions (each insert is one), so that
		// its last NOTIFYs, their CPU and its own latency figures are the
		// round's. Wakes of earlier commits reach the workers meanwhile.
		n := 0
		for i := range recs {
			n += len(recs[i])
		}
		deadline := time.Now().Add(b.p.WritersCatchUp)
		for {
			rm, err := scrapeRelay(relayMetrics)
			if err == nil && rm.Transactions-rm0.Transactions >= float64(n) {
				break
			}
			if time.Now().After(deadline) {
				b.logf("  relay: not caught up %v after the writers stopped", b.p.WritersCatchUp)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		rr.catchUp = time.Since(start) - elapsed
	}
	rr.pgCPU = (e.pgCPU() - pg0).Seconds()
	rr.relayCPU = (procCPU(pidOf(relay)) - relay0).Seconds()
	rr.hubCPU = (procCPU(e.hubPID()) - hub0).Seconds()
	rr.workersCPU = (e.workersCPU() - workers0).Seconds()
	rr.writersCPU = (procCPU(os.Getpid()) - writers0).Seconds()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("writer: %w", err)
	}
	if relay != nil {
		select {
		case <-relayDone:
			return nil, fmt.Errorf("relay exited during the round: %s", tailFile(relayLog, 3))
		default:
		}
	}

	// The last wakes: the writers have stopped, what is coming comes
	// within the drain. The relay's last NOTIFY transactions too, whose
	// counters follow its decoding.
	if e.nworkers > 0 || rm0 != nil {
		time.Sleep(b.p.WritersDrain)
	}
	if rm0 != nil {
		if rm1, err := scrapeRelay(relayMetrics); err == nil {
			rr.relay = rm1.sub(rm0)
			rr.relay.CatchUpS = rr.catchUp.Seconds()
			rr.relay.WalsenderCPU = (procCPU(walsender) - ws0).Seconds()
		}
	}
	reps := make([]wakeReport, len(e.workers))
	for i, p := range e.workers {
		if err := p.send("report"); err != nil {
			return nil, err
		}
		line, err := p.recv(30 * time.Second)
		if err != nil {
			return nil, err
		}
		var m map[string]wakeReport
		if err := jsonUnmarshal(line, &m); err != nil {
			return nil, err
		}
		reps[i] = m["wakes"]
		if reps[i].Error != "" {
			return nil, fmt.Errorf("wakeworker %d: %s", i, reps[i].Error)
		}
	}

	// Each insert against its owner's wakes and re-reads.
	type queueView struct {
		wakes []int64         // absolute, sorted
		seen  map[int64]int64 // msg_id → absolute time its re-read returned
	}
	views := make([]queueView, e.queues)
	for i, rep := range reps {
		rr.wakes += rep.Total
		rr.reads += rep.Reads
		for _, qw := range rep.Queue {
			if qw.Q%e.nworkers != i {
				continue
			}
			v := queueView{seen: make(map[int64]int64, len(qw.Seen))}
			for _, t := range qw.Wakes {
				v.wakes = append(v.wakes, rep.Base+t)
			}
			slices.Sort(v.wakes)
			for _, s := range qw.Seen {
				v.seen[s[0]] = rep.Base + s[1]
			}
			views[qw.Q] = v
		}
	}
	for i := range recs {
		rr.commits += len(recs[i])
		rr.commit.Merge(&hists[i])
		if e.nworkers == 0 {
			continue // no one to know of the rows: no latency, no miss
		}
		for _, in := range recs[i] {
			v := &views[in.q]
			known := int64(-1)
			if k := sort.Search(len(v.wakes), func(j int) bool { return v.wakes[j] >= in.e }); k < len(v.wakes) {
				known = v.wakes[k]
			}
			if t, ok := v.seen[in.id]; ok && (known < 0 || t < known) {
				known = t
			}
			if known < 0 {
				rr.misses++
				continue
			}
			rr.wake.Record(max(known-in.e, 0))
		}
	}
	if src == "none" || b.p.WritersNoReread {
		// Nothing wakes anyone: not a miss of a wake source. Or no
		// re-reads: a wake that beat its writer's return, with none
		// after it, is no miss, and cannot be told from one.
		rr.misses = 0
	}
	return rr, nil
}

// setup creates the queue tables (pgmq's columns), pgmq's two trigger
// functions, the throttle table and the publication.
func (e *writersEnv) setup() error {
	var sb strings.Builder
	sb.WriteString(`CREATE SCHEMA IF NOT EXISTS pgmq;
-- pgmq's per-row trigger function (pgmq 1.7).
CREATE OR REPLACE FUNCTION pgmq.lhbench_notify_queue_listeners() RETURNS trigger AS $$
BEGIN
  PERFORM PG_NOTIFY('pgmq.' || TG_TABLE_NAME || '.' || TG_OP, NULL);
  RETURN NEW;
END;
$$ LANGUAGE plpgsql;
-- pgmq 1.8's throttle: an unlogged table of the last NOTIFY per queue, and
-- a trigger that NOTIFYs only when its UPDATE of that row matched.
CREATE UNLOGGED TABLE IF NOT EXISTS pgmq.lhbench_notify_insert_throttle (
  queue_name VARCHAR UNIQUE NOT NULL,
  throttle_interval_ms INTEGER NOT NULL DEFAULT 0,
  last_notified_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT to_timestamp(0)
);
CREATE OR REPLACE FUNCTION pgmq.lhbench_notify_queue_listeners_throttled() RETURNS trigger AS $$
DECLARE
  updated_count INTEGER;
BEGIN
  UPDATE pgmq.lhbench_notify_insert_throttle
     SET last_notified_at = clock_timestamp()
   WHERE queue_name = substring(TG_TABLE_NAME from 3)
     AND clock_timestamp() - last_notified_at >= throttle_interval_ms * INTERVAL '1 millisecond';
  GET DIAGNOSTICS updated_count = ROW_COUNT;
  IF updated_count > 0 THEN
    PERFORM PG_NOTIFY('pgmq.' || TG_TABLE_NAME || '.' || TG_OP, NULL);
  END IF;
  RETURN NEW;
END;
$$ LANGUAGE plpgsql;
`)
	for q := range e.queues {
		n := queueName(q)
		fmt.Fprintf(&sb, `CREATE TABLE IF NOT EXISTS pgmq.q_%[1]s (
  msg_id BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
  read_ct INT DEFAULT 0 NOT NULL,
  enqueued_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
  vt TIMESTAMP WITH TIME ZONE NOT NULL,
  message JSONB
);
CREATE INDEX IF NOT EXISTS q_%[1]s_vt_idx ON pgmq.q_%[1]s (vt ASC);
INSERT INTO pgmq.lhbench_notify_insert_throttle (queue_name, throttle_interval_ms) VALUES ('%[1]s', %[2]d)
  ON CONFLICT (queue_name) DO UPDATE SET throttle_interval_ms = EXCLUDED.throttle_interval_ms;
`, n, e.b.p.WritersThrottle.Milliseconds())
	}
	if _, err := e.db.Exec(e.b.ctx, sb.String()); err != nil {
		return err
	}
	if !e.logical {
		return nil
	}
	var n int
	if err := e.db.QueryRow(e.b.ctx, "SELECT count(*)::int FROM pg_publication WHERE pubname = $1", writersPublication).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		_, err := e.db.Exec(e.b.ctx, "CREATE PUBLICATION "+writersPublication+" FOR TABLES IN SCHEMA pgmq")
		return err
	}
	return nil
}

// setSource puts src's trigger (or none) on every queue table, empties the
// tables and checkpoints.
func (e *writersEnv) setSource(src string) error {
	var sb strings.Builder
	for q := range e.queues {
		t := "pgmq.q_" + queueName(q)
		fmt.Fprintf(&sb, "DROP TRIGGER IF EXISTS %s ON %s;\n", writersTrigger, t)
		fn := map[string]string{"trigger": "lhbench_notify_queue_listeners", "throttled": "lhbench_notify_queue_listeners_throttled"}[src]
		if fn != "" {
			// pgmq's own form: a deferrable constraint trigger, fired per row.
			fmt.Fprintf(&sb, "CREATE CONSTRAINT TRIGGER %s AFTER INSERT ON %s DEFERRABLE FOR EACH ROW EXECUTE PROCEDURE pgmq.%s();\n", writersTrigger, t, fn)
		}
	}
	sb.WriteString("UPDATE pgmq.lhbench_notify_insert_throttle SET last_notified_at = to_timestamp(0);\nTRUNCATE ")
	for q := range e.queues {
		if q > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("pgmq.q_" + queueName(q))
	}
	sb.WriteString(" RESTART IDENTITY;\n")
	if _, err := e.db.Exec(e.b.ctx, sb.String()); err != nil {
		return err
	}
	_, err := e.db.Exec(e.b.ctx, "CHECKPOINT")
	return err
}

func (e *writersEnv) relayArgv() []string {
	// A relay on the database's host connects through its socket
	// directory, as docs/relay.md advises: the walsender's send() per
	// message costs less on a Unix socket than on TCP.
	u := e.url
	if e.cluster != nil {
		u = e.cluster.SocketURL()
	}
	argv := []string{e.relayBin, "relay", "--database-url", u, "--publication", writersPublication, "--slot", writersSlot}
	return append(argv, strings.Fields(e.b.p.WritersRelayArgs)...)
}

// startRelay starts `listenhub relay` on a new slot and waits until its
// walsender streams.
func (e *writersEnv) startRelay(round int) (*exec.Cmd, chan struct{}, string, string, error) {
	if err := e.dropSlot(); err != nil {
		return nil, nil, "", "", err
	}
	argv := e.relayArgv()
	metrics := ""
	if !strings.Contains(e.b.p.WritersRelayArgs, "--metrics-addr") {
		if port, err := freeTCPPort(); err == nil {
			metrics = "127.0.0.1:" + strconv.Itoa(port)
			argv = append(argv, "--metrics-addr", metrics)
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	// A session of its own, as under its systemd unit (see system.session).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	logPath := filepath.Join(e.b.dir, fmt.Sprintf("relay-%d.log", round))
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, "", "", err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, nil, "", "", err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var active bool
		err := e.db.QueryRow(e.b.ctx, "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1", writersSlot).Scan(&active)
		if err == nil && active {
			break
		}
		select {
		case <-done:
			return nil, nil, "", "", fmt.Errorf("relay exited at start: %s", tailFile(logPath, 3))
		default:
		}
		if time.Now().After(deadline) {
			e.stopRelay(cmd, done)
			return nil, nil, "", "", fmt.Errorf("relay's slot not active in 30 s: %s", tailFile(logPath, 3))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Its NOTIFY connection may open after the walsender's: a moment.
	time.Sleep(200 * time.Millisecond)
	return cmd, done, logPath, metrics, nil
}

func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (e *writersEnv) stopRelay(cmd *exec.Cmd, done chan struct{}) {
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
	e.dropSlot()
}

// dropSlot drops the relay's slot once no walsender holds it, so that the
// next relay round starts from the present, not from the WAL of the rounds
// in between.
func (e *writersEnv) dropSlot() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n, active int
		err := e.db.QueryRow(e.b.ctx, "SELECT count(*)::int, count(*) FILTER (WHERE active)::int FROM pg_replication_slots WHERE slot_name = $1", writersSlot).Scan(&n, &active)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if active == 0 {
			_, err := e.db.Exec(e.b.ctx, "SELECT pg_drop_replication_slot($1)", writersSlot)
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slot %s still active after 10 s", writersSlot)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pgCPU is the CPU time of the postmaster and all its children.
func (e *writersEnv) pgCPU() time.Duration {
	if e.pgPID == 0 {
		return 0
	}
	t := procCPU(e.pgPID)
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if ppidOf(pid) == e.pgPID {
			t += procCPU(pid)
		}
	}
	return t
}

func ppidOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// hubPID is the hub's process (0: no hub, with no workers).
func (e *writersEnv) hubPID() int {
	if e.hub == nil {
		return 0
	}
	return e.hub.serverPID()
}

// workersCPU is the CPU time of every worker process.
func (e *writersEnv) workersCPU() time.Duration {
	var t time.Duration
	for _, w := range e.workers {
		t += procCPU(w.pid())
	}
	return t
}

func pidOf(cmd *exec.Cmd) int {
	if cmd == nil || cmd.Process == nil {
		return 0
	}
	return cmd.Process.Pid
}

func (e *writersEnv) close() {
	for _, c := range e.writers {
		c.Close(context.Background())
	}
	for _, p := range e.workers {
		p.stop()
	}
	if e.hub != nil {
		e.hub.stop()
	}
	if e.db != nil {
		if e.cluster == nil {
			// An external server: leave it as it was.
			e.dropSlot()
			var sb strings.Builder
			for q := range e.queues {
				fmt.Fprintf(&sb, "DROP TABLE IF EXISTS pgmq.q_%s;\n", queueName(q))
			}
			sb.WriteString(`DROP PUBLICATION IF EXISTS ` + writersPublication + `;
DROP TABLE IF EXISTS pgmq.lhbench_notify_insert_throttle;
DROP FUNCTION IF EXISTS pgmq.lhbench_notify_queue_listeners();
DROP FUNCTION IF EXISTS pgmq.lhbench_notify_queue_listeners_throttled();`)
			e.db.Exec(context.Background(), sb.String())
		}
		e.db.Close(context.Background())
	}
	if e.cluster != nil {
		e.cluster.Close()
	}
}

func connectApp(ctx context.Context, url, app string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = app
	return pgx.ConnectConfig(ctx, cfg)
}

// pgTestFsync runs pg_test_fsync in dir and returns its first fdatasync
// figure (one 8 kB write; Linux's default wal_sync_method), in µs per
// operation, with its line. It stops the tool after that line.
func pgTestFsync(ctx context.Context, binDir, dir string, secs int) (float64, string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "pg_test_fsync"), "-s", strconv.Itoa(secs), "-f", filepath.Join(dir, "lhbench_fsync_test"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, "", err
	}
	if err := cmd.Start(); err != nil {
		return 0, "", err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGINT) // it removes its file on SIGINT
		cmd.Wait()
		os.Remove(filepath.Join(dir, "lhbench_fsync_test"))
	}()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 5 && f[0] == "fdatasync" && f[len(f)-1] == "usecs/op" {
			v, err := strconv.ParseFloat(f[len(f)-2], 64)
			return v, strings.Join(f, " "), err
		}
	}
	return 0, "", fmt.Errorf("no fdatasync line in pg_test_fsync's output")
}
