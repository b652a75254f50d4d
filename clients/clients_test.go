// Package clients_test runs the test suites of the non-Go clients
// (clients/python, clients/node, clients/ruby) against the real listenhub
// binary and a real, throwaway Postgres: it builds the binary, starts the
// cluster, and runs `python3 -m unittest`, `node --test` and the Ruby
// minitest suites (test/run.rb) with
//
//	LHTEST_HUB_BIN       the binary (each test starts its own hubs: killing
//	                     one for a failover test touches no other test)
//	LHTEST_DATABASE_URL  the cluster
//	LHTEST_PGBOUNCER_TRANSACTION_URL, LHTEST_PGBOUNCER_SESSION_URL
//	                     a PgBouncer in front of it in each pool mode
//	                     (the local listeners' delivery check); unset
//	                     without pgbouncer, which fails under CI=true
//
// in the environment, failing with their output on a non-zero exit.
// LISTENHUB_CLIENT_TEST_RUN=PATTERN runs only the matching tests (unittest
// -k, node --test-name-pattern, minitest -n /PATTERN/). A
// missing interpreter or dependency (python3 with psycopg 3; node with
// clients/node/node_modules from `npm ci`; ruby with Debian's ruby-pg,
// ruby-minitest, ruby-actioncable, ruby-activerecord and puma) skips,
// except under CI=true,
// where it fails: a client suite that silently skips is one that never
// runs.
package clients_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

var db *pgtest.Cluster

// TestMain runs everything (the cluster, the hub binary, both suites and
// what they start) in a TMPDIR of its own, and fails the run if anything is
// left in it at the end: a test run must leave nothing in /tmp (it once
// left the 17 MB hub binary every time).
func TestMain(m *testing.M) { pgtesting.MainPrivateTemp(m, pgtest.Options{}, &db) }

// suiteTimeout bounds one language's whole suite (generous: the machine is
// shared).
const suiteTimeout = 4 * time.Minute

// missing skips the test, or fails it under CI=true.
func missing(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: not skipping)")
	}
	t.Skip(msg)
}

// findPython returns an interpreter that can import psycopg (3):
// LISTENHUB_PYTHON, else python3 on PATH, else /usr/bin/python3 (Debian's
// python3-psycopg installs there, which a pyenv python3 first on PATH does
// candidates lists the programs to try for name: $env, else name on PATH,
// else /usr/bin/name.
func candidates(env, name string) []string {
	var cands []string
	if p := os.Getenv(env); p != "" {
		cands = append(cands, p)
	}
	if p, err := exec.LookPath(name); err == nil {
		cands = append(cands, p)
	}
	return append(cands, "/usr/bin/"+name)
}

// not see).
func findPython(t *testing.T) string {
	t.Helper()
	cands := candidates("LISTENHUB_PYTHON", "python3")
	for _, p := range cands {
		cmd := exec.Command(p, "-c", "import psycopg, sys; assert psycopg.__version__ >= '3' and sys.version_info >= (3, 8)")
		if cmd.Run() == nil {
			return p
		}
	}
	missing(t, fmt.Sprintf("python client tests need python3 (>= 3.8) with psycopg 3; tried %v; on Debian: apt-get install -y python3-psycopg", cands))
	return ""
}

// run runs a suite in dir with the hub binary and the database in its
// environment (testutil.RunSuite: no hub it started outlives it).
func run(t *testing.T, dir string, name string, args ...string) {
	t.Helper()
	bin := testutil.Binary(t, "github.com/listenhub/listenhub/cmd/listenhub")
	env := append([]string{"LHTEST_HUB_BIN=" + bin, "LHTEST_DATABASE_URL=" + db.URL()}, pgbouncers(t)...)
	out := testutil.RunSuite(t, suiteTimeout, dir, env, name, args...)
	t.Logf("%s %s:\n%s", name, strings.Join(args, " "), out)
}

// pgbouncers starts a PgBouncer in each pool mode in front of the cluster
// for the suite (closed at the end of t) and returns their URLs as
// environment variables. Without pgbouncer the suites skip those tests,
// except under CI=true.
func pgbouncers(t *testing.T) []string {
	t.Helper()
	var env []string
	for _, mode := range []string{"transaction", "session"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		b, err := db.StartPgBouncer(ctx, mode)
		cancel()
		if errors.Is(err, pgtest.ErrNoPgBouncer) || errors.Is(err, pgtest.ErrExternal) {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%v (CI=true: the local listeners' delivery check must be tested)", err)
			}
			t.Logf("no PgBouncer: %v", err)
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		env = append(env, "LHTEST_PGBOUNCER_"+strings.ToUpper(mode)+"_URL="+b.URL())
	}
	return env
}

func TestPython(t *testing.T) {
	py := findPython(t)
	dir := absPath(t, "python")
	// -s tests: the helpers import as top-level modules; `-m` puts the
	// working directory first on sys.path, so the package under test is
	// the source tree's.
	args := []string{"-m", "unittest", "discover", "-v", "-s", "tests"}
	if pat := os.Getenv("LISTENHUB_CLIENT_TEST_RUN"); pat != "" {
		args = append(args, "-k", pat)
	}
	run(t, dir, py, args...)
}

// findNode returns node and clients/node with its dependencies installed;
// without them the test is missing them ("<whoNeeds> node", say).
func findNode(t *testing.T, whoNeeds string) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		missing(t, whoNeeds+" node (>= 18); on Debian: apt-get install -y nodejs npm")
	}
	dir = absPath(t, "node")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "pg")); err != nil {
		missing(t, whoNeeds+" the client's dependencies: run `npm ci` in clients/node")
	}
	return node, dir
}

func TestNode(t *testing.T) {
	node, dir := findNode(t, "node client tests need")
	files, err := filepath.Glob(filepath.Join(dir, "test", "*.test.js"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files in %s/test (%v)", dir, err)
	}
	args := []string{"--test", "--test-reporter=spec"}
	if pat := os.Getenv("LISTENHUB_CLIENT_TEST_RUN"); pat != "" {
		args = append(args, "--test-name-pattern", pat)
	}
	run(t, dir, node, append(args, files...)...)
}

// rubyDeps is what the Ruby suites load: the gem's own dependency (pg), the
// test framework, and what the Action Cable adapter's tests run (Rails'
// adapter contract, Active Record for the broadcasts, Puma end to end).
const rubyDeps = `require "pg"; require "minitest"; require "action_cable"; require "active_record"; require "puma"`

// findRuby returns a ruby (>= 3.0) that loads rubyDeps: LISTENHUB_RUBY,
// else ruby on PATH, else /usr/bin/ruby (Debian's packages install for it).
func findRuby(t *testing.T) string {
	t.Helper()
	cands := candidates("LISTENHUB_RUBY", "ruby")
	for _, p := range cands {
		if exec.Command(p, "-e", `exit(RUBY_VERSION >= "3.0" ? 0 : 1); `+rubyDeps).Run() == nil {
			return p
		}
	}
	missing(t, fmt.Sprintf("ruby client tests need ruby (>= 3.0) with pg, minitest, actioncable, activerecord and puma; tried %v; on Debian: apt-get install -y ruby ruby-pg ruby-minitest ruby-actioncable ruby-activerecord puma", cands))
	return ""
}

func TestRuby(t *testing.T) {
	rb := findRuby(t)
	dir := absPath(t, "ruby")
	// test/rails first: Rails' copied adapter tests require "test_helper"
	// and mean that harness.
	args := []string{"-Ilib", "-Itest/rails", "test/run.rb", "-v"}
	if pat := os.Getenv("LISTENHUB_CLIENT_TEST_RUN"); pat != "" {
		args = append(args, "-n", "/"+pat+"/")
	}
	run(t, dir, rb, args...)
}
