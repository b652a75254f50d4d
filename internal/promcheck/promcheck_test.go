package promcheck

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

const timeout = 30 * time.Second

var db *pgtest.Cluster

func TestMain(m *testing.M) { pgtesting.Main(m, pgtest.Options{}, &db) }

// serveWithMetrics starts the real binary with --metrics-addr on a free
// port and returns the socket path and the metrics address.
func serveWithMetrics(t *testing.T, url string) (string, string) {
	t.Helper()
	bin := testutil.Binary(t, "github.com/listenhub/listenhub/cmd/listenhub")
	sock := filepath.Join(t.TempDir(), "hub.sock")
	cmd := exec.Command(bin, "serve", "--socket", sock, "--database-url", url, "--metrics-addr", "127.0.0.1:0",
		"--log-format", "json", "--application-name", "listenhub-promcheck")
	logs := &testutil.SyncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("listenhub output:\n%s", logs.String())
		}
	})
	var addr string
	testutil.WaitFor(t, timeout, "the metrics address in the log", func() bool {
		sc := bufio.NewScanner(strings.NewReader(logs.String()))
		for sc.Scan() {
			var l struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "metrics listening" {
				addr = l.Addr
			}
		}
		return addr != ""
	})
	testutil.WaitFor(t, timeout, "the hub socket", func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return sock, addr
}

// subscriber connects to the hub, subscribes to q and waits for the ack.
func subscriber(t *testing.T, sock, q string) (net.Conn, *frame.Decoder) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write(frame.AppendSub(nil, q)); err != nil {
		t.Fatal(err)
	}
	d := &frame.Decoder{}
	expect(t, c, d, "ack")
	return c, d
}

// expect reads frames until one of type typ (status frames come and go).
func expect(t *testing.T, c net.Conn, d *frame.Decoder, typ string) frame.Message {
	t.Helper()
	buf := make([]byte, 4096)
	for {
		m, ok, err := d.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if m.Type == typ {
				return m
			}
			continue
		}
		c.SetReadDeadline(time.Now().Add(timeout))
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %s: %v", typ, err)
		}
		d.Feed(buf[:n])
	}
}

func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	if f := expfmt.ResponseFormat(resp.Header); f.FormatType() != expfmt.TypeTextPlain {
		t.Errorf("/metrics Content-Type %q is not the text format (%v)", resp.Header.Get("Content-Type"), f)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("Prometheus' parser rejects /metrics: %v\n%s", err, body)
	}
	return fams
}

// TestExpositionParses scrapes a hub that has acked subscriptions and
// fanned out NOTIFYs, and checks with Prometheus' parser that every family
// is well-formed (HELP, TYPE, legal names, labels and values), the required
// families are there with their types, the histograms are coherent
// (ascending bounds, cumulative counts, count and sum matching what
// happened) and the build info and process series say something true.
func TestExpositionParses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := db
	sock, addr := serveWithMetrics(t, c.URL())
	c1, d1 := subscriber(t, sock, "pc")
	c2, d2 := subscriber(t, sock, "pc")
	const notifies = 5
	for i := range notifies {
		if err := c.Notify(ctx, "pc", fmt.Sprint("n", i)); err != nil {
			t.Fatal(err)
		}
	}
	for range notifies {
		expect(t, c1, d1, "wake")
		expect(t, c2, d2, "wake")
	}

	var fams map[string]*dto.MetricFamily
	testutil.WaitFor(t, timeout, "the fanout histogram to count every NOTIFY", func() bool {
		fams = scrape(t, addr)
		f := fams["listenhub_fanout_latency_seconds"]
		return f != nil && len(f.Metric) == 1 && f.Metric[0].GetHistogram().GetSampleCount() >= notifies
	})
	want := map[string]dto.MetricType{
		"listenhub_workers":                   dto.MetricType_GAUGE,
		"listenhub_channels":                  dto.MetricType_GAUGE,
		"listenhub_postgres_healthy":          dto.MetricType_GAUGE,
		"listenhub_wakes_received_total":      dto.MetricType_COUNTER,
		"listenhub_frames_sent_total":         dto.MetricType_COUNTER,
		"listenhub_durable_coalesced_total":   dto.MetricType_COUNTER,
		"listenhub_durable_dropped_total":     dto.MetricType_COUNTER,
		"listenhub_evictions_total":           dto.MetricType_COUNTER,
		"listenhub_protocol_errors_total":     dto.MetricType_COUNTER,
		"listenhub_postgres_reconnects_total": dto.MetricType_COUNTER,
		"listenhub_accepts_total":             dto.MetricType_COUNTER,
		"listenhub_fanout_latency_seconds":    dto.MetricType_HISTOGRAM,
		"listenhub_ack_latency_seconds":       dto.MetricType_HISTOGRAM,
		"listenhub_build_info":                dto.MetricType_GAUGE,
		"process_cpu_seconds_total":           dto.MetricType_COUNTER,
		"process_open_fds":                    dto.MetricType_GAUGE,
		"process_max_fds":                     dto.MetricType_GAUGE,
		"process_virtual_memory_bytes":        dto.MetricType_GAUGE,
		"process_resident_memory_bytes":       dto.MetricType_GAUGE,
		"process_start_time_seconds":          dto.MetricType_GAUGE,
	}
	for name, typ := range want {
		f := fams[name]
		switch {
		case f == nil:
			t.Errorf("%s: missing", name)
		case f.GetType() != typ:
			t.Errorf("%s: type %v, want %v", name, f.GetType(), typ)
		case f.GetHelp() == "":
			t.Errorf("%s: no HELP", name)
		case len(f.Metric) != 1:
			t.Errorf("%s: %d series, want 1", name, len(f.Metric))
		}
	}
	for name, f := range fams {
		if _, ok := want[name]; !ok {
			t.Logf("%s (%v): not checked here", name, f.GetType())
		}
	}

	value := func(name string) float64 {
		m := fams[name].GetMetric()[0]
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetCounter().GetValue()
	}
	if value("listenhub_workers") != 2 || value("listenhub_wakes_received_total") != notifies {
		t.Errorf("workers %v, wakes received %v; want 2 and %d", value("listenhub_workers"), value("listenhub_wakes_received_total"), notifies)
	}

	checkHistogram(t, fams["listenhub_fanout_latency_seconds"], hubBounds(t).FanoutLatency().Bounds, notifies)
	checkHistogram(t, fams["listenhub_ack_latency_seconds"], hubBounds(t).AckLatency().Bounds, 2)

	bi := fams["listenhub_build_info"].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range bi.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if bi.GetGauge().GetValue() != 1 || labels["version"] == "" || labels["revision"] == "" ||
		!strings.HasPrefix(labels["goversion"], "go") || len(labels) != 3 {
		t.Errorf("build info %v = %v", labels, bi.GetGauge().GetValue())
	}
	now := float64(time.Now().Unix())
	if s := value("process_start_time_seconds"); s < now-600 || s > now+5 {
		t.Errorf("process_start_time_seconds %v, now %v", s, now)
	}
	if value("process_open_fds") < 5 || value("process_open_fds") > value("process_max_fds") ||
		value("process_resident_memory_bytes") < 1<<20 || value("process_virtual_memory_bytes") < value("process_resident_memory_bytes") {
		t.Errorf("process series: fds %v/%v, rss %v, vsz %v", value("process_open_fds"), value("process_max_fds"),
			value("process_resident_memory_bytes"), value("process_virtual_memory_bytes"))
	}
}

// checkHistogram: the buckets are the hub's bounds in seconds, ascending,
// with cumulative counts up to the sample count, which is at least min;
// the sum is positive and below count × the largest observation possible.
// hubBounds is a hub that never runs: its histograms, empty, say the
// buckets the binary's /metrics must carry.
func hubBounds(t *testing.T) *hub.Hub {
	t.Helper()
	h, err := hub.New(hub.Config{SocketPath: filepath.Join(t.TempDir(), "s"), DatabaseURL: "postgres://localhost/x"})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func checkHistogram(t *testing.T, f *dto.MetricFamily, bounds []time.Duration, min uint64) {
	t.Helper()
	h := f.GetMetric()[0].GetHistogram()
	b := h.GetBucket()
	// The parser keeps the +Inf bucket as the last one.
	if len(b) != len(bounds)+1 {
		t.Fatalf("%s: %d buckets, want %d and +Inf", f.GetName(), len(b), len(bounds))
	}
	var prev uint64
	for i, bk := range b {
		if i < len(bounds) && bk.GetUpperBound() != bounds[i].Seconds() {
			t.Errorf("%s: bucket %d le=%v, want %v", f.GetName(), i, bk.GetUpperBound(), bounds[i].Seconds())
		}
		if bk.GetCumulativeCount() < prev {
			t.Errorf("%s: bucket %d count %d below the previous %d", f.GetName(), i, bk.GetCumulativeCount(), prev)
		}
		prev = bk.GetCumulativeCount()
	}
	if prev != h.GetSampleCount() || h.GetSampleCount() < min {
		t.Errorf("%s: +Inf bucket %d, count %d, want equal and at least %d", f.GetName(), prev, h.GetSampleCount(), min)
	}
	if h.GetSampleSum() <= 0 || h.GetSampleSum() > float64(h.GetSampleCount())*60 {
		t.Errorf("%s: sum %v for %d observations", f.GetName(), h.GetSampleSum(), h.GetSampleCount())
	}
}
