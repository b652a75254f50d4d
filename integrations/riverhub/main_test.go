package riverhub_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/listenhub/listenhub/client"
	"github.com/listenhub/listenhub/integrations/riverhub"
)

// TestMain runs a worker process when LHRIVER_WORKER is set: the census
// and fault tests start several, each a River client working jobs.
func TestMain(m *testing.M) {
	if mode := os.Getenv("LHRIVER_WORKER"); mode != "" {
		os.Exit(workerMain(mode))
	}
	os.Exit(m.Run())
}

// fetchPollInterval is long: a job picked up well before it was woken.
const fetchPollInterval = 20 * time.Second

// noopArgs is a job that does nothing.
type noopArgs struct {
	N int `json:"n"`
}

func (noopArgs) Kind() string { return "lhriver_noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// plainDriver is riverpgxv5's driver whose listener (riverpgxv5's own)
// takes its connection from a pool of its own, tagged by application name,
// so that a census can count River's LISTEN backends.
type plainDriver struct {
	*riverpgxv5.Driver
	listen *riverpgxv5.Driver
}

func (d plainDriver) GetListener(p *riverdriver.GetListenenerParams) riverdriver.Listener {
	return d.listen.GetListener(p)
}

// workerMain is one worker process: a River client on LHRIVER_SCHEMA
// working noop jobs, whose listener is River's own ("plain", on a pool
// tagged LHRIVER_APP) or goes through the hub at LHRIVER_SOCKET ("hub",
// local listeners tagged LHRIVER_APP). It prints "started" once running
// and stops when its stdin closes.
func workerMain(mode string) int {
	ctx := context.Background()
	schema, app := os.Getenv("LHRIVER_SCHEMA"), os.Getenv("LHRIVER_APP")
	pool, err := workerPool(ctx, schema, "lhriver-worker")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	var driver riverdriver.Driver[pgx.Tx]
	switch mode {
	case "plain":
		listenPool, err := workerPool(ctx, schema, app)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer listenPool.Close()
		driver = plainDriver{riverpgxv5.New(pool), riverpgxv5.New(listenPool)}
	case "hub":
		driver = riverhub.New(pool, riverhub.Options{Failover: client.FailoverOptions{
			Hub:           client.Options{SocketPath: os.Getenv("LHRIVER_SOCKET")},
			Local:         client.LocalOptions{ApplicationName: app},
			FailbackDelay: 100 * time.Millisecond,
			ProbeInterval: 100 * time.Millisecond,
		}})
	default:
		fmt.Fprintln(os.Stderr, "unknown worker mode", mode)
		return 1
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
	rc, err := river.NewClient(driver, &river.Config{
		Schema:            schema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 20}},
		Workers:           workers,
		FetchPollInterval: fetchPollInterval,
		Logger:            quietLogger(),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := rc.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("started")
	io.Copy(io.Discard, bufio.NewReader(os.Stdin))
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rc.Stop(sctx); err != nil {
		fmt.Fprintln(os.Stderr, "stop:", err)
		return 1
	}
	return 0
}

func workerPool(ctx context.Context, schema, app string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	return pgxpool.NewWithConfig(ctx, cfg)
}
