package main

// The harness: flags, setup, the scenario list, output.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/listenhub/listenhub/benchmarks/internal/hist"
)

// params are the sizes and durations of one suite; --quick shrinks them.
type params struct {
	Quick          bool          `json:"quick"`
	PacedN         []int         `json:"paced_n"`
	CensusN        []int         `json:"census_n"`
	PacedDur       time.Duration `json:"paced_dur_ns"`
	PacedRounds    int           `json:"paced_rounds"` // for N ≥ 64: interleaved rounds, pooled
	PacedRoundDur  time.Duration `json:"paced_round_dur_ns"`
	SatN           []int         `json:"saturation_n"`
	FloodDur       time.Duration `json:"flood_dur_ns"`
	SearchDur      time.Duration `json:"search_step_dur_ns"`
	SearchSteps    int           `json:"search_steps"`
	ChurnCycles    int           `json:"churn_cycles"`
	ChurnProcs     int           `json:"churn_procs"`
	ChurnIdleDur   time.Duration `json:"churn_idle_dur_ns"`
	ChurnRate      float64       `json:"churn_steady_rate"`
	ChurnCycleRate float64       `json:"churn_cycle_rate"` // cycles/s offered, all churn processes together
	IdleN          []int         `json:"idle_n"`
	WedgedDur      time.Duration `json:"wedged_dur_ns"`
	WedgedRate     float64       `json:"wedged_rate"`
	WedgedPad      int           `json:"wedged_payload_pad"`
	WedgedN        int           `json:"wedged_n"`
	OneProcN       int           `json:"one_proc_n"`
	SatOneProc     bool          `json:"saturation_one_proc"`
	SatOneProcN    []int         `json:"saturation_one_proc_n"` // 1×N saturation layouts (full suite)
	Layouts        []layout      `json:"layouts,omitempty"`     // P×C layouts (--n PxC), paced and saturation
	BigCensusProcs int           `json:"big_census_procs"`
	ChannelsN      []int         `json:"channels_n,omitempty"` // the many-channels scenario's channel counts
	// The writers scenario.
	WritersW       []int         `json:"writers_w,omitempty"`
	WritersDur     time.Duration `json:"writers_dur_ns,omitempty"`
	WritersDrain   time.Duration `json:"writers_drain_ns,omitempty"`    // wait for the last wakes after the writers stop
	WritersCatchUp time.Duration `json:"writers_catch_up_ns,omitempty"` // at most this long for the relay to decode the last commits
	WritersRounds  int           `json:"writers_rounds,omitempty"`
	WritersQueues  int           `json:"writers_queues,omitempty"`
	WritersWorkers int           `json:"writers_workers"` // 0: no hub, no workers (what the sources cost the writers alone)
	// WritersNoReread: the workers count their wakes and never re-read
	// their queues (a diagnostic: what the wakes cost without the
	// consumers' reads; misses are then not measured).
	WritersNoReread  bool          `json:"writers_no_reread,omitempty"`
	WritersSources   []string      `json:"writers_sources,omitempty"`
	WritersThrottle  time.Duration `json:"writers_throttle_ns,omitempty"`
	WritersRelayArgs string        `json:"writers_relay_args,omitempty"`   // extra `listenhub relay` flags
	WritersFsyncSecs int           `json:"writers_fsync_test_s,omitempty"` // pg_test_fsync -s (0: not run)
	// CPUs, when set, pins every server process (not the workers, not
	// Postgres) to that many cores with taskset.
	CPUs int `json:"server_cpus,omitempty"`
}

func fullParams() params {
	return params{
		PacedN: []int{1, 8, 64, 256}, CensusN: []int{1000}, PacedDur: 5 * time.Second, PacedRounds: 3, PacedRoundDur: 3 * time.Second,
		SatN: []int{64, 256}, FloodDur: 3 * time.Second, SearchDur: 1200 * time.Millisecond, SearchSteps: 5,
		ChurnCycles: 100000, ChurnProcs: 4, ChurnIdleDur: 3 * time.Second, ChurnRate: 1000, ChurnCycleRate: 10000,
		IdleN:     []int{1000, 10000},
		WedgedDur: 4 * time.Second, WedgedRate: 1000, WedgedPad: 500, WedgedN: 64,
		OneProcN: 256, SatOneProc: true, SatOneProcN: []int{64, 256}, BigCensusProcs: 8,
		ChannelsN: []int{1000, 10000, 50000},
		WritersW:  []int{1, 16, 64}, WritersDur: 10 * time.Second, WritersDrain: time.Second, WritersCatchUp: time.Minute, WritersRounds: 2,
		WritersQueues: 50, WritersWorkers: 8, WritersSources: writersSources, WritersThrottle: 250 * time.Millisecond, WritersFsyncSecs: 2,
	}
}

func quickParams() params {
	return params{
		Quick:  true,
		PacedN: []int{1, 256}, CensusN: nil, PacedDur: 2 * time.Second,
		SatN: []int{256}, FloodDur: 2 * time.Second, SearchDur: time.Second, SearchSteps: 3,
		ChurnCycles: 10000, ChurnProcs: 4, ChurnIdleDur: 2 * time.Second, ChurnRate: 1000, ChurnCycleRate: 10000,
		IdleN:     []int{1000},
		WedgedDur: 2500 * time.Millisecond, WedgedRate: 1000, WedgedPad: 500, WedgedN: 64,
		OneProcN: 256, BigCensusProcs: 8,
		ChannelsN: []int{1000, 10000},
		WritersW:  []int{1, 16}, WritersDur: 2 * time.Second, WritersDrain: time.Second, WritersCatchUp: time.Minute, WritersRounds: 1,
		WritersQueues: 50, WritersWorkers: 8, WritersSources: writersSources, WritersThrottle: 250 * time.Millisecond, WritersFsyncSecs: 2,
	}
}

type bench struct {
	ctx   context.Context
	p     params
	dir   string // temp dir for sockets and logs
	dbURL string
	// external is true with --database-url (no throwaway cluster).
	external bool
	// relayBin is the listenhub binary the writers scenario runs `relay`
	// from (default: the hub's).
	relayBin string
	db       *pgx.Conn // the harness's helper connection
	nt       *notifier
	systems  []*system
	res      *Results
	run      atomic.Int64
	// drainWait bounds the wait for a paced run's last wakes (a system
	// far behind, like gnet's unbounded task queue, would hold it longer).
	drainWait time.Duration
	logf      func(string, ...any)
}

func (b *bench) nextRun() int64 { return b.run.Add(1) }

func (b *bench) sys(name string) *system {
	for _, s := range b.systems {
		if s.name == name {
			return s
		}
	}
	return nil
}

func runMain(args []string) error {
	fs := flag.NewFlagSet("lhbench", flag.ExitOnError)
	quick := fs.Bool("quick", false, "the short suite (under 2 minutes)")
	jsonOut := fs.String("json", "", "write all results to this file")
	mdOut := fs.String("md", "", "write the tables as Markdown to this file")
	only := fs.String("only", "", "comma-separated scenarios: census,paced,saturation,churn,idle,wedged,channels,writers")
	writersW := fs.String("writers", "", "override the writers scenario's writer counts (e.g. 1,16,64)")
	writersDur := fs.Duration("writers-dur", 0, "override the writers scenario's round duration")
	writersRounds := fs.Int("writers-rounds", 0, "override the writers scenario's rounds")
	writersWorkers := fs.Int("writers-workers", fullParams().WritersWorkers, "override the writers scenario's worker processes (0: no hub and no workers, only what each wake source costs the writers)")
	writersNoReread := fs.Bool("writers-no-reread", false, "the writers scenario's workers count wakes and never re-read their queues (a diagnostic: what the wakes cost without the consumers' reads; misses not measured)")
	writersSrc := fs.String("writers-sources", "", "override the writers scenario's wake sources (none,trigger,throttled,relay)")
	relayArgs := fs.String("relay-args", "", "extra flags for `listenhub relay` in the writers scenario (e.g. \"--window 1ms\")")
	relayBin := fs.String("relay-bin", "", "run `relay` from this listenhub binary (default: the hub's)")
	cpus := fs.Int("cpus", 0, "pin every server process to this many cores (taskset -c 0..N-1; 0: no pinning)")
	channelsN := fs.String("channels", "", "override the many-channels scenario's channel counts (e.g. 1000,50000)")
	systems := fs.String("systems", "", "comma-separated systems (default direct,hub,gohub,gnet; --quick leaves out gnet; also hub-wt1 and hub-wt2: the hub with --write-threads 1 or 2, hub-poll: the hub built with -tags listenhub_poll, hublib)")
	hubBin := fs.String("hub-bin", "", "use this listenhub binary instead of building ../cmd/listenhub")
	dbURL := fs.String("database-url", "", "use this PostgreSQL instead of a throwaway one (max_connections must allow 1,000 listeners)")
	keep := fs.Bool("keep", false, "keep the temp dir (server logs)")
	nList := fs.String("n", "", "override the paced and saturation N list (e.g. 1,8,1x256; 1xN = one process holding N; PxC = P processes holding C each, e.g. 16x64), for development")
	churnProcs := fs.Int("churn-procs", 0, "override the number of churn processes")
	churnRate := fs.Float64("churn-rate", -1, "override the offered churn cycles/s (0: as fast as possible)")
	fs.Float64Var(&ratePerNotifier, "rate-per-notifier", ratePerNotifier, "paced NOTIFY/s per notifier connection")
	guard := fs.Float64("guard", 0, "fail unless the hub's paced CPU/delivery at N >= 64 is within this multiple of gohub's in the same run, with nothing lost (CI's check that the epoll path did not get slower; 0: off)")
	fs.Parse(args)

	p := fullParams()
	if *quick {
		p = quickParams()
	}
	p.CPUs = *cpus
	if *writersW != "" {
		p.WritersW = nil
		for _, s := range strings.Split(*writersW, ",") {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return fmt.Errorf("--writers: bad count %q", s)
			}
			p.WritersW = append(p.WritersW, n)
		}
	}
	if *writersDur > 0 {
		p.WritersDur = *writersDur
	}
	if *writersRounds > 0 {
		p.WritersRounds = *writersRounds
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "writers-workers" {
			p.WritersWorkers = *writersWorkers
		}
	})
	if p.WritersWorkers < 0 {
		return fmt.Errorf("--writers-workers: bad count %d", p.WritersWorkers)
	}
	p.WritersNoReread = *writersNoReread
	if *writersSrc != "" {
		p.WritersSources = strings.Split(*writersSrc, ",")
		for _, s := range p.WritersSources {
			if !slices.Contains(writersSources, s) {
				return fmt.Errorf("--writers-sources: unknown source %q", s)
			}
		}
	}
	p.WritersRelayArgs = *relayArgs
	if *channelsN != "" {
		p.ChannelsN = nil
		for _, s := range strings.Split(*channelsN, ",") {
			n, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("--channels: %w", err)
			}
			p.ChannelsN = append(p.ChannelsN, n)
		}
	}
	if *cpus > 0 {
		if _, err := exec.LookPath("taskset"); err != nil {
			return fmt.Errorf("--cpus needs taskset (util-linux): %w", err)
		}
		if *cpus > runtime.NumCPU() {
			return fmt.Errorf("--cpus %d: the machine has %d", *cpus, runtime.NumCPU())
		}
	}
	if *churnRate >= 0 {
		p.ChurnCycleRate = *churnRate
	}
	if *churnProcs > 0 {
		p.ChurnProcs = *churnProcs
	}
	if *systems == "" {
		*systems = "direct,hub,gohub,gnet"
		if *quick {
			*systems = "direct,hub,gohub"
		}
	}
	if *nList != "" {
		p.PacedN, p.SatN, p.CensusN, p.OneProcN = nil, nil, nil, 0
		p.SatOneProc, p.SatOneProcN = false, nil
		for _, s := range strings.Split(*nList, ",") {
			if ps, cs, ok := strings.Cut(s, "x"); ok && ps != "1" { // P processes holding C sockets each
				np, err1 := strconv.Atoi(ps)
				nc, err2 := strconv.Atoi(cs)
				if err1 != nil || err2 != nil || np < 1 || nc < 1 {
					return fmt.Errorf("--n: bad layout %q (want PxC)", s)
				}
				p.Layouts = append(p.Layouts, layout{Procs: np, ConnsPerProc: nc})
				continue
			}
			if v, ok := strings.CutPrefix(s, "1x"); ok { // one process holding v sockets
				n, err := strconv.Atoi(v)
				if err != nil {
					return fmt.Errorf("--n: %w", err)
				}
				p.OneProcN, p.SatOneProc, p.SatOneProcN = n, true, []int{n}
				continue
			}
			n, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("--n: %w", err)
			}
			p.PacedN = append(p.PacedN, n)
			p.SatN = append(p.SatN, n)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	raiseNofile()

	dir, err := os.MkdirTemp("", "lhbench-")
	if err != nil {
		return err
	}
	if !*keep {
		defer os.RemoveAll(dir)
	} else {
		defer fmt.Printf("logs kept in %s\n", dir)
	}
	start := time.Now()
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}
	b := &bench{ctx: ctx, p: p, dir: dir, logf: logf, drainWait: 3 * time.Second, relayBin: *relayBin}
	b.res = &Results{Params: p, Started: start.UTC().Format(time.RFC3339)}

	pgVersion := ""
	if *dbURL == "" {
		cl, err := startCluster(ctx, 1100, false, false, logf)
		if err != nil {
			return err
		}
		defer cl.Close()
		b.dbURL = cl.URL()
		pgVersion = cl.Version()
	} else {
		b.dbURL, b.external = *dbURL, true
	}
	cfg, err := pgx.ParseConfig(b.dbURL)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = "lhbench-harness"
	if b.db, err = pgx.ConnectConfig(ctx, cfg); err != nil {
		return err
	}
	defer b.db.Close(context.Background())
	var serverVersion string
	b.db.QueryRow(ctx, "show server_version").Scan(&serverVersion)
	var maxConn int
	b.db.QueryRow(ctx, "select setting::int from pg_settings where name='max_connections'").Scan(&maxConn)
	if pgVersion == "" {
		pgVersion = "PostgreSQL " + serverVersion
	}
	b.res.Machine = machineInfo(pgVersion, maxConn)
	if b.nt, err = newNotifier(ctx, b.dbURL, 1); err != nil {
		return err
	}
	defer b.nt.close()

	self, _ := os.Executable()
	var builtHub string
	for _, name := range strings.Split(*systems, ",") {
		s := &system{name: name, dbURL: b.dbURL, cpus: p.CPUs}
		switch name {
		case "direct":
			s.direct, s.appName = true, directAppName
		case "hub-poll":
			// The hub built with -tags listenhub_poll: the poll(2) loop
			// of macOS and FreeBSD, measured on Linux against epoll.
			logf("building ../cmd/listenhub -tags listenhub_poll")
			bin, err := buildHub(ctx, dir, "listenhub-poll", "-tags", "listenhub_poll")
			if err != nil {
				return fmt.Errorf("hub-poll: %w", err)
			}
			s.argv, s.appName = []string{bin, "serve", "--log-level", "warn"}, "listenhub"
		case "hub", "hub-wt1", "hub-wt2":
			bin := *hubBin
			if bin == "" && builtHub == "" {
				logf("building ../cmd/listenhub")
				if builtHub, err = buildHub(ctx, dir, "listenhub"); err != nil {
					logf("hub: not available, its rows are skipped: %v", err)
					b.res.Notes = append(b.res.Notes, "hub not measured: "+err.Error())
					continue
				}
			}
			if bin == "" {
				bin = builtHub
			}
			s.argv, s.appName = []string{bin, "serve", "--log-level", "warn"}, "listenhub"
			if name == "hub-wt1" {
				// Every write on the loop's thread: what the parallel
				// fanout is measured against.
				s.argv = append(s.argv, "--write-threads", "1")
			}
			if name == "hub-wt2" {
				// The loop's thread and one helper, whatever the
				// default on this machine.
				s.argv = append(s.argv, "--write-threads", "2")
			}
		case "gohub":
			s.argv, s.appName = []string{self, "gohub"}, "lhbench-gohub"
		case "gnet":
			s.argv, s.appName = []string{self, "gnethub"}, "lhbench-gnet"
		case "hublib": // the hub package embedded in lhbench (for profiles: LHBENCH_CPUPROFILE)
			s.argv, s.appName = []string{self, "hublib"}, "listenhub"
		default:
			return fmt.Errorf("unknown system %q", name)
		}
		b.systems = append(b.systems, s)
	}
	for _, s := range b.systems {
		b.res.Systems = append(b.res.Systems, s.name)
	}
	logf("machine: %s", b.res.Machine)
	if hop, err := measureHop(1000, time.Millisecond); err == nil {
		b.res.Machine.UnixHop = hop
		logf("one-way Unix-socket hop to an idle process: p50 %.0fµs p99 %.0fµs", hop.P50, hop.P99)
	}

	scenarios := []struct {
		name string
		run  func() error
	}{
		{"census", b.census}, // census rows for N ≤ 256 come from the paced fleets
		{"paced", b.paced},
		{"saturation", b.saturation},
		{"churn", b.churn},
		{"idle", b.idle},
		{"wedged", b.wedged},
		{"channels", b.channelsScenario},
		{"writers", b.writersScenario},
	}
	want := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		if s != "" {
			want[s] = true
		}
	}
	if want["census"] {
		want["paced"] = true // the small-N census is taken on the paced fleets
	}
	for _, sc := range scenarios {
		if len(want) > 0 && !want[sc.name] {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		logf("== %s", sc.name)
		if err := sc.run(); err != nil {
			logf("%s: %v", sc.name, err)
			b.res.Notes = append(b.res.Notes, sc.name+": "+err.Error())
		}
		b.res.Durations = append(b.res.Durations, scenarioTime{sc.name, time.Since(t0).Round(100 * time.Millisecond).String()})
	}
	b.res.Machine.LoadEnd = loadavg()
	b.res.Elapsed = time.Since(start).Round(time.Second).String()
	b.res.Targets = evaluateListen(b.res, b.sys)
	b.res.TargetsScale = evaluateScale(b.res)
	b.res.TargetsWriters = evaluateWriters(b.res)
	printAll(os.Stdout, b.res)
	if *jsonOut != "" {
		out, _ := json.MarshalIndent(b.res, "", "  ")
		if err := os.WriteFile(*jsonOut, append(out, '\n'), 0o644); err != nil {
			return err
		}
		logf("wrote %s", *jsonOut)
	}
	if *mdOut != "" {
		var buf strings.Builder
		writeMarkdown(&buf, b.res)
		if err := os.WriteFile(*mdOut, []byte(buf.String()), 0o644); err != nil {
			return err
		}
		logf("wrote %s", *mdOut)
	}
	if *guard > 0 && ctx.Err() == nil {
		if err := guardPaced(b.res, *guard); err != nil {
			return err
		}
		logf("guard: the hub's paced CPU/delivery within %.2f× gohub's, nothing lost", *guard)
	}
	return ctx.Err()
}

// raiseNofile lifts RLIMIT_NOFILE to its hard limit; children inherit it
// (10,000 idle workers need 10,000 fds in the worker and in the hub).
func raiseNofile() {
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r) == nil && r.Cur < r.Max {
		r.Cur = r.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
	}
}

// Machine describes where the figures were measured.
type Machine struct {
	CPUs           int    `json:"nproc"`
	CPUModel       string `json:"cpu_model"`
	Kernel         string `json:"kernel"`
	Postgres       string `json:"postgres"`
	MaxConnections int    `json:"max_connections"`
	Go             string `json:"go"`
	LoadStart      string `json:"load_start"`
	LoadEnd        string `json:"load_end"`
	NofileLimit    uint64 `json:"nofile_limit"`
	// UnixHop is the one-way latency of an 8-byte write to an idle
	// process over a Unix socket, sent every 1 ms: what one extra hop costs.
	UnixHop hist.Summary `json:"unix_hop"`
}

func (m Machine) String() string {
	return fmt.Sprintf("%d × %s, Linux %s, %s (max_connections %d), %s, load %s",
		m.CPUs, m.CPUModel, m.Kernel, m.Postgres, m.MaxConnections, m.Go, m.LoadStart)
}

func machineInfo(pg string, maxConn int) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Postgres: pg, MaxConnections: maxConn, Go: runtime.Version(), LoadStart: loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if out, err := exec.Command("uname", "-r").Output(); err == nil {
		m.Kernel = strings.TrimSpace(string(out))
	}
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r) == nil {
		m.NofileLimit = r.Cur
	}
	return m
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return ""
}
