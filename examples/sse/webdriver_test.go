package main

// A minimal W3C WebDriver client over net/http, enough to drive headless
// Chromium through chromedriver: open tabs, navigate, run scripts and poll
// the DOM with deadlines. No third-party dependencies, so that go.mod stays
// pgx and x/sys only.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// chromiumArgs are the flags the browser is launched with: headless, no
// sandbox (CI containers run as root, where the sandbox cannot start), and
// nothing that would phone home or run in the background during a test.
var chromiumArgs = []string{
	"--headless",
	"--no-sandbox",
	"--disable-gpu",
	"--disable-background-networking",
	"--disable-component-update",
	"--no-first-run",
	"--disable-sync",
	"--disable-dev-shm-usage", // small /dev/shm in containers crashes tabs
}

// findBrowser locates chromium and chromedriver (LISTENHUB_CHROMIUM and
// LISTENHUB_CHROMEDRIVER override the search). When either is missing the
// test is skipped, except under CI (CI=true), where a browser test that
// silently skips is a browser test that never runs: there it fails, saying
// what to install.
func findBrowser(t *testing.T) (chromium, driver string) {
	t.Helper()
	find := func(env string, names ...string) string {
		if p := os.Getenv(env); p != "" {
			return p
		}
		for _, n := range names {
			if p, err := exec.LookPath(n); err == nil {
				return p
			}
		}
		return ""
	}
	chromium = find("LISTENHUB_CHROMIUM", "chromium", "chromium-browser", "google-chrome")
	driver = find("LISTENHUB_CHROMEDRIVER", "chromedriver")
	if chromium != "" && driver != "" {
		return chromium, driver
	}
	msg := fmt.Sprintf("browser test needs chromium (found %q) and chromedriver (found %q); "+
		"on Debian: apt-get install -y chromium chromium-driver", chromium, driver)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: not skipping)")
	}
	t.Skip(msg)
	return "", ""
}

// browser is one chromedriver process with one WebDriver session (one
// headless Chromium), cleaned up when the test ends.
type browser struct {
	t       *testing.T
	base    string // http://127.0.0.1:PORT/session/ID
	http    *http.Client
	mu      sync.Mutex
	current string // handle of the tab commands go to
	log     *lockedBuffer
}

type lockedBuffer = testutil.SyncBuffer

var driverPortRE = regexp.MustCompile(`started successfully on port (\d+)`)

// startBrowser starts chromedriver on a port of its choosing (--port=0; it
// prints the port), then a session with a fresh profile directory.
func startBrowser(t *testing.T) *browser {
	t.Helper()
	chromium, driverPath := findBrowser(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cmd := exec.Command(driverPath, "--port=0")
	// Its own process group, so that cleanup can take Chromium (the
	// driver's child) down with it even if the session was not deleted.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logs := &lockedBuffer{}
	cmd.Stderr = logs
	stdout := testutil.StartPiped(t, cmd)
	portc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sent := false
		for sc.Scan() {
			logs.Write(append(sc.Bytes(), '\n'))
			if m := driverPortRE.FindSubmatch(sc.Bytes()); m != nil && !sent {
				portc <- string(m[1])
				sent = true
			}
		}
		if !sent {
			close(portc)
		}
	}()
	waited := make(chan struct{})
	go func() { cmd.Wait(); close(waited) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-waited:
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-waited
		}
	})

	var port string
	select {
	case p, ok := <-portc:
		if !ok {
			t.Fatalf("chromedriver exited without announcing its port:\n%s", logs)
		}
		port = p
	case <-ctx.Done():
		t.Fatalf("chromedriver did not announce its port within 30s:\n%s", logs)
	}

	b := &browser{t: t, http: &http.Client{Timeout: 60 * time.Second}, log: logs}
	caps := map[string]any{
		"capabilities": map[string]any{
			"alwaysMatch": map[string]any{
				"browserName": "chrome",
				"goog:chromeOptions": map[string]any{
					"binary": chromium,
					"args":   append(append([]string(nil), chromiumArgs...), "--user-data-dir="+t.TempDir()),
				},
			},
		},
	}
	var sess struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.do(ctx, http.MethodPost, "http://127.0.0.1:"+port+"/session", caps, &sess); err != nil {
		t.Fatalf("new WebDriver session: %v\nchromedriver log:\n%s", err, logs)
	}
	b.base = "http://127.0.0.1:" + port + "/session/" + sess.SessionID
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b.do(ctx, http.MethodDelete, b.base, nil, nil)
	})
	var h string
	if err := b.do(ctx, http.MethodGet, b.base+"/window", nil, &h); err != nil {
		t.Fatalf("current window: %v", err)
	}
	b.current = h
	return b
}

// webdriverError is the error object of a failed WebDriver command.
type webdriverError struct {
	Status  int
	Code    string `json:"error"`
	Message string `json:"message"`
}

func (e *webdriverError) Error() string {
	msg, _, _ := strings.Cut(e.Message, "\n") // drop the stack trace
	return fmt.Sprintf("webdriver: HTTP %d %s: %s", e.Status, e.Code, msg)
}

// do runs one WebDriver command and decodes its "value" into out.
func (b *browser) do(ctx context.Context, method, url string, in, out any) error {
	var body io.Reader
	if in != nil {
		j, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(j)
	} else if method == http.MethodPost {
		body = strings.NewReader("{}")
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return fmt.Errorf("webdriver: %s %s: HTTP %d, undecodable body %q", method, url, resp.StatusCode, raw)
	}
	if resp.StatusCode != http.StatusOK {
		werr := &webdriverError{Status: resp.StatusCode}
		json.Unmarshal(env.Value, werr)
		return werr
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(env.Value, out)
}

// cmd runs a command on the session, failing the test on error.
func (b *browser) cmd(method, path string, in, out any) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.do(ctx, method, b.base+path, in, out); err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
}

// tab is one browser tab (a WebDriver window handle).
type tab struct {
	b      *browser
	handle string
	url    string // last opened, for failure messages
}

// firstTab returns the tab the session started with.
func (b *browser) firstTab() *tab { return &tab{b: b, handle: b.current} }

// newTab opens another tab.
func (b *browser) newTab() *tab {
	b.t.Helper()
	var w struct {
		Handle string `json:"handle"`
	}
	b.cmd(http.MethodPost, "/window/new", map[string]any{"type": "tab"}, &w)
	return &tab{b: b, handle: w.Handle}
}

// focus makes the tab the target of the session's commands (WebDriver
// addresses one window at a time).
func (tb *tab) focus() {
	tb.b.t.Helper()
	tb.b.mu.Lock()
	defer tb.b.mu.Unlock()
	if tb.b.current == tb.handle {
		return
	}
	tb.b.cmd(http.MethodPost, "/window", map[string]any{"handle": tb.handle}, nil)
	tb.b.current = tb.handle
}

// open navigates the tab to url and waits for the page load (WebDriver's
// default "normal" page load strategy).
func (tb *tab) open(url string) {
	tb.b.t.Helper()
	tb.focus()
	tb.url = url
	tb.b.cmd(http.MethodPost, "/url", map[string]any{"url": url}, nil)
}

// eval runs script (a function body; arguments in `arguments`) in the
// tab and decodes its return value into out.
func (tb *tab) eval(out any, script string, args ...any) {
	tb.b.t.Helper()
	tb.focus()
	if args == nil {
		args = []any{}
	}
	tb.b.cmd(http.MethodPost, "/execute/sync", map[string]any{"script": script, "args": args}, out)
}

// texts returns the textContent of every element matching the CSS selector.
func (tb *tab) texts(selector string) []string {
	tb.b.t.Helper()
	var out []string
	tb.eval(&out, `return Array.from(document.querySelectorAll(arguments[0]), e => e.textContent);`, selector)
	if out == nil {
		out = []string{}
	}
	return out
}

// waitTexts polls the DOM until the elements matching selector hold
// exactly want, in order, and fails with what it last saw if that does
// not happen within timeout.
func (tb *tab) waitTexts(timeout time.Duration, selector string, want []string) {
	tb.b.t.Helper()
	var got []string
	tb.waitFor(timeout, func() bool {
		got = tb.texts(selector)
		return reflect.DeepEqual(got, want)
	}, func() string { return fmt.Sprintf("%s: got %s, want %s", selector, abbrev(got), abbrev(want)) })
}

// abbrev quotes texts for a failure message, shortening long ones.
func abbrev(texts []string) string {
	q := make([]string, len(texts))
	for i, s := range texts {
		if len(s) > 40 {
			s = fmt.Sprintf("%s…(%d bytes)", s[:40], len(s))
		}
		q[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(q, " ") + "]"
}

// waitFor polls cond (which may run scripts in the tab) until it is true,
// and fails with describe() after timeout. The interval starts at 5 ms and
// doubles to 100 ms: each probe is a WebDriver round trip.
func (tb *tab) waitFor(timeout time.Duration, cond func() bool, describe func() string) {
	tb.b.t.Helper()
	deadline := time.Now().Add(timeout)
	interval := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			tb.b.t.Fatalf("timed out after %v in the tab of %s: %s", timeout, tb.url, describe())
		}
		time.Sleep(interval)
		interval = min(2*interval, 100*time.Millisecond)
	}
}

// close closes the tab. The session switches to no tab at all; the next
// command on another tab focuses it again.
func (tb *tab) close() {
	tb.b.t.Helper()
	tb.focus()
	tb.b.cmd(http.MethodDelete, "/window", nil, nil)
	tb.b.mu.Lock()
	tb.b.current = ""
	tb.b.mu.Unlock()
}
