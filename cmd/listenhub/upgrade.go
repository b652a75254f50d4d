package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/fdpass"
	"github.com/listenhub/listenhub/internal/handoff"
	"github.com/listenhub/listenhub/internal/systemd"
)

// hubUp is the hub's side of the hand-over (not part of its API).
var hubUp = handoff.GetHub[*hub.Hub]()

// upgradeEnv names the descriptor through which the new process of a hot
// upgrade (SIGUSR2) talks to the old one; the old one sets it for its child.
const upgradeEnv = "LISTENHUB_UPGRADE_FD"

// defaultUpgradeTimeout bounds an upgrade from SIGUSR2 to the new process's
// commit; past it the old process serves on.
const defaultUpgradeTimeout = 10 * time.Second

// refusedExit is how long a new process that refused the hand-over is given
// to exit by itself before it is killed.
const refusedExit = 2 * time.Second

// inheritedUpgrade returns the connection to the old process when this
// process was started by a hot upgrade, nil otherwise. The variable is
// removed, so that this process's own upgrades start clean.
func inheritedUpgrade() (*fdpass.Conn, error) {
	v := os.Getenv(upgradeEnv)
	if v == "" {
		return nil, nil
	}
	os.Unsetenv(upgradeEnv)
	if errNoHotUpgrade != nil {
		return nil, errNoHotUpgrade
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: not a descriptor", upgradeEnv, v)
	}
	f := os.NewFile(uintptr(fd), "upgrade")
	defer f.Close()
	return fdpass.New(f)
}

// upgrader runs hot upgrades of a serving hub: on SIGUSR2 it starts the
// binary found at exe now (a replaced file is the new version) with the same
// arguments and hands the hub over to it.
type upgrader struct {
	exe     string // the path this process was started from (upgradePath)
	args    []string
	timeout time.Duration
	log     *slog.Logger
	stdout  io.Writer
	stderr  io.Writer
	h       *hub.Hub
	metrics net.Listener // handed over too, when set
	// predecessor is the pid of the process this one took over from
	// (its parent), until it has exited: an upgrade waits for that, so
	// that no more than two hubs (and two backends) ever exist.
	predecessor int
}

// waitPredecessor waits, at most the upgrade timeout, for the process this
// one took over from to exit.
func (u *upgrader) waitPredecessor(ctx context.Context) error {
	if u.predecessor <= 0 {
		return nil
	}
	deadline := time.Now().Add(u.timeout)
	for os.Getppid() == u.predecessor {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the process this one took over from (pid %d) has not exited after %v", u.predecessor, u.timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	u.predecessor = 0
	return nil
}

// run performs one upgrade and reports whether the new process took over
// (then this hub has stopped and the process should exit). On a failure the
// hub serves on and the reason is logged.
func (u *upgrader) run(ctx context.Context) bool {
	if errNoHotUpgrade != nil {
		u.log.Error("upgrade refused; serving on", "reason", errNoHotUpgrade)
		return false
	}
	start := time.Now()
	if err := u.waitPredecessor(ctx); err != nil {
		u.log.Error("upgrade refused; serving on", "reason", err)
		return false
	}
	u.log.Info("upgrade: starting the new process", "path", u.exe)
	mine, theirs, err := fdpass.Pair()
	if err != nil {
		u.log.Error("upgrade failed; serving on", "reason", err)
		return false
	}
	cmd := exec.Command(u.exe, u.args...)
	cmd.Env = append(upgradeChildEnv(os.Environ(), u.h.Config().SocketPath), upgradeEnv+"=3")
	cmd.ExtraFiles = []*os.File{theirs} // descriptor 3
	cmd.Stdin = os.Stdin
	cmd.Stdout, cmd.Stderr = asFile(u.stdout, os.Stdout), asFile(u.stderr, os.Stderr)
	// A process group of its own: whatever it starts (a script in place
	// of the binary, say) holds the hand-over socket too, and a failed
	// attempt kills them all.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		mine.Close()
		u.log.Error("upgrade failed; serving on", "reason", fmt.Errorf("start %s: %w", u.exe, err))
		return false
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	kill := func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	conn, err := fdpass.New(mine)
	mine.Close()
	if err != nil {
		kill()
		u.log.Error("upgrade failed; serving on", "reason", err, "new_exit", <-exited)
		return false
	}
	defer conn.Close()
	extra := map[string]int{}
	if u.metrics != nil {
		if fd, err := dupListener(u.metrics); err == nil {
			defer unix.Close(fd)
			extra["metrics"] = fd
		} else {
			u.log.Warn("upgrade: the metrics listener is not handed over", "reason", err)
		}
	}
	hctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	// A SIGTERM (ctx) or the deadline ends a wait on the new process at
	// once, whatever step it is in.
	stopWait := context.AfterFunc(hctx, func() { conn.SetDeadline(time.Now()) })
	defer stopWait()
	if err := hubUp.Handover(u.h, hctx, conn, extra); err != nil {
		var werr error
		if errors.Is(err, handoff.ErrRefused) {
			// It refused and exits on its own, after its line saying
			// why: not cut short by the kill, unless it lingers.
			select {
			case werr = <-exited:
				exited <- werr
			case <-time.After(refusedExit):
			}
		}
		kill()
		werr = <-exited
		u.log.Error("upgrade abandoned; the new process was stopped", "reason", err, "new_pid", cmd.Process.Pid,
			"new_exit", exitString(werr), "timeout", u.timeout)
		return false
	}
	u.log.Info("upgrade: handed over", "new_pid", cmd.Process.Pid, "took", time.Since(start).Round(time.Microsecond))
	// From the main process: systemd accepts MAINPID= from it whatever
	// NotifyAccess says.
	notifyMainPID(cmd.Process.Pid)
	return true
}

// dupListener duplicates ln's descriptor without (*os.File).Fd, which
// would put the socket, shared with ln, in blocking mode: ln's Accept, and
// with it the metrics server's Close, would then block.
func dupListener(ln net.Listener) (int, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("%T has no descriptor", ln)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	return fd, derr
}

// upgradePath is the path an upgrade starts the new process from: the
// one this process was started from, made absolute but with its links
// not resolved, so that switching a link (bin/listenhub -> a new
// version) is what the next upgrade runs.
func upgradePath() string {
	arg0 := os.Args[0]
	if !strings.Contains(arg0, "/") {
		if p, err := exec.LookPath(arg0); err == nil {
			arg0 = p
		}
	}
	if strings.Contains(arg0, "/") {
		if p, err := filepath.Abs(arg0); err == nil {
			return p
		}
	}
	exe, _ := os.Executable()
	return exe
}

// takeover is serve's start in the new process of an upgrade.
func takeover(ctx context.Context, h *hub.Hub, conn *fdpass.Conn, timeout time.Duration, pidFile string, log *slog.Logger) (metrics net.Listener, err error) {
	defer conn.Close()
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	extra, err := hubUp.Takeover(h, tctx, conn, func() {
		if pidFile != "" {
			if err := writePIDFile(pidFile); err != nil {
				log.Error("pid file", "reason", err)
			}
		}
		notifyMainPID(os.Getpid())
	})
	if err != nil {
		return nil, err
	}
	if fd, ok := extra["metrics"]; ok {
		f := os.NewFile(uintptr(fd), "metrics")
		metrics, err = net.FileListener(f)
		f.Close()
		if err != nil {
			log.Error("upgrade: metrics listener not taken over", "reason", err)
			metrics = nil
		}
	}
	return metrics, nil
}

// notifyMainPID tells systemd that pid is the service's main process now
// (MAINPID=): the old process says it before it exits, the new one once it
// serves (accepted with NotifyAccess=all). A variable, so that tests can
// watch it; a no-op outside systemd.
var notifyMainPID = func(pid int) {
	_ = systemd.Notify("MAINPID=" + strconv.Itoa(pid))
}

// upgradeChildEnv is the environment of the new process. WATCHDOG_PID goes:
// it names this process, and the new one, the main process from now on,
// pings the watchdog itself. The socket path is passed along: a hub
// started by systemd socket activation may have none on its command line,
// and the new process gets the socket from the handover, not LISTEN_FDS.
func upgradeChildEnv(env []string, socket string) []string {
	env = withoutEnv(withoutEnv(env, upgradeEnv), "WATCHDOG_PID")
	if socket != "" {
		env = append(withoutEnv(env, envName("socket")), envName("socket")+"="+socket)
	}
	return env
}

func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, name+"=") {
			out = append(out, e)
		}
	}
	return out
}

// asFile returns w as the *os.File the child inherits, or def: a child
// writing to a pipe of ours would need a goroutine of ours copying, which
// would die with us.
func asFile(w io.Writer, def *os.File) *os.File {
	if f, ok := w.(*os.File); ok {
		return f
	}
	return def
}

func exitString(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit status 0"
	case errors.As(err, &ee):
		return ee.String()
	}
	return err.Error()
}
