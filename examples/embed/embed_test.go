package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

var db *pgtest.Cluster

func TestMain(m *testing.M) { pgtesting.Main(m, pgtest.Options{}, &db) }

const timeout = 20 * time.Second

// The program serves the hub's /metrics on its own mux, and the scrape
// sees its worker and the channel it subscribed; the program stops when
// its context ends.
func TestEmbedMetricsSeeTheWorker(t *testing.T) {
	ln := testutil.ListenTCP(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, db.URL(), filepath.Join(t.TempDir(), "hub.sock"), ln) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(timeout):
			t.Errorf("run did not return within %v of its context's end", timeout)
		}
	}()

	var metrics string
	testutil.WaitFor(t, timeout, "/monitor/metrics with the worker and its channel", func() bool {
		resp, err := http.Get("http://" + ln.Addr().String() + "/monitor/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		metrics = string(b)
		return resp.StatusCode == 200 && strings.Contains(metrics, "\nlistenhub_workers 1\n") &&
			strings.Contains(metrics, "\nlistenhub_channels 1\n")
	})
	if !strings.Contains(metrics, "\nlistenhub_postgres_healthy 1\n") {
		t.Errorf("the hub is not healthy after its channel was LISTENed:\n%s", metrics)
	}
}
