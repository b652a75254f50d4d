// Command lhbench is listenhub's macro benchmark harness.
//
//	cd benchmarks && go run ./cmd/lhbench [--quick] [--json out.json]
//
// It starts a throwaway PostgreSQL, builds ../cmd/listenhub, starts each
// system under test (the hub, the goroutine-per-connection baseline, the
// gnet baseline, and direct per-worker LISTEN) and runs every scenario
// against all of them in the same run: census, paced latency, saturation,
// churn, idle memory, a wedged worker, many channels, and writers (what a
// wake source — trigger, throttled trigger, `listenhub relay` — costs the
// writers of pgmq queues; see writers.go). It prints tables and, with
// --json, writes every figure to a file. See docs/performance.md.
//
// The same binary is re-executed for its helper processes:
//
//	lhbench pg                                 a throwaway PostgreSQL until ^C (prints its URL)
//	lhbench report  --json in.json [--md out.md]  re-print a run's tables and verdicts
//	lhbench worker  --mode socket|direct ...   a subscriber (see worker.go)
//	lhbench churn   --socket PATH ...          connect/subscribe/close cycles
//	lhbench wakeworker --socket PATH ...       a queue consumer of the writers scenario (see wakeworker.go)
//	lhbench relay   --database-url URL ...     the relay package embedded (the writers smoke test's relay)
//	lhbench gohub   --database-url URL --socket PATH   the goroutine-per-connection baseline
//	lhbench gnethub --database-url URL --socket PATH   the gnet v2 baseline
//	lhbench hublib  --database-url URL --socket PATH   the hub package embedded (for heap figures)
//
// The servers run here answer SIGUSR1 by running the GC and writing their
// runtime.MemStats to --memstats (the idle scenario's live-heap column).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/benchmarks/gnethub"
	"github.com/listenhub/listenhub/benchmarks/gohub"
	"github.com/listenhub/listenhub/hub"
)

// commands are lhbench's subcommands, each given the arguments after its
// name.
var commands = map[string]func(args []string) error{
	"run":        runMain,
	"worker":     workerMain,
	"churn":      churnMain,
	"wakeworker": wakeWorkerMain,
	"relay":      relayMain,
	"report":     reportMain,
	"hopsink":    func([]string) error { return hopSinkMain() },
	"pg":         func([]string) error { return pgMain() },
	"gohub":      func(args []string) error { return serverMain("gohub", args) },
	"gnethub":    func(args []string) error { return serverMain("gnethub", args) },
	"hublib":     func(args []string) error { return serverMain("hublib", args) },
}

func main() {
	args := os.Args[1:]
	sub := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	cmd := commands[sub]
	if cmd == nil {
		fmt.Fprintf(os.Stderr, "lhbench: unknown command %q (run, worker, churn, gohub, gnethub)\n", sub)
		os.Exit(2)
	}
	if err := cmd(args); err != nil {
		fmt.Fprintln(os.Stderr, "lhbench "+sub+":", err)
		os.Exit(1)
	}
}

// pgMain starts a throwaway cluster, prints its URL and runs until SIGINT
// or SIGTERM (for experiments outside the suite).
func pgMain() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cl, err := startCluster(ctx, 1100, false, false, nil)
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Println(cl.URL())
	<-ctx.Done()
	return nil
}

// reportMain re-prints the tables of a --json file (verdicts recomputed).
func reportMain(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	in := fs.String("json", "", "a file written by lhbench --json")
	md := fs.String("md", "", "also write Markdown here")
	fs.Parse(args)
	b, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	r.Targets = evaluateListen(&r, nil)
	r.TargetsScale = evaluateScale(&r)
	r.TargetsWriters = evaluateWriters(&r)
	printAll(os.Stdout, &r)
	if *md != "" {
		var buf strings.Builder
		writeMarkdown(&buf, &r)
		return os.WriteFile(*md, []byte(buf.String()), 0o644)
	}
	return nil
}

// serverMain runs a baseline hub (or the embedded hub) until SIGTERM or SIGINT.
func serverMain(which string, args []string) error {
	fs := flag.NewFlagSet(which, flag.ExitOnError)
	url := fs.String("database-url", os.Getenv("DATABASE_URL"), "database URL")
	socket := fs.String("socket", "", "Unix socket path")
	memstats := fs.String("memstats", "", "on SIGUSR1, GC and write runtime.MemStats here as JSON")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile here until exit")
	fs.String("log-level", "warn", "ignored (the baselines log at warn)")
	fs.Parse(args)
	if *socket == "" {
		return fmt.Errorf("--socket is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *memstats != "" {
		go serveMemstats(ctx, *memstats)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(f)
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	switch which {
	case "gohub":
		return gohub.Run(ctx, gohub.Config{SocketPath: *socket, DatabaseURL: *url, Logger: log})
	case "gnethub":
		return gnethub.Run(ctx, gnethub.Config{SocketPath: *socket, DatabaseURL: *url, Logger: log})
	}
	h, err := hub.New(hub.Config{SocketPath: *socket, DatabaseURL: *url, Logger: log})
	if err != nil {
		return err
	}
	if err := h.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.Stop(sctx)
}

// heapStats is what serveMemstats writes.
type heapStats struct {
	Seq        int    `json:"seq"`
	HeapAlloc  uint64 `json:"heap_alloc"`
	HeapInuse  uint64 `json:"heap_inuse"`
	StackInuse uint64 `json:"stack_inuse"`
	Sys        uint64 `json:"sys"`
	Goroutines int    `json:"goroutines"`
	TotalAlloc uint64 `json:"total_alloc"`
	Mallocs    uint64 `json:"mallocs"`
	NumGC      uint32 `json:"num_gc"`
}

func serveMemstats(ctx context.Context, path string) {
	runtime.MemProfileRate = 64 // fine-grained: the idle figures are per-worker bytes
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	for seq := 1; ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
		runtime.GC()
		debug.FreeOSMemory()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		b, _ := json.Marshal(heapStats{Seq: seq, HeapAlloc: m.HeapAlloc, HeapInuse: m.HeapInuse, StackInuse: m.StackInuse,
			Sys: m.Sys, Goroutines: runtime.NumGoroutine(), TotalAlloc: m.TotalAlloc, Mallocs: m.Mallocs, NumGC: m.NumGC})
		if f, err := os.Create(path + ".pprof"); err == nil {
			pprof.Lookup("heap").WriteTo(f, 0) // in-use allocation sites, for `go tool pprof`
			f.Close()
		}
		os.WriteFile(path+".tmp", b, 0o644)
		os.Rename(path+".tmp", path)
	}
}
