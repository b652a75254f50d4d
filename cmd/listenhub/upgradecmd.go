package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// runUpgrade is `listenhub upgrade`: the hot upgrade of a running hub from
// a shell or a deploy script, where systemd's `systemctl reload` is not the
// way in. It sends SIGUSR2 to the pid in the hub's --pid-file and waits for
// the file to name the new process, which writes it once it has taken over.
// Exit 0: the upgrade went through (the line names both pids). Exit 1: it
// did not, and the old process serves on (its log says why), or there is no
// hot upgrade on this platform. Exit 2: a bad flag.
func runUpgrade(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("upgrade")
	pidFile := fs.String("pid-file", "", "the running hub's --pid-file (required)")
	timeout := durationFlag(fs, "timeout", defaultUpgradeTimeout+5*time.Second,
		"how long to wait for the new process to take over: the hub's --upgrade-timeout and a margin")
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, "upgrade", true)
		}
		return flagError(stderr, "upgrade", err)
	}
	if errNoHotUpgrade != nil {
		fmt.Fprintf(stderr, "listenhub upgrade: %v\n", errNoHotUpgrade)
		return 1
	}
	if *pidFile == "" {
		return flagError(stderr, "upgrade", errors.New("--pid-file is required: the hub's own --pid-file, which names the process to upgrade"))
	}
	if *timeout <= 0 {
		return flagError(stderr, "upgrade", fmt.Errorf("--timeout %v: must be positive", *timeout))
	}
	old, err := readPid(*pidFile)
	if err != nil {
		fmt.Fprintf(stderr, "listenhub upgrade: %v\n", err)
		return 1
	}
	if err := syscall.Kill(old, syscall.SIGUSR2); err != nil {
		fmt.Fprintf(stderr, "listenhub upgrade: signal pid %d (from %s): %v\n", old, *pidFile, err)
		return 1
	}
	deadline := time.NewTimer(*timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintf(stderr, "listenhub upgrade: interrupted while waiting for pid %d's successor\n", old)
			return 1
		case <-deadline.C:
			if processExists(old) {
				fmt.Fprintf(stderr, "listenhub upgrade: no new process took over within %v: pid %d serves on (its log says why)\n", *timeout, old)
			} else {
				fmt.Fprintf(stderr, "listenhub upgrade: pid %d is gone and %s names no successor within %v\n", old, *pidFile, *timeout)
			}
			return 1
		case <-tick.C:
			pid, err := readPid(*pidFile)
			if err == nil && pid != old && processExists(pid) {
				fmt.Fprintf(stdout, "listenhub upgrade: pid %d took over from pid %d\n", pid, old)
				return 0
			}
		}
	}
}

// readPid reads the pid a hub wrote to its pid file and checks that the
// process is there to signal.
func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("pid file: %w (is the hub running with --pid-file %s?)", err, path)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %s: %q is not a pid", path, strings.TrimSpace(string(b)))
	}
	if !processExists(pid) {
		return 0, fmt.Errorf("pid file %s: pid %d is not running (a stale file?)", path, pid)
	}
	return pid, nil
}

// processExists reports whether a process with this pid exists (one of another
// user's counts: the signal itself then says it is not ours).
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
