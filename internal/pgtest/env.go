package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

const (
	// dirPrefix names the cluster directories, so that sweep can find the
	// ones left behind by a process that died.
	dirPrefix = "listenhub-pgtest-"
	// ownerFile in a cluster directory holds the pid of the process that
	// created it.
	ownerFile = "owner.pid"
)

// findBinDir returns the directory holding initdb and postgres: EnvBinDir,
// else the directory of an initdb on PATH (following symlinks, as Debian's
// /usr/bin wrappers and /usr/local/bin links point into the versioned
// directory), else the newest /usr/lib/postgresql/*/bin.
func findBinDir() (string, error) {
	ok := func(dir string) bool {
		for _, name := range []string{"initdb", "postgres"} {
			if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv(EnvBinDir); dir != "" {
		if ok(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("pgtest: %w in %s=%s; %s", ErrNotInstalled, EnvBinDir, dir, installHint)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if ok(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
		if r, err := filepath.EvalSymlinks(p); err == nil && ok(filepath.Dir(r)) {
			return filepath.Dir(r), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest first by numeric major version (10 sorts after 9).
	ver := func(d string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64)
		return v
	}
	sort.Slice(dirs, func(i, j int) bool { return ver(dirs[i]) > ver(dirs[j]) })
	for _, d := range dirs {
		if ok(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("pgtest: %w on PATH or under /usr/lib/postgresql/*/bin; %s", ErrNotInstalled, installHint)
}

// installHint tells a newcomer what to do about ErrNotInstalled.
const installHint = "install PostgreSQL (Debian/Ubuntu: apt-get install postgresql; " +
	"Fedora: dnf install postgresql-server; macOS: brew install postgresql), " +
	"or set " + EnvBinDir + " to the directory holding initdb and postgres, " +
	"or set " + EnvURL + " to an existing server"

// tempBase picks the parent of the cluster directory: os.TempDir(), unless
// the server user could not reach it (we are root, it is not) or the socket
// path would be too long for sun_path (108 bytes), then /tmp.
func tempBase(otherUser bool) string {
	base := os.TempDir()
	// base + "/listenhub-pgtest-NNNNNNNNNN/sock/.s.PGSQL.NNNNN"
	if len(base)+len(dirPrefix)+40 > 100 {
		return "/tmp"
	}
	if otherUser {
		for d := base; ; d = filepath.Dir(d) {
			st, err := os.Stat(d)
			if err != nil || st.Mode().Perm()&0o001 == 0 {
				return "/tmp"
			}
			if d == "/" || d == "." {
				break
			}
		}
	}
	return base
}

// sweep removes cluster directories left behind by processes that died
// without Close (a test binary killed by its -timeout, SIGKILL). Their server
// got the parent-death signal; if it is somehow still running it is sent
// SIGQUIT and its directory is left for a later sweep. Directories whose
// owner lives, or without an owner's pid yet, are not touched.
func sweep(logf func(string, ...any)) {
	bases := []string{os.TempDir()}
	if bases[0] != "/tmp" {
		bases = append(bases, "/tmp")
	}
	for _, base := range bases {
		dirs, _ := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
		for _, dir := range dirs {
			// No pid yet (a file being written: 0) is an owner
			// starting, as much as a live one is.
			if owner := readPID(filepath.Join(dir, ownerFile)); owner == 0 || alive(owner) {
				continue
			}
			dataDir := filepath.Join(dir, "data")
			if pm := readPID(filepath.Join(dataDir, "postmaster.pid")); alive(pm) {
				cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pm) + "/cmdline")
				if strings.Contains(string(cmdline), dataDir) {
					logf("pgtest: stale cluster %s: postmaster %d still running, sending SIGQUIT", dir, pm)
					syscall.Kill(pm, syscall.SIGQUIT)
				}
				continue
			}
			logf("pgtest: removing stale cluster %s", dir)
			os.RemoveAll(dir)
		}
	}
}

// readPID returns the integer on the first line of a file, 0 if none.
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// alive reports whether a process with this pid exists and has not exited
// (a zombie nobody reaped, common under minimal container inits, is dead).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && err != syscall.EPERM {
		return false
	}
	st, err := procState(pid)
	return err == nil && st != 'Z' && st != 'X'
}
