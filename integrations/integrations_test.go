// Package integrations_test runs the test suites of the integrations (each
// a Go module of its own under integrations/, with its library's
// dependencies) against the real listenhub binary and a real, throwaway
// Postgres: it builds the binary, starts the cluster, and runs `go test
// -race ./...` in each module with
//
//	LHTEST_HUB_BIN       the binary (each test starts its own hubs)
//	LHTEST_DATABASE_URL  the cluster
//
// in the environment, failing with the suite's output on a non-zero exit.
// The modules' dependencies come through the ordinary module proxy, as a
// user's go would fetch them. LISTENHUB_INTEGRATION_TEST_RUN=PATTERN is
// passed on as -run.
package integrations_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

var db *pgtest.Cluster

func TestMain(m *testing.M) { pgtesting.MainPrivateTemp(m, pgtest.Options{}, &db) }

// suiteTimeout bounds one module's suite, its dependencies' download and
// its build under the race detector included (the machine is shared).
const suiteTimeout = 15 * time.Minute

// runModule runs go test in the module at dir.
func runModule(t *testing.T, dir string) {
	t.Helper()
	bin := testutil.Binary(t, "github.com/listenhub/listenhub/cmd/listenhub")
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	args := []string{"test", "-race", "-count=1", "-timeout", suiteTimeout.String()}
	if testing.Verbose() {
		args = append(args, "-v")
	}
	if pat := os.Getenv("LISTENHUB_INTEGRATION_TEST_RUN"); pat != "" {
		args = append(args, "-run", pat)
	}
	args = append(args, "./...")
	out := testutil.RunSuite(t, suiteTimeout+time.Minute, dir,
		[]string{"LHTEST_HUB_BIN=" + bin, "LHTEST_DATABASE_URL=" + db.URL()}, gobin, args...)
	if testing.Verbose() {
		t.Logf("%s", out)
	}
}

// TestRiver: integrations/riverhub, River's listener through the hub.
func TestRiver(t *testing.T) { runModule(t, "riverhub") }

// TestFleet: fleet/, the NATS side (bridge, the hub's NATS upstream, the
// listenhub-fleet binary), against real nats-servers started in its tests.
func TestFleet(t *testing.T) { runModule(t, "../fleet") }
