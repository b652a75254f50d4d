package main

// The harness side of the worker processes.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/benchmarks/internal/hist"
)

type proc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan []byte
	stderr *bytes.Buffer
	done   chan struct{}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) send(line string) error {
	_, err := io.WriteString(p.in, line+"\n")
	return err
}

func (p *proc) recv(timeout time.Duration) ([]byte, error) {
	select {
	case l, ok := <-p.lines:
		if !ok {
			<-p.done
			return nil, fmt.Errorf("worker %d exited: %s", p.pid(), lastLines(p.stderr.String(), 3))
		}
		return l, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("worker %d: no answer in %v", p.pid(), timeout)
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}

// startProc re-execs this binary with args.
func startProc(env []string, args ...string) (*proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), env...)
	// Own process group: a terminal ^C goes to the harness, which then
	// stops its children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, in: in, lines: make(chan []byte, 16), stderr: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{w: p.stderr}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			p.lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(p.lines)
		cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.Len() > 1<<20 {
		return len(b), nil
	}
	return l.w.Write(b)
}

func (p *proc) stop() {
	p.send("quit")
	p.in.Close()
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Kill()
		<-p.done
	}
}

// fleet is a set of worker processes holding conns subscriptions in total.
type fleet struct {
	procs     []*proc
	conns     int
	startTime time.Duration
}

// layout describes how many processes hold how many conns.
type layout struct {
	Procs        int `json:"procs"`
	ConnsPerProc int `json:"conns_per_proc"`
}

func (l layout) total() int { return l.Procs * l.ConnsPerProc }

func (l layout) String() string {
	if l.ConnsPerProc == 1 {
		return fmt.Sprintf("%d procs", l.Procs)
	}
	return fmt.Sprintf("%d×%d", l.Procs, l.ConnsPerProc)
}

// startFleet starts the workers of layout l against sys and waits for all
// of them to be subscribed.
func startFleet(sys *system, channel string, l layout, readyTimeout time.Duration) (*fleet, error) {
	f := &fleet{conns: l.total()}
	t0 := time.Now()
	defer func() { f.startTime = time.Since(t0) }()
	args := []string{"worker", "--channel", channel, "--conns", strconv.Itoa(l.ConnsPerProc)}
	if sys.direct {
		args = append(args, "--mode", "direct", "--database-url", sys.dbURL, "--parallel", "8")
	} else {
		args = append(args, "--mode", "socket", "--socket", sys.socket)
	}
	var env []string
	if l.ConnsPerProc == 1 {
		// A single-subscription worker needs one P; more only adds threads
		// that compete for the two cores.
		env = append(env, "GOMAXPROCS=1")
	}
	for range l.Procs {
		p, err := startProc(env, args...)
		if err != nil {
			f.stop()
			return nil, err
		}
		f.procs = append(f.procs, p)
	}
	deadline := time.Now().Add(readyTimeout)
	for _, p := range f.procs {
		line, err := p.recv(time.Until(deadline))
		if err != nil {
			f.stop()
			return nil, err
		}
		var m struct {
			Ready int    `json:"ready"`
			Error string `json:"error"`
		}
		json.Unmarshal(line, &m)
		if m.Ready != l.ConnsPerProc {
			f.stop()
			return nil, fmt.Errorf("worker %d: %s", p.pid(), firstNonEmpty(m.Error, string(line)))
		}
	}
	return f, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

func (f *fleet) stop() {
	var wg sync.WaitGroup
	for _, p := range f.procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop() }()
	}
	wg.Wait()
}

// cpu is the CPU time all the fleet's processes have used.
func (f *fleet) cpu() time.Duration {
	var t time.Duration
	for _, p := range f.procs {
		t += procCPU(p.pid())
	}
	return t
}

// begin starts run id in every worker and waits for their ok.
func (f *fleet) begin(id int64) error {
	for _, p := range f.procs {
		if err := p.send("run " + strconv.FormatInt(id, 10)); err != nil {
			return err
		}
	}
	for _, p := range f.procs {
		if _, err := p.recv(10 * time.Second); err != nil {
			return err
		}
	}
	return nil
}

// reconnect re-opens the conns the server evicted, in every worker.
func (f *fleet) reconnect() error {
	for _, p := range f.procs {
		if err := p.send("reconnect"); err != nil {
			return err
		}
	}
	var firstErr error
	for _, p := range f.procs {
		line, err := p.recv(60 * time.Second)
		if err != nil {
			return err
		}
		var m struct {
			OK    bool   `json:"ok"`
			Error string `json:"error"`
		}
		json.Unmarshal(line, &m)
		if !m.OK && firstErr == nil {
			firstErr = fmt.Errorf("worker %d: reconnect: %s", p.pid(), firstNonEmpty(m.Error, string(line)))
		}
	}
	return firstErr
}

// reports asks every worker for its report on a run of sent wakes per conn.
// skip lists processes that are stopped (they are asked last).
func (f *fleet) reports(sent int, wait time.Duration) ([]report, error) {
	ms := strconv.Itoa(int(wait / time.Millisecond))
	for _, p := range f.procs {
		if err := p.send("report " + strconv.Itoa(sent) + " " + ms); err != nil {
			return nil, err
		}
	}
	out := make([]report, len(f.procs))
	for i, p := range f.procs {
		line, err := p.recv(wait + 20*time.Second)
		if err != nil {
			return nil, err
		}
		var m struct {
			Report report `json:"report"`
		}
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("worker %d: bad report: %w", p.pid(), err)
		}
		out[i] = m.Report
	}
	return out, nil
}

// merged is the sum of several reports, with the merged histogram.
type merged struct {
	report
	h hist.H
}

func merge(rs []report) merged {
	var m merged
	m.MinRecv = ^uint64(0)
	for _, r := range rs {
		m.Conns += r.Conns
		m.Live += r.Live
		m.EOF += r.EOF
		m.LostLive += r.LostLive
		m.LostEvicted += r.LostEvicted
		m.addReceipts(r.Recv, r.Stale, r.Durable, r.MinRecv, r.First, r.Last)
		m.h.MergeSparse(r.Hist)
	}
	return m
}

var errNoHub = errors.New("hub binary not available")
