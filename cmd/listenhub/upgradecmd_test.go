package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// TestUpgradeCommand: `listenhub upgrade --pid-file` upgrades a serving hub
// (exit 0, the line names both pids, the pid file the new one) without the
// worker connected through it noticing; with a binary that cannot start it
// exits 1 saying the old process serves on, and the old process does.
func TestUpgradeCommand(t *testing.T) {
	if errNoHotUpgrade != nil {
		t.Skip(errNoHotUpgrade)
	}
	c := needDB(t)
	u := startUpHub(t, c.URL())
	w := dialSeqWorker(t, u.socket, "upgrade_cmd")
	old := u.pid()

	code, out, errOut := runCmd([]string{"upgrade", "--pid-file", u.pidFile})
	if code != 0 {
		t.Fatalf("upgrade: exit %d, stderr %q", code, errOut)
	}
	m := regexp.MustCompile(`pid (\d+) took over from pid (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("upgrade printed %q, want the new and the old pid", out)
	}
	newPid, _ := strconv.Atoi(m[1])
	u.seen = append(u.seen, newPid)
	if m[2] != strconv.Itoa(old) || newPid == old || u.pid() != newPid {
		t.Fatalf("upgrade printed %q; old pid %d, pid file %d", out, old, u.pid())
	}
	notify(t, "NOTIFY upgrade_cmd, '1'")
	w.awaitWakes(t, 1, "a wake through the new hub")
	if _, _, _, err := w.state(); err != nil {
		t.Fatalf("the worker's connection ended in the upgrade: %v", err)
	}

	// A new binary that cannot start: exit 1 within --timeout, the
	// serving hub named, and it serves on.
	testutil.WaitFor(t, 30*time.Second, "the old process to exit", func() bool { return !alive(old) })
	u.replaceBin("#!/bin/sh\nexit 1\n")
	start := time.Now()
	code, _, errOut = runCmd([]string{"upgrade", "--pid-file", u.pidFile, "--timeout", "3s"})
	if code != 1 || !strings.Contains(errOut, "pid "+strconv.Itoa(newPid)+" serves on") {
		t.Fatalf("failed upgrade: exit %d, stderr %q; want 1 and pid %d serves on", code, errOut, newPid)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("a --timeout 3s upgrade took %v to give up", d)
	}
	if got := u.pid(); got != newPid {
		t.Fatalf("pid file %d after a failed upgrade, want %d", got, newPid)
	}
	notify(t, "NOTIFY upgrade_cmd, '2'")
	w.awaitWakes(t, 2, "a wake through the hub that served on")
}

// TestUpgradeCommandRefusals: no --pid-file is a bad flag (exit 2); a pid
// file that names nothing running, or no pid file, is exit 1 with the
// reason.
func TestUpgradeCommandRefusals(t *testing.T) {
	if errNoHotUpgrade != nil {
		if code, _, errOut := runCmd([]string{"upgrade"}); code != 1 || !strings.Contains(errOut, "hot upgrade is Linux only") {
			t.Fatalf("upgrade off Linux: exit %d, %q; want 1 and why", code, errOut)
		}
		return
	}
	if code, _, errOut := runCmd([]string{"upgrade"}); code != 2 || !strings.Contains(errOut, "--pid-file is required") {
		t.Fatalf("no --pid-file: exit %d, %q", code, errOut)
	}
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.pid")
	if code, _, errOut := runCmd([]string{"upgrade", "--pid-file", missing}); code != 1 || !strings.Contains(errOut, "is the hub running with --pid-file") {
		t.Fatalf("no pid file: exit %d, %q", code, errOut)
	}
	stale := filepath.Join(dir, "stale.pid")
	// A pid past the kernel's pid_max: certainly not running.
	if err := os.WriteFile(stale, []byte("2147483646\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runCmd([]string{"upgrade", "--pid-file", stale}); code != 1 || !strings.Contains(errOut, "is not running") {
		t.Fatalf("stale pid file: exit %d, %q", code, errOut)
	}
	garbage := filepath.Join(dir, "garbage.pid")
	if err := os.WriteFile(garbage, []byte("hub\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runCmd([]string{"upgrade", "--pid-file", garbage}); code != 1 || !strings.Contains(errOut, "is not a pid") {
		t.Fatalf("garbage pid file: exit %d, %q", code, errOut)
	}
}
