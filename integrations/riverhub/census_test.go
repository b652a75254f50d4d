package riverhub_test

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// workers is the number of worker processes of the census (K >= 4).
const workers = 4

type workerProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan error
}

// startWorkers starts k worker processes (workerMain) and waits until each
// has started its River client.
func startWorkers(t *testing.T, k int, mode, schema, socket, app string) []*workerProc {
	t.Helper()
	var ws []*workerProc
	for range k {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "LHRIVER_WORKER="+mode, "LHRIVER_SCHEMA="+schema, "LHRIVER_SOCKET="+socket, "LHRIVER_APP="+app)
		cmd.Stderr = testWriter{t}
		stdin, err := cmd.StdinPipe()
		mustf(t, err, "stdin")
		stdout, err := cmd.StdoutPipe()
		mustf(t, err, "stdout")
		mustf(t, cmd.Start(), "start a worker")
		w := &workerProc{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
		started := make(chan bool, 1)
		go func() {
			line, _ := bufio.NewReader(stdout).ReadString('\n')
			started <- line == "started\n"
			io.Copy(io.Discard, stdout)
			w.done <- cmd.Wait()
		}()
		select {
		case ok := <-started:
			if !ok {
				t.Fatal("a worker process did not start")
			}
		case <-time.After(timeout):
			cmd.Process.Kill()
			t.Fatal("a worker process did not start in time")
		}
		ws = append(ws, w)
		t.Cleanup(func() { w.cmd.Process.Kill() })
	}
	return ws
}

// stopWorkers closes each worker's stdin and waits for it to exit.
func stopWorkers(t *testing.T, ws []*workerProc) {
	t.Helper()
	for _, w := range ws {
		w.stdin.Close()
	}
	for _, w := range ws {
		select {
		case err := <-w.done:
			if err != nil {
				t.Errorf("a worker process: %v", err)
			}
		case <-time.After(timeout):
			w.cmd.Process.Kill()
			t.Error("a worker process did not stop in time")
		}
	}
}

// jobFlow inserts a noop job every interval from an insert-only client
// until stopped (past River's per-queue notify limit, so that each insert
// notifies).
type jobFlow struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	inserted int
	err      error
}

func startFlow(t *testing.T, schema string, interval time.Duration) *jobFlow {
	rc, err := river.NewClient(plainInsertDriver(t, schema), &river.Config{Schema: schema, Logger: quietLogger()})
	mustf(t, err, "NewClient (insert only)")
	fl := &jobFlow{stop: make(chan struct{})}
	fl.wg.Add(1)
	go func() {
		defer fl.wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; ; i++ {
			if _, err := rc.Insert(context.Background(), noopArgs{N: i}, nil); err != nil {
				fl.mu.Lock()
				fl.err = err
				fl.mu.Unlock()
				return
			}
			fl.mu.Lock()
			fl.inserted++
			fl.mu.Unlock()
			select {
			case <-fl.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return fl
}

// more waits until k more jobs have been inserted: the flow goes on
// through what the test does meanwhile.
func (fl *jobFlow) more(t *testing.T, k int) {
	t.Helper()
	fl.mu.Lock()
	want := fl.inserted + k
	fl.mu.Unlock()
	waitFor(t, timeout, "more jobs inserted", func() bool {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		return fl.inserted >= want || fl.err != nil
	})
}

func (fl *jobFlow) end(t *testing.T) int {
	t.Helper()
	close(fl.stop)
	fl.wg.Wait()
	if fl.err != nil {
		t.Fatalf("inserting: %v", fl.err)
	}
	return fl.inserted
}

// pickups waits until every noop job is completed and returns how long the
// slowest and the median waited from insert to fetch (the database's own
// clock: attempted_at - created_at).
func pickups(t *testing.T, db *pgx.Conn, schema string, want int) (p50, worst time.Duration) {
	t.Helper()
	waitFor(t, 2*fetchPollInterval, "every job completed", func() bool {
		var n int
		db.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".river_job WHERE kind = 'lhriver_noop' AND state = 'completed'").Scan(&n)
		return n == want
	})
	mustf(t, db.QueryRow(context.Background(), `SELECT
		percentile_cont(0.5) WITHIN GROUP (ORDER BY attempted_at - created_at),
		max(attempted_at - created_at)
		FROM `+schema+`.river_job WHERE kind = 'lhriver_noop'`).Scan(&p50, &worst), "pick-up figures")
	return p50, worst
}

// TestRiverCensus: K worker processes, each a River client working jobs,
// hold K LISTEN backends with riverpgxv5's own listener and one (the hub's)
// through the hub, measured in the same test; jobs flow in both.
func TestRiverCensus(t *testing.T) {
	h := startHub(t)
	db := connect(t)

	plainSchema, plainApp := newSchema(t, true), randName("lhriver-listen-")
	ws := startWorkers(t, workers, "plain", plainSchema, "", plainApp)
	waitFor(t, timeout, "a LISTEN backend per worker", func() bool { return backends(t, db, plainApp) == workers })
	fl := startFlow(t, plainSchema, 150*time.Millisecond)
	fl.more(t, 6)
	n := fl.end(t)
	p50, worst := pickups(t, db, plainSchema, n)
	plain := backends(t, db, plainApp)
	stopWorkers(t, ws)

	hubSchema, localApp := newSchema(t, true), randName("lhriver-local-")
	ws = startWorkers(t, workers, "hub", hubSchema, h.socket, localApp)
	fl = startFlow(t, hubSchema, 150*time.Millisecond)
	fl.more(t, 6)
	n = fl.end(t)
	hp50, hworst := pickups(t, db, hubSchema, n)
	local, hubs := backends(t, db, localApp), backends(t, db, h.app)
	stopWorkers(t, ws)

	t.Logf("census, %d worker processes: %d LISTEN backends with riverpgxv5's listener, %d through the hub (%d local + %d the hub's)",
		workers, plain, local+hubs, local, hubs)
	t.Logf("pick-up (insert to fetch), p50 / max: riverpgxv5 %v / %v, through the hub %v / %v",
		p50.Round(time.Millisecond), worst.Round(time.Millisecond), hp50.Round(time.Millisecond), hworst.Round(time.Millisecond))
	if plain != workers {
		t.Errorf("riverpgxv5: %d LISTEN backends, want %d", plain, workers)
	}
	if local != 0 || hubs != 1 {
		t.Errorf("through the hub: %d local LISTEN backends and %d of the hub's, want 0 and 1", local, hubs)
	}
	if hworst >= fetchPollInterval/4 {
		t.Errorf("through the hub, a job waited %v to be fetched (the poll is %v): a wake was lost", hworst, fetchPollInterval)
	}
}

// TestRiverHubKilledWhileJobsFlow: the hub is SIGKILLed while jobs flow;
// every worker falls back to its own LISTEN (the census says K), no job
// waits for a poll (20 s), the hub restarts and the census returns to 1.
func TestRiverHubKilledWhileJobsFlow(t *testing.T) {
	h := startHub(t)
	db := connect(t)
	schema, localApp := newSchema(t, true), randName("lhriver-local-")
	ws := startWorkers(t, workers, "hub", schema, h.socket, localApp)
	fl := startFlow(t, schema, 120*time.Millisecond)
	fl.more(t, 4)

	h.kill()
	killed := time.Now()
	waitFor(t, timeout, "every worker on a LISTEN of its own", func() bool { return backends(t, db, localApp) == workers })
	t.Logf("%d local LISTEN backends %v after the kill", workers, time.Since(killed).Round(time.Millisecond))
	fl.more(t, 4)

	h.start()
	restarted := time.Now()
	waitFor(t, timeout, "every worker back on the hub", func() bool {
		return backends(t, db, localApp) == 0 && backends(t, db, h.app) == 1
	})
	t.Logf("census back to 1 %v after the restart", time.Since(restarted).Round(time.Millisecond))
	fl.more(t, 4)
	n := fl.end(t)
	p50, worst := pickups(t, db, schema, n)
	t.Logf("%d jobs through a hub kill and restart: pick-up p50 %v, max %v", n, p50.Round(time.Millisecond), worst.Round(time.Millisecond))
	if worst >= fetchPollInterval/4 {
		t.Errorf("a job waited %v to be fetched (the poll is %v): a wake was lost across the kill", worst, fetchPollInterval)
	}
	stopWorkers(t, ws)
}

// plainInsertDriver is riverpgxv5 on a pool of its own: an inserter in a
// session of its own, as another process's would be.
func plainInsertDriver(t *testing.T, schema string) *riverpgxv5.Driver {
	return riverpgxv5.New(newPool(t, schema, "lhriver-inserter"))
}
