// Package pgtesting is the test-binary side of pgtest: a TestMain helper that
// starts one cluster for all of a package's tests and removes it however the
// binary ends, and helpers that turn pgtest.ErrExternal into a skip. It is a
// separate package so that pgtest itself does not import "testing" (the demo
// command links pgtest into the listenhub binary).
//
//	var db *pgtest.Cluster
//
//	func TestMain(m *testing.M) { pgtesting.Main(m, pgtest.Options{}, &db) }
package pgtesting

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/testutil"
)

// Main starts a cluster with opts, stores it in *dst, runs the tests and
// exits with their status. A cluster that cannot be started fails the binary
// (exit 1, the reason and how to install PostgreSQL on stderr): a missing
// database is never a skip. The cluster is removed when the tests end, pass
// or fail, and on SIGINT or SIGTERM (after which the binary exits 1). Should
// the binary die otherwise (its -timeout panic, SIGKILL), the server follows
// it (parent-death signal) and the next Start removes the directory. The
// programs the tests built with testutil.Binary are removed too.
//
// With -v, lifecycle steps are logged to stderr unless opts.Logf is set.
func Main(m *testing.M, opts pgtest.Options, dst **pgtest.Cluster) {
	os.Exit(run(m, opts, dst))
}

// MainPrivateTemp is Main with TMPDIR set, for the whole run, to a fresh
// directory of its own, which must be empty once the tests, the cluster
// and the programs they built are gone: anything left in it fails the run
// (exit 1, the names on stderr), and it is removed. The directory is
// 0755, so that a cluster or PgBouncer running as another user, and a
// test's foreign uid, reach what the tests make in it.
func MainPrivateTemp(m *testing.M, opts pgtest.Options, dst **pgtest.Cluster) {
	tmp, err := os.MkdirTemp("", "listenhub-tmp-")
	if err == nil {
		err = os.Chmod(tmp, 0o755)
	}
	if err == nil {
		err = os.Setenv("TMPDIR", tmp)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: private TMPDIR:", err)
		os.Exit(1)
	}
	code := run(m, opts, dst)
	if left, err := os.ReadDir(tmp); err != nil || len(left) > 0 {
		names := make([]string, len(left))
		for i, e := range left {
			names[i] = e.Name()
		}
		fmt.Fprintf(os.Stderr, "FAIL: the tests left %v in their TMPDIR %s (%v): a test run must leave nothing behind\n", names, tmp, err)
		code = 1
	}
	os.RemoveAll(tmp)
	os.Exit(code)
}

func run(m *testing.M, opts pgtest.Options, dst **pgtest.Cluster) int {
	defer testutil.RemoveBinaries()
	if !flag.Parsed() {
		flag.Parse() // for testing.Verbose; m.Run does not parse twice
	}
	if opts.Logf == nil && testing.Verbose() {
		opts.Logf = func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		}
	}

	// Handle signals from before Start, so that a ^C during initdb still
	// removes the directory.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var (
		mu      sync.Mutex
		cluster *pgtest.Cluster
		closed  bool
	)
	cleanup := func() {
		mu.Lock()
		defer mu.Unlock()
		if cluster != nil && !closed {
			closed = true
			if err := cluster.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "pgtest: close:", err)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "pgtest: %v: removing the test cluster\n", s)
		cancel()
		// A Start in progress removes its own directory once cancelled.
		select {
		case <-started:
		case <-time.After(10 * time.Second):
		}
		cleanup()
		os.Exit(1)
	}()

	sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
	c, err := pgtest.Start(sctx, opts)
	scancel()
	if err == nil {
		mu.Lock()
		cluster = c
		mu.Unlock()
	}
	close(started)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer cleanup()
	*dst = c
	return m.Run()
}

// Must fails the test on err, except that pgtest.ErrExternal (the operation
// needs a server this process owns) skips it:
//
//	pgtesting.Must(t, db.Restart(ctx))
func Must(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, pgtest.ErrExternal) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// RequireLocal skips the test when c is an external server, for tests that
// need to stop, restart or freeze it.
func RequireLocal(t testing.TB, c *pgtest.Cluster) {
	t.Helper()
	if c.External() {
		t.Skip("needs a throwaway cluster; " + pgtest.EnvURL + " is set")
	}
}

// Connect opens a plain connection to url (within 30 seconds, or the test
// fails), closed when the test ends.
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// FreezeIdleOnly freezes (Cluster.FreezeIdle) the one backend named app
// on c and returns its pid; more or fewer than one fails the test.
func FreezeIdleOnly(ctx context.Context, t testing.TB, c *pgtest.Cluster, app string) int {
	t.Helper()
	pids, err := c.BackendPIDs(ctx, app)
	if err != nil || len(pids) != 1 {
		t.Fatalf("the backends of %s: %v (%v), want one", app, pids, err)
	}
	if err := c.FreezeIdle(ctx, pids[0]); err != nil {
		t.Fatal(err)
	}
	return pids[0]
}

// PgBouncer starts a PgBouncer with pool_mode mode in front of c
// (pgtest.Cluster.StartPgBouncer), stopped at cleanup. Without the
// pgbouncer binary the test is skipped, unless CI is set (.ci/run installs
// it): then it fails. An external server skips it too.
func PgBouncer(t testing.TB, c *pgtest.Cluster, mode string) *pgtest.PgBouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := c.StartPgBouncer(ctx, mode)
	if errors.Is(err, pgtest.ErrNoPgBouncer) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	Must(t, err)
	t.Cleanup(b.Close)
	return b
}
