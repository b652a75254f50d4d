package pglisten

import (
	"context"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/loop"
)

// benchReceiver is a listener under benchmark: every notification bumps
// count and stores the time it reached the callback.
type benchReceiver struct {
	count atomic.Int64
	last  atomic.Int64 // UnixNano of the last callback
	// signal gets a token once count reaches want (non-blocking send):
	// the benchmark blocks on it instead of spinning, which on a small
	// machine would steal the core the listener needs.
	want   atomic.Int64
	signal chan struct{}
	close  func()
	// watchdog bounds each wait; one timer, reset per wait, so that the
	// benchmark's own allocations stay out of allocs/op.
	watchdog *time.Timer
}

func newBenchReceiver() *benchReceiver {
	return &benchReceiver{signal: make(chan struct{}, 1), watchdog: time.NewTimer(time.Hour)}
}

func (r *benchReceiver) got() {
	r.last.Store(time.Now().UnixNano())
	if r.count.Add(1) == r.want.Load() {
		select {
		case r.signal <- struct{}{}:
		default:
		}
	}
}

// arm makes the callback signal once count has grown by n; wait blocks for
// that signal.
func (r *benchReceiver) arm(n int64) {
	r.want.Store(r.count.Load() + n)
	r.watchdog.Reset(10 * time.Second)
}

func (r *benchReceiver) wait(b *testing.B) {
	select {
	case <-r.signal:
	case <-r.watchdog.C:
		b.Fatalf("timed out: %d of %d notifications", r.count.Load(), r.want.Load())
	}
}

// openLoopReceiver runs a Conn on its own loop, LISTENing to ch.
func openLoopReceiver(b *testing.B, url, ch string) *benchReceiver {
	b.Helper()
	r := newBenchReceiver()
	cc := mustParseConfig(b, url, "lh-bench")
	l, err := loop.New(loop.Options{})
	if err != nil {
		b.Fatal(err)
	}
	go l.Run()
	c, err := Open(context.Background(), l, Config{ConnConfig: cc, Logger: testLogger(),
		OnNotification: func(_, _ []byte) { r.got() }})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	l.Post(func() { c.Listen(ch, func(err error) { done <- err }) })
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	r.close = func() {
		closed := make(chan struct{})
		l.Post(func() { c.Close(func() { close(closed) }) })
		<-closed
		l.Stop()
		<-l.Done()
	}
	return r
}

// openPgxReceiver is the baseline: pgconn (what pgx.Conn wraps) blocked in
// WaitForNotification on a goroutine.
func openPgxReceiver(b *testing.B, url, ch string) *benchReceiver {
	b.Helper()
	r := newBenchReceiver()
	cc := mustParseConfig(b, url, "lh-bench-pgx")
	cc.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { r.got() }
	pc, err := pgconn.ConnectConfig(context.Background(), cc)
	if err != nil {
		b.Fatal(err)
	}
	if err := pc.Exec(context.Background(), "LISTEN "+QuoteIdentifier(ch)).Close(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for pc.WaitForNotification(ctx) == nil {
		}
	}()
	r.close = func() {
		cancel()
		<-stopped
		pc.Close(context.Background())
	}
	return r
}

func openPlainReceiver(b *testing.B, url, ch string) *benchReceiver {
	b.Helper()
	r := newBenchReceiver()
	cc := mustParseConfig(b, url, "lh-bench-plain")
	p, err := NewPlain(context.Background(), PlainConfig{ConnConfig: cc, Logger: testLogger(),
		OnNotification: func(_, _ string) { r.got() }})
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Listen(context.Background(), ch); err != nil {
		b.Fatal(err)
	}
	r.close = func() { p.Close() }
	return r
}

type receiverKind struct {
	name string
	url  func() string
	open func(*testing.B, string, string) *benchReceiver
}

func receiverKinds() []receiverKind {
	ks := []receiverKind{
		{"rawfd-tcp", db.URL, openLoopReceiver},
		{"rawfd-unix", db.SocketURL, openLoopReceiver},
		{"pgx-WaitForNotification-tcp", db.URL, openPgxReceiver},
		{"pgx-WaitForNotification-unix", db.SocketURL, openPgxReceiver},
		{"plain-tcp", db.URL, openPlainReceiver},
	}
	if db.TLSURL() != "" {
		ks = append(ks, receiverKind{"tls-bridge", db.TLSURL, openLoopReceiver})
	}
	return ks
}

func notifier(b *testing.B) *pgconn.PgConn {
	b.Helper()
	cc, err := pgconn.ParseConfig(db.URL())
	if err != nil {
		b.Fatal(err)
	}
	pc, err := pgconn.ConnectConfig(context.Background(), cc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pc.Close(context.Background()) })
	return pc
}

// BenchmarkNotifyLatency measures NOTIFY → callback: from just before the
// NOTIFY is sent (simple protocol, its own connection) to the moment the
// listener's callback runs, one notification at a time. Reported: p50 and
// p99 in µs, and allocs/op of the whole process (notifier included; see
// BenchmarkNotifyThroughput for the listener's share).
func BenchmarkNotifyLatency(b *testing.B) {
	b.Run("interleaved-rawfd-vs-pgx-tcp", benchInterleaved)
	for _, k := range receiverKinds() {
		b.Run(k.name, func(b *testing.B) {
			n := notifier(b)
			r := k.open(b, k.url(), "bench_latency")
			defer r.close()
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r.arm(1)
				t0 := time.Now()
				if err := n.Exec(ctx, "NOTIFY bench_latency, 'x'").Close(); err != nil {
					b.Fatal(err)
				}
				r.wait(b)
				lat = append(lat, time.Duration(r.last.Load()-t0.UnixNano()))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}

// BenchmarkNotifyThroughput: each op is one transaction sending 1,000
// notifications (so the notifier's own allocations are amortised away);
// reported per notification: wall ns, CPU ns of this process (user+sys:
// the listener's cost, plus the notifier's amortised share) and allocations.
func BenchmarkNotifyThroughput(b *testing.B) {
	const per = 1000
	for _, k := range receiverKinds() {
		b.Run(k.name, func(b *testing.B) {
			n := notifier(b)
			r := k.open(b, k.url(), "bench_tp")
			defer r.close()
			ctx := context.Background()
			var ms0, ms1 runtime.MemStats
			var ru0, ru1 syscall.Rusage
			runtime.GC()
			runtime.ReadMemStats(&ms0)
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r.arm(per)
				if err := n.Exec(ctx, "SELECT pg_notify('bench_tp', 'payload-' || g) FROM generate_series(1, 1000) g").Close(); err != nil {
					b.Fatal(err)
				}
				r.wait(b)
			}
			b.StopTimer()
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
			runtime.ReadMemStats(&ms1)
			total := float64(b.N * per)
			cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/total, "allocs/notification")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/notification")
			b.ReportMetric(float64(cpu.Nanoseconds())/total, "cpu-ns/notification")
		})
	}
}

// benchInterleaved is the head-to-head: the raw-fd Conn and
// pgx's WaitForNotification listen at the same time, over TCP, each to its
// own channel, and the NOTIFYs alternate between them, so that both paths
// see the same machine (on a shared box the load changes from one
// sub-benchmark to the next). Each op is one NOTIFY to each.
func benchInterleaved(b *testing.B) {
	n := notifier(b)
	raw := openLoopReceiver(b, db.URL(), "bench_il_raw")
	defer raw.close()
	pgx := openPgxReceiver(b, db.URL(), "bench_il_pgx")
	defer pgx.close()
	ctx := context.Background()
	measure := func(r *benchReceiver, sql string) time.Duration {
		r.arm(1)
		t0 := time.Now()
		if err := n.Exec(ctx, sql).Close(); err != nil {
			b.Fatal(err)
		}
		r.wait(b)
		return time.Duration(r.last.Load() - t0.UnixNano())
	}
	var lraw, lpgx []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			lraw = append(lraw, measure(raw, "NOTIFY bench_il_raw, 'x'"))
			lpgx = append(lpgx, measure(pgx, "NOTIFY bench_il_pgx, 'x'"))
		} else {
			lpgx = append(lpgx, measure(pgx, "NOTIFY bench_il_pgx, 'x'"))
			lraw = append(lraw, measure(raw, "NOTIFY bench_il_raw, 'x'"))
		}
	}
	b.StopTimer()
	for _, m := range []struct {
		name string
		l    []time.Duration
	}{{"rawfd", lraw}, {"pgx", lpgx}} {
		slices.Sort(m.l)
		b.ReportMetric(float64(m.l[len(m.l)/2].Nanoseconds())/1e3, m.name+"-p50-µs")
		b.ReportMetric(float64(m.l[len(m.l)*99/100].Nanoseconds())/1e3, m.name+"-p99-µs")
	}
}
