package main

// The systemd units allow the hub only the system calls of
// @system-service (SystemCallFilter=): a call outside it fails with EPERM
// under systemd and nowhere else. This test runs the real binary under
// strace through what the hub does in production and holds every call it
// made to that set.

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// systemServiceCalls expands a SystemCallFilter= group of `systemd-analyze
// syscall-filter` into system call names.
func systemServiceCalls(t *testing.T, group string) map[string]bool {
	t.Helper()
	out, err := exec.Command("systemd-analyze", "syscall-filter").Output()
	if err != nil {
		t.Fatalf("systemd-analyze syscall-filter: %v", err)
	}
	groups := map[string][]string{}
	var cur string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "@"):
			cur = strings.TrimSpace(line)
		case strings.HasPrefix(line, "#") || line == "":
			cur = "" // the ungrouped and unlisted calls: in no group
		case cur != "" && !strings.HasPrefix(strings.TrimSpace(line), "#"):
			groups[cur] = append(groups[cur], strings.TrimSpace(line))
		}
	}
	calls := map[string]bool{}
	seen := map[string]bool{}
	var expand func(string)
	expand = func(g string) {
		if seen[g] {
			return
		}
		seen[g] = true
		for _, c := range groups[g] {
			if strings.HasPrefix(c, "@") {
				expand(c)
			} else {
				calls[c] = true
			}
		}
	}
	expand(group)
	if len(calls) < 100 {
		t.Fatalf("%s expanded to %d calls: the output of systemd-analyze syscall-filter was not understood", group, len(calls))
	}
	return calls
}

// TestSyscallsInSystemServiceFilter: start, a worker subscribing and
// receiving, /metrics and /workers, a SIGUSR2 upgrade (the new process is
// traced too) and SIGTERM, all under strace -f; every system call made is
// in @system-service, the filter of deploy/systemd/*.service.
func TestSyscallsInSystemServiceFilter(t *testing.T) {
	for _, tool := range []string{"strace", "systemd-analyze"} {
		if _, err := exec.LookPath(tool); err != nil {
			if tool == "strace" && os.Getenv("CI") == "true" {
				t.Fatalf("strace is missing (CI=true; .ci/run installs it)")
			}
			t.Skipf("%s is not installed", tool)
		}
	}
	allowed := systemServiceCalls(t, "@system-service")
	c := needDB(t)

	dir := t.TempDir()
	bin := filepath.Join(dir, "listenhub")
	copyFile(t, hubBinary(t), bin)
	socket, pidFile, trace := filepath.Join(dir, "hub.sock"), filepath.Join(dir, "hub.pid"), filepath.Join(dir, "trace")
	logf, err := os.Create(filepath.Join(dir, "hub.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("strace", "-f", "-qq", "-o", trace, "--", bin, "serve", "--log-format", "json",
		"--socket", socket, "--database-url", c.URL(), "--application-name", testApp(t),
		"--pid-file", pidFile, "--metrics-addr", "127.0.0.1:0")
	cmd.Env = cleanEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	pid := func() int {
		b, _ := os.ReadFile(pidFile)
		var n int
		for _, r := range strings.TrimSpace(string(b)) {
			n = n*10 + int(r-'0')
		}
		return n
	}
	hubLog := func() string { b, _ := os.ReadFile(logf.Name()); return string(b) }
	t.Cleanup(func() {
		if p := pid(); p > 0 {
			syscall.Kill(p, syscall.SIGKILL)
		}
		cmd.Process.Kill()
		if t.Failed() {
			t.Logf("listenhub log:\n%s", hubLog())
		}
	})
	testutil.WaitFor(t, 2*timeout, "the pid file", func() bool { return pid() > 0 })
	first := pid()

	w := dialSeqWorker(t, socket, "sandbox")
	notify(t, "NOTIFY sandbox, '1'")
	w.awaitWakes(t, 1, "the wake")
	addr := regexp.MustCompile(`"msg":"metrics listening","addr":"([^"]+)"`).FindStringSubmatch(hubLog())
	if addr == nil {
		t.Fatalf("no metrics address in the log")
	}
	for _, path := range []string{"/metrics", "/workers?limit=1", "/healthz"} {
		resp, err := http.Get("http://" + addr[1] + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	syscall.Kill(first, syscall.SIGUSR2)
	testutil.WaitFor(t, 30*time.Second, "the upgraded process", func() bool { p := pid(); return p > 0 && p != first })
	notify(t, "NOTIFY sandbox, '2'")
	w.awaitWakes(t, 2, "the wake after the upgrade")
	if _, _, _, err := w.state(); err != nil {
		t.Fatalf("the worker's connection ended across the upgrade: %v", err)
	}

	syscall.Kill(pid(), syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("strace did not end after SIGTERM")
	}

	b := testutil.ReadFile(t, trace)
	call := regexp.MustCompile(`^\d+\s+([a-z0-9_]+)\(`)
	used := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if m := call.FindStringSubmatch(line); m != nil {
			used[m[1]] = true
		}
	}
	if !used["execve"] || !used["epoll_wait"] && !used["epoll_pwait"] {
		t.Fatalf("the trace holds no execve or epoll_wait: strace output not understood (%d calls)", len(used))
	}
	var outside []string
	for c := range used {
		if !allowed[c] {
			outside = append(outside, c)
		}
	}
	slices.Sort(outside)
	if len(outside) > 0 {
		t.Errorf("the hub made system calls outside @system-service, which SystemCallFilter= in deploy/systemd refuses (EPERM): %v", outside)
	}
	t.Logf("%d distinct system calls, all in @system-service", len(used))
}
