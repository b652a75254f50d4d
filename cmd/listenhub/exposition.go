package main

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/listenhub/listenhub/hub"
)

// The /metrics families beyond the hub's counters and gauges (metrics.go):
// the latency histograms, build information and the process_* series
// (process.go). Hand-written in the Prometheus text format (0.0.4); the
// module that checks it with Prometheus' own parser is internal/promcheck.

// writeMoreMetrics writes every family that is not in the metrics table.
func writeMoreMetrics(buf *bytes.Buffer, fanout, ack hub.Histogram) {
	writeHistogram(buf, "listenhub_fanout_latency_seconds",
		"Time from reading a NOTIFY from the Postgres socket to the write that handed its frames to the workers' sockets, per NOTIFY delivered.", fanout)
	writeHistogram(buf, "listenhub_ack_latency_seconds",
		"Time from reading a sub to queuing its ack (a LISTEN round trip for a new channel).", ack)
	b := readBuildInfo()
	fmt.Fprintf(buf, "# HELP listenhub_build_info Always 1; the labels say which build runs.\n# TYPE listenhub_build_info gauge\n"+
		"listenhub_build_info{version=%s,revision=%s,goversion=%s} 1\n",
		labelValue(b.version), labelValue(b.revision), labelValue(b.goVersion))
	writeProcessMetrics(buf)
}

// writeSample writes a family of one unlabelled sample.
func writeSample(buf *bytes.Buffer, name, typ, help string, v float64) {
	fmt.Fprintf(buf, "# HELP %s %s\n# TYPE %s %s\n%s %s\n", name, help, name, typ, name, formatFloat(v))
}

// writeHistogram writes h as a Prometheus histogram in seconds.
func writeHistogram(buf *bytes.Buffer, name, help string, h hub.Histogram) {
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
