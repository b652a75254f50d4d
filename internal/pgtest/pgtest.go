// Package pgtest runs a throwaway PostgreSQL cluster: initdb into a temporary
// directory, its own free port on 127.0.0.1 and its own Unix socket
// directory, fsync off. It is used by the integration tests (through the
// TestMain helper in the pgtesting subpackage) and by `listenhub demo`, so this
// package does not import "testing".
//
// Failure handling: Close stops the server and removes the directory. A parent
// that dies without calling Close (SIGKILL, a test timeout's panic) takes the
// server with it: the postmaster is started with a parent-death signal
// (SIGQUIT, immediate shutdown). The directory it leaves behind is removed by
// the next Start on the machine (see sweep). Signals are not handled here: the
// test helper handles SIGINT/SIGTERM, and a command using this package handles
// them in its own shutdown path.
//
// When the process runs as root, the server runs as the `postgres` OS user
// (PostgreSQL refuses to run as root); the cluster directory is owned by it.
//
// With LISTENHUB_TEST_DATABASE_URL set, Start starts nothing and returns a
// Cluster for that server: External() is true and the operations that need
// to own the server process (Stop, Start, Restart, Freeze, Thaw) return
// ErrExternal.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// EnvURL names the environment variable that points the tests at an existing
// server instead of a throwaway cluster.
const EnvURL = "LISTENHUB_TEST_DATABASE_URL"

// EnvBinDir names an environment variable that, when set, is the directory
// holding initdb and postgres (it wins over PATH and /usr/lib/postgresql).
const EnvBinDir = "LISTENHUB_PG_BINDIR"

// ErrExternal is returned by the operations that need to own the server
// process when the cluster is an external server (LISTENHUB_TEST_DATABASE_URL).
// Tests turn it into a skip (pgtesting.Must).
var ErrExternal = errors.New("pgtest: not possible on an external server (" + EnvURL + " is set)")

// ErrNotInstalled is wrapped by Start's error when no PostgreSQL server
// binaries are found. The message says how to install them.
var ErrNotInstalled = errors.New("PostgreSQL server binaries (initdb, postgres) not found")

// helperApp is the application_name of the helper connection used by Exec,
// Terminate and BackendPIDs, so that tests never count or kill it.
const helperApp = "pgtest"

// Options configure Start.
type Options struct {
	// TLS, when set, turns TLS on with the certificate and key it makes
	// at start (pgtls.Certificate); TLSURL then returns a URL with
	// sslmode=require.
	TLS func() (certPEM, keyPEM []byte, err error)
	// Logf, when set, receives one line per lifecycle step (init, start,
	// stop, sweep of a stale directory). Nil discards them.
	Logf func(format string, args ...any)
	// MaxConnections is max_connections; 0 means 300, enough for the
	// benchmarks that open one connection per simulated worker.
	MaxConnections int
	// Settings are extra postgresql.conf parameters (name -> value, written
	// as name = 'value').
	Settings map[string]string
	// Logical sets wal_level = logical (a restart-time setting) with room
	// for walsenders and replication slots, and synchronous_commit = on,
	// for the relay's tests; the other tests keep wal_level = minimal,
	// which writes less WAL.
	Logical bool
	// StartTimeout bounds the wait for the server to accept connections when
	// the context passed to Start has no earlier deadline; 0 means 60 s.
	StartTimeout time.Duration
}

// Cluster is a running (or stopped) throwaway server, or an external one.
// Its methods are safe for concurrent use.
type Cluster struct {
	opts     Options
	external bool
	extURL   string

	root    string // the temporary directory; everything lives under it
	dataDir string
	sockDir string
	logPath string
	binDir  string
	port    int
	cred    *syscall.Credential // the postgres user when we are root, else nil
	uid     int                 // owner of the cluster files (-1: ourselves)
	gid     int

	mu      sync.Mutex // serialises lifecycle changes and guards the fields below
	proc    *process   // nil while stopped
	frozen  map[int]bool
	closed  bool
	helper  *pgx.Conn // lazily opened helper connection; guarded by helperM
	helperM sync.Mutex
}

// process is one run of the postmaster.
type process struct {
	pid  int
	done chan struct{} // closed when it has exited; err is set before
	err  error
}

// Start starts a new cluster (or, with LISTENHUB_TEST_DATABASE_URL, connects
// to that server to check it is reachable) and returns when it accepts
// connections. ctx bounds the whole start.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 300
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	if u := os.Getenv(EnvURL); u != "" {
		return startExternal(ctx, opts, u)
	}
	binDir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, binDir: binDir, uid: -1, gid: -1, frozen: map[int]bool{}}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgtest: running as root, so the server must run as the postgres OS user, but: %w (apt-get install postgresql creates it)", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		c.uid, c.gid = uid, gid
	}
	sweep(opts.Logf)
	if err := c.create(ctx); err != nil {
		os.RemoveAll(c.root)
		return nil, err
	}
	// A free port can be taken by someone else between our probe and the
	// server's bind (other test binaries start clusters in parallel): retry
	// with a new port a few times.
	for attempt := 1; ; attempt++ {
		err = c.start(ctx)
		if err == nil {
			break
		}
		if attempt == 5 || !strings.Contains(err.Error(), "could not bind") {
			os.RemoveAll(c.root)
			return nil, err
		}
		opts.Logf("pgtest: port %d taken, retrying", c.port)
		if c.port, err = freePort(); err != nil {
			os.RemoveAll(c.root)
			return nil, err
		}
	}
	return c, nil
}

func startExternal(ctx context.Context, opts Options, u string) (*Cluster, error) {
	c := &Cluster{opts: opts, external: true, extURL: u, frozen: map[int]bool{}}
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %s: %w", EnvURL, err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %s: cannot connect: %w", EnvURL, err)
	}
	conn.Close(ctx)
	opts.Logf("pgtest: using the external server of %s", EnvURL)
	return c, nil
}

// create makes the directory tree, runs initdb and writes the configuration.
func (c *Cluster) create(ctx context.Context) error {
	base := tempBase(c.cred != nil)
	root, err := os.MkdirTemp(base, dirPrefix)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	c.root = root
	c.dataDir = filepath.Join(root, "data")
	c.sockDir = filepath.Join(root, "sock")
	c.logPath = filepath.Join(root, "postgres.log")
	if err := os.WriteFile(filepath.Join(root, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if err := os.Mkdir(c.sockDir, 0o755); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if err := c.chown(root, c.sockDir); err != nil {
		return err
	}
	if c.port, err = freePort(); err != nil {
		return err
	}

	c.opts.Logf("pgtest: initdb %s (binaries %s)", c.dataDir, c.binDir)
	cmd := c.command(ctx, "initdb", "-D", c.dataDir, "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}

	conf := []string{
		"",
		"# pgtest: a throwaway cluster; durability is not wanted.",
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = '" + c.sockDir + "'",
		"max_connections = " + strconv.Itoa(c.opts.MaxConnections),
		"shared_buffers = '32MB'",
		"fsync = off",
		"synchronous_commit = off",
		"full_page_writes = off",
		"wal_level = minimal",
		"max_wal_senders = 0",
		"logging_collector = off",
		"log_line_prefix = '%m [%p] %q%a '",
	}
	if c.opts.TLS != nil {
		if err := c.writeCert(); err != nil {
			return err
		}
		conf = append(conf, "ssl = on", "ssl_cert_file = 'server.crt'", "ssl_key_file = 'server.key'")
	}
	if c.opts.Logical {
		// synchronous_commit on: a walsender sends only flushed WAL, and
		// with it off a commit waits for the WAL writer (up to
		// wal_writer_delay, 200 ms) before it can be decoded. fsync
		// stays off, so a flush costs little.
		conf = append(conf, "wal_level = logical", "max_wal_senders = 20", "max_replication_slots = 20",
			"synchronous_commit = on")
	}
	for k, v := range c.opts.Settings {
		conf = append(conf, k+" = '"+strings.ReplaceAll(v, "'", "''")+"'")
	}
	f, err := os.OpenFile(filepath.Join(c.dataDir, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	_, err = f.WriteString(strings.Join(conf, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtest: writing postgresql.conf: %w", err)
	}
	return nil
}

// chown gives paths to the postgres user when the server runs as it.
func (c *Cluster) chown(paths ...string) error {
	if c.uid < 0 {
		return nil
	}
	for _, p := range paths {
		if err := os.Chown(p, c.uid, c.gid); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
	}
	return nil
}

// BinDir returns the directory holding initdb and postgres that Start uses
// (EnvBinDir, else PATH, else the newest /usr/lib/postgresql/*/bin).
func BinDir() (string, error) { return findBinDir() }

// Version returns the server binary's version line (postgres --version),
// or "" for an external server.
func (c *Cluster) Version() string {
	if c.external {
		return ""
	}
	out, err := c.command(context.Background(), "postgres", "--version").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// command builds a command for one of the server binaries, run as the server
// user, with the PG* environment removed (PGDATA, PGPORT, ... must not steer
// initdb or the server).
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.root
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "LC_ALL=C")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd
}

// start runs the postmaster and waits until it accepts connections.
func (c *Cluster) start(ctx context.Context) error {
	logf, err := os.OpenFile(c.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	logStart, _ := logf.Seek(0, io.SeekEnd)
	cmd := c.command(context.Background(), "postgres", "-D", c.dataDir, "-p", strconv.Itoa(c.port))
	cmd.Stdout, cmd.Stderr = logf, logf
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// Own process group: a terminal's ^C reaches only us, and the helper
	// shuts the server down in order; a last-resort SIGKILL can hit the
	// postmaster and all its backends at once.
	cmd.SysProcAttr.Setpgid = true
	// If we die without Close, the server goes too. Immediate shutdown:
	// unlike a fast one it does not wait for a backend we froze.
	setPdeathsig(cmd.SysProcAttr, syscall.SIGQUIT)

	p := &process{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The kernel sends the parent-death signal when the thread that
		// forked exits, not the process: keep that thread alive, locked to
		// this goroutine blocked in Wait, for as long as the server runs.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			runtime.UnlockOSThread()
			logf.Close()
			started <- err
			return
		}
		p.pid = cmd.Process.Pid
		started <- nil
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
		// Returning while locked ends the thread, which is what we want.
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("pgtest: starting postgres: %w", err)
	}
	c.opts.Logf("pgtest: postgres pid %d on 127.0.0.1:%d and %s", p.pid, c.port, c.sockDir)

	timeout := c.opts.StartTimeout
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	interval := 10 * time.Millisecond
	for {
		select {
		case <-p.done:
			return fmt.Errorf("pgtest: postgres exited during start (%v):\n%s", p.err, c.logTail(logStart))
		default:
		}
		cctx, ccancel := context.WithTimeout(wctx, 2*time.Second)
		conn, err := pgconn.Connect(cctx, c.SocketURL())
		ccancel()
		if err == nil {
			conn.Close(wctx)
			break
		}
		select {
		case <-wctx.Done():
			c.kill(p)
			return fmt.Errorf("pgtest: postgres did not accept connections within %v (%v):\n%s", timeout, err, c.logTail(logStart))
		case <-p.done:
		case <-time.After(interval):
			interval = min(2*interval, 100*time.Millisecond)
		}
	}
	c.proc = p
	return nil
}

// logTail returns the server log written since offset from, at most 4 KiB.
func (c *Cluster) logTail(from int64) string {
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return err.Error()
	}
	if from < int64(len(b)) {
		b = b[from:]
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return strings.TrimRight(string(b), "\n")
}

// stop shuts the running server down: SIGINT (fast shutdown: backends
// terminated, checkpoint), escalating to SIGQUIT and then SIGKILL of the
// whole process group. Frozen backends are thawed first, since a stopped
// process cannot exit.
func (c *Cluster) stop(ctx context.Context) error {
	p := c.proc
	if p == nil {
		return nil
	}
	for pid := range c.frozen {
		syscall.Kill(pid, syscall.SIGCONT)
		delete(c.frozen, pid)
	}
	c.opts.Logf("pgtest: stopping postgres pid %d", p.pid)
	steps := []struct {
		sig  syscall.Signal
		wait time.Duration
	}{{syscall.SIGINT, 30 * time.Second}, {syscall.SIGQUIT, 10 * time.Second}}
	for _, s := range steps {
		syscall.Kill(p.pid, s.sig)
		t := time.NewTimer(s.wait)
		select {
		case <-p.done:
			t.Stop()
			c.proc = nil
			return nil
		case <-ctx.Done():
			t.Stop()
			c.kill(p)
			c.proc = nil
			return fmt.Errorf("pgtest: stop: %w (server killed)", ctx.Err())
		case <-t.C:
		}
	}
	c.kill(p)
	c.proc = nil
	return nil
}

// kill SIGKILLs the postmaster's process group, waits for the postmaster to
// be reaped and removes the lock file it could not remove itself.
func (c *Cluster) kill(p *process) {
	syscall.Kill(-p.pid, syscall.SIGKILL)
	<-p.done
	os.Remove(filepath.Join(c.dataDir, "postmaster.pid"))
}

// URL is the TCP URL of the server:
// postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable (or the
// external URL).
func (c *Cluster) URL() string {
	if c.external {
		return c.extURL
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// SocketURL is the same server through its Unix socket directory. For an
// external server it is the external URL.
func (c *Cluster) SocketURL() string {
	if c.external {
		return c.extURL
	}
	return fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", url.QueryEscape(c.sockDir), c.port)
}

// TLSURL is the TCP URL with sslmode=require, or "" when the cluster was
// started without Options.TLS or is external.
func (c *Cluster) TLSURL() string {
	if c.external || c.opts.TLS == nil {
		return ""
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=require", c.port)
}

// CertFile is the path of the server's self-signed certificate (valid for
// 127.0.0.1, ::1 and localhost; usable as sslrootcert with
// sslmode=verify-full), or "" without TLS.
func (c *Cluster) CertFile() string {
	if c.external || c.opts.TLS == nil {
		return ""
	}
	return filepath.Join(c.root, "server.crt")
}

// Port is the server's TCP port (0 for an external server). It stays the
// same across Stop/Start and Restart.
func (c *Cluster) Port() int { return c.port }

// SocketDir is the directory holding the server's Unix socket ("" when
// external).
func (c *Cluster) SocketDir() string { return c.sockDir }

// Dir is the cluster's temporary directory (data/, sock/, postgres.log);
// "" when external.
func (c *Cluster) Dir() string { return c.root }

// External reports whether this is the server of LISTENHUB_TEST_DATABASE_URL.
func (c *Cluster) External() bool { return c.external }

// PID is the postmaster's pid, 0 while stopped or when external.
func (c *Cluster) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return 0
	}
	return c.proc.pid
}

// Stop shuts the server down (fast shutdown: every connection is
// terminated). Start brings it back on the same port and socket directory.
func (c *Cluster) Stop(ctx context.Context) error {
	if c.external {
		return ErrExternal
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropHelper()
	return c.stop(ctx)
}

// lockOwn takes c.mu of a cluster this process started and has not closed.
func (c *Cluster) lockOwn() error {
	if c.external {
		return ErrExternal
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errors.New("pgtest: cluster closed")
	}
	return nil
}

// Start starts a stopped server again, on the same port, and waits until it
// accepts connections. It is a no-op when the server runs.
func (c *Cluster) Start(ctx context.Context) error {
	if err := c.lockOwn(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if c.proc != nil {
		return nil
	}
	return c.start(ctx)
}

// Restart stops and starts the server (every connection is terminated).
func (c *Cluster) Restart(ctx context.Context) error {
	if err := c.lockOwn(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.dropHelper()
	if err := c.stop(ctx); err != nil {
		return err
	}
	return c.start(ctx)
}

// Close stops the server and removes its directory; for an external server it
// only closes the helper connection. It is idempotent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropHelper()
	if c.external || c.closed {
		c.closed = true
		return nil
	}
	c.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := c.stop(ctx)
	if rerr := os.RemoveAll(c.root); err == nil && rerr != nil {
		err = fmt.Errorf("pgtest: %w", rerr)
	}
	c.opts.Logf("pgtest: removed %s", c.root)
	return err
}

// dropHelper closes the helper connection (the server is going away).
func (c *Cluster) dropHelper() {
	c.helperM.Lock()
	defer c.helperM.Unlock()
	if c.helper != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c.helper.Close(ctx)
		cancel()
		c.helper = nil
	}
}

// withHelper runs f on the helper connection, (re)connecting as needed. A
// failure that pgconn says is safe to retry (the request never reached a
// server, e.g. the connection died in a restart) is retried once on a fresh
// connection.
func (c *Cluster) withHelper(ctx context.Context, f func(*pgx.Conn) error) error {
	c.helperM.Lock()
	defer c.helperM.Unlock()
	for attempt := 0; ; attempt++ {
		if c.helper == nil || c.helper.IsClosed() {
			cfg, err := pgx.ParseConfig(c.URL())
			if err != nil {
				return fmt.Errorf("pgtest: %w", err)
			}
			cfg.RuntimeParams["application_name"] = helperApp
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				return fmt.Errorf("pgtest: helper connection: %w", err)
			}
			c.helper = conn
		}
		err := f(c.helper)
		if err == nil {
			return nil
		}
		if c.helper.IsClosed() || pgconn.SafeToRetry(err) {
			c.helper.Close(context.Background())
			c.helper = nil
			if attempt == 0 && pgconn.SafeToRetry(err) && ctx.Err() == nil {
				continue
			}
		}
		return err
	}
}

// Exec runs one statement on a helper connection (application_name
// "pgtest"), e.g. c.Exec(ctx, "SELECT pg_notify($1, $2)", ch, payload).
func (c *Cluster) Exec(ctx context.Context, sql string, args ...any) error {
	return c.withHelper(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	})
}

// Notify sends NOTIFY channel, payload through the helper connection.
func (c *Cluster) Notify(ctx context.Context, channel, payload string) error {
	return c.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload)
}

// QueryInt runs a query returning one integer (a count, say).
func (c *Cluster) QueryInt(ctx context.Context, sql string, args ...any) (int, error) {
	var n int
	err := c.withHelper(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, sql, args...).Scan(&n)
	})
	return n, err
}

// Terminate calls pg_terminate_backend for every client backend with this
// application_name and returns how many were signalled. It does not wait for
// them to exit.
func (c *Cluster) Terminate(ctx context.Context, applicationName string) (int, error) {
	return c.QueryInt(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int
		FROM pg_stat_activity
		WHERE application_name = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()`,
		applicationName)
}

// BackendPIDs returns the pids of the client backends with this
// application_name, in increasing order.
func (c *Cluster) BackendPIDs(ctx context.Context, applicationName string) ([]int, error) {
	var pids []int
	err := c.withHelper(ctx, func(conn *pgx.Conn) error {
		pids = pids[:0]
		rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()
			ORDER BY pid`, applicationName)
		if err != nil {
			return err
		}
		for rows.Next() {
			var pid int
			if err := rows.Scan(&pid); err != nil {
				rows.Close()
				return err
			}
			pids = append(pids, pid)
		}
		return rows.Err()
	})
	return pids, err
}

func procState(pid int) (byte, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	return f[0][0], nil
}

// freePort asks the kernel for a free port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
