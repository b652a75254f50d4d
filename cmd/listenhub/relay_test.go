package main

import (
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// The relay's own tests (relay/) run on a cluster with wal_level=logical;
// this package's cluster has wal_level=minimal, which is the first
// misconfiguration the relay names.

// TestRelayWalLevelNotLogical: one line that says how to fix it, exit 1.
func TestRelayWalLevelNotLogical(t *testing.T) {
	db := needDB(t)
	code, _, errOut := runCmd([]string{"relay", "--database-url", db.URL(), "--log-level", "error"})
	want := "listenhub relay: wal_level is minimal, the relay needs logical: run ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL\n"
	if code != 1 || errOut != want {
		t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errOut, want)
	}
}

// TestServeRelayMisconfigured: under serve --relay the relay is a guest.
// Misconfigured (wal_level minimal here), it is down, never the hub: a
// worker on a plain NOTIFY channel keeps its connection and its wakes,
// /metrics says listenhub_relay_up 0, /healthz answers 200 for the hub with
// the relay's line, and listenhub status shows the relay's last error,
// which names the fix.
func TestServeRelayMisconfigured(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, nil, "--relay", "--metrics-addr", "127.0.0.1:0")
	p.ready()
	addr := p.metricsAddr()
	get := func(path string) (int, string) { return httpGet(t, addr, path) }
	testutil.WaitFor(t, timeout, "the relay down", func() bool {
		_, body := get("/healthz")
		return strings.Contains(body, "relay down")
	})
	if _, m := get("/metrics"); !strings.Contains(m, "\nlistenhub_relay_up 0\n") {
		t.Error("/metrics lacks listenhub_relay_up 0")
	}
	code, body := get("/healthz")
	if code != 200 || body != "ok\nrelay down: wal_level is minimal, the relay needs logical: run ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL\n" {
		t.Errorf("/healthz %d %q; want 200, the hub's ok and the relay's line", code, body)
	}
	w := subscribedWorker(t, path, "plain")
	notify(t, "NOTIFY plain")
	w.expect("wake")
	out, err := exec.Command(hubBinary(t), "status", "--metrics-addr", addr).CombinedOutput()
	if err != nil || !regexp.MustCompile(`\nlast error +wal_level is minimal, .*: run ALTER SYSTEM SET wal_level = logical`).Match(out) {
		t.Errorf("listenhub status: %v\n%s", err, out)
	}
	select {
	case <-p.done:
		t.Fatalf("serve --relay exited with a misconfigured relay:\n%s", p.stderr.String())
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.exit(); code != 0 {
		t.Errorf("exit %d on SIGTERM, want 0", code)
	}
}

func TestRelayBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--ops", "insert,upsert"}, `--ops: unknown op "upsert"`},
		{[]string{"--window", "-1ms"}, "--window must not be negative"},
		{[]string{"--window", "1"}, "use a unit"},
		{[]string{"--standby-retry", "0s"}, "--standby-retry must be positive"},
		{[]string{"--channel-template", "{schema}.{tabel}"}, "unknown placeholder"},
		{[]string{"--channel-template", "{schema}.wakes"}, "has no {table}"},
		{[]string{"--max-lag-bytes", "0"}, "--max-lag-bytes must be at least 1"},
		{[]string{"--slot", "My-Slot"}, "only lower-case letters, digits and underscores (e.g. --slot my_slot)"},
		{[]string{"--channel-template", "{schema}.{table}\xff"}, "not UTF-8"},
	} {
		t.Run(c.want, func(t *testing.T) {
			start := time.Now()
			code, _, errOut := runCmd(append([]string{"relay", "--database-url", "postgres://127.0.0.1:1/x"}, c.args...))
			if code != 2 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, c.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and one line with %q", code, errOut, c.want)
			}
			if time.Since(start) > 5*time.Second {
				t.Errorf("a bad flag took %v: it must not wait for the database", time.Since(start))
			}
		})
	}
}
