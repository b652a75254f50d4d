package testutil_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

// TestBinaryHasTheTestsLoop: a program a test starts runs the loop
// backend the test itself was built with, so that the poll-tagged run of
// the command's tests proves the hub's guarantees on poll(2), not on epoll.
func TestBinaryHasTheTestsLoop(t *testing.T) {
	t.Cleanup(testutil.RemoveBinaries)
	bin := testutil.Binary(t, "github.com/listenhub/listenhub/cmd/listenhub")
	out, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m: %v\n%s", err, out)
	}
	tagged := strings.Contains(string(out), "-tags=listenhub_poll")
	if want := loop.Backend == "poll"; tagged != want {
		t.Fatalf("this test runs the %s loop; the binary it started was built with -tags=listenhub_poll: %v\n%s", loop.Backend, tagged, out)
	}
}
