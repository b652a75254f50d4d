package hub

// The delivery check through a real PgBouncer (docs/design.md rule 13):
// the hub never acks, never reports healthy and says why in one line when
// its URL names a transaction pooler; a session pooler works.

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

// startPooled starts a hub with k connections to url (a PgBouncer).
func startPooled(t *testing.T, url string, k int) (*Hub, *logBuf, string) {
	t.Helper()
	logs := &logBuf{}
	cfg := Config{
		SocketPath:          filepath.Join(t.TempDir(), "hub.sock"),
		DatabaseURL:         url,
		ApplicationName:     "lh-" + appSafe.ReplaceAllString(t.Name(), "-"),
		PostgresConnections: k,
		HealthCheckTimeout:  300 * time.Millisecond,
		Logger:              slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	h := startHub(t, cfg, logs)
	return h, logs, cfg.SocketPath
}

const poolerLine = "listener: notifications do not arrive on this connection: a transaction-pooling PgBouncer? use a direct URL"

// TestPGTransactionPooler: two connections through a transaction-pooling
// PgBouncer. The worker's sub is never acked and it hears only
// healthy:false while the hub retries (several rounds of connections), the
// hub never counts as healthy, and its log has exactly one error line,
// which names the likely cause.
func TestPGTransactionPooler(t *testing.T) {
	c := needDB(t)
	b := pgtesting.PgBouncer(t, c, "transaction")
	h, logs, path := startPooled(t, b.URL(), 2)
	t.Cleanup(func() {
		if t.Failed() {
			l := b.Log()
			t.Logf("pgbouncer log (its end):\n%s", l[max(0, len(l)-4096):])
		}
	})
	w := dialRaw(t, path)
	w.expect(statusFalse)
	w.sub("pooled")
	// Each round is a connection per hub connection plus a second
	// session for the check: wait for three rounds.
	testutil.WaitFor(t, 30*time.Second, "three rounds of checks", func() bool {
		return strings.Count(b.Log(), "login attempt") >= 12
	})
	for {
		m, err := w.read(50 * time.Millisecond)
		if err != nil {
			break // nothing more waiting
		}
		if got := encode(m); got != statusFalse {
			t.Fatalf("worker got %s through a transaction pooler", got)
		}
	}
	if s := h.Stats(); s.PostgresHealthy {
		t.Fatal("hub healthy through a transaction pooler")
	}
	if n := logs.count(poolerLine); n != 1 {
		t.Fatalf("%d lines with %q, want 1", n, poolerLine)
	}
	if n := logs.count("level=ERROR"); n != 1 {
		t.Fatalf("%d error lines, want 1", n)
	}
}

// TestPGSessionPooler: the same through a session-pooling PgBouncer works:
// healthy, acked, woken.
func TestPGSessionPooler(t *testing.T) {
	c := needDB(t)
	b := pgtesting.PgBouncer(t, c, "session")
	h, logs, path := startPooled(t, b.URL(), 2)
	testutil.WaitFor(t, timeout, "healthy", func() bool { return h.Stats().PostgresHealthy })
	w := dialRaw(t, path)
	w.expect(statusTrue)
	w.subscribe("sess")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := c.Notify(ctx, "sess", "through"); err != nil {
		t.Fatal(err)
	}
	w.expect(wake("sess", ptr("through")))
	if logs.count("do not arrive") != 0 || logs.count("pooler that delivers") == 0 {
		t.Fatalf("log:\n%s", logs.String())
	}
}
