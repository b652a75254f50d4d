// Package pgcluster starts a throwaway PostgreSQL cluster for the benchmarks.
//
// It is a small copy of the main module's internal/pgtest: benchmarks/ is a
// separate Go module, and Go's internal rule forbids it to import
// github.com/listenhub/listenhub/internal/.... The cluster lives in a temp
// dir, listens on its own port on 127.0.0.1 and on a Unix socket in that dir,
// and runs as the postgres user when the harness runs as root (postgres
// refuses to run as root).
//
// It is tuned for measuring fanout, not disk: fsync, synchronous_commit and
// full_page_writes are off, so a NOTIFY commit costs CPU, not an fsync
// (Options.Durable turns them back on, for the writers scenario).
// max_connections is high enough for 1,000 direct listeners.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options configures Start.
type Options struct {
	// MaxConnections is the server's max_connections. Default 1100.
	MaxConnections int
	// Logf, when set, receives progress lines.
	Logf func(format string, args ...any)
	// Durable keeps PostgreSQL's defaults for fsync, synchronous_commit
	// and full_page_writes (on): a commit waits for its WAL flush. Time
	// checkpoints are pushed out to 30 min, so that the harness decides
	// when one runs.
	Durable bool
	// Logical sets wal_level=logical (with WAL senders and slots for
	// logical replication).
	Logical bool
}

// Cluster is a running throwaway cluster.
type Cluster struct {
	dir     string // temp root: data/ and the socket dir live here
	bin     string // directory holding initdb and postgres
	port    int
	cmd     *exec.Cmd
	cred    *syscall.Credential
	version string
	exited  chan struct{}
}

// URL is a TCP connection URL for the superuser.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// SocketURL is URL through the cluster's Unix socket directory instead of
// TCP: what a client on the database's host should use.
func (c *Cluster) SocketURL() string {
	// pgx decodes %XX in a URL's query but not '+': a space is %20.
	host := strings.ReplaceAll(url.QueryEscape(c.dir), "+", "%20")
	return fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", host, c.port)
}

// Version is the server's version string (postgres --version).
func (c *Cluster) Version() string { return c.version }

// Dir is the directory holding the data directory (on the same file
// system, so pg_test_fsync run here measures the WAL's disk).
func (c *Cluster) Dir() string { return c.dir }

// PID is the postmaster's pid.
func (c *Cluster) PID() int { return c.cmd.Process.Pid }

// BinDir is the directory of the PostgreSQL binaries Start uses.
func BinDir() (string, error) { return findBin() }

// findBin returns the newest /usr/lib/postgresql/*/bin holding initdb, or
// the directory of initdb on PATH.
func findBin() (string, error) {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[j]))))
		return vi > vj
	})
	if len(matches) > 0 {
		return filepath.Dir(matches[0]), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("pgcluster: no initdb found (install postgresql, e.g. apt-get install postgresql)")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start initializes and starts a cluster. Close stops it and removes its files.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 1100
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "lhbench-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, bin: bin, exited: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: running as root needs a postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	out, err := c.command(ctx, "postgres", "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("pgcluster: postgres --version: %w", err)
	}
	c.version = strings.TrimSpace(string(out))
	data := filepath.Join(dir, "data")
	logf("pgcluster: initdb %s (%s)", data, c.version)
	initdb := c.command(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgcluster: initdb: %w\n%s", err, out)
	}
	c.port, err = freePort()
	if err != nil {
		return nil, err
	}
	// shared_buffers stays small: 1,100 connections need only their own
	// per-backend shared memory, which postgres sizes from max_connections.
	settings := []string{
		"port=" + strconv.Itoa(c.port),
		"listen_addresses=127.0.0.1",
		"unix_socket_directories=" + dir,
		"max_connections=" + strconv.Itoa(opts.MaxConnections),
		"shared_buffers=128MB",
		"max_wal_size=1GB",
		"log_min_messages=warning",
		"logging_collector=off",
	}
	if opts.Durable {
		settings = append(settings, "fsync=on", "synchronous_commit=on", "full_page_writes=on", "checkpoint_timeout=30min", "max_wal_size=4GB")
	} else {
		settings = append(settings, "fsync=off", "synchronous_commit=off", "full_page_writes=off")
	}
	if opts.Logical {
		settings = append(settings, "wal_level=logical", "max_wal_senders=10", "max_replication_slots=10")
	}
	args := []string{"-D", data}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	logFile, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return nil, err
	}
	if c.cred != nil {
		os.Chown(logFile.Name(), int(c.cred.Uid), int(c.cred.Gid))
	}
	c.cmd = c.command(context.Background(), "postgres", args...)
	c.cmd.Stdout = logFile
	c.cmd.Stderr = logFile
	// Own process group, so that a terminal ^C reaches the harness only and
	// the harness stops postgres in order.
	c.cmd.SysProcAttr.Setpgid = true
	if err := c.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	go func() { c.cmd.Wait(); logFile.Close(); close(c.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, c.URL())
		if err == nil {
			conn.Close(ctx)
			break
		}
		select {
		case <-c.exited:
			log, _ := os.ReadFile(logFile.Name())
			return nil, fmt.Errorf("pgcluster: postgres exited during start:\n%s", log)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.kill()
			return nil, fmt.Errorf("pgcluster: postgres not ready after 30s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	logf("pgcluster: postgres ready on port %d (pid %d)", c.port, c.cmd.Process.Pid)
	ok = true
	return c, nil
}

func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

func (c *Cluster) kill() {
	c.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
	}
}

// Close stops the server (fast shutdown) and removes its files.
func (c *Cluster) Close() error {
	if c.cmd != nil && c.cmd.Process != nil {
		c.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-c.exited:
		case <-time.After(15 * time.Second):
			c.kill()
		}
	}
	return os.RemoveAll(c.dir)
}
