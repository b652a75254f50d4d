package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/client"
)

// The demo's worker processes: the parent starts and stops them
// (demoWorker), and each is this binary re-executed as `demo-worker`
// (runDemoWorker), a Failover that reports its wakes' latencies.

// demoWorker is one worker process as the demo sees it.
type demoWorker struct {
	id    int
	cmd   *exec.Cmd
	stdin io.WriteCloser // closing it tells the worker to exit
	done  chan struct{}  // closed when the process has exited and its output is read
	err   error          // Wait's, valid after done

	mu       sync.Mutex
	curMode  string
	stopping bool // stop was called: its exit is expected
}

func (w *demoWorker) mode() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.curMode
}

// demoWorkerURLEnv carries the database URL to a demo worker: in its
// environment, which only its own user can read, not in its argv, which
// every user sees in ps.
const demoWorkerURLEnv = "LISTENHUB_DEMO_WORKER_DATABASE_URL"

func startDemoWorker(exe string, id int, args []string, url string, stderr io.Writer, ready chan<- string, exited chan<- *demoWorker, lat func([]int64)) (*demoWorker, error) {
	cmd := exec.Command(exe, append([]string{"demo-worker"}, args...)...)
	cmd.Env = append(os.Environ(), demoWorkerURLEnv+"="+url)
	// Its own process group: a Ctrl-C in the terminal reaches the demo
	// only, which then stops the workers in order. Pdeathsig and the
	// stdin pipe make a worker exit if the demo dies without cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	dieWithParent(cmd.SysProcAttr) // Linux only
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker %d: %w", id, err)
	}
	w := &demoWorker{id: id, cmd: cmd, stdin: stdin, done: make(chan struct{}), curMode: "starting"}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			kind, rest, _ := strings.Cut(sc.Text(), " ")
			switch kind {
			case "ready":
				w.mu.Lock()
				w.curMode = rest
				w.mu.Unlock()
				ready <- rest
			case "mode":
				w.mu.Lock()
				w.curMode = rest
				w.mu.Unlock()
			case "l":
				fields := strings.Fields(rest)
				ns := make([]int64, 0, len(fields))
				for _, f := range fields {
					if v, err := strconv.ParseInt(f, 10, 64); err == nil {
						ns = append(ns, v)
					}
				}
				lat(ns)
			}
		}
		w.err = cmd.Wait()
		w.mu.Lock()
		stopping := w.stopping
		w.curMode = "exited"
		w.mu.Unlock()
		if !stopping {
			exited <- w
		}
	}()
	return w, nil
}

// stop asks the worker to exit (stdin EOF, then SIGTERM) and kills it if it
// does not within demoStopTimeout.
func (w *demoWorker) stop() error {
	w.mu.Lock()
	w.stopping = true
	w.mu.Unlock()
	w.stdin.Close()
	select {
	case <-w.done:
		return nil // a worker that exits on EOF exits 0; its status is not ours to judge here
	case <-time.After(demoStopTimeout / 2):
	}
	w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
		return nil
	case <-time.After(demoStopTimeout / 2):
	}
	w.cmd.Process.Kill()
	<-w.done
	return fmt.Errorf("worker %d (pid %d) did not exit; killed", w.id, w.cmd.Process.Pid)
}

// runDemoWorker is the hidden `listenhub demo-worker`: one worker process
// of the demo. It subscribes through a client.Failover (hub first, its own
// LISTEN if the hub fails) and reports to the demo on stdout. It exits when
// its stdin closes (the demo is done, or dead) or on SIGTERM; it ignores
// SIGINT, so that a Ctrl-C reaches the demo, which stops the workers in
// order.
func runDemoWorker(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	signal.Ignore(os.Interrupt)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stop()

	socket, channel, appName, err := parseDemoWorker(args)
	if err != nil {
		return flagError(stderr, "demo-worker", err)
	}
	databaseURL := os.Getenv(demoWorkerURLEnv) // the fallback listener's Postgres

	var (
		mu  sync.Mutex
		out = bufio.NewWriter(stdout)
		lat []int64
	)
	emit := func(line string) {
		mu.Lock()
		defer mu.Unlock()
		out.WriteString(line)
		out.WriteByte('\n')
		out.Flush()
	}
	onWake := func(w client.Wake) {
		now := time.Now().UnixNano()
		_, ts, ok := strings.Cut(w.Payload, " ")
		if !ok {
			return // a durable wake after a failover: nothing to time
		}
		sent, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			return
		}
		mu.Lock()
		lat = append(lat, now-sent)
		mu.Unlock()
	}
	f, err := client.NewFailover(ctx, client.FailoverOptions{
		Hub:   client.Options{SocketPath: socket},
		Local: client.LocalOptions{DatabaseURL: databaseURL, ApplicationName: appName},
	}, client.FailoverHandlers{OnWake: onWake, OnFailover: func(reason error) {
		fmt.Fprintf(stderr, "listenhub demo-worker %d: hub failed (%s); listening on its own connection\n", os.Getpid(), oneLine(reason))
		emit("mode local")
	}, OnFailback: func() {
		fmt.Fprintf(stderr, "listenhub demo-worker %d: hub back; its own connection closed\n", os.Getpid())
		emit("mode hub")
	}})
	if err != nil {
		fmt.Fprintf(stderr, "listenhub demo-worker: %s\n", oneLine(err))
		return 1
	}
	defer f.Close()
	if err := f.Subscribe(ctx, channel); err != nil {
		fmt.Fprintf(stderr, "listenhub demo-worker: subscribe %q: %s\n", channel, oneLine(err))
		return 1
	}
	emit("ready " + f.Mode().String())

	eof := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	tick := time.NewTicker(workerReportInterval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-eof:
			return 0
		case <-ctx.Done():
			return 0
		case <-f.Done():
			fmt.Fprintf(stderr, "listenhub demo-worker: %s\n", oneLine(f.Err()))
			return 1
		}
		mu.Lock()
		if len(lat) > 0 {
			var b strings.Builder
			b.WriteString("l")
			for _, v := range lat {
				b.WriteByte(' ')
				b.WriteString(strconv.FormatInt(v, 10))
			}
			lat = lat[:0]
			b.WriteByte('\n')
			out.WriteString(b.String())
			out.Flush()
		}
		mu.Unlock()
	}
}

// parseDemoWorker parses the flags the demo gives its worker processes.
func parseDemoWorker(args []string) (socket, channel, appName string, err error) {
	fs := newFlagSet("demo-worker")
	fs.StringVar(&socket, "socket", "", "hub socket")
	fs.StringVar(&channel, "channel", "", "subscription name")
	fs.StringVar(&appName, "application-name", "listenhub-local", "application_name of the fallback listener")
	if err := fs.Parse(args); err != nil {
		return "", "", "", err
	}
	if socket == "" || channel == "" {
		return "", "", "", errors.New("--socket and --channel are required")
	}
	return socket, channel, appName, nil
}
