// Package river_test measures River's job pick-up latency with its notifier
// going through the hub (integrations/riverhub) against River's own listener
// (riverpgxv5), in one run on one machine and one Postgres, the two
// interleaved job by job:
//
//	cd benchmarks && go test ./river/ -run '^$' -bench RiverPickup -benchtime 400x
//
// Each iteration inserts one job from an insert-only client (a session of
// its own) and waits until a worker River client has run it; the latency is
// insert call to Work, on this process's clock. The fetch poll is 20 s, so
// every pick-up is a woken one. Reported: p50 and p99 per system and the
// hub's over River's own as ratios.
package river_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/listenhub/listenhub/client"
	"github.com/listenhub/listenhub/integrations/riverhub"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/testutil"
)

// timedArgs carries its insert time.
type timedArgs struct {
	Inserted int64 `json:"inserted"`
}

func (timedArgs) Kind() string { return "lhbench_timed" }

type timedWorker struct {
	river.WorkerDefaults[timedArgs]
	took chan time.Duration
}

func (w *timedWorker) Work(_ context.Context, job *river.Job[timedArgs]) error {
	w.took <- time.Since(time.Unix(0, job.Args.Inserted))
	return nil
}

type system struct {
	name     string
	inserter *river.Client[pgx.Tx]
	worker   *timedWorker
	took     []time.Duration
}

func BenchmarkRiverPickup(b *testing.B) {
	ctx := context.Background()
	cluster, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	// Cleanups run last first: the River clients (added below) stop
	// before the hub, the hub before the cluster.
	b.Cleanup(func() { cluster.Close() })
	b.Cleanup(testutil.RemoveBinaries)
	bin := testutil.Binary(b, "github.com/listenhub/listenhub/cmd/listenhub")
	dir := b.TempDir()
	sock := filepath.Join(dir, "hub.sock")
	hub := exec.Command(bin, "serve", "--socket", sock, "--database-url", cluster.URL(), "--log-level", "warn")
	if err := hub.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { hub.Process.Signal(syscall.SIGTERM); hub.Wait() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := client.Dial(ctx, client.Options{SocketPath: sock}, client.Handlers{})
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the hub never served: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	pool := func(schema string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(cluster.URL())
		if err != nil {
			b.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
		return p
	}
	newSystem := func(name string, hubbed bool) *system {
		schema := "bench_" + name
		if _, err := pool("public").Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			b.Fatal(err)
		}
		m, err := rivermigrate.New(riverpgxv5.New(pool(schema)), &rivermigrate.Config{Schema: schema})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
			b.Fatal(err)
		}
		s := &system{name: name, worker: &timedWorker{took: make(chan time.Duration, 1)}}
		workers := river.NewWorkers()
		river.AddWorker(workers, s.worker)
		var wc *river.Client[pgx.Tx]
		cfg := &river.Config{
			Schema:            schema,
			Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
			Workers:           workers,
			FetchCooldown:     time.Millisecond,
			FetchPollInterval: 20 * time.Second,
		}
		if hubbed {
			wc, err = river.NewClient(riverhub.New(pool(schema), riverhub.Options{
				Failover: client.FailoverOptions{Hub: client.Options{SocketPath: sock}},
			}), cfg)
		} else {
			wc, err = river.NewClient(riverpgxv5.New(pool(schema)), cfg)
		}
		if err != nil {
			b.Fatal(err)
		}
		if err := wc.Start(ctx); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			wc.Stop(sctx)
		})
		s.inserter, err = river.NewClient(riverpgxv5.New(pool(schema)), &river.Config{Schema: schema, FetchCooldown: time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	systems := []*system{newSystem("riverpgxv5", false), newSystem("hub", true)}

	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		s := systems[i%2]
		if _, err := s.inserter.Insert(ctx, timedArgs{Inserted: time.Now().UnixNano()}, nil); err != nil {
			b.Fatal(err)
		}
		select {
		case d := <-s.worker.took:
			s.took = append(s.took, d)
		case <-time.After(10 * time.Second):
			b.Fatalf("%s: a job not run within 10s (the fetch poll is 20s: its wake was lost)", s.name)
		}
		// Past the 1 ms per-queue insert notify limit.
		time.Sleep(2 * time.Millisecond)
	}
	b.StopTimer()
	q := func(s *system, p float64) float64 {
		if len(s.took) == 0 {
			return 0
		}
		slices.Sort(s.took)
		return float64(s.took[min(len(s.took)-1, int(p*float64(len(s.took))))]) / float64(time.Millisecond)
	}
	base, hubbed := systems[0], systems[1]
	b.ReportMetric(q(base, 0.5), "riverpgxv5-p50-ms")
	b.ReportMetric(q(base, 0.99), "riverpgxv5-p99-ms")
	b.ReportMetric(q(hubbed, 0.5), "hub-p50-ms")
	b.ReportMetric(q(hubbed, 0.99), "hub-p99-ms")
	if q(base, 0.5) > 0 && q(base, 0.99) > 0 {
		b.ReportMetric(q(hubbed, 0.5)/q(base, 0.5), "p50-ratio")
		b.ReportMetric(q(hubbed, 0.99)/q(base, 0.99), "p99-ratio")
	}
	b.ReportMetric(0, "ns/op")
	if os.Getenv("LHBENCH_RIVER_LOG") != "" {
		b.Logf("%d jobs each", len(base.took))
	}
}
