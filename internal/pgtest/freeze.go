package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The fault tools on a backend: Freeze and Thaw (SIGSTOP, SIGCONT) a
// backend of this cluster, checked to be one. Only tests call them, so the
// linker leaves them out of a binary that starts a cluster (listenhub
// demo); cmd/listenhub's TestBinaryHasNoTestTools holds that.

// lockBackend takes c.mu when pid is a backend of a cluster this process
// started.
func (c *Cluster) lockBackend(pid int) error {
	if c.external {
		return ErrExternal
	}
	c.mu.Lock()
	if err := c.checkBackend(pid); err != nil {
		c.mu.Unlock()
		return err
	}
	return nil
}

// Freeze stops a backend process with SIGSTOP, as a hung server or a
// half-open connection looks to a client: the socket stays open, nothing
// answers. It returns once the kernel reports the process stopped. pid must
// be a backend of this cluster. Stop, Restart and Close thaw frozen backends.
func (c *Cluster) Freeze(pid int) error {
	if err := c.lockBackend(pid); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pgtest: freeze %d: %w", pid, os.NewSyscallError("kill", err))
	}
	c.frozen[pid] = true
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := procState(pid)
		if err != nil || st == 'T' || st == 't' {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: freeze %d: still in state %c after SIGSTOP", pid, st)
		}
		time.Sleep(time.Millisecond)
	}
}

// FreezeIdle is Freeze at a moment the backend is idle: outside a
// transaction, waiting for its client's next message. A backend frozen
// while it runs a statement or ends a transaction may hold a lock or a
// shared-memory LWLock (a snapshot's ProcArrayLock, the lock manager's
// partition locks at commit), and then every other session that needs it
// hangs with it, which is not the half-open connection a test means. It
// freezes, checks the frozen process (the idle/ClientRead that
// pg_stat_activity last had from it, and epoll_wait on its client where
// /proc can tell), and thaws and tries again until they hold or ctx ends;
// ctx needs a deadline.
func (c *Cluster) FreezeIdle(ctx context.Context, pid int) error {
	for {
		if err := c.Freeze(pid); err != nil {
			return err
		}
		idle, err := c.frozenIdle(ctx, pid)
		if err == nil && idle {
			return nil
		}
		if terr := c.Thaw(pid); terr != nil {
			return terr
		}
		if err != nil {
			return fmt.Errorf("pgtest: freeze %d while idle: %w", pid, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: freeze %d while idle: never idle: %w", pid, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// epollWaits are the numbers of epoll_wait, epoll_pwait and epoll_pwait2,
// as /proc/PID/syscall shows them for a process stopped in one, on the
// architectures where it shows them: arm64 forgets a stopped task's system
// call (it reads -1), and elsewhere the numbers are not listed here.
var epollWaits = map[string]map[string]bool{
	"amd64": {"232": true, "281": true, "441": true},
}

// stoppedInEpoll reads /proc/PID/syscall of a stopped process: idle is
// whether it stopped in an epoll wait, and known whether the file can say
// so on this architecture (see epollWaits).
func stoppedInEpoll(arch, syscallFile string) (idle, known bool) {
	waits, ok := epollWaits[arch]
	if !ok {
		return false, false
	}
	nr, _, _ := strings.Cut(strings.TrimSpace(syscallFile), " ")
	return waits[nr], true
}

// frozenIdle reports whether the frozen backend pid stopped in its wait for
// the client: its last reported state is idle, waiting on ClientRead, and,
// where /proc can tell (x86-64, with ptrace access to the backend: root
// without CAP_SYS_PTRACE has none to another user's process), its
// interrupted system call is an epoll wait.
func (c *Cluster) frozenIdle(ctx context.Context, pid int) (bool, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/syscall")
	switch {
	case err == nil:
		if idle, known := stoppedInEpoll(runtime.GOARCH, string(b)); known && !idle {
			return false, nil
		}
	case errors.Is(err, fs.ErrPermission):
		// pg_stat_activity alone, below.
	default:
		return false, err
	}
	// A backend frozen halfway through reporting its state makes a reader
	// of pg_stat_activity wait for it: bounded, and then not idle.
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	n, err := c.QueryInt(qctx, `SELECT count(*)::int FROM pg_stat_activity
		WHERE pid = $1 AND state = 'idle' AND wait_event = 'ClientRead'`, pid)
	if err != nil && qctx.Err() != nil && ctx.Err() == nil {
		return false, nil
	}
	return n == 1, err
}

// Thaw resumes a backend stopped by Freeze (SIGCONT).
func (c *Cluster) Thaw(pid int) error {
	if err := c.lockBackend(pid); err != nil {
		return err
	}
	defer c.mu.Unlock()
	delete(c.frozen, pid)
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		return fmt.Errorf("pgtest: thaw %d: %w", pid, os.NewSyscallError("kill", err))
	}
	return nil
}

// checkBackend makes sure pid is a child of our postmaster, so that a wrong
// pid never stops an unrelated process.
func (c *Cluster) checkBackend(pid int) error {
	if c.proc == nil {
		return errors.New("pgtest: server not running")
	}
	ppid, err := procPPID(pid)
	if err != nil {
		return fmt.Errorf("pgtest: pid %d: %w", pid, err)
	}
	if ppid != c.proc.pid {
		return fmt.Errorf("pgtest: pid %d is not a backend of this cluster (parent %d, postmaster %d)", pid, ppid, c.proc.pid)
	}
	return nil
}

// procStat returns the fields of /proc/pid/stat after the command name.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return nil, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	return f, nil
}

func procPPID(pid int) (int, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(f[1])
}
