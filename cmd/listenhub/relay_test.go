package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
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

// TestServeRelayMisconfigured: serve --relay stops with the relay's
// misconfiguration, so that it is seen (exit 1, the line on stderr).
func TestServeRelayMisconfigured(t *testing.T) {
	db := needDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, hubBinary(t), "serve", "--relay", "--socket", sockPath(t),
		"--database-url", db.URL(), "--log-level", "error").CombinedOutput()
	code := -1
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	if code != 1 || !strings.Contains(string(out), "listenhub serve: relay: wal_level is minimal") {
		t.Fatalf("exit %d (%v), output %q; want 1 and the relay's line", code, err, out)
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
