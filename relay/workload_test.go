package relay

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/listenhub/listenhub/internal/testutil"
)

// workload is the miss check of the process tests. Each table has one
// writer, so its ids commit in order; a checker LISTENs to every table's
// channel and, on each wake, re-reads the table's max(id), as a worker
// would re-read its queue. An insert is served when some re-read that
// started after a wake received after the writer sent it saw it; a miss is
// one that never is. (Not "after its commit returned": on a loaded machine
// the relay's wake can reach the checker before the writer's goroutine
// gets to note that its commit returned, and the last insert of a burst
// then looked missed although its own wake's re-read saw it.)
//
// The writers insert in bursts, one transaction per row, and after each
// burst the workload waits until every insert of it is served: a wake
// lost anywhere in the burst would leave its tail unserved.
type workload struct {
	t      *testing.T
	tables []string // qualified names
	chans  []string

	mu      sync.Mutex
	commits []map[int64]insert // per table, by id
	reads   [][]read           // per table, in time order
	cancel  context.CancelFunc
	done    chan struct{}
}

type insert struct {
	sent, returned time.Time // the INSERT sent, its commit returned
}

type read struct {
	wake time.Time // when the wake that caused it was received
	max  int64
}

func newWorkload(t *testing.T, f *fixture, tables ...string) *workload {
	w := &workload{t: t}
	for _, tb := range tables {
		w.tables = append(w.tables, f.schema+"."+tb)
		w.chans = append(w.chans, f.schema+"."+tb+".INSERT")
		w.commits = append(w.commits, map[int64]insert{})
		w.reads = append(w.reads, nil)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go w.check(ctx)
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// check is the checker: it LISTENs, and reconnects when the server goes.
func (w *workload) check(ctx context.Context) {
	defer close(w.done)
	byChan := map[string]int{}
	for i, c := range w.chans {
		byChan[c] = i
	}
	for ctx.Err() == nil {
		conn, err := pgx.Connect(ctx, db.URL())
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		func() {
			defer conn.Close(context.Background())
			for _, c := range w.chans {
				if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{c}.Sanitize()); err != nil {
					return
				}
			}
			// A new connection re-reads everything once, as a worker
			// does after a reconnect.
			now := time.Now()
			for i := range w.tables {
				if !w.reread(ctx, conn, i, now) {
					return
				}
			}
			for {
				n, err := conn.WaitForNotification(ctx)
				if err != nil {
					return
				}
				i, ok := byChan[n.Channel]
				if !ok {
					continue
				}
				if !w.reread(ctx, conn, i, time.Now()) {
					return
				}
			}
		}()
	}
}

func (w *workload) reread(ctx context.Context, conn *pgx.Conn, i int, wake time.Time) bool {
	var m *int64
	if err := conn.QueryRow(ctx, "SELECT max(id) FROM "+w.tables[i]).Scan(&m); err != nil {
		return false
	}
	v := int64(0)
	if m != nil {
		v = *m
	}
	w.mu.Lock()
	w.reads[i] = append(w.reads[i], read{wake: wake, max: v})
	w.mu.Unlock()
	return true
}

// burst makes every writer insert n rows, one transaction each; an insert
// that fails (the server restarting) is retried.
func (w *workload) burst(n int) { w.write(n, nil) }

// commitCount is the number of inserts committed so far.
func (w *workload) commitCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.commits {
		n += len(c)
	}
	return n
}

// write is burst, stopping early when stop is closed.
func (w *workload) write(n int, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for i := range w.tables {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					conn.Close(context.Background())
				}
			}()
			for k := 0; k < n && ctx.Err() == nil; {
				select {
				case <-stop:
					return
				default:
				}
				if conn == nil {
					c, err := pgx.Connect(ctx, db.URL())
					if err != nil {
						time.Sleep(50 * time.Millisecond)
						continue
					}
					conn = c
				}
				var id int64
				sent := time.Now()
				if err := conn.QueryRow(ctx, "INSERT INTO "+w.tables[i]+" (v) VALUES ('x') RETURNING id").Scan(&id); err != nil {
					conn.Close(context.Background())
					conn = nil
					continue
				}
				now := time.Now()
				w.mu.Lock()
				w.commits[i][id] = insert{sent: sent, returned: now}
				w.mu.Unlock()
				k++
			}
		}()
	}
	wg.Wait()
}

// served reports whether insert id of table i was served, and when (the
// first re-read that saw it after a wake after it was sent).
func (w *workload) served(i int, id int64, c insert) (time.Time, bool) {
	rs := w.reads[i]
	k := sort.Search(len(rs), func(k int) bool { return !rs[k].wake.Before(c.sent) })
	for ; k < len(rs); k++ {
		if rs[k].max >= id {
			return rs[k].wake, true
		}
	}
	return time.Time{}, false
}

// misses returns the inserts not served yet, one of them described, and
// the latencies of those that were (commit returned to wake received, 0
// for a wake that beat the writer to noting its return).
func (w *workload) misses() (int, string, []time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	miss := 0
	var one string
	var lat []time.Duration
	for i := range w.tables {
		for id, c := range w.commits[i] {
			at, ok := w.served(i, id, c)
			if !ok {
				if miss++; one == "" {
					one = fmt.Sprintf("%s id %d, sent at %s, returned %v later", w.tables[i], id,
						c.sent.Format("15:04:05.000000"), c.returned.Sub(c.sent))
					if rs := w.reads[i]; len(rs) > 0 {
						last := rs[len(rs)-1]
						one += fmt.Sprintf("; the table's last re-read: wake at %s, max id %d (%d re-reads)",
							last.wake.Format("15:04:05.000000"), last.max, len(rs))
					}
				}
				continue
			}
			lat = append(lat, max(0, at.Sub(c.returned)))
		}
	}
	return miss, one, lat
}

// settle waits until every insert so far is served, and fails the test
// with the number of misses if that takes longer than timeout.
func (w *workload) settle(timeout time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		miss, one, _ := w.misses()
		if miss == 0 {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%d inserts missed: no wake after they were sent let a re-read see them within %v (%s)", miss, timeout, one)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// report logs the latency distribution from commit to served.
func (w *workload) report() {
	miss, _, lat := w.misses()
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	if len(lat) == 0 {
		return
	}
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	w.t.Logf("%d inserts, %d missed; commit to wake: p50 %v p90 %v p99 %v max %v", len(lat)+miss, miss,
		q(0.5), q(0.9), q(0.99), lat[len(lat)-1])
}

// relayProc is a `listenhub relay` process.
type relayProc struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan struct{}
	err  error
}

func relayBinary(t *testing.T) string {
	return testutil.Binary(t, "github.com/listenhub/listenhub/cmd/listenhub")
}

// execListenhub starts the listenhub binary with args, its output
// captured; it dies with the test binary, the caller stops it otherwise.
func execListenhub(t *testing.T, args ...string) *relayProc {
	t.Helper()
	p := &relayProc{out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(relayBinary(t), args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{}
	testutil.DieWithParent(p.cmd.SysProcAttr, syscall.SIGKILL)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p
}

func startRelayProc(t *testing.T, args ...string) *relayProc {
	t.Helper()
	p := execListenhub(t, append([]string{"relay"}, args...)...)
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() || env("LISTENHUB_TEST_RELAY_LOGS") {
			t.Logf("relay pid %d output:\n%s", p.cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

func (p *relayProc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// exitCode waits for the process to exit and returns its status.
func (p *relayProc) exitCode(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("relay still running after %v:\n%s", timeout, p.out.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

func (f *fixture) procArgs(extra ...string) []string {
	return append([]string{"--database-url", db.URL(), "--publication", f.pub, "--slot", f.slot,
		"--standby-retry", "100ms", "--log-level", "debug"}, extra...)
}

// slotActivePID is the pid of the walsender using the slot, 0 if none.
func (f *fixture) slotActivePID() int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := db.QueryInt(ctx, "SELECT coalesce((SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active), 0)", f.slot)
	if err != nil {
		return 0
	}
	return n
}

func env(name string) bool { return os.Getenv(name) != "" }

var _ = fmt.Sprintf
