package main

import (
	"context"

	"github.com/listenhub/listenhub/internal/pgtest"
)

// startCluster starts the throwaway cluster of a run (internal/pgtest),
// tuned for measuring fanout, not disk: fsync, synchronous_commit and
// full_page_writes off, unless durable (the writers scenario), which keeps
// PostgreSQL's defaults for them (a commit waits for its WAL flush) and
// pushes time checkpoints out to 30 min, so that the harness decides when
// one runs. shared_buffers stays small: 1,100 connections need only their
// own per-backend shared memory, which postgres sizes from max_connections.
func startCluster(ctx context.Context, maxConns int, durable, logical bool, logf func(string, ...any)) (*pgtest.Cluster, error) {
	set := map[string]string{
		"shared_buffers":   "128MB",
		"max_wal_size":     "1GB",
		"log_min_messages": "warning",
	}
	if !logical {
		set["wal_level"] = "replica" // PostgreSQL's default, as measured so far
	}
	if durable {
		for k, v := range map[string]string{"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
			"checkpoint_timeout": "30min", "max_wal_size": "4GB"} {
			set[k] = v
		}
	}
	return pgtest.Start(ctx, pgtest.Options{MaxConnections: maxConns, Logical: logical, Settings: set, Logf: logf})
}
