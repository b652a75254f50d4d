package main

// The helpers the tests of this package share to speak to a hub from
// outside: a worker speaking raw frames on the socket (no client library),
// frames built byte by byte, and /metrics scraped into series.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/testutil"
)

// worker is a test worker speaking raw frames: it reads each frame's body
// as the hub wrote it, to check the exact bytes (compact JSON, key order),
// or decoded, to check what it says.
type worker struct {
	t testing.TB
	c *net.UnixConn
	r *bufio.Reader
}

// connectWorker connects without reading anything (nobody may be there to
// send the first status yet, or the test checks its bytes).
func connectWorker(t testing.TB, path string) *worker {
	t.Helper()
	return connectWorkerSize(t, path, 4096)
}

// connectWorkerSize is connectWorker with a read buffer of size bytes.
func connectWorkerSize(t testing.TB, path string, size int) *worker {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return newWorker(t, c, size)
}

// newWorker is a worker on a connection the caller made (and closes),
// with a read buffer of size bytes.
func newWorker(t testing.TB, c *net.UnixConn, size int) *worker {
	return &worker{t: t, c: c, r: bufio.NewReaderSize(c, size)}
}

// dialWorker connects and reads the hub's first status frame.
func dialWorker(t testing.TB, path string) *worker {
	t.Helper()
	w := connectWorker(t, path)
	w.expect("status")
	return w
}

// dialBig is dialWorker with a read buffer that takes a burst of acks.
func dialBig(t testing.TB, path string) *worker {
	t.Helper()
	w := connectWorkerSize(t, path, 256<<10)
	w.expect("status")
	return w
}

// dialRaw connects a worker and reads the hub's first frame, which says
// whether it was admitted: a status frame (admitted true), or a refusal,
// told as a nack with an empty q (its words in nack) and then EOF, or a
// bare close (nack ""). Anything else fails the test.
func dialRaw(t *testing.T, socket string, i int) (w *worker, admitted bool, nack string) {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatalf("worker %d: %v", i, err)
	}
	t.Cleanup(func() { c.Close() })
	w = newWorker(t, c, 4096)
	m, err := w.read(timeout)
	switch {
	case err == nil && m.Type == "status":
		return w, true, ""
	case err == nil && m.Type == "nack" && m.Name == "":
		return w, false, m.Error
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
		return w, false, ""
	}
	t.Fatalf("worker %d: %+v, %v; want a status frame, a refusal or EOF", i, m, err)
	return nil, false, ""
}

// send writes b, whatever it holds.
func (w *worker) send(b []byte) {
	w.t.Helper()
	w.c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := w.c.Write(b); err != nil {
		w.t.Fatalf("worker write: %v", err)
	}
}

// body reads one frame, within d, and returns its JSON body.
func (w *worker) body(d time.Duration) (string, error) {
	w.c.SetReadDeadline(time.Now().Add(d))
	var hdr [4]byte
	if _, err := io.ReadFull(w.r, hdr[:]); err != nil {
		return "", err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > frame.MaxLen {
		return "", fmt.Errorf("hub sent a frame of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(w.r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// read reads one frame, within d, and decodes it.
func (w *worker) read(d time.Duration) (frame.Message, error) {
	b, err := w.body(d)
	if err != nil {
		return frame.Message{}, err
	}
	return frame.Decode([]byte(b))
}

// nextBody returns the next frame body, skipping status frames unless
// withStatus.
func (w *worker) nextBody(withStatus bool) string {
	w.t.Helper()
	for {
		b, err := w.body(timeout)
		if err != nil {
			w.t.Fatalf("worker read: %v", err)
		}
		if !withStatus && strings.HasPrefix(b, `{"t":"status",`) {
			continue
		}
		return b
	}
}

// expectBodies reads the next non-status frames and compares their bytes.
func (w *worker) expectBodies(want ...string) {
	w.t.Helper()
	for _, s := range want {
		if got := w.nextBody(false); got != s {
			w.t.Fatalf("worker got %s, want %s", got, s)
		}
	}
}

// expect reads the next frame and checks its type. Status frames (the
// hub re-sends them every 5 intervals) are skipped unless typ is "status".
func (w *worker) expect(typ string) frame.Message {
	w.t.Helper()
	for {
		m, err := w.read(timeout)
		if err != nil {
			w.t.Fatalf("worker: %v", err)
		}
		if m.Type == "status" && typ != "status" {
			continue
		}
		if m.Type != typ {
			w.t.Fatalf("worker got %+v, want %s", m, typ)
		}
		return m
	}
}

// nextMessage reads the next frame that is not a status.
func (w *worker) nextMessage() frame.Message {
	w.t.Helper()
	for {
		m, err := w.read(timeout)
		if err != nil {
			w.t.Fatalf("worker: %v", err)
		}
		if m.Type != "status" {
			return m
		}
	}
}

// status waits for a status frame saying healthy, skipping others.
func (w *worker) status(healthy bool) {
	w.t.Helper()
	for {
		if m := w.expect("status"); m.Healthy == healthy {
			return
		}
	}
}

// sub subscribes q and checks the ack's exact bytes.
func (w *worker) sub(q string) {
	w.t.Helper()
	w.send(frame.AppendSub(nil, q))
	w.expectBodies(bbAck(q))
}

// answer writes one sub and returns the answer to it, ack or nack (status
// frames skipped).
func (w *worker) answer(q string) frame.Message {
	w.t.Helper()
	w.send(frame.AppendSub(nil, q))
	m := w.nextMessage()
	if m.Type != "ack" && m.Type != "nack" {
		w.t.Fatalf("got %+v, want the answer to sub %q", m, q)
	}
	if m.Name != q {
		w.t.Fatalf("answer for %q, want %q", m.Name, q)
	}
	return m
}

// answers reads frames until it has an ack or nack for n names, skipping
// status frames and failing on anything else or on EOF. It returns the
// nacks by name.
func (w *worker) answers(n int, d time.Duration) (acks int, nacks map[string]string) {
	w.t.Helper()
	nacks = map[string]string{}
	deadline := time.Now().Add(d)
	for acks+len(nacks) < n {
		m, err := w.read(time.Until(deadline))
		if err != nil {
			w.t.Fatalf("after %d acks and %d nacks of %d: %v", acks, len(nacks), n, err)
		}
		switch m.Type {
		case "status":
			if !m.Healthy {
				w.t.Fatalf("healthy:false after %d acks", acks)
			}
		case "ack":
			acks++
		case "nack":
			nacks[m.Name] = m.Error
		default:
			w.t.Fatalf("got %+v while waiting for acks", m)
		}
	}
	return acks, nacks
}

// eofWithin waits for the hub to close the connection, skipping what was
// queued before the close, and returns how long that took. EOF and
// ECONNRESET count alike: severed either way.
func (w *worker) eofWithin(d time.Duration) time.Duration {
	w.t.Helper()
	start := time.Now()
	for {
		_, err := w.body(d)
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.t.Fatalf("no EOF within %v", d)
		}
		return time.Since(start)
	}
}

// frameHeader is a frame's 4-byte length alone, announcing n bytes.
func frameHeader(n int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(n)) }

// rawBody frames any bytes as a body.
func rawBody(body string) []byte { return append(frameHeader(len(body)), body...) }

// bbAck is the exact body of the hub's ack of q.
func bbAck(q string) string { return `{"t":"ack","q":` + jsonString(q) + `}` }

// bbWake is the exact body of a wake of q with payload p (nil: durable).
func bbWake(q string, p *string) string {
	if p == nil {
		return `{"t":"wake","q":` + jsonString(q) + `,"p":null}`
	}
	return `{"t":"wake","q":` + jsonString(q) + `,"p":` + jsonString(*p) + `}`
}

// jsonString is s as encoding/json writes it without HTML escaping: the
// hub's compact output.
func jsonString(s string) string { return testutil.JSONString(s) }

// scrapeSeries reads /metrics into series (name and labels, as written) →
// value, and returns the families that have a TYPE. It checks the
// exposition on the way: every sample line is a series and a number, and
// follows its family's TYPE. (internal/promcheck parses it with
// Prometheus' own parser.)
func scrapeSeries(t testing.TB, addr string) (series map[string]float64, families []string) {
	t.Helper()
	cl := http.Client{Timeout: timeout}
	resp, err := cl.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	series = map[string]float64{}
	typed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[0] == "#" && f[1] == "TYPE" {
			typed[f[2]] = true
			families = append(families, f[2])
		}
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("/metrics line %q", line)
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		series[f[0]] = v
		family, _, _ := strings.Cut(f[0], "{")
		if !typed[family] && !typed[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(family, "_bucket"), "_sum"), "_count")] {
			t.Errorf("/metrics: %s has no TYPE before it", f[0])
		}
	}
	return series, families
}

// scrape is scrapeSeries of a hub without a relay, whose families must be
// exactly docs/design.md's.
func scrape(t testing.TB, addr string) map[string]float64 {
	t.Helper()
	series, families := scrapeSeries(t, addr)
	slices.Sort(families)
	want := slices.Clone(designMetrics)
	slices.Sort(want)
	if !slices.Equal(families, want) {
		t.Fatalf("/metrics names %v, want exactly %v", families, want)
	}
	return series
}

// httpGet answers GET http://addr+path: the status code and the body.
func httpGet(t testing.TB, addr, path string) (int, string) {
	t.Helper()
	cl := http.Client{Timeout: timeout}
	resp, err := cl.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// waitMetric waits until the metric has the value.
func waitMetric(t testing.TB, addr, name string, want float64) {
	t.Helper()
	var got float64
	testutil.WaitFor(t, timeout, fmt.Sprintf("%s == %v", name, want), func() bool {
		got = scrape(t, addr)[name]
		return got == want
	})
}

// subscribedWorker is dialWorker subscribed to q.
func subscribedWorker(t testing.TB, path, q string) *worker {
	t.Helper()
	w := dialWorker(t, path)
	w.sub(q)
	return w
}

// serveMetrics starts a hub on path with a metrics address and the
// given flags, waits until it is ready, and returns it with that address.
func serveMetrics(t testing.TB, path string, args ...string) (*proc, string) {
	t.Helper()
	p := serve(t, path, nil, append([]string{"--metrics-addr", "127.0.0.1:0"}, args...)...)
	p.ready()
	return p, p.metricsAddr()
}

// subscribedWorkers is n subscribedWorkers on q.
func subscribedWorkers(t testing.TB, path, q string, n int) []*worker {
	t.Helper()
	ws := make([]*worker, n)
	for i := range ws {
		ws[i] = subscribedWorker(t, path, q)
	}
	return ws
}

// checkSocketMode fails unless path is a socket with mode 0600; the
// message says under what conditions (when).
func checkSocketMode(t testing.TB, path, when string) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v%s, want a socket with 0600", fi.Mode(), when)
	}
}

// ownDB is needDB for a test that needs a server of its own (to stop,
// freeze or reconfigure): it is skipped on an external one, saying why.
func ownDB(t testing.TB, why string) *pgtest.Cluster {
	t.Helper()
	c := needDB(t)
	if c.External() {
		t.Skip(why)
	}
	return c
}
