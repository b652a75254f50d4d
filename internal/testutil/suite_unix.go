//go:build unix

package testutil

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RunSuite runs a test suite of another language or module (name args... in
// dir, with env added to this process's environment) and fails t with its
// output if it fails or gives no result within timeout. The suite runs in a
// process group of its own, killed at the end, so that nothing it started
// (a hub of a crashed suite) outlives it. It returns the suite's output.
func RunSuite(t testing.TB, timeout time.Duration, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out := &SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // leftovers
	}
	what := name + " " + strings.Join(args, " ")
	if ctx.Err() != nil {
		t.Fatalf("%s in %s: no result within %v:\n%s", what, dir, timeout, out)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("%s in %s: %v:\n%s", what, dir, err, out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out.String()
}
