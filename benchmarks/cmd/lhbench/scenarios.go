package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/benchmarks/internal/hist"
)

// Results is everything one run measured; it is the --json output.
type Results struct {
	Started      string        `json:"started"`
	Elapsed      string        `json:"elapsed"`
	Machine      Machine       `json:"machine"`
	Params       params        `json:"params"`
	Systems      []string      `json:"systems"`
	Census       []CensusRow   `json:"census"`
	Paced        []LatencyRow  `json:"paced"`
	Saturation   []SatRow      `json:"saturation"`
	Churn        []ChurnRow    `json:"churn"`
	Idle         []IdleRow     `json:"idle"`
	Wedged       []WedgedRow   `json:"wedged"`
	Channels     []ChannelsRow `json:"channels,omitempty"`
	Targets      []Target      `json:"targets"`
	TargetsScale []Target      `json:"targets_scale,omitempty"`
	Writers      []WritersRow  `json:"writers,omitempty"`
	// WritersInfo is the writers scenario's set-up (nil when it did not run).
	WritersInfo    *WritersInfo   `json:"writers_info,omitempty"`
	TargetsWriters []Target       `json:"targets_writers,omitempty"`
	Notes          []string       `json:"notes,omitempty"`
	Durations      []scenarioTime `json:"durations"`
}

type scenarioTime struct {
	Scenario string `json:"scenario"`
	Took     string `json:"took"`
}

type CensusRow struct {
	System   string `json:"system"`
	N        int    `json:"n"`
	Layout   layout `json:"layout"`
	Backends int    `json:"backends"`
	Err      string `json:"error,omitempty"`
}

type LatencyRow struct {
	System  string       `json:"system"`
	N       int          `json:"n"`
	Layout  layout       `json:"layout"`
	Rate    float64      `json:"rate_per_s"`
	Sent    int          `json:"sent"`
	Recv    uint64       `json:"recv"`
	Lost    uint64       `json:"lost_live"`
	Evicted int          `json:"evicted"`
	Lat     hist.Summary `json:"latency"`
	CPU     float64      `json:"server_cpu_s"`     // hub process CPU during the run (0 for direct)
	CPUSys  float64      `json:"server_cpu_sys_s"` // the kernel's part of it
	// Rounds is the number of interleaved runs pooled in Lat; RoundP99
	// the p99 of each.
	Rounds   int       `json:"rounds,omitempty"`
	RoundP99 []float64 `json:"round_p99_us,omitempty"`
	Err      string    `json:"error,omitempty"`
}

type SatRow struct {
	System          string       `json:"system"`
	N               int          `json:"n"`
	Layout          layout       `json:"layout"`
	NotifyPerSec    float64      `json:"notify_per_s"`
	DeliveriesPerS  float64      `json:"deliveries_per_s"`
	Sent            int          `json:"sent"`
	Recv            uint64       `json:"recv"`
	LostLive        uint64       `json:"lost_live"`
	LostEvicted     uint64       `json:"lost_evicted"`
	Evicted         int          `json:"evicted"`
	Lat             hist.Summary `json:"latency"`
	SustainedRate   float64      `json:"sustained_rate_per_s"`
	SustainedDeliv  float64      `json:"sustained_deliveries_per_s"`
	SustainedLat    hist.Summary `json:"sustained_latency"`
	SustainedLimit  string       `json:"sustained_limited_by"`
	SearchSteps     []SearchStep `json:"search_steps"`
	Err             string       `json:"error,omitempty"`
	NotifyErrors    int          `json:"notify_errors"`
	SustainedTested bool         `json:"sustained_tested"`
	CPU             float64      `json:"server_cpu_s"`           // hub process CPU during the flood
	CPUPerDelivery  float64      `json:"server_ns_per_delivery"` // that CPU over the deliveries
}

type SearchStep struct {
	Rate     float64 `json:"rate"`
	Achieved float64 `json:"achieved"`
	P99      float64 `json:"p99_us"`
	Evicted  int     `json:"evicted"`
	Lost     uint64  `json:"lost"`
	Pass     bool    `json:"pass"`
	// CPU seconds used during the step by the server and by all workers.
	ServerCPU float64 `json:"server_cpu_s"`
	WorkerCPU float64 `json:"worker_cpu_s"`
	Why       string  `json:"why,omitempty"`
}

type ChurnRow struct {
	System     string       `json:"system"`
	Cycles     int          `json:"cycles"`
	Procs      int          `json:"procs"`
	Seconds    float64      `json:"seconds"`
	CyclesPerS float64      `json:"cycles_per_s"`
	Errors     int          `json:"errors"`
	FirstError string       `json:"first_error,omitempty"`
	FDBefore   int          `json:"fd_before"`
	FDAfter    int          `json:"fd_after"`
	RSSBefore  int64        `json:"rss_before"`
	RSSAfter1s int64        `json:"rss_after_1s"`
	RSSRounds  []int64      `json:"rss_after_each_fifth"` // RSS after each fifth of the cycles
	RSSAfter   int64        `json:"rss_after"`            // 5 s after the churn
	Idle       hist.Summary `json:"steady_idle"`
	During     hist.Summary `json:"steady_during"`
	// The same NOTIFYs to a direct LISTEN worker, idle and during the churn.
	ControlIdle   hist.Summary `json:"control_direct_idle"`
	ControlDuring hist.Summary `json:"control_direct_during"`
	SteadyLost    uint64       `json:"steady_lost"`
	Err           string       `json:"error,omitempty"`
}

type IdleRow struct {
	System    string  `json:"system"`
	N         int     `json:"n"`
	RSSBase   int64   `json:"rss_base"`
	RSSIdle   int64   `json:"rss_idle"`
	PerWorker float64 `json:"bytes_per_worker"`
	FDs       int     `json:"fds"`
	// Go heap (HeapAlloc) and goroutine stacks (StackInuse) per worker,
	// after a forced GC: for the servers that can be asked (not the
	// listenhub binary; "hub (lib)" is the same package embedded).
	HeapPerWorker  float64 `json:"heap_bytes_per_worker,omitempty"`
	StackPerWorker float64 `json:"stack_bytes_per_worker,omitempty"`
	Goroutines     int     `json:"goroutines,omitempty"`
	Err            string  `json:"error,omitempty"`
}

type WedgedRow struct {
	System        string       `json:"system"`
	N             int          `json:"n"`
	Rate          float64      `json:"rate_per_s"`
	PayloadBytes  int          `json:"payload_bytes"`
	Without       hist.Summary `json:"siblings_without"`
	With          hist.Summary `json:"siblings_with"`
	SiblingsLost  uint64       `json:"siblings_lost"`
	SiblingsEvict int          `json:"siblings_evicted"`
	WedgedEvicted bool         `json:"wedged_evicted"`
	WedgedRecv    uint64       `json:"wedged_recv"`
	Err           string       `json:"error,omitempty"`
}

// ---- helpers

// withServer starts sys, runs f, stops sys.
func (b *bench) withServer(sys *system, f func() error) error {
	if err := sys.start(b.dir); err != nil {
		return err
	}
	defer sys.stop()
	return f()
}

// otherBackends counts client backends that are not the harness's own.
func (b *bench) otherBackends() (int, error) {
	var n int
	err := b.db.QueryRow(b.ctx, `select count(*) from pg_stat_activity
		where backend_type = 'client backend' and pid <> pg_backend_pid()
		and coalesce(application_name, '') not in ('lhbench-harness', 'lhbench-notifier')`).Scan(&n)
	return n, err
}

// waitBackends waits until at most n foreign backends are left (the last
// system's backends exit asynchronously after their clients close).
func (b *bench) waitBackends(n int) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := b.otherBackends(); err != nil || c <= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pacedRun runs one paced measurement on f and merges the reports.
func (b *bench) pacedRun(f *fleet, channel string, rate float64, dur time.Duration, pad int) (sendResult, []report, error) {
	id := b.nextRun()
	if err := f.begin(id); err != nil {
		return sendResult{}, nil, err
	}
	conns := int(math.Ceil(rate / ratePerNotifier))
	sr, err := b.nt.paced(b.ctx, channel, id, rate, dur, min(max(conns, 1), 8), pad)
	if err != nil {
		return sr, nil, err
	}
	reps, err := f.reports(sr.Sent, b.drainWait)
	return sr, reps, err
}

func latencyRow(sys *system, n int, l layout, rate float64, sr sendResult, m merged) LatencyRow {
	return LatencyRow{System: sys.name, N: n, Layout: l, Rate: rate, Sent: sr.Sent, Recv: m.Recv, Lost: m.LostLive, Evicted: m.EOF, Lat: m.h.Summarize()}
}

// ---- census and paced latency

func (b *bench) census() error {
	for _, n := range b.p.CensusN {
		l := layout{Procs: b.p.BigCensusProcs, ConnsPerProc: n / b.p.BigCensusProcs}
		for _, sys := range b.systems {
			row := CensusRow{System: sys.name, N: l.total(), Layout: l}
			b.waitBackends(0)
			err := b.withServer(sys, func() error {
				f, err := startFleet(sys, "census", l, 120*time.Second)
				if err != nil {
					return err
				}
				defer f.stop()
				row.Backends, err = b.otherBackends()
				return err
			})
			if err != nil {
				row.Err = err.Error()
			}
			b.logf("census %s N=%d (%s): %d backends %s", sys.name, row.N, l, row.Backends, row.Err)
			b.res.Census = append(b.res.Census, row)
		}
	}
	return nil
}

func (b *bench) paced() error {
	type job struct {
		n int
		l layout
	}
	var jobs []job
	for _, n := range b.p.PacedN {
		jobs = append(jobs, job{n, layout{Procs: n, ConnsPerProc: 1}})
	}
	if b.p.OneProcN > 0 {
		jobs = append(jobs, job{b.p.OneProcN, layout{Procs: 1, ConnsPerProc: b.p.OneProcN}})
	}
	for _, l := range b.p.Layouts {
		jobs = append(jobs, job{l.total(), l})
	}
	for _, j := range jobs {
		// Large N is noisy on 2 cores (one stall delays all N receipts of
		// a NOTIFY): it runs in interleaved rounds (hub, gohub, …, hub,
		// gohub, …) whose histograms are pooled, so that a passing
		// disturbance does not land on one system only.
		rounds, dur := 1, b.p.PacedDur
		if j.n >= 64 && b.p.PacedRounds > 1 {
			rounds, dur = b.p.PacedRounds, b.p.PacedRoundDur
		}
		rows := make([]LatencyRow, len(b.systems))
		hs := make([]merged, len(b.systems))
		p99s := make([][]float64, len(b.systems))
		crows := make([]CensusRow, len(b.systems))
		for round := range rounds {
			for si, sys := range b.systems {
				if rows[si].Err != "" {
					continue
				}
				b.waitBackends(0)
				crow := CensusRow{System: sys.name, N: j.n, Layout: j.l}
				var sr sendResult
				var m merged
				var cpu, cpuSys float64
				err := b.withServer(sys, func() error {
					f, err := startFleet(sys, "paced", j.l, 60*time.Second)
					if err != nil {
						return err
					}
					b.logf("  %s: %s subscribed in %v", sys.name, j.l, f.startTime.Round(time.Millisecond))
					defer f.stop()
					if crow.Backends, err = b.otherBackends(); err != nil {
						return err
					}
					u0, s0 := procCPUSplit(sys.serverPID())
					var reps []report
					sr, reps, err = b.pacedRun(f, "paced", 100, dur, 0)
					if err != nil {
						return err
					}
					m = merge(reps)
					u1, s1 := procCPUSplit(sys.serverPID())
					cpu, cpuSys = (u1 + s1 - u0 - s0).Seconds(), (s1 - s0).Seconds()
					return nil
				})
				if err != nil {
					rows[si] = LatencyRow{System: sys.name, N: j.n, Layout: j.l, Rate: 100, Err: err.Error()}
					crow.Err = err.Error()
				} else {
					r := latencyRow(sys, j.n, j.l, 100, sr, m)
					p99s[si] = append(p99s[si], r.Lat.P99)
					b.logf("paced %s N=%d (%s) round %d: p50 %.0fµs p99 %.0fµs max %.0fµs lost %d evicted %d; %d backends",
						sys.name, j.n, j.l, round+1, r.Lat.P50, r.Lat.P99, r.Lat.Max, r.Lost, r.Evicted, crow.Backends)
					hs[si].h.Merge(&m.h)
					rows[si].Sent += r.Sent
					rows[si].Recv += r.Recv
					rows[si].Lost += r.Lost
					rows[si].Evicted += r.Evicted
					rows[si].CPU += cpu
					rows[si].CPUSys += cpuSys
				}
				if round == 0 {
					crows[si] = crow
				}
			}
		}
		for si, sys := range b.systems {
			row := rows[si]
			if row.Err == "" {
				row.System, row.N, row.Layout, row.Rate = sys.name, j.n, j.l, 100
				row.Lat = hs[si].h.Summarize()
				row.Rounds = rounds
				row.RoundP99 = p99s[si]
			}
			b.res.Paced = append(b.res.Paced, row)
			if j.l.ConnsPerProc == 1 {
				b.res.Census = append(b.res.Census, crows[si])
			}
		}
	}
	return nil
}

// ---- saturation

func (b *bench) saturation() error {
	var layouts []layout
	for _, n := range b.p.SatN {
		layouts = append(layouts, layout{Procs: n, ConnsPerProc: 1})
	}
	if b.p.SatOneProc {
		for _, n := range b.p.SatOneProcN {
			layouts = append(layouts, layout{Procs: 1, ConnsPerProc: n})
		}
	}
	layouts = append(layouts, b.p.Layouts...)
	for _, l := range layouts {
		for _, sys := range b.systems {
			b.waitBackends(0)
			row := SatRow{System: sys.name, N: l.total(), Layout: l}
			if err := b.saturate(sys, l, &row); err != nil {
				row.Err = err.Error()
			}
			b.logf("saturation %s N=%d (%s): %.0f NOTIFY/s, %.0f deliveries/s, lost %d+%d, evicted %d, p99 %.0fµs; sustained %.0f/s (%.0f deliveries/s, p99 %.0fµs) %s",
				sys.name, row.N, l, row.NotifyPerSec, row.DeliveriesPerS, row.LostLive, row.LostEvicted, row.Evicted, row.Lat.P99,
				row.SustainedRate, row.SustainedDeliv, row.SustainedLat.P99, row.Err)
			b.res.Saturation = append(b.res.Saturation, row)
		}
	}
	return nil
}

func (b *bench) saturate(sys *system, l layout, row *SatRow) error {
	if err := sys.start(b.dir); err != nil {
		return err
	}
	defer sys.stop()
	f, err := startFleet(sys, "sat", l, 60*time.Second)
	if err != nil {
		return err
	}
	defer func() { f.stop() }()
	id := b.nextRun()
	if err := f.begin(id); err != nil {
		return err
	}
	cpu0 := procCPU(sys.serverPID())
	sr, err := b.nt.flood(b.ctx, "sat", id, b.p.FloodDur)
	if err != nil {
		return err
	}
	reps, err := f.reports(sr.Sent, 6*time.Second)
	if err != nil {
		return err
	}
	row.CPU = (procCPU(sys.serverPID()) - cpu0).Seconds()
	m := merge(reps)
	row.Sent, row.Recv, row.LostLive, row.LostEvicted, row.Evicted = sr.Sent, m.Recv, m.LostLive, m.LostEvicted, m.EOF
	row.NotifyErrors = sr.Errors
	row.NotifyPerSec = sr.rate()
	if m.Last > sr.Start {
		row.DeliveriesPerS = float64(m.Recv) / (float64(m.Last-sr.Start) / 1e9)
	}
	row.Lat = m.h.Summarize()
	if m.Recv > 0 {
		row.CPUPerDelivery = row.CPU * 1e9 / float64(m.Recv)
	}

	// The highest paced rate with zero evictions, no loss and p99 under
	// 10 ms.
	restart := func() error {
		if err := f.reconnect(); err == nil {
			return nil
		}
		f.stop()
		sys.stop()
		b.waitBackends(0)
		if err := sys.start(b.dir); err != nil {
			return err
		}
		f, err = startFleet(sys, "sat", l, 60*time.Second)
		return err
	}
	if m.EOF > 0 {
		if err := restart(); err != nil {
			return err
		}
	}
	// Log-space bisection between top/1000 and top. top is twice the flood
	// rate: the flood uses one connection (its rate is bound by that
	// connection's round trips), the paced notifier spreads its schedule
	// over several, so a hub may sustain more than the flood offered.
	top := 2 * row.NotifyPerSec
	lo, hi := max(top/1000, 20), top
	var best *SearchStep
	var bestLat hist.Summary
	var fails []SearchStep // final verdicts of failing rates
	retries := 2           // a failing rate is tried once more (a passing disturbance on 2 shared cores is not the system's limit)
	for step := 0; step < b.p.SearchSteps; step++ {
		rate := math.Sqrt(lo * hi)
		var s SearchStep
		var m merged
		for attempt := 0; ; attempt++ {
			c0, w0 := procCPU(sys.serverPID()), f.cpu()
			sr, reps, err := b.pacedRun(f, "sat", rate, b.p.SearchDur, 0)
			if err != nil {
				return err
			}
			m = merge(reps)
			s = SearchStep{Rate: math.Round(rate), Achieved: math.Round(sr.rate()), P99: m.h.Summarize().P99, Evicted: m.EOF, Lost: m.LostLive,
				ServerCPU: (procCPU(sys.serverPID()) - c0).Seconds(), WorkerCPU: (f.cpu() - w0).Seconds()}
			switch {
			case m.EOF > 0:
				s.Why = "evictions"
			case m.LostLive > 0:
				s.Why = "loss"
			case s.P99 >= 10000:
				s.Why = "p99 ≥ 10 ms"
			case sr.rate() < 0.95*rate:
				s.Why = "notifier below target rate"
			default:
				s.Pass = true
			}
			if attempt > 0 {
				s.Why += " (retried)"
			}
			row.SearchSteps = append(row.SearchSteps, s)
			b.logf("  %s N=%d rate %.0f/s: achieved %.0f/s p99 %.0fµs evicted %d lost %d, CPU server %.2fs workers %.2fs → %v %s", sys.name, l.total(),
				s.Rate, s.Achieved, s.P99, s.Evicted, s.Lost, s.ServerCPU, s.WorkerCPU, s.Pass, s.Why)
			if m.EOF > 0 {
				if err := restart(); err != nil {
					return err
				}
			}
			if s.Pass || retries == 0 || attempt == 1 {
				break
			}
			retries--
		}
		if s.Pass {
			lo = rate
			if best == nil || rate > best.Rate {
				best, bestLat = &s, m.h.Summarize()
			}
		} else {
			hi = rate
			fails = append(fails, s)
		}
	}
	row.SustainedTested = true
	if best != nil {
		row.SustainedRate = best.Achieved
		row.SustainedDeliv = best.Achieved * float64(l.total())
		row.SustainedLat = bestLat
		row.SustainedLimit = "none below the flood rate (the notifier is the limit)"
		lowest := math.Inf(1)
		for _, st := range fails {
			if st.Rate > best.Rate && st.Rate < lowest {
				lowest = st.Rate
				row.SustainedLimit = fmt.Sprintf("%s at %.0f/s", st.Why, st.Rate)
			}
		}
	} else {
		row.SustainedLimit = fmt.Sprintf("no tested rate passed (lowest tried %.0f/s)", hiTried(row.SearchSteps))
	}
	return nil
}

// ---- churn

func (b *bench) churn() error {
	for _, sys := range b.systems {
		if sys.direct {
			continue // 100,000 backend forks are not a churn test of a hub
		}
		b.waitBackends(0)
		row := ChurnRow{System: sys.name, Cycles: b.p.ChurnCycles, Procs: b.p.ChurnProcs}
		if err := b.churnOne(sys, &row); err != nil {
			row.Err = err.Error()
		}
		b.logf("churn %s: %d cycles in %.1fs (%d errors %s), fds %d→%d, RSS %.1f→%.1f MB, steady p99 idle %.0fµs during %.0fµs %s",
			sys.name, row.Cycles, row.Seconds, row.Errors, row.FirstError, row.FDBefore, row.FDAfter,
			float64(row.RSSBefore)/1e6, float64(row.RSSAfter)/1e6, row.Idle.P99, row.During.P99, row.Err)
		b.res.Churn = append(b.res.Churn, row)
	}
	return nil
}

func (b *bench) churnOne(sys *system, row *ChurnRow) error {
	return b.withServer(sys, func() error {
		f, err := startFleet(sys, "churn", layout{Procs: 1, ConnsPerProc: 1}, 30*time.Second)
		if err != nil {
			return err
		}
		defer f.stop()
		// The control: a direct LISTEN worker on the same channel. The
		// churn processes take CPU from everyone on 2 cores; the control
		// shows how much of the steady worker's tail is that, not the hub.
		ctl, err := startFleet(&system{name: "direct", direct: true, dbURL: b.dbURL}, "churn", layout{Procs: 1, ConnsPerProc: 1}, 30*time.Second)
		if err != nil {
			return err
		}
		defer ctl.stop()
		id := b.nextRun()
		if err := f.begin(id); err != nil {
			return err
		}
		if err := ctl.begin(id); err != nil {
			return err
		}
		sr, err := b.nt.paced(b.ctx, "churn", id, b.p.ChurnRate, b.p.ChurnIdleDur, 1, 0)
		if err != nil {
			return err
		}
		reps, err := f.reports(sr.Sent, 5*time.Second)
		if err != nil {
			return err
		}
		creps, err := ctl.reports(sr.Sent, 5*time.Second)
		if err != nil {
			return err
		}
		m, cm := merge(reps), merge(creps)
		row.Idle, row.ControlIdle = m.h.Summarize(), cm.h.Summarize()
		pid := sys.serverPID()
		row.RSSBefore, row.FDBefore, err = procMem(pid)
		if err != nil {
			return err
		}

		// Paced wakes to the steady worker (and to every churner that is
		// subscribed at that moment) for as long as the churners run.
		id = b.nextRun()
		if err := f.begin(id); err != nil {
			return err
		}
		if err := ctl.begin(id); err != nil {
			return err
		}
		ctx, cancel := context.WithCancel(b.ctx)
		defer cancel()
		var done atomic.Bool
		var srErr error
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			sr, srErr = b.nt.pacedUntil(ctx, "churn", id, b.p.ChurnRate, &done)
		}()
		// Five rounds, RSS read after each: growth that stops after the
		// first round is the runtime sizing its heap; growth in every
		// round is a leak.
		const rounds = 5
		per := row.Cycles / row.Procs
		var procs []*proc
		defer func() {
			for _, p := range procs {
				p.stop()
			}
		}()
		for i := range row.Procs {
			p, err := startProc(nil, "churn", "--socket", sys.socket, "--cycles", strconv.Itoa(per), "--rounds", strconv.Itoa(rounds),
				"--rate", strconv.FormatFloat(b.p.ChurnCycleRate/float64(row.Procs), 'f', 0, 64),
				"--channel", "churn", "--offset", strconv.Itoa(i*3))
			if err != nil {
				done.Store(true)
				return err
			}
			procs = append(procs, p)
		}
		for round := range rounds {
			secs, errs, first := 0.0, 0, ""
			for _, p := range procs {
				line, err := p.recv(10 * time.Minute)
				if err != nil {
					done.Store(true)
					return err
				}
				var r struct {
					Cycles     int     `json:"cycles"`
					Errors     int     `json:"errors"`
					FirstError string  `json:"first_error"`
					Seconds    float64 `json:"seconds"`
				}
				if err := jsonUnmarshal(line, &r); err != nil {
					done.Store(true)
					return err
				}
				errs += r.Errors
				if first == "" {
					first = r.FirstError
				}
				secs = max(secs, r.Seconds)
			}
			row.Seconds, row.Errors, row.FirstError = secs, errs, first
			rss, _, _ := procMem(pid)
			row.RSSRounds = append(row.RSSRounds, rss)
			if round < rounds-1 {
				for _, p := range procs {
					p.send("next")
				}
			}
		}
		row.Cycles = per / rounds * rounds * row.Procs
		row.CyclesPerS = float64(row.Cycles) / row.Seconds
		done.Store(true)
		wg.Wait()
		if srErr != nil {
			return srErr
		}
		reps, err = f.reports(sr.Sent, 5*time.Second)
		if err != nil {
			return err
		}
		if creps, err = ctl.reports(sr.Sent, 5*time.Second); err != nil {
			return err
		}
		m, cm = merge(reps), merge(creps)
		row.During, row.ControlDuring = m.h.Summarize(), cm.h.Summarize()
		row.SteadyLost = m.LostLive + m.LostEvicted

		// The hub closes churned sockets asynchronously: wait (bounded)
		// for the fd count to come back, then let RSS settle.
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, fds, err := procMem(pid)
			if err != nil {
				return err
			}
			row.FDAfter = fds
			if fds <= row.FDBefore || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(time.Second)
		row.RSSAfter1s, row.FDAfter, err = procMem(pid)
		if err != nil {
			return err
		}
		// The Go runtime hands freed heap back to the kernel gradually
		// (the background scavenger): RSS is read again after 5 s and the
		// verdict uses that second reading; both are reported.
		time.Sleep(4 * time.Second)
		row.RSSAfter, row.FDAfter, err = procMem(pid)
		return err
	})
}

// ---- idle memory

func (b *bench) idle() error {
	var systems []*system
	for _, sys := range b.systems {
		if sys.direct {
			continue
		}
		if sys.name == "gohub" || sys.name == "gnet" {
			sys.memstats = filepath.Join(b.dir, sys.name+".memstats")
		}
		systems = append(systems, sys)
		if sys.name == "hub" {
			// The same hub package embedded in lhbench, for its Go heap
			// after a GC (the binary has no such hook).
			self, _ := os.Executable()
			systems = append(systems, &system{name: "hub (lib)", argv: []string{self, "hublib"}, dbURL: b.dbURL, appName: "listenhub",
				memstats: filepath.Join(b.dir, "hublib.memstats")})
		}
	}
	defer func() {
		for _, sys := range systems {
			if sys.name == "gohub" || sys.name == "gnet" {
				sys.memstats = ""
			}
		}
	}()
	for _, n := range b.p.IdleN {
		for _, sys := range systems {
			row := IdleRow{System: sys.name, N: n}
			err := b.withServer(sys, func() error {
				time.Sleep(300 * time.Millisecond)
				pid := sys.serverPID()
				var err error
				var h0 heapStats
				if sys.memstats != "" {
					if h0, err = sys.heap(0); err != nil {
						return err
					}
				}
				if row.RSSBase, _, err = procMem(pid); err != nil {
					return err
				}
				f, err := startFleet(sys, "idle", layout{Procs: 1, ConnsPerProc: n}, 120*time.Second)
				if err != nil {
					return err
				}
				defer f.stop()
				// Let the hub settle (status frames out, GC caught up).
				time.Sleep(1500 * time.Millisecond)
				if row.RSSIdle, row.FDs, err = procMem(pid); err != nil {
					return err
				}
				if sys.memstats != "" {
					h1, err := sys.heap(h0.Seq)
					if err != nil {
						return err
					}
					row.HeapPerWorker = (float64(h1.HeapAlloc) - float64(h0.HeapAlloc)) / float64(n)
					row.StackPerWorker = (float64(h1.StackInuse) - float64(h0.StackInuse)) / float64(n)
					row.Goroutines = h1.Goroutines
				}
				return nil
			})
			if err != nil {
				row.Err = err.Error()
			} else {
				row.PerWorker = float64(row.RSSIdle-row.RSSBase) / float64(n)
			}
			b.logf("idle %s N=%d: RSS %.1f → %.1f MB, %.0f B/worker (Go heap %.0f B, stacks %.0f B), %d fds %s", sys.name, n,
				float64(row.RSSBase)/1e6, float64(row.RSSIdle)/1e6, row.PerWorker, row.HeapPerWorker, row.StackPerWorker, row.FDs, row.Err)
			b.res.Idle = append(b.res.Idle, row)
		}
	}
	return nil
}

// ---- wedged worker

func (b *bench) wedged() error {
	for _, sys := range b.systems {
		if sys.direct {
			continue
		}
		row := WedgedRow{System: sys.name, N: b.p.WedgedN, Rate: b.p.WedgedRate, PayloadBytes: b.p.WedgedPad + 30}
		if err := b.wedgedOne(sys, &row); err != nil {
			row.Err = err.Error()
		}
		b.logf("wedged %s: siblings p99 %.0fµs without, %.0fµs with; wedged evicted %v (recv %d); siblings lost %d evicted %d %s",
			sys.name, row.Without.P99, row.With.P99, row.WedgedEvicted, row.WedgedRecv, row.SiblingsLost, row.SiblingsEvict, row.Err)
		b.res.Wedged = append(b.res.Wedged, row)
	}
	return nil
}

func (b *bench) wedgedOne(sys *system, row *WedgedRow) error {
	return b.withServer(sys, func() error {
		f, err := startFleet(sys, "wedged", layout{Procs: row.N, ConnsPerProc: 1}, 60*time.Second)
		if err != nil {
			return err
		}
		defer f.stop()
		_, reps, err := b.pacedRun(f, "wedged", row.Rate, b.p.WedgedDur, b.p.WedgedPad)
		if err != nil {
			return err
		}
		without := merge(reps[1:])
		row.Without = without.h.Summarize()

		id := b.nextRun()
		if err := f.begin(id); err != nil {
			return err
		}
		victim := f.procs[0].cmd.Process
		if err := victim.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		sr, err := b.nt.paced(b.ctx, "wedged", id, row.Rate, b.p.WedgedDur, 1, b.p.WedgedPad)
		victim.Signal(syscall.SIGCONT)
		if err != nil {
			return err
		}
		reps, err = f.reports(sr.Sent, 5*time.Second)
		if err != nil {
			return err
		}
		sib := merge(reps[1:])
		row.With = sib.h.Summarize()
		row.SiblingsLost = sib.LostLive + sib.LostEvicted
		row.SiblingsEvict = sib.EOF
		row.WedgedEvicted = reps[0].EOF == 1
		row.WedgedRecv = reps[0].Recv
		return nil
	})
}

func jsonUnmarshal(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("bad line %.100q: %w", b, err)
	}
	return nil
}

func hiTried(steps []SearchStep) float64 {
	low := math.Inf(1)
	for _, s := range steps {
		low = min(low, s.Rate)
	}
	return low
}

// ratePerNotifier is the paced rate one notifier connection is given; above
// it the schedule is split over more connections.
var ratePerNotifier = 2500.0
