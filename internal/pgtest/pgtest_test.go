package pgtest_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/pgtest/pgtls"
	"github.com/listenhub/listenhub/internal/testutil"
)

var db *pgtest.Cluster

func TestMain(m *testing.M) {
	if os.Getenv("PGTEST_CHILD") == "1" {
		child()
		return
	}
	pgtesting.Main(m, pgtest.Options{}, &db)
}

// child is the helper process of TestParentDeath (in sweep_test.go): it
// starts a cluster, reports its directory and postmaster pid, and waits to be
// killed.
func child() {
	c, err := pgtest.Start(context.Background(), pgtest.Options{})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	fmt.Println(c.Dir(), c.PID())
	select {}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// connect opens a connection with an application_name, closed at cleanup.
func connect(t *testing.T, url, app string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(ctxT(t), cfg)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func queryInt(t *testing.T, conn *pgx.Conn, sql string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctxT(t), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestConnect(t *testing.T) {
	ctx := ctxT(t)
	for _, u := range []string{db.URL(), db.SocketURL()} {
		conn := connect(t, u, "pgtest-connect")
		if got := queryInt(t, conn, "SELECT 1"); got != 1 {
			t.Fatalf("SELECT 1 = %d", got)
		}
		if db.External() {
			continue
		}
		var mc, fsync string
		if err := conn.QueryRow(ctx, "SELECT current_setting('max_connections'), current_setting('fsync')").Scan(&mc, &fsync); err != nil {
			t.Fatal(err)
		}
		if mc != "300" || fsync != "off" {
			t.Fatalf("max_connections %s fsync %s, want 300 off", mc, fsync)
		}
	}
	if !db.External() {
		if !strings.HasPrefix(db.URL(), "postgres://postgres@127.0.0.1:") || !strings.Contains(db.SocketURL(), "host=%2F") {
			t.Fatalf("URL %s SocketURL %s", db.URL(), db.SocketURL())
		}
		if _, err := os.Stat(filepath.Join(db.SocketDir(), fmt.Sprintf(".s.PGSQL.%d", db.Port()))); err != nil {
			t.Fatalf("socket file: %v", err)
		}
	}
	if err := db.Exec(ctx, "CREATE TABLE IF NOT EXISTS pgtest_t (x int)"); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(ctx, "INSERT INTO pgtest_t VALUES ($1)", 42); err != nil {
		t.Fatal(err)
	}
	if n, err := db.QueryInt(ctx, "SELECT count(*)::int FROM pgtest_t WHERE x = $1", 42); err != nil || n < 1 {
		t.Fatalf("QueryInt = %d, %v", n, err)
	}
	if db.TLSURL() != "" {
		t.Fatalf("TLSURL %q without Options.TLS", db.TLSURL())
	}
}

func TestNotify(t *testing.T) {
	ctx := ctxT(t)
	conn := connect(t, db.URL(), "pgtest-notify")
	if _, err := conn.Exec(ctx, `LISTEN "pgtest chan"`); err != nil {
		t.Fatal(err)
	}
	if err := db.Notify(ctx, "pgtest chan", "hello"); err != nil {
		t.Fatal(err)
	}
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Channel != "pgtest chan" || n.Payload != "hello" {
		t.Fatalf("notification %q %q", n.Channel, n.Payload)
	}
}

func TestRestart(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	ctx := ctxT(t)
	old := connect(t, db.URL(), "pgtest-restart")
	port, pid := db.Port(), db.PID()
	pgtesting.Must(t, db.Restart(ctx))
	if db.Port() != port || db.PID() == pid || db.PID() == 0 {
		t.Fatalf("after restart: port %d (was %d), pid %d (was %d)", db.Port(), port, db.PID(), pid)
	}
	if _, err := old.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a connection survived the restart")
	}
	conn := connect(t, db.URL(), "pgtest-restart")
	queryInt(t, conn, "SELECT 1")
	// The helper connection died in the restart too; it reconnects.
	if err := db.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("Exec after restart: %v", err)
	}
}

func TestStopStartSamePort(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	ctx := ctxT(t)
	url := db.URL()
	pgtesting.Must(t, db.Stop(ctx))
	if db.PID() != 0 {
		t.Fatalf("PID %d after Stop", db.PID())
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := pgx.Connect(cctx, url)
	cancel()
	if err == nil {
		t.Fatal("connected to a stopped server")
	}
	if err := db.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("Exec on a stopped server succeeded")
	}
	pgtesting.Must(t, db.Stop(ctx)) // idempotent
	pgtesting.Must(t, db.Start(ctx))
	pgtesting.Must(t, db.Start(ctx)) // no-op when running
	if db.URL() != url {
		t.Fatalf("URL changed across stop/start: %s -> %s", url, db.URL())
	}
	conn := connect(t, url, "pgtest-stopstart")
	queryInt(t, conn, "SELECT 1")
}

func TestTerminate(t *testing.T) {
	ctx := ctxT(t)
	a := connect(t, db.URL(), "pgtest-victim")
	connect(t, db.SocketURL(), "pgtest-victim")
	bystander := connect(t, db.URL(), "pgtest-bystander")
	pids, err := db.BackendPIDs(ctx, "pgtest-victim")
	if err != nil || len(pids) != 2 {
		t.Fatalf("BackendPIDs = %v, %v; want 2", pids, err)
	}
	if pids[0] >= pids[1] {
		t.Fatalf("BackendPIDs not sorted: %v", pids)
	}
	n, err := db.Terminate(ctx, "pgtest-victim")
	if err != nil || n != 2 {
		t.Fatalf("Terminate = %d, %v; want 2", n, err)
	}
	testutil.WaitFor(t, 10*time.Second, "terminated backends to exit", func() bool {
		pids, err := db.BackendPIDs(ctx, "pgtest-victim")
		return err == nil && len(pids) == 0
	})
	if _, err := a.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("terminated connection still works")
	}
	queryInt(t, bystander, "SELECT 1")
	if n, err := db.Terminate(ctx, "pgtest-nobody"); err != nil || n != 0 {
		t.Fatalf("Terminate of nobody = %d, %v", n, err)
	}
}

// ownBackend opens a connection named app to the (throwaway) cluster and
// returns it with the pid of its one backend.
func ownBackend(t *testing.T, app string) (*pgx.Conn, int) {
	t.Helper()
	pgtesting.RequireLocal(t, db)
	conn := connect(t, db.URL(), app)
	pids, err := db.BackendPIDs(ctxT(t), app)
	if err != nil || len(pids) != 1 {
		t.Fatalf("BackendPIDs = %v, %v", pids, err)
	}
	return conn, pids[0]
}

// checkFrozenThenThaw sends a query on conn, whose backend pid is frozen:
// no answer may come; after Thaw it must, without an error.
func checkFrozenThenThaw(t *testing.T, conn *pgx.Conn, pid int) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(context.Background(), "SELECT 1")
		done <- err
	}()
	// A frozen backend answers nothing. This negative check needs a window;
	// 300 ms is far above a local round trip.
	select {
	case err := <-done:
		t.Fatalf("frozen backend answered: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	pgtesting.Must(t, db.Thaw(pid))
	testutil.WaitErr(t, done, 10*time.Second, "query after thaw")
}

func TestFreezeThaw(t *testing.T) {
	conn, pid := ownBackend(t, "pgtest-freeze")
	if err := db.Freeze(os.Getpid()); err == nil {
		t.Fatal("Freeze accepted a pid that is not a backend")
	}
	pgtesting.Must(t, db.Freeze(pid))
	checkFrozenThenThaw(t, conn, pid)
}

// TestFreezeIdle: FreezeIdle stops a backend only in its wait for the
// client. A backend kept busy by a statement is never frozen (the call
// ends with ctx and the backend runs on); once it is idle it is frozen, and
// a query sent then goes unanswered until Thaw.
func TestFreezeIdle(t *testing.T) {
	conn, pid := ownBackend(t, "pgtest-freezeidle")
	ctx := ctxT(t)
	busy := make(chan error, 1)
	go func() {
		_, err := conn.Exec(context.Background(), "SELECT pg_sleep(1.5)")
		busy <- err
	}()
	testutil.WaitFor(t, 5*time.Second, "the backend running pg_sleep", func() bool {
		n, err := db.QueryInt(ctx, "SELECT count(*)::int FROM pg_stat_activity WHERE pid = $1 AND state = 'active'", pid)
		return err == nil && n == 1
	})
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := db.FreezeIdle(short, pid)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("FreezeIdle on a backend running a statement: %v, want it to wait for idle until the deadline", err)
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
		t.Fatal(err)
	} else if _, rest, _ := strings.Cut(string(b), ") "); strings.HasPrefix(rest, "T") || strings.HasPrefix(rest, "t") {
		t.Fatalf("backend left stopped (%.1s) after a failed FreezeIdle", rest)
	}
	if err := <-busy; err != nil {
		t.Fatalf("the statement under a failed FreezeIdle: %v", err)
	}
	pgtesting.Must(t, db.FreezeIdle(ctx, pid))
	checkFrozenThenThaw(t, conn, pid)
}

func TestFreezeThenStop(t *testing.T) {
	// A frozen backend must not hang Stop (it is thawed first).
	_, pid := ownBackend(t, "pgtest-freeze2")
	ctx := ctxT(t)
	pgtesting.Must(t, db.Freeze(pid))
	start := time.Now()
	pgtesting.Must(t, db.Restart(ctx))
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("restart with a frozen backend took %v", d)
	}
}

func TestSSL(t *testing.T) {
	if db.External() {
		t.Skip("external server")
	}
	ctx := ctxT(t)
	c, err := pgtest.Start(ctx, pgtest.Options{TLS: pgtls.Certificate, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	dir := c.Dir()
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cluster directory %s not removed: %v", dir, err)
		}
	}()
	if !strings.Contains(c.TLSURL(), "sslmode=require") {
		t.Fatalf("TLSURL %q", c.TLSURL())
	}
	key, err := os.Stat(filepath.Join(dir, "data", "server.key"))
	if err != nil || key.Mode().Perm() != 0o600 {
		t.Fatalf("server.key: %v %v", key, err)
	}
	if os.Geteuid() == 0 {
		if st := key.Sys().(*syscall.Stat_t); st.Uid == 0 {
			t.Fatal("server.key owned by root, want the postgres user")
		}
	}
	check := func(url string) {
		t.Helper()
		conn := connect(t, url, "pgtest-ssl")
		var ssl bool
		if err := conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil {
			t.Fatal(err)
		}
		if !ssl {
			t.Fatalf("%s: connection is not encrypted", url)
		}
		if conn.PgConn().Conn() == nil {
			t.Fatal("no net.Conn")
		}
		if _, ok := conn.PgConn().Conn().(*tls.Conn); !ok {
			t.Fatalf("%s: %T, want *tls.Conn", url, conn.PgConn().Conn())
		}
	}
	check(c.TLSURL())
	check(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=verify-full&sslrootcert=%s", c.Port(), c.CertFile()))
	// Plaintext still works on the same server.
	conn := connect(t, c.URL(), "pgtest-plain")
	queryInt(t, conn, "SELECT 1")
}

func TestExternal(t *testing.T) {
	t.Setenv(pgtest.EnvURL, db.URL())
	ctx := ctxT(t)
	c, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.External() || c.URL() != db.URL() || c.Dir() != "" {
		t.Fatalf("External %v URL %s Dir %q", c.External(), c.URL(), c.Dir())
	}
	for name, err := range map[string]error{
		"Stop": c.Stop(ctx), "Start": c.Start(ctx), "Restart": c.Restart(ctx),
		"Freeze": c.Freeze(1), "Thaw": c.Thaw(1),
	} {
		if !errors.Is(err, pgtest.ErrExternal) {
			t.Errorf("%s = %v, want ErrExternal", name, err)
		}
	}
	if err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.BackendPIDs(ctx, "pgtest-x"); err != nil {
		t.Fatal(err)
	}

	t.Setenv(pgtest.EnvURL, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5")
	if _, err := pgtest.Start(ctx, pgtest.Options{}); err == nil || !strings.Contains(err.Error(), pgtest.EnvURL) {
		t.Fatalf("Start with an unreachable external server = %v", err)
	}
}

func TestMissingPostgres(t *testing.T) {
	t.Setenv(pgtest.EnvURL, "")
	t.Setenv(pgtest.EnvBinDir, t.TempDir())
	_, err := pgtest.Start(ctxT(t), pgtest.Options{})
	if !errors.Is(err, pgtest.ErrNotInstalled) || !strings.Contains(err.Error(), "apt-get install postgresql") {
		t.Fatalf("Start without binaries = %v; want ErrNotInstalled saying how to install", err)
	}
}
