package riverhub_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/listenhub/listenhub/client"
	"github.com/listenhub/listenhub/integrations/riverhub"
)

// The harness (integrations/integrations_test.go in the main module, run
// by the README's go test) builds the hub and starts a throwaway Postgres,
// and passes both here.
var (
	hubBin      = os.Getenv("LHTEST_HUB_BIN")
	databaseURL = os.Getenv("LHTEST_DATABASE_URL")
)

const timeout = 20 * time.Second

func needEnv(t testing.TB) {
	t.Helper()
	if hubBin == "" || databaseURL == "" {
		t.Skip("LHTEST_HUB_BIN and LHTEST_DATABASE_URL are not set: run go test ./integrations/ from the repository root")
	}
}

// waitFor polls cond until true, failing the test after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for wait := time.Millisecond; !cond(); wait = min(2*wait, 20*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(wait)
	}
}

func randName(prefix string) string {
	var b [4]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// hub is one `listenhub serve` of the test's own.
type hub struct {
	t      testing.TB
	socket string
	app    string
	mu     sync.Mutex
	cmd    *exec.Cmd
	out    *strings.Builder
}

func startHub(t testing.TB) *hub {
	t.Helper()
	needEnv(t)
	dir, err := os.MkdirTemp("", "lhriver-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &hub{t: t, socket: filepath.Join(dir, "hub.sock"), app: randName("lhriver-hub-")}
	h.start()
	t.Cleanup(h.kill)
	return h
}

func (h *hub) start() {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.out = &strings.Builder{}
	cmd := exec.Command(hubBin, "serve", "--socket", h.socket, "--database-url", databaseURL,
		"--application-name", h.app, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.cmd = cmd
	waitFor(h.t, timeout, "the hub's socket", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := client.Dial(ctx, client.Options{SocketPath: h.socket}, client.Handlers{})
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

// kill SIGKILLs the hub: its workers see EOF.
func (h *hub) kill() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cmd == nil {
		return
	}
	h.cmd.Process.Signal(syscall.SIGKILL)
	h.cmd.Wait()
	h.cmd = nil
}

func (h *hub) restart() {
	h.kill()
	os.Remove(h.socket)
	h.start()
}

// db is a connection of the test's own, for NOTIFYs and census queries.
func connect(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// newSchema makes a schema of the test's own, with River's tables when
// migrate is set, dropped at the end.
func newSchema(t testing.TB, migrate bool) string {
	t.Helper()
	needEnv(t)
	schema := randName("lhriver_")
	c := connect(t)
	ctx := context.Background()
	if _, err := c.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, databaseURL)
		if err == nil {
			c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			c.Close(ctx)
		}
	})
	if migrate {
		pool := newPool(t, schema, "")
		m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
			t.Fatal(err)
		}
	}
	return schema
}

// newPool is a pool on the test database with search_path set to
// searchPath (empty: the server's default), tagged app.
func newPool(t testing.TB, searchPath, app string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	if searchPath != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = searchPath
	}
	if app != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testLogger logs through t at level and above.
func testLogger(t testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// driverOptions are a Driver's options for hub h (local listeners tagged
// app).
func driverOptions(t testing.TB, h *hub, app string) riverhub.Options {
	return riverhub.Options{
		Failover: client.FailoverOptions{
			Hub:           client.Options{SocketPath: h.socket},
			Local:         client.LocalOptions{ApplicationName: app},
			FailbackDelay: 100 * time.Millisecond,
			ProbeInterval: 100 * time.Millisecond,
		},
		Logger: testLogger(t, slog.LevelWarn),
	}
}

// listenBackends counts the backends of the database that LISTEN, by
// application name: the hub's and the local listeners'.
func backends(t testing.TB, c *pgx.Conn, app string) int {
	t.Helper()
	var n int
	if err := c.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func mustf(t testing.TB, err error, format string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(format, args...), err)
	}
}
