package main

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/relay"
)

// metric is one line family of /metrics, named exactly as in docs/design.md
// ("Metrics").
type metric struct {
	name, typ, help string
	value           func(s *hub.Stats) float64
}

var metrics = []metric{
	{"listenhub_workers", "gauge", "Workers connected to the hub now.",
		func(s *hub.Stats) float64 { return float64(s.Workers) }},
	{"listenhub_channels", "gauge", "Channels LISTENed in Postgres now.",
		func(s *hub.Stats) float64 { return float64(s.Channels) }},
	{"listenhub_postgres_healthy", "gauge", "1 when the Postgres connection is up and the union LISTENed, else 0.",
		func(s *hub.Stats) float64 { return b2f(s.PostgresHealthy) }},
	{"listenhub_wakes_received_total", "counter", "NOTIFYs received from Postgres.",
		func(s *hub.Stats) float64 { return float64(s.WakesReceived) }},
	{"listenhub_frames_sent_total", "counter", "Frames fully written to workers.",
		func(s *hub.Stats) float64 { return float64(s.FramesSent) }},
	{"listenhub_durable_coalesced_total", "counter", "Durable wakes merged into a pending unsent one.",
		func(s *hub.Stats) float64 { return float64(s.DurableCoalesced) }},
	{"listenhub_durable_dropped_total", "counter", "Durable wakes dropped at the durable queue limit.",
		func(s *hub.Stats) float64 { return float64(s.DurableDropped) }},
	{"listenhub_evictions_total", "counter", "Workers evicted for a backlog over the hard limit.",
		func(s *hub.Stats) float64 { return float64(s.Evictions) }},
	{"listenhub_protocol_errors_total", "counter", "Worker connections severed for malformed input.",
		func(s *hub.Stats) float64 { return float64(s.ProtocolErrors) }},
	{"listenhub_postgres_reconnects_total", "counter", "Times the Postgres connection came back after a loss.",
		func(s *hub.Stats) float64 { return float64(s.PostgresReconnects) }},
	{"listenhub_accepts_total", "counter", "Worker connections accepted.",
		func(s *hub.Stats) float64 { return float64(s.Accepts) }},
	{"listenhub_upgrades_total", "counter", "Hot upgrades taken over (counted by the new process; counters carry over).",
		func(s *hub.Stats) float64 { return float64(s.Upgrades) }},
	{"listenhub_nacks_total", "counter", "Subscriptions refused with nack.",
		func(s *hub.Stats) float64 { return float64(s.Nacks) }},
	{"listenhub_connections_refused_total", "counter", "Worker connections closed at accept: past --max-workers, out of descriptors, or uid not allowed.",
		func(s *hub.Stats) float64 { return float64(s.ConnectionsRefused) }},
	{"listenhub_workers_shed_total", "counter", "Connected workers closed, the newest first, because RLIMIT_NOFILE was lowered below what they held.",
		func(s *hub.Stats) float64 { return float64(s.WorkersShed) }},
	{"listenhub_outbound_bytes", "gauge", "Bytes queued for all workers and not yet written (bounded by --max-outbound-bytes).",
		func(s *hub.Stats) float64 { return float64(s.OutboundBytes) }},
	{"listenhub_workers_paused", "gauge", "Workers not read now because they left too many answers unread.",
		func(s *hub.Stats) float64 { return float64(s.ReadsPaused) }},
	{"listenhub_read_pauses_total", "counter", "Times a worker stopped being read because it left too many answers unread.",
		func(s *hub.Stats) float64 { return float64(s.ReadPauses) }},
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// writeMetrics renders s in the Prometheus text exposition format.
func writeMetrics(buf *bytes.Buffer, s hub.Stats) {
	for _, m := range metrics {
		fmt.Fprintf(buf, "# HELP %s %s\n# TYPE %s %s\n%s %s\n", m.name, m.help, m.name, m.typ,
			m.name, strconv.FormatFloat(m.value(&s), 'f', -1, 64))
	}
}

// metricsHandler serves /metrics and /healthz from h.Stats(), which is safe
// from the HTTP server's goroutines, and the JSON endpoints of
// introspect.go.
func metricsHandler(h *hub.Hub, rl *relay.Relay) http.Handler {
	mux := http.NewServeMux()
	registerIntrospection(mux, h)
	if rl != nil {
		registerRelay(mux, rl)
	}
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		writeMetrics(&buf, h.Stats())
		writeMoreMetrics(&buf, h.FanoutLatency(), h.AckLatency())
		if rl != nil {
			writeRelayMetrics(&buf, rl)
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(buf.Bytes())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !h.Stats().PostgresHealthy {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "postgres unhealthy")
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}
