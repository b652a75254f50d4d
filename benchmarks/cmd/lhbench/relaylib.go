package main

// `lhbench relay`: the relay package embedded, with the few flags of
// `listenhub relay` the writers scenario passes, and the listenhub_relay_*
// series it reads from /metrics. The smoke test runs it (it needs no
// listenhub binary built); the full runs use `listenhub relay`.

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/relay"
)

func relayMain(args []string) error {
	fs := flag.NewFlagSet("relay", flag.ExitOnError)
	url := fs.String("database-url", "", "database URL")
	pub := fs.String("publication", relay.DefaultOptions().Publication, "publication")
	slot := fs.String("slot", relay.DefaultOptions().Slot, "replication slot")
	window := fs.Duration("window", relay.DefaultOptions().Window, "coalescing window")
	metrics := fs.String("metrics-addr", "", "serve /metrics here")
	fs.String("log-level", "warn", "ignored (the embedded relay logs at warn)")
	fs.Parse(args)
	cc, err := pgconn.ParseConfig(*url)
	if err != nil {
		return err
	}
	r, err := relay.New(relay.Options{ConnConfig: cc, Publication: *pub, Slot: *slot, Window: *window,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *metrics != "" {
		l, err := net.Listen("tcp", *metrics)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { writeRelayMetrics(w, r) }),
			ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(l)
		defer srv.Close()
	}
	return r.Run(ctx)
}

// writeRelayMetrics writes the series scrapeRelay reads, named as
// `listenhub relay` names them.
func writeRelayMetrics(w http.ResponseWriter, r *relay.Relay) {
	s := r.Stats()
	fmt.Fprintf(w, "listenhub_relay_transactions_total %d\nlistenhub_relay_notifies_total %d\nlistenhub_relay_batches_total %d\nlistenhub_relay_visibility_waits_total %d\n",
		s.Transactions, s.Notifies, s.Batches, s.VisibilityWaits)
	h := r.CommitToNotify()
	for i, b := range h.Bounds {
		fmt.Fprintf(w, "listenhub_relay_commit_to_notify_seconds_bucket{le=%q} %d\n", strconv.FormatFloat(b.Seconds(), 'g', -1, 64), h.Counts[i])
	}
	fmt.Fprintf(w, "listenhub_relay_commit_to_notify_seconds_bucket{le=\"+Inf\"} %d\n", h.Count)
}
