package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/relay"
)

// relayFlags are the relay's own flags: `listenhub relay` has them, and so
// has `serve`, which runs a relay in the hub's process with --relay.
type relayFlags struct {
	publication, createPublication, slot string
	temporarySlot, recreateInvalidSlot   bool
	channelTemplate, ops                 string
	window, standbyRetry, maxLag         *time.Duration
	maxLagBytes                          int64
}

func (f *relayFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.publication, "publication", relay.DefaultPublication, "the publication whose tables are relayed")
	fs.StringVar(&f.createPublication, "create-publication", "", "create a missing publication FOR this, e.g. 'TABLES IN SCHEMA pgmq'; without it a missing publication is an error that names the SQL")
	fs.StringVar(&f.slot, "slot", relay.DefaultSlot, "the logical replication slot, created when missing; two relays on one slot are active and standby")
	fs.BoolVar(&f.temporarySlot, "temporary-slot", false, "a slot that lives as long as the relay's connection: no WAL held while it is down, and every channel of the publication NOTIFYed once at start instead")
	fs.BoolVar(&f.recreateInvalidSlot, "recreate-invalid-slot", false, "drop and create again a slot that can no longer decode (invalidated past max_slot_wal_keep_size, or older than its publication), NOTIFYing every channel once; without it the relay names the fix and stops")
	fs.StringVar(&f.channelTemplate, "channel-template", relay.DefaultChannelTemplate, "the channel of a change: {schema}, {table}, {op} (INSERT, UPDATE, DELETE, TRUNCATE); the default is pgmq's")
	fs.StringVar(&f.ops, "ops", relay.DefaultOps.String(), "the changes NOTIFYed: insert, update, delete, truncate, comma-separated, or all")
	f.window = durationFlag(fs, "window", relay.DefaultWindow, "transactions decoded within this are NOTIFYed in one transaction, each channel once; a batch goes out at once when nothing more is waiting; 0 means one per transaction")
	f.standbyRetry = durationFlag(fs, "standby-retry", relay.DefaultStandbyRetry, "while another relay has the slot, try to take it this often")
	f.maxLag = durationFlag(fs, "max-lag", relay.DefaultMaxLag, "warn when the NOTIFYs are further behind the commits than this")
	fs.Int64Var(&f.maxLagBytes, "max-lag-bytes", relay.DefaultMaxLagBytes, "warn when the slot holds more WAL than this")
}

// options turns the flags into relay options; the error names the flag.
func (f *relayFlags) options(cc *pgconn.Config) (relay.Options, error) {
	ops, err := relay.ParseOps(f.ops)
	if err != nil {
		return relay.Options{}, fmt.Errorf("--ops: %w", err)
	}
	if *f.window < 0 {
		return relay.Options{}, fmt.Errorf("--window must not be negative (got %v)", *f.window)
	}
	for _, err := range []error{
		positiveDuration("standby-retry", *f.standbyRetry),
		positiveDuration("max-lag", *f.maxLag),
	} {
		if err != nil {
			return relay.Options{}, err
		}
	}
	if f.maxLagBytes < 1 {
		return relay.Options{}, fmt.Errorf("--max-lag-bytes must be at least 1 (got %d)", f.maxLagBytes)
	}
	if _, err := relay.ParseTemplate(f.channelTemplate); err != nil {
		return relay.Options{}, fmt.Errorf("--channel-template: %w", err)
	}
	return relay.Options{
		ConnConfig:          cc,
		Publication:         f.publication,
		CreatePublication:   f.createPublication,
		Slot:                f.slot,
		TemporarySlot:       f.temporarySlot,
		RecreateInvalidSlot: f.recreateInvalidSlot,
		ChannelTemplate:     f.channelTemplate,
		Ops:                 ops,
		Window:              *f.window,
		StandbyRetry:        *f.standbyRetry,
		MaxLag:              *f.maxLag,
		MaxLagBytes:         f.maxLagBytes,
	}, nil
}

// relayProcs gives `listenhub relay` one P (GOMAXPROCS=1) unless the
// environment sets GOMAXPROCS. The relay does little work per message, on
// two goroutines (the reader and the batcher) that hand each commit from
// one to the other; with a P per core the runtime spends more CPU waking
// and parking threads for those hand-offs than the relay spends on the
// work. At 16 writers and ~20k commits/s on 2 cores the relay process
// used 33-54 µs of CPU per commit with 2 Ps and 14-17 µs with one, and it
// caught up with the writers 2-2.4 times sooner: the CPU it no longer
// burns goes to its walsender, which decodes every commit for it and is
// what a busy server starves first (docs/relay.md). In-process tests
// call runRelay and keep their own setting.
func relayProcs() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}

// runRelay is `listenhub relay`: the relay on its own.
func runRelay(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("relay")
	var rf relayFlags
	databaseURL := fs.String("database-url", "", "PostgreSQL URL or key=value DSN of a direct connection to the primary (env "+envName("database-url")+", then DATABASE_URL, then the libpq PG* variables)")
	appName := fs.String("application-name", relay.DefaultApplicationName, "application_name of the relay's two backends")
	rf.register(fs)
	metricsAddr := fs.String("metrics-addr", "", "serve /metrics, /healthz and /relay on this address, e.g. 127.0.0.1:9188 (off when empty)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, "relay", true)
		}
		return flagError(stderr, "relay", err)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if !isSet(fs, "database-url") && os.Getenv("DATABASE_URL") != "" {
		*databaseURL = os.Getenv("DATABASE_URL")
	}
	bad := func(err error) int { return flagError(stderr, "relay", err) }
	log, err := newLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		return bad(err)
	}
	cc, err := pgconn.ParseConfig(*databaseURL)
	if err != nil {
		fmt.Fprintf(stderr, "listenhub relay: --database-url: %s\n", oneLine(err))
		return 1
	}
	opts, err := rf.options(cc)
	if err != nil {
		return bad(err)
	}
	opts.ApplicationName = *appName
	opts.Logger = log
	rl, err := relay.New(opts)
	if err != nil {
		return bad(err)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *metricsAddr != "" {
		ln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			fmt.Fprintf(stderr, "listenhub relay: --metrics-addr: %v\n", err)
			return 1
		}
		srv := &http.Server{Handler: relayHandler(rl), ReadHeaderTimeout: 5 * time.Second}
		log.Info("metrics listening", "addr", ln.Addr().String())
		go srv.Serve(ln)
		defer srv.Close()
	}
	sd := newSDReporter(log)
	defer sd.close()
	sd.ready()
	log.Info("listenhub relay starting", "version", versionString(), "host", cc.Host, "port", cc.Port,
		"database", cc.Database, "user", cc.User, "publication", opts.Publication, "slot", opts.Slot,
		"gomaxprocs", runtime.GOMAXPROCS(0))
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	for {
		select {
		case <-hup:
			log.Warn("SIGHUP ignored; send SIGTERM to stop")
			continue
		case err := <-done:
			if err != nil {
				sd.stopping("stopped: " + oneLine(err))
				fmt.Fprintf(stderr, "listenhub relay: %s\n", oneLine(err))
				return 1
			}
			sd.stopping("stopping")
			log.Info("relay stopped")
			return 0
		}
	}
}

// relayHandler is the metrics server of `listenhub relay`.
func relayHandler(rl *relay.Relay) http.Handler {
	mux := http.NewServeMux()
	registerRelay(mux, rl)
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		writeRelayMetrics(&buf, rl)
		b := readBuildInfo()
		fmt.Fprintf(&buf, "# HELP listenhub_build_info Always 1; the labels say which build runs.\n# TYPE listenhub_build_info gauge\n"+
			"listenhub_build_info{version=%s,revision=%s,goversion=%s} 1\n",
			labelValue(b.version), labelValue(b.revision), labelValue(b.goVersion))
		writeProcessMetrics(&buf)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(buf.Bytes())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch st := rl.Stats().State; st {
		case relay.StateActive, relay.StateStandby:
			fmt.Fprintf(w, "ok (%s)\n", st)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "relay %s\n", st)
		}
	})
	return mux
}

// relayJSON is the body of /relay, the relay section of listenhub status.
type relayJSON struct {
	State               string  `json:"state"`
	Publication         string  `json:"publication"`
	Slot                string  `json:"slot"`
	TemporarySlot       bool    `json:"temporary_slot"`
	ChannelTemplate     string  `json:"channel_template"`
	Ops                 string  `json:"ops"`
	WindowSeconds       float64 `json:"window_seconds"`
	Transactions        uint64  `json:"transactions"`
	Changes             uint64  `json:"changes"`
	Notifies            uint64  `json:"notifies"`
	Batches             uint64  `json:"batches"`
	Coalesced           uint64  `json:"coalesced"`
	ChannelsTooLong     uint64  `json:"channels_too_long"`
	VisibilityWaits     uint64  `json:"visibility_waits"`
	Reconnects          uint64  `json:"reconnects"`
	Takeovers           uint64  `json:"takeovers"`
	LagBytes            int64   `json:"lag_bytes"`
	LagSeconds          float64 `json:"lag_seconds"`
	ConfirmedLSN        string  `json:"confirmed_lsn"`
	CommitToNotifyP50   float64 `json:"commit_to_notify_p50_seconds"`
	CommitToNotifyP99   float64 `json:"commit_to_notify_p99_seconds"`
	CommitToNotifyCount uint64  `json:"commit_to_notify_count"`
}

// registerRelay adds GET /relay to a metrics server.
func registerRelay(mux *http.ServeMux, rl *relay.Relay) {
	mux.HandleFunc("GET /relay", func(w http.ResponseWriter, r *http.Request) {
		s, o, h := rl.Stats(), rl.Options(), rl.CommitToNotify()
		writeJSON(w, http.StatusOK, relayJSON{
			State: s.State.String(), Publication: o.Publication, Slot: o.Slot, TemporarySlot: o.TemporarySlot,
			ChannelTemplate: o.ChannelTemplate, Ops: o.Ops.String(), WindowSeconds: o.Window.Seconds(),
			Transactions: s.Transactions, Changes: s.Changes, Notifies: s.Notifies, Batches: s.Batches,
			Coalesced: s.Coalesced, ChannelsTooLong: s.ChannelsTooLong, VisibilityWaits: s.VisibilityWaits,
			Reconnects: s.Reconnects, Takeovers: s.Takeovers, LagBytes: s.LagBytes, LagSeconds: s.LagSeconds,
			ConfirmedLSN:        fmt.Sprintf("%X/%X", s.ConfirmedLSN>>32, uint32(s.ConfirmedLSN)),
			CommitToNotifyP50:   h.Quantile(0.5).Seconds(),
			CommitToNotifyP99:   h.Quantile(0.99).Seconds(),
			CommitToNotifyCount: h.Count,
		})
	})
}

// relayMetrics are the listenhub_relay_* families but the histogram.
var relayMetrics = []struct {
	name, typ, help string
	value           func(s *relay.Stats) float64
}{
	{"listenhub_relay_active", "gauge", "1 while this relay streams from the slot, else 0.",
		func(s *relay.Stats) float64 { return b2f(s.State == relay.StateActive) }},
	{"listenhub_relay_standby", "gauge", "1 while another relay has the slot and this one waits to take over, else 0.",
		func(s *relay.Stats) float64 { return b2f(s.State == relay.StateStandby) }},
	{"listenhub_relay_transactions_total", "counter", "Committed transactions decoded.",
		func(s *relay.Stats) float64 { return float64(s.Transactions) }},
	{"listenhub_relay_changes_total", "counter", "Row changes decoded (a TRUNCATE counts one per table).",
		func(s *relay.Stats) float64 { return float64(s.Changes) }},
	{"listenhub_relay_notifies_total", "counter", "Channels NOTIFYed.",
		func(s *relay.Stats) float64 { return float64(s.Notifies) }},
	{"listenhub_relay_batches_total", "counter", "NOTIFY transactions committed.",
		func(s *relay.Stats) float64 { return float64(s.Batches) }},
	{"listenhub_relay_coalesced_total", "counter", "Wakes (one per transaction and channel) merged into another NOTIFY of the same batch.",
		func(s *relay.Stats) float64 { return float64(s.Coalesced) }},
	{"listenhub_relay_channels_too_long_total", "counter", "Changes not NOTIFYed because their channel would exceed 63 bytes.",
		func(s *relay.Stats) float64 { return float64(s.ChannelsTooLong) }},
	{"listenhub_relay_visibility_waits_total", "counter", "Times a batch waited for a decoded commit to become visible.",
		func(s *relay.Stats) float64 { return float64(s.VisibilityWaits) }},
	{"listenhub_relay_reconnects_total", "counter", "Sessions streaming again after a lost connection.",
		func(s *relay.Stats) float64 { return float64(s.Reconnects) }},
	{"listenhub_relay_takeovers_total", "counter", "Times this relay took the slot over from another.",
		func(s *relay.Stats) float64 { return float64(s.Takeovers) }},
	{"listenhub_relay_lag_bytes", "gauge", "WAL between the server's position and the slot's confirmed one.",
		func(s *relay.Stats) float64 { return float64(s.LagBytes) }},
	{"listenhub_relay_lag_seconds", "gauge", "How far the last NOTIFY was behind the commit of the newest transaction it covered; 0 when caught up.",
		func(s *relay.Stats) float64 { return s.LagSeconds }},
}

// writeRelayMetrics writes the listenhub_relay_* families.
func writeRelayMetrics(buf *bytes.Buffer, rl *relay.Relay) {
	s := rl.Stats()
	for _, m := range relayMetrics {
		writeSample(buf, m.name, m.typ, m.help, m.value(&s))
	}
	h := rl.CommitToNotify()
	writeHistogram(buf, "listenhub_relay_commit_to_notify_seconds",
		"Per transaction: from its commit timestamp (the server's clock) to the commit of the NOTIFY that covered it.",
		hub.Histogram{Bounds: h.Bounds, Counts: h.Counts, Count: h.Count, Sum: h.Sum})
	d := rl.CommitToDecode()
	writeHistogram(buf, "listenhub_relay_commit_to_decode_seconds",
		"Per transaction: from its commit timestamp to the relay reading its Commit message (the server's share of commit_to_notify).",
		hub.Histogram{Bounds: d.Bounds, Counts: d.Counts, Count: d.Count, Sum: d.Sum})
}
