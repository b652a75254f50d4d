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
	log, _ := testLog(t)
	sock := filepath.Join(t.TempDir(), "hub.sock")
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
	return h, sock
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
		exit <- run(ctx, []string{"--socket", sock, "--database-url", db.URL(), "--addr", "127.0.0.1:0"}, pw, logw)
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
// and Postgres one backend. Then the hub goes away: the page keeps going on
// the process's own LISTEN, after a durable wake that says "re-read".
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
	afterGap := append(append([]string(nil), chatWant...), "(durable wake: re-read chat)")
	chat.waitTexts(timeout, "#messages li", afterGap)
	notify(t, "chat", "after failover")
	chat.waitTexts(timeout, "#messages li", append(afterGap, "after failover"))
	if n := backends(t, "listenhub-sse-local"); n != 1 {
		t.Errorf("%d local fallback backends after failover, want 1", n)
	}
}
