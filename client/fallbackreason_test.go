package client

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// A Failover that cannot use the hub says why, even when the application
// gave it no logger: a socket in a directory the client refuses (here one
// above the socket's own, open to all) is logged once, with the reason,
// on the process's default logger, and Reason returns it.
func TestFailoverFallbackSaysWhy(t *testing.T) {
	c := needDB(t)
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(open, "run")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "hub.sock")
	// Someone listens there: only the directory check can refuse it.
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	logs := &testutil.SyncBuffer{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(logs, nil)))
	defer slog.SetDefault(old)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := NewFailover(ctx, FailoverOptions{Hub: Options{SocketPath: path}, Local: LocalOptions{DatabaseURL: c.URL()}}, FailoverHandlers{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Mode() != ModeLocal {
		t.Fatalf("mode %v, want local", f.Mode())
	}
	var se *SocketError
	if r := f.Reason(); !errors.As(r, &se) || !strings.Contains(r.Error(), open) {
		t.Errorf("Reason() = %v, want a SocketError naming %s", r, open)
	}
	out := logs.String()
	if n := strings.Count(out, "hub unreachable"); n != 1 || !strings.Contains(out, "writable by group or other") {
		t.Errorf("the default logger got %d fallback lines, want 1 with the reason:\n%s", n, out)
	}
}
