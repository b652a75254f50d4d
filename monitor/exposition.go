package monitor

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/latency"
)

// The /metrics families, hand-written in the Prometheus text format
// (0.0.4) so that the module needs no Prometheus client: the hub's
// counters and gauges (the table below), the latency histograms, build
// information and the process_* series (process.go). The module that
// checks the text with Prometheus' own parser is internal/promcheck.

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
	{"listenhub_socket_refusable", "gauge", "1 when the socket's directories are ones the clients refuse (served with --allow-refusable-socket, or changed since the start), else 0.",
		func(s *hub.Stats) float64 { return b2f(s.SocketRefusable) }},
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

// b2f is a 0/1 gauge.
func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// writeMetrics renders s in the Prometheus text exposition format.
func writeMetrics(buf *bytes.Buffer, s hub.Stats) {
	for _, m := range metrics {
		writeSample(buf, m.name, m.typ, m.help, m.value(&s))
	}
}

// writeMoreMetrics writes every family of a hub that is not in the
// metrics table.
func writeMoreMetrics(buf *bytes.Buffer, fanout, ack latency.Histogram, b build) {
	writeHistogram(buf, "listenhub_fanout_latency_seconds",
		"Time from reading a NOTIFY from the Postgres socket to the write that handed its frames to the workers' sockets, per NOTIFY delivered.", fanout)
	writeHistogram(buf, "listenhub_ack_latency_seconds",
		"Time from reading a sub to queuing its ack (a LISTEN round trip for a new channel).", ack)
	writeBuildInfo(buf, b)
	writeProcessMetrics(buf)
}

// writeBuildInfo writes listenhub_build_info.
func writeBuildInfo(buf *bytes.Buffer, b build) {
	fmt.Fprintf(buf, "# HELP listenhub_build_info Always 1; the labels say which build runs.\n# TYPE listenhub_build_info gauge\n"+
		"listenhub_build_info{version=%s,revision=%s,goversion=%s} 1\n",
		labelValue(b.version), labelValue(b.revision), labelValue(b.goVersion))
}

// writeSample writes a family of one unlabelled sample.
func writeSample(buf *bytes.Buffer, name, typ, help string, v float64) {
	fmt.Fprintf(buf, "# HELP %s %s\n# TYPE %s %s\n%s %s\n", name, help, name, typ, name, formatFloat(v))
}

// writeHistogram writes h as a Prometheus histogram in seconds.
func writeHistogram(buf *bytes.Buffer, name, help string, h latency.Histogram) {
	fmt.Fprintf(buf, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	for i, b := range h.Bounds {
		var c uint64
		if i < len(h.Counts) {
			c = h.Counts[i]
		}
		fmt.Fprintf(buf, "%s_bucket{le=\"%s\"} %d\n", name, formatFloat(b.Seconds()), c)
	}
	fmt.Fprintf(buf, "%s_bucket{le=\"+Inf\"} %d\n%s_sum %s\n%s_count %d\n",
		name, h.Count, name, formatFloat(h.Sum.Seconds()), name, h.Count)
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// labelValue quotes a label value: backslash, double quote and newline
// escaped, as the text format wants.
func labelValue(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}
