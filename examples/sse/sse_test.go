package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

var db *pgtest.Cluster

func TestMain(m *testing.M) { pgtesting.Main(m, pgtest.Options{}, &db) }

const (
	timeout = 20 * time.Second
	// hubApp tags the test hub's backend, so that the test can count it.
	hubApp = "listenhub-sse-test"
	// minLocal is the example's --min-local in the tests: short, so that
	// a restarted hub is returned to within about a second (the first
	// attempt after the failover finds no hub; the next one, a second
	// later, finds it).
	minLocal = 100 * time.Millisecond
)

// testWriter sends log lines to t.Log, and drops them once the test is over
// (goroutines may still log during cleanup).
type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func testLog(t *testing.T) (*slog.Logger, io.Writer) {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})), w
}

// startHub runs a real hub in this process against the test cluster.
func startHub(t *testing.T) (*hub.Hub, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "hub.sock")
	return startHubAt(t, sock), sock
}

// startHubAt runs a real hub on the socket sock (a restarted hub: the same
// path as one stopped before).
func startHubAt(t *testing.T, sock string) *hub.Hub {
	t.Helper()
	log, _ := testLog(t)
	h, err := hub.New(hub.Config{
		SocketPath:      sock,
		DatabaseURL:     db.URL(),
		ApplicationName: hubApp,
		Logger:          log.With("side", "hub"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		h.Stop(ctx)
	})
	return h
}

var servingRE = regexp.MustCompile(`serving (http://\S+)/\?q=chat \(wakes via (\w+)\)`)

// startApp runs the example through run, its command line included, and
// returns its base URL. It stops (and checks the exit code) at cleanup.
func startApp(t *testing.T, sock string) string {
	t.Helper()
	_, logw := testLog(t)
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"--socket", sock, "--database-url", db.URL(), "--addr", "127.0.0.1:0",
			"--min-local", minLocal.String()}, pw, logw)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-exit:
			if code != 0 {
				t.Errorf("sse exited %d after cancel, want 0", code)
			}
		case <-time.After(timeout):
			t.Errorf("sse did not exit within %v of cancel", timeout)
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
	}()
	select {
	case line, ok := <-lines:
		m := servingRE.FindStringSubmatch(line)
		if !ok || m == nil {
			t.Fatalf("sse did not announce its address; first line %q", line)
		}
		if m[2] != "hub" {
			t.Fatalf("sse started in %s mode, want hub: %q", m[2], line)
		}
		return m[1]
	case code := <-exit:
		exit <- code
		t.Fatalf("sse exited %d before serving", code)
	case <-time.After(timeout):
		t.Fatal("sse did not start serving")
	}
	return ""
}

func notify(t *testing.T, channel, payload string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := db.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload); err != nil {
		t.Fatalf("NOTIFY %s: %v", channel, err)
	}
}

func backends(t *testing.T, app string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pids, err := db.BackendPIDs(ctx, app)
	if err != nil {
		t.Fatal(err)
	}
	return len(pids)
}

func get(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
}

// TestSSEInBrowser is the example end to end: real Postgres, a real hub,
// the example server, and headless Chromium. Two tabs watch two channels
// through one process; each sees exactly its own payloads, in commit
// order, whatever they contain; the whole process costs the hub one worker
// and Postgres one backend. Then the hub goes away: the page shows the mode
// "local" and keeps going on the process's own LISTEN, after a durable wake
// that says "re-read". Then a hub starts on the same socket again: the
// page shows "hub", a durable wake, and keeps going; the process's own
// backend is gone.
func TestSSEInBrowser(t *testing.T) {
	b := startBrowser(t) // first, so that its cleanup (closing the tabs) runs last
	h, sock := startHub(t)
	base := startApp(t, sock)

	chat := b.firstTab()
	chat.open(base + "/?q=chat")
	news := b.newTab()
	news.open(base + "/?q=news")
	for _, tb := range []*tab{chat, news} {
		var state string
		tb.waitFor(timeout, func() bool {
			tb.eval(&state, `return document.getElementById("status").dataset.state;`)
			return state == "subscribed"
		}, func() string { return "page state " + state + ", want subscribed" })
		tb.waitMode("hub")
	}
	// Both tabs, one process: one hub worker with two channels, one
	// Postgres backend, no local fallback connection.
	testutil.WaitFor(t, timeout, "hub: 1 worker, 2 channels", func() bool {
		s := h.Stats()
		return s.Workers == 1 && s.Channels == 2
	})
	if n := backends(t, hubApp); n != 1 {
		t.Errorf("%d backends with application_name %s, want 1", n, hubApp)
	}
	if n := backends(t, "listenhub-sse-local"); n != 0 {
		t.Errorf("%d local fallback backends, want 0", n)
	}

	chatWant := []string{
		"one",
		"two",
		`<b>not bold</b> & <script>alert(1)</script>`,
		`quote " backslash \ tab` + "\t" + `end`,
		"multi\nline",
		"ünïcödé ✓ 🚀",
		strings.Repeat("x", 7999), // Postgres' largest payload
	}
	newsWant := []string{"n1", "n2", "n3"}
	for i, p := range chatWant {
		notify(t, "chat", p)
		if i < len(newsWant) {
			notify(t, "news", newsWant[i])
		}
	}
	notify(t, "other", "nobody listens")
	chat.waitTexts(timeout, "#messages li", chatWant)
	news.waitTexts(timeout, "#messages li", newsWant)
	var bolds int
	chat.eval(&bolds, `return document.querySelectorAll("#messages b, #messages script").length;`)
	if bolds != 0 {
		t.Errorf("a payload's HTML was rendered (%d elements), want text only", bolds)
	}

	// A closed tab unsubscribes: the last subscriber of news leaves, the
	// process unsubscribes, the hub UNLISTENs.
	news.close()
	testutil.WaitFor(t, timeout, "hub: news UNLISTENed after its tab closed", func() bool {
		return h.Stats().Channels == 1
	})

	// The hub dies: the process fails over to its own LISTEN connection,
	// the page gets a durable wake (a gap is possible) and then keeps
	// receiving.
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := h.Stop(ctx); err != nil {
		t.Fatalf("hub stop: %v", err)
	}
	testutil.WaitFor(t, timeout, "the example to fail over", func() bool {
		return get(t, base+"/healthz") == "200 ok (local)"
	})
	chat.waitMode("local")
	want := append(append([]string(nil), chatWant...), "(durable wake: re-read chat)")
	chat.waitTexts(timeout, "#messages li", want)
	notify(t, "chat", "after failover")
	want = append(want, "after failover")
	chat.waitTexts(timeout, "#messages li", want)
	if n := backends(t, "listenhub-sse-local"); n != 1 {
		t.Errorf("%d local fallback backends after failover, want 1", n)
	}

	// The hub is back on the same socket: the process returns to it, the
	// page says so and gets a durable wake (the swap's), and its own
	// connection is closed.
	started := time.Now()
	h2 := startHubAt(t, sock)
	chat.waitMode("hub")
	t.Logf("hub started → page shows hub: %v", time.Since(started).Round(time.Millisecond))
	if got := get(t, base+"/healthz"); got != "200 ok (hub)" {
		t.Errorf("healthz %q after the fail-back", got)
	}
	want = append(want, "(durable wake: re-read chat)")
	chat.waitTexts(timeout, "#messages li", want)
	notify(t, "chat", "after failback")
	want = append(want, "after failback")
	chat.waitTexts(timeout, "#messages li", want)
	testutil.WaitFor(t, timeout, "1 hub backend and no local one", func() bool {
		return backends(t, hubApp) == 1 && backends(t, "listenhub-sse-local") == 0
	})
	if s := h2.Stats(); s.Workers != 1 || s.Channels != 1 {
		t.Errorf("new hub: %d workers, %d channels; want 1, 1", s.Workers, s.Channels)
	}
}

// waitMode waits until the page shows that wakes come via mode.
func (tb *tab) waitMode(mode string) {
	tb.b.t.Helper()
	var got string
	tb.waitFor(timeout, func() bool {
		tb.eval(&got, `return document.getElementById("mode").dataset.mode;`)
		return got == mode
	}, func() string { return "page mode " + got + ", want " + mode })
}

// sseEvent is one event of a stream: its type and its data line.
type sseEvent struct{ typ, data string }

// readEvents parses a text/event-stream into events (comments and retry
// lines skipped) until the body ends.
func readEvents(body io.Reader, out chan<- sseEvent) {
	defer close(out)
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.typ != "" || ev.data != "" {
				out <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			ev.typ = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data = strings.TrimPrefix(line, "data: ")
		}
	}
}

// The /events stream as documented, without a browser: ready with the
// mode, a mode event when the hub goes away and another when it is back,
// each with the swap's durable wake, and the payloads in between.
func TestSSEModeEvents(t *testing.T) {
	h, sock := startHub(t)
	base := startApp(t, sock)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/events?q=modes", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("GET /events: %d %s", resp.StatusCode, ct)
	}
	events := make(chan sseEvent, 16)
	go readEvents(resp.Body, events)
	next := func() sseEvent {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("stream ended")
			}
			return ev
		case <-time.After(timeout):
			t.Fatal("no event")
		}
		return sseEvent{}
	}
	// expect reads the next len(want) events, in any order.
	expect := func(want ...sseEvent) {
		t.Helper()
		var got []sseEvent
		for range want {
			got = append(got, next())
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Fatalf("events %q, want %q (any order)", got, want)
			}
		}
	}
	durable := sseEvent{"wake", `{"q":"modes","durable":true}`}
	expect(sseEvent{"ready", `{"mode":"hub","q":"modes"}`})
	notify(t, "modes", "one")
	expect(sseEvent{"wake", `{"q":"modes","p":"one","durable":false}`})

	sctx, scancel := context.WithTimeout(context.Background(), timeout)
	defer scancel()
	if err := h.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	expect(sseEvent{"mode", `{"mode":"local"}`}, durable)
	notify(t, "modes", "two")
	expect(sseEvent{"wake", `{"q":"modes","p":"two","durable":false}`})

	startHubAt(t, sock)
	expect(sseEvent{"mode", `{"mode":"hub"}`}, durable)
	notify(t, "modes", "three")
	expect(sseEvent{"wake", `{"q":"modes","p":"three","durable":false}`})
}
