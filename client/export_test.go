package client

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// setEnterHook sets the hook every reader runs between the two steps of
// entering a handler call, until the test ends.
func setEnterHook(t *testing.T, h func()) {
	t.Helper()
	testEnterHook = h
	t.Cleanup(func() { testEnterHook = nil })
}

// setAckTimeoutHook sets the hook an ack timer runs as it fires, until the
// test ends.
func setAckTimeoutHook(t *testing.T, h func()) {
	t.Helper()
	testAckTimeoutHook = h
	t.Cleanup(func() { testAckTimeoutHook = nil })
}

// setNewLocal makes every Failover build its local listener with f, with
// no connection settings of its own (no database check), until the test
// ends.
func setNewLocal(t *testing.T, f func(ctx context.Context, opts LocalOptions, h Handlers) (Listener, error)) {
	t.Helper()
	savedNew, savedConfig := newLocal, localConfig
	newLocal = f
	localConfig = func(LocalOptions) (*pgconn.Config, error) { return nil, nil }
	t.Cleanup(func() { newLocal, localConfig = savedNew, savedConfig })
}

// withPath returns opts with SocketPath set.
func withPath(opts Options, path string) Options {
	opts.SocketPath = path
	return opts
}
