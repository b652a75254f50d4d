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
	"strconv"
	"strings"
	"time"

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

// inheritedUpgrade returns the connection to the old process when this
// process was started by a hot upgrade, nil otherwise. The variable is
// removed, so that this process's own upgrades start clean.
func inheritedUpgrade() (*fdpass.Conn, error) {
	v := os.Getenv(upgradeEnv)
	if v == "" {
		return nil, nil
	}
	os.Unsetenv(upgradeEnv)
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
	exe     string // os.Executable at start: the path, not the running file
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
func (u *upgrader) waitPredecessor() error {
	if u.predecessor <= 0 {
		return nil
	}
	deadline := time.Now().Add(u.timeout)
	for os.Getppid() == u.predecessor {
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
	start := time.Now()
	if err := u.waitPredecessor(); err != nil {
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
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		mine.Close()
		u.log.Error("upgrade failed; serving on", "reason", fmt.Errorf("start %s: %w", u.exe, err))
		return false
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	conn, err := fdpass.New(mine)
	mine.Close()
	if err != nil {
		cmd.Process.Kill()
		u.log.Error("upgrade failed; serving on", "reason", err, "new_exit", <-exited)
		return false
	}
	defer conn.Close()
	extra := map[string]int{}
	if u.metrics != nil {
		if f, err := u.metrics.(*net.TCPListener).File(); err == nil {
			defer f.Close()
			extra["metrics"] = int(f.Fd())
		}
	}
	hctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	if err := hubUp.Handover(u.h, hctx, conn, extra); err != nil {
		cmd.Process.Kill()
		werr := <-exited
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

// writePIDFile writes this process's pid to path atomically (a temporary
// file in the same directory, then rename), so that a reader never sees a
// partial pid.
func writePIDFile(path string) error {
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("pid file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("pid file: %w", err)
	}
	return nil
}

// removePIDFile removes path if it still names this process: after an
// upgrade it names the new one, which must keep it.
func removePIDFile(path string) {
	b, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(os.Getpid()) {
		os.Remove(path)
	}
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
