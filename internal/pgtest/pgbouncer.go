package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoPgBouncer is wrapped by StartPgBouncer's error when the pgbouncer
// binary is not installed (Debian: apt-get install pgbouncer).
var ErrNoPgBouncer = errors.New("pgbouncer not found on PATH or in /usr/sbin (Debian/Ubuntu: apt-get install pgbouncer)")

// PgBouncer is a PgBouncer started in front of a Cluster, with its own ini
// file, port and log in a directory under the cluster's. It runs as the
// server's OS user (PgBouncer refuses to run as root) and dies with the
// process that started it (parent-death signal).
type PgBouncer struct {
	mode string
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// pgbouncerBin finds the pgbouncer binary.
func pgbouncerBin() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("pgtest: %w", ErrNoPgBouncer)
}

// StartPgBouncer starts a PgBouncer with pool_mode mode ("transaction",
// "session" or "statement") that serves the cluster's database "postgres"
// to any user with auth_type trust, on its own port on 127.0.0.1, and
// returns once it accepts connections. It is not possible on an external
// server (ErrExternal).
func (c *Cluster) StartPgBouncer(ctx context.Context, mode string) (*PgBouncer, error) {
	if c.external {
		return nil, ErrExternal
	}
	bin, err := pgbouncerBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(c.root, "pgbouncer-"+mode+"-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := c.chown(dir); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{mode: mode, dir: dir, port: port, done: make(chan struct{})}
	ini := strings.Join([]string{
		"[databases]",
		fmt.Sprintf("postgres = host=%s port=%d dbname=postgres", c.sockDir, c.port),
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(dir, "userlist.txt"),
		"pool_mode = " + mode,
		"default_pool_size = 4",
		"max_client_conn = 100",
		"logfile = " + filepath.Join(dir, "pgbouncer.log"),
		"pidfile =",
		"ignore_startup_parameters = extra_float_digits",
		"",
	}, "\n")
	files := map[string]string{"pgbouncer.ini": ini, "userlist.txt": `"postgres" ""` + "\n"}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
		if err := c.chown(p); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	setPdeathsig(cmd.SysProcAttr, syscall.SIGKILL)
	if c.cred != nil {
		cmd.SysProcAttr.Credential = c.cred
	}
	b.cmd = cmd
	started := make(chan error, 1)
	go func() {
		// Pdeathsig follows the thread that forked: keep it (see start).
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			runtime.UnlockOSThread()
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(b.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("pgtest: starting pgbouncer: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgconn.Connect(cctx, b.URL())
		cancel()
		if err == nil {
			conn.Close(ctx)
			return b, nil
		}
		select {
		case <-b.done:
			return nil, fmt.Errorf("pgtest: pgbouncer exited during start: %s", b.Log())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			b.Close()
			return nil, fmt.Errorf("pgtest: pgbouncer did not accept connections (%v): %s", err, b.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// URL is the PgBouncer's URL for the database "postgres" as user postgres.
func (b *PgBouncer) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", b.port)
}

// Log returns the PgBouncer's whole log file (tests count its lines).
func (b *PgBouncer) Log() string {
	s, err := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	if err != nil {
		return err.Error()
	}
	return string(s)
}

// Close stops the PgBouncer (SIGINT, then SIGKILL) and removes its
// directory. It is idempotent.
func (b *PgBouncer) Close() {
	if b.cmd != nil && b.cmd.Process != nil {
		select {
		case <-b.done:
		default:
			_ = b.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-b.done:
			case <-time.After(5 * time.Second):
				_ = b.cmd.Process.Kill()
				<-b.done
			}
		}
	}
	os.RemoveAll(b.dir)
}
