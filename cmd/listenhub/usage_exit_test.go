package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUsageExitStatus holds the exit status docs/usage.md gives to the
// code: 2 for a wrong command line (a bad flag value, a channel template
// too long for every table, a config file that does not parse), found
// before anything is connected; 1 for a command that ran and failed (no
// database named).
func TestUsageExitStatus(t *testing.T) {
	for _, v := range append([]string{"LISTENHUB_DATABASE_URL", "DATABASE_URL"}, pgServerVars...) {
		t.Setenv(v, "")
	}
	conf := filepath.Join(t.TempDir(), "listenhub.conf")
	if err := os.WriteFile(conf, []byte("max-workers = many\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	long := "{schema}.{table}." + strings.Repeat("x", 64) + ".{op}"
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"relay"}, 1, "listenhub relay: no database named: give --database-url URL"},
		{[]string{"serve", "--socket", filepath.Join(t.TempDir(), "s")}, 1, "listenhub serve: no database named: give --database-url URL"},
		{[]string{"relay", "--database-url", "postgres://u@127.0.0.1:1/db", "--channel-template", long}, 2, "over the 63 PostgreSQL keeps"},
		{[]string{"relay", "--database-url", "postgres://u@127.0.0.1:1/db", "--channel-template", "{schema}.wakes"}, 2, "has no {table}"},
		{[]string{"serve", "--config", conf, "--socket", filepath.Join(t.TempDir(), "s")}, 2, conf + ":1:"},
		{[]string{"status", "--limit", "ten"}, 2, "--limit"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
	} {
		var out, errw bytes.Buffer
		code := run(context.Background(), c.args, &out, &errw)
		if code != c.code || !strings.Contains(errw.String(), c.want) {
			t.Errorf("listenhub %s: exit %d, stderr %q; want exit %d and %q", strings.Join(c.args, " "), code, errw.String(), c.code, c.want)
		}
		if c.code != 2 || c.args[0] == "frobnicate" {
			continue
		}
		if n := strings.Count(errw.String(), "\n"); n != 1 {
			t.Errorf("listenhub %s: %d lines on stderr, want one: %q", strings.Join(c.args, " "), n, errw.String())
		}
	}
}
