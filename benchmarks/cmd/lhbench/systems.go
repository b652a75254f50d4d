package main

// The systems under test: the listenhub binary, the baselines, and direct
// per-worker LISTEN.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/benchmarks/internal/wire"
)

// system is one fanout system: how to start its server and how its
// workers subscribe.
type system struct {
	name    string // "direct", "hub", "gohub", "gnet"
	direct  bool   // workers LISTEN themselves; no server process
	appName string // application_name of its backends
	dbURL   string
	socket  string // set while running

	argv     []string // server command, without --database-url/--socket
	cpus     int      // when > 0, the server runs under taskset on cores 0..cpus-1
	memstats string   // when set, --memstats path (the server answers SIGUSR1)
	// session starts the server in a session of its own, as a service
	// manager does. On Linux with autogroup scheduling (the default) a
	// session is the unit that gets a fair share of the CPU, and every
	// PostgreSQL backend is a session; in the harness's session the server
	// would share one backend's share with every worker and writer.
	session bool
	cmd     *exec.Cmd
	log     *os.File
	done    chan struct{}
}

func (s *system) serverPID() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// start starts the server (not for direct) and waits until it accepts a
// connection and says status.
func (s *system) start(dir string) error {
	if s.direct {
		return nil
	}
	s.socket = filepath.Join(dir, s.name+".sock")
	os.Remove(s.socket)
	args := append(append([]string(nil), s.argv[1:]...), "--database-url", s.dbURL, "--socket", s.socket)
	if s.memstats != "" {
		os.Remove(s.memstats)
		args = append(args, "--memstats", s.memstats)
	}
	if d := os.Getenv("LHBENCH_CPUPROFILE"); d != "" && s.argv[0] != "" && len(s.argv) > 1 && s.argv[1] != "serve" {
		// One CPU profile per server start, for the in-process servers.
		profileSeq++
		args = append(args, "--cpuprofile", filepath.Join(d, fmt.Sprintf("%s-%d.pprof", s.name, profileSeq)))
	}
	if s.cpus > 0 {
		args = append([]string{"-c", fmt.Sprintf("0-%d", s.cpus-1), s.argv[0]}, args...)
		s.cmd = exec.Command("taskset", args...)
	} else {
		s.cmd = exec.Command(s.argv[0], args...)
	}
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: !s.session, Setsid: s.session, Pdeathsig: syscall.SIGKILL}
	var err error
	s.log, err = os.OpenFile(filepath.Join(dir, s.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("%s: start: %w", s.name, err)
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := probe(s.socket)
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("%s exited at start: %s", s.name, tailFile(s.log.Name(), 5))
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return fmt.Errorf("%s not ready in 15s: %v; log: %s", s.name, err, tailFile(s.log.Name(), 5))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var profileSeq int

// probe connects to a hub socket and waits for its first status frame.
func probe(path string) error {
	c, err := dialUnix(path, 0)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	r := wire.NewReader(c, 4096)
	body, err := r.Next()
	if err != nil {
		return err
	}
	m, err := wire.Decode(body)
	if err != nil {
		return err
	}
	if m.T != "status" {
		return fmt.Errorf("first frame is %q, want status", m.T)
	}
	if !m.Healthy {
		return fmt.Errorf("hub says unhealthy")
	}
	return nil
}

func (s *system) stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGCONT)
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.log.Close()
	s.cmd = nil
}

// heap asks the server for its Go heap after a GC (SIGUSR1, see serveMemstats).
func (s *system) heap(prevSeq int) (heapStats, error) {
	var h heapStats
	if s.memstats == "" || s.cmd == nil {
		return h, fmt.Errorf("no memstats")
	}
	s.cmd.Process.Signal(syscall.SIGUSR1)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(s.memstats); err == nil && json.Unmarshal(b, &h) == nil && h.Seq > prevSeq {
			return h, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return h, fmt.Errorf("%s: no memstats after SIGUSR1", s.name)
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	return lastLines(string(b), n)
}

// procMem reads VmRSS (bytes) and the open fd count of pid.
func procMem(pid int) (rss int64, fds int, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			rss = kb << 10
		}
	}
	f.Close()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return rss, 0, err
	}
	return rss, len(ents), nil
}

// procCPU is the user+system CPU time pid has used (10 ms resolution).
func procCPU(pid int) time.Duration {
	u, s := procCPUSplit(pid)
	return u + s
}

// procCPUSplit is procCPU's user and system parts.
func procCPUSplit(pid int) (user, sys time.Duration) {
	if pid == 0 {
		return 0, 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// Fields after the parenthesised command: state is field 3, utime 14, stime 15.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut) * 10 * time.Millisecond, time.Duration(st) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// findRepoRoot walks up from the working directory to the main module.
func findRepoRoot() (string, error) {
	dir, _ := os.Getwd()
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/listenhub/listenhub\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("main module not found above the working directory")
		}
		dir = parent
	}
}

// buildHub builds ../cmd/listenhub into dir.
func buildHub(ctx context.Context, dir, name string, flags ...string) (string, error) {
	root, err := findRepoRoot()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "listenhub")); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", append(append([]string{"build"}, flags...), "-o", bin, "./cmd/listenhub")...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/listenhub: %v: %s", err, lastLines(string(out), 4))
	}
	return bin, nil
}
