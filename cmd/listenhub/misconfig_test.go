package main

// Misconfigurations a user meets first (docs/robustness.md,
// "When the set-up is wrong"): each must say what is wrong, at once.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"

	"github.com/listenhub/listenhub/monitor"
)

// TestJSONLogDurations: a duration in a JSON log line is a string such as
// "1.5s", as in the text format, never integer nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	var b bytes.Buffer
	log, err := newLogger(&b, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("x", "retry_in_max", 1500*time.Millisecond, "n", 3)
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m["retry_in_max"] != "1.5s" || m["n"] != float64(3) {
		t.Fatalf("line %s: want \"retry_in_max\":\"1.5s\", \"n\":3", b.String())
	}
}

// TestStatusRevisionLikeVersion: `status` prints the revision as `version`
// does, 12 hex digits (the hub's /status carries all 40).
func TestStatusRevisionLikeVersion(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	mux := http.NewServeMux()
	reply := func(path string, v any) {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(v)
		})
	}
	reply("/status", monitor.Status{Healthy: true, Version: "v1.0.0", Revision: rev + "+dirty", GoVersion: "go1.26"})
	reply("/workers", hub.WorkerList{})
	reply("/channels", hub.ChannelList{})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	var out, errOut bytes.Buffer
	if code := runStatus(context.Background(), []string{"--metrics-addr", srv.URL}, &out, &errOut); code != 0 {
		t.Fatalf("status exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "(revision 0123456789ab+dirty, go1.26)") || strings.Contains(out.String(), rev) {
		t.Fatalf("status printed:\n%s\nwant the revision as version prints it: 0123456789ab+dirty", out.String())
	}
	if got := shortRevision(rev); got != "0123456789ab" {
		t.Fatalf("shortRevision = %q", got)
	}
}

// TestServeNoDatabase: serve with no URL and no PG* variable naming a
// server exits 1 at once with a hint (it used to retry the default socket
// forever, one warning every 30 s). A PG* variable keeps libpq's fallback:
// the hub then runs and retries what it names.
func TestServeNoDatabase(t *testing.T) {
	sock := sockPath(t)
	cmd := exec.Command(hubBinary(t), "serve", "--socket", sock)
	cmd.Env = cleanEnv()
	done := make(chan error, 1)
	var out syncBuf
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("exit %v, want 1; output %q", err, out.String())
		}
	case <-time.After(timeout):
		cmd.Process.Kill()
		t.Fatalf("serve without a database still running after %v; output %q", timeout, out.String())
	}
	got := out.String()
	if strings.Count(got, "\n") != 1 || !strings.HasPrefix(got, "listenhub serve: no database named: give --database-url URL") ||
		!strings.Contains(got, "PGHOST") {
		t.Fatalf("output %q, want one line naming the flag and the variables", got)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket file left: %v", err)
	}

	// PGHOST names a server (here one that is not there): the hub runs.
	p := serveEnv(t, []string{"PGHOST=" + t.TempDir(), "LISTENHUB_SOCKET=" + sockPath(t)})
	testutil.WaitFor(t, timeout, "the connect failure logged", func() bool {
		return strings.Contains(p.stderr.String(), "listener: connect failed")
	})
	select {
	case <-p.done:
		t.Fatalf("serve with PGHOST exited: %s", p.stderr.String())
	default:
	}
}

// TestServeURLTypoAndAuthFailure: a misspelt scheme and a role the server
// refuses each end serve with one line that gives the real cause first
// (not "failed to parse as keyword/value", not "tls error: server refused
// TLS connection").
func TestServeURLTypoAndAuthFailure(t *testing.T) {
	code, _, errOut := runCmd([]string{"serve", "--socket", sockPath(t), "--database-url", "postgress://x"})
	want := `listenhub serve: --database-url: listener: not a PostgreSQL URL: unknown scheme "postgress://" (want postgres:// or postgresql://)` + "\n"
	if code != 1 || errOut != want {
		t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errOut, want)
	}

	code, _, errOut = runCmd([]string{"census", "--database-url", "postgress://x"})
	if code != 2 || !strings.Contains(errOut, `unknown scheme "postgress://"`) {
		t.Fatalf("census: exit %d, stderr %q", code, errOut)
	}

	c := needDB(t)
	u := fmt.Sprintf("postgres://nobody@127.0.0.1:%d/postgres", c.Port()) // sslmode=prefer
	code, _, errOut = runCmd([]string{"census", "--database-url", u})
	if want := "listenhub census: connect to `user=nobody database=postgres`: FATAL: role \"nobody\" does not exist (SQLSTATE 28000)\n"; code != 1 || errOut != want {
		t.Fatalf("census: exit %d, stderr %q, want %q", code, errOut, want)
	}
	cmd := exec.Command(hubBinary(t), "serve", "--socket", sockPath(t), "--database-url", u)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1; output %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	wantLast := "listenhub serve: hub: postgres: listener: connect to `user=nobody database=postgres`: FATAL: role \"nobody\" does not exist (SQLSTATE 28000)"
	if last != wantLast || strings.Contains(string(out), "tls error") {
		t.Fatalf("output:\n%s\nwant the last line %q and no tls error", out, wantLast)
	}
}

// TestServeTransactionPooler: `serve` pointed at a transaction-pooling
// PgBouncer stays unhealthy: /healthz answers 503, a worker's sub is never
// acked (it hears only healthy:false), and the log has one error line that
// names the likely cause, however many times the hub retries meanwhile.
func TestServeTransactionPooler(t *testing.T) {
	c := needDB(t)
	b := pgtesting.PgBouncer(t, c, "transaction")
	sock := sockPath(t)
	p := serve(t, sock, nil, "--database-url", b.URL(), "--metrics-addr", "127.0.0.1:0", "--health-check-timeout", "300ms")
	addr := p.metricsAddr()
	// The metrics address is bound before the socket: wait for the latter.
	testutil.WaitFor(t, timeout, "the socket", func() bool { _, err := os.Stat(sock); return err == nil })
	w := dialWorker(t, sock)
	if _, err := w.c.Write(frame.AppendSub(nil, "pooled")); err != nil {
		t.Fatal(err)
	}
	// Three rounds of a connection and a second session's check.
	testutil.WaitFor(t, 30*time.Second, "three rounds of checks", func() bool {
		return strings.Count(b.Log(), "login attempt") >= 6
	})
	for {
		m, err := w.read(100 * time.Millisecond)
		if err != nil {
			break
		}
		if m.Type != "status" || m.Healthy {
			t.Fatalf("worker got %+v through a transaction pooler", m)
		}
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/healthz %d, want 503", resp.StatusCode)
	}
	log := p.stderr.String()
	want := `"msg":"listener: notifications do not arrive on this connection: a transaction-pooling PgBouncer? use a direct URL`
	if n := strings.Count(log, want); n != 1 {
		t.Fatalf("%d lines with %s, want 1:\n%s", n, want, log)
	}
	if n := strings.Count(log, `"level":"ERROR"`); n != 1 {
		t.Fatalf("%d error lines, want 1:\n%s", n, log)
	}
}
