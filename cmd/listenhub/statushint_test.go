package main

import (
	"strings"
	"testing"

	"github.com/listenhub/listenhub/internal/testutil"
)

// `listenhub status` with no hub behind the address says so and names what
// to try: whether the hub runs, that it serves status only with
// --metrics-addr, and the address to give (the one tried, or the default).
func TestStatusNoHubSaysWhatToTry(t *testing.T) {
	ln := testutil.ListenTCP(t)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	code, out, errOut := runCmd([]string{"status", "--metrics-addr", addr})
	t.Logf("status --metrics-addr %s:\n%s", addr, errOut)
	if code != 1 || out != "" {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	for _, want := range []string{
		"listenhub status: cannot reach the hub's metrics server",
		"nothing answers at " + addr,
		"is the hub running? systemctl status listenhub",
		"start serve with --metrics-addr " + addr + " (or LISTENHUB_METRICS_ADDR=" + addr + ")",
		"without the flag, status tries 127.0.0.1:9064",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
}
