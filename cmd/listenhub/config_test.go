package main

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/listenhub/listenhub/internal/testutil"
)

func writeConfig(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The file fills what the command line and the environment leave unset;
// keys may be spelled with - or _; comments and blank lines are skipped.
func TestConfigFilePrecedence(t *testing.T) {
	fs := newFlagSet("serve")
	workers := fs.Int("max-workers", 1, "")
	hard := fs.Int("hard-queue-limit", 1, "")
	level := fs.String("log-level", "info", "")
	ivl := durationFlag(fs, "status-interval", 0, "")
	var uids uidList
	fs.Var(&uids, "allow-uid", "")
	path := filepath.Join(t.TempDir(), "listenhub.conf")
	writeConfig(t, path, `
# pgbouncer.ini style
max-workers = 5
hard_queue_limit=6
  ; another comment
log-level = debug
status-interval = 2s
allow-uid = 1000, 1001
`)
	t.Setenv(envName("hard-queue-limit"), "9")
	if err := parseFlags(fs, []string{"--max-workers", "7"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadConfig(fs, path); err != nil {
		t.Fatal(err)
	}
	if *workers != 7 || *hard != 9 || *level != "debug" || ivl.String() != "2s" || uids.String() != "1000,1001" {
		t.Fatalf("max-workers %d (flag 7), hard-queue-limit %d (env 9), log-level %q, status-interval %v, allow-uid %v",
			*workers, *hard, *level, *ivl, uids)
	}
}

// A bad file stops serve before it starts, naming the file and line.
func TestConfigFileErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "listenhub.conf")
	for _, c := range []struct{ body, want string }{
		{"max-workers = 5\nfrobnicate = 1\n", `listenhub.conf:2: unknown key "frobnicate"`},
		{"# x\n\nmax-workers = lots\n", `listenhub.conf:3: max-workers: invalid value "lots"`},
		{"status-interval = 5\n", `listenhub.conf:1: status-interval: invalid value "5"`},
		{"max-workers 5\n", `listenhub.conf:1: want key = value`},
		{"max-workers = 5\nmax_workers = 6\n", `listenhub.conf:2: max-workers is set twice (first on line 1)`},
		{"config = /etc/other\n", `listenhub.conf:1: a config file cannot name another`},
	} {
		writeConfig(t, path, c.body)
		code, _, errOut := runCmd([]string{"serve", "--socket", filepath.Join(dir, "s"), "--config", path})
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, %q; want 2 and %q", c.body, code, errOut, c.want)
		}
	}
	if code, _, errOut := runCmd([]string{"serve", "--socket", filepath.Join(dir, "s"), "--config", filepath.Join(dir, "none")}); code != 2 || !strings.Contains(errOut, "no such file") {
		t.Errorf("missing file: exit %d, %q", code, errOut)
	}
}

// serveConfig starts serve with --config and no log flags on the command
// line (the file sets them).
func serveConfig(t *testing.T, socket, conf string, args ...string) *proc {
	t.Helper()
	c := needDB(t)
	p := &proc{t: t, socket: socket, app: testApp(t), stderr: &syncBuf{}, done: make(chan struct{})}
	full := append([]string{"serve", "--socket", socket, "--database-url", c.URL(), "--application-name", p.app,
		"--config", conf}, args...)
	p.cmd = exec.Command(hubBinary(t), full...)
	p.cmd.Env = cleanEnv()
	p.cmd.Stderr, p.cmd.Stdout = p.stderr, p.stderr
	p.start()
	p.ready()
	return p
}

// SIGHUP re-reads the file: live settings (a cap, the log level and
// format) take effect at once on the same connections; a setting that
// needs an upgrade is logged as such; a flag still wins over the file; a
// broken file changes nothing; a setting taken out goes back to its
// default.
func TestServeConfigSIGHUP(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "listenhub.conf")
	writeConfig(t, conf, "max-subscriptions = 1\nlog-format = json\nlog-level = info\n")
	p := serveConfig(t, filepath.Join(dir, "hub.sock"), conf, "--max-channels", "100")
	w := dialWorker(t, p.socket)
	if m := w.answer("a"); m.Type != "ack" {
		t.Fatalf("sub a: %+v", m)
	}
	if m := w.answer("b"); m.Type != "nack" || m.Error != "too many subscriptions" {
		t.Fatalf("sub b past max-subscriptions 1: %+v", m)
	}
	hup := func(want string) {
		t.Helper()
		n := strings.Count(p.stderr.String(), want)
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, timeout, want, func() bool { return strings.Count(p.stderr.String(), want) > n })
	}
	writeConfig(t, conf, "max-subscriptions = 3\nlog-format = text\nlog-level = debug\nchannel-prefix = x.\nmax-channels = 1\nhealth-check-interval = 7s\n")
	hup(`msg="config reloaded"`)
	log := p.stderr.String()
	for _, want := range []string{
		`msg="config: changed settings need an upgrade (SIGUSR2) to take effect" keys=[health-check-interval]`,
		`msg="config: a changed channel mapping needs a restart; an upgrade refuses it (its workers' channels are named under the old one)" keys=[channel-prefix]`,
		`msg="config: settings given as flags or in the environment override the file" keys=[max-channels]`,
		`max_subscriptions=3`,
	} {
		if !strings.Contains(log, want) {
			t.Fatalf("log lacks %s:\n%s", want, log)
		}
	}
	if m := w.answer("b"); m.Type != "ack" {
		t.Fatalf("sub b after max-subscriptions 3: %+v", m)
	}
	// An unknown frame type is logged at warn once, then at debug.
	unknown := []byte(`{"t":"zz"}`)
	for range 2 {
		if _, err := w.c.Write(append(frameHeader(len(unknown)), unknown...)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, timeout, "a debug line in text", func() bool { return strings.Contains(p.stderr.String(), "level=DEBUG") })

	writeConfig(t, conf, "max-subscriptions = 0\n")
	hup(`msg="config not reloaded"`)
	if m := w.answer("c"); m.Type != "ack" {
		t.Fatalf("sub c after a refused reload (max-subscriptions still 3): %+v", m)
	}
	if m := w.answer("d"); m.Type != "nack" {
		t.Fatalf("sub d past max-subscriptions 3: %+v", m)
	}

	// A setting taken out of the file goes back to its default.
	writeConfig(t, conf, "log-format = text\n")
	hup(`msg="config reloaded"`)
	if m := w.answer("d"); m.Type != "ack" {
		t.Fatalf("sub d with max-subscriptions out of the file (the default, 10,000): %+v", m)
	}
}

// The new process of an upgrade reads the file afresh: a setting changed
// in it takes effect, and the worker connected before keeps its
// connection.
func TestServeConfigUpgrade(t *testing.T) {
	c := needDB(t)
	conf := filepath.Join(t.TempDir(), "listenhub.conf")
	writeConfig(t, conf, "max-subscriptions = 1\n")
	u := startUpHub(t, c.URL(), "--config", conf)
	w := dialWorker(t, u.socket)
	if m := w.answer("a"); m.Type != "ack" {
		t.Fatalf("sub a: %+v", m)
	}
	if m := w.answer("b"); m.Type != "nack" {
		t.Fatalf("sub b past max-subscriptions 1: %+v", m)
	}
	writeConfig(t, conf, "max-subscriptions = 2\n")
	u.upgrade()
	if m := w.answer("b"); m.Type != "ack" {
		t.Fatalf("sub b after the upgrade to max-subscriptions 2: %+v", m)
	}
	if m := w.answer("c"); m.Type != "nack" {
		t.Fatalf("sub c past max-subscriptions 2: %+v", m)
	}
}

// A logger derived from the switch (the relay's, With a component) keeps
// its attributes across a SIGHUP's switch of format and level, and writes
// in the format now in force.
func TestLogSwitchDerived(t *testing.T) {
	var buf bytes.Buffer
	s, err := newLogSwitch(&buf, "text", "info")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(s).With("component", "relay").WithGroup("g")
	log.Info("one", "k", 1)
	log.Debug("hidden")
	if err := s.set("json", "debug"); err != nil {
		t.Fatal(err)
	}
	log.Debug("two", "k", 2)
	log.Info("three", "k", 3)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("got %d lines, want 3:\n%s", len(lines), buf.String())
	}
	if l := lines[0]; !strings.Contains(l, "msg=one") || !strings.Contains(l, "component=relay") || !strings.Contains(l, "g.k=1") {
		t.Errorf("text line: %s", l)
	}
	for i, msg := range []string{"two", "three"} {
		l := lines[i+1]
		if !strings.Contains(l, `"msg":"`+msg+`"`) || !strings.Contains(l, `"component":"relay"`) || !strings.Contains(l, `"g":{"k":`) {
			t.Errorf("json line %d: %s", i+1, l)
		}
	}
}
