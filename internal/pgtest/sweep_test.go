package pgtest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// TestParentDeath kills a process that started a cluster without giving it a
// chance to clean up: the server must follow it, and the next sweep must
// remove the directory it left.
func TestParentDeath(t *testing.T) {
	if os.Getenv(EnvURL) != "" {
		t.Skip("external server")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "PGTEST_CHILD=1")
	cmd.Stderr = os.Stderr
	out := testutil.StartPiped(t, cmd)
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 2 || f[0] == "ERROR" {
		t.Fatalf("child said %q", line)
	}
	dir := f[0]
	pm, _ := strconv.Atoi(f[1])
	if !alive(pm) {
		t.Fatalf("postmaster %d of the child not running", pm)
	}
	cmd.Process.Kill()
	cmd.Wait()

	waitFor(t, 30*time.Second, "the postmaster to die with its parent", func() bool { return !alive(pm) })
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the child's directory is already gone: %v", err)
	}
	sweep(t.Logf)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("sweep left %s: %v", dir, err)
	}
}

// TestSweepSparesLiving: directories of live owners, and ones without an
// owner file yet (being created), are never removed.
func TestSweepSparesLiving(t *testing.T) {
	base := tempBase(false)
	mine, err := os.MkdirTemp(base, dirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(mine)
	os.WriteFile(filepath.Join(mine, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
	fresh, err := os.MkdirTemp(base, dirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(fresh)
	sweep(t.Logf)
	for _, d := range []string{mine, fresh} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("sweep removed %s: %v", d, err)
		}
	}
}

// waitFor is testutil.WaitFor; testutil cannot be imported from package
// pgtest's own tests without a cycle-free but redundant dependency, and this
// is four lines.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}
