package main

// Attack tests (docs/design.md rule 10, "Limits"): each drives the real
// binary, on a real Postgres, past one limit and asserts the bound, and that
// a sibling worker on another channel meanwhile gets every paced payload
// wake, in order, with no healthy:false. The figures they log are the ones
// of docs/robustness.md, "Threat model".

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/client"
	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

// attackHub is a `listenhub serve` under attack: its logs go to a file,
// counted as they are written, and it serves /metrics.
type attackHub struct {
	*proc
	log  *logSink
	addr string // metrics address
}

// startAttackHub starts the binary at log level info (what production
// runs; debug would log every sub) with --metrics-addr, and waits until it
// accepts. wrap, when set, turns the command line into the one to exec
// (a shell that lowers the fd limit first, say).
func startAttackHub(t *testing.T, wrap func(bin string, args []string) (string, []string), args ...string) *attackHub {
	t.Helper()
	c := needDB(t)
	socket := sockPath(t)
	p := &proc{t: t, socket: socket, app: testApp(t), stderr: &syncBuf{}, done: make(chan struct{})}
	full := []string{"serve", "--log-format", "json", "--log-level", "info", "--socket", socket,
		"--database-url", c.URL(), "--application-name", p.app, "--metrics-addr", "127.0.0.1:0"}
	full = append(full, args...)
	bin := hubBinary(t)
	if wrap != nil {
		bin, full = wrap(bin, full)
	}
	sink := newLogSink(t, p.stderr)
	p.cmd = exec.Command(bin, full...)
	p.cmd.Env = cleanEnv()
	p.cmd.Stderr, p.cmd.Stdout = sink, sink
	p.start()
	p.ready()
	return &attackHub{proc: p, log: sink, addr: p.metricsAddr()}
}

// logSink takes a process's log: every byte to a file, counted, with the
// longest line measured; the first headBytes also to head (p.stderr, shown
// on failure and searched for the metrics address), so that a log flood
// cannot flood the test's memory or its output.
type logSink struct {
	mu      sync.Mutex
	f       *os.File
	head    *syncBuf
	headN   int
	bytes   int64
	lines   int64
	curLine int
	maxLine int
}

const headBytes = 256 << 10

func newLogSink(t *testing.T, head *syncBuf) *logSink {
	f, err := os.Create(filepath.Join(t.TempDir(), "hub.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &logSink{f: f, head: head}
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.f.Write(p)
	if s.headN < headBytes {
		n := min(len(p), headBytes-s.headN)
		s.head.Write(p[:n])
		s.headN += n
	}
	s.bytes += int64(len(p))
	for _, b := range p {
		if b == '\n' {
			s.lines++
			s.maxLine = max(s.maxLine, s.curLine)
			s.curLine = 0
		} else {
			s.curLine++
		}
	}
	return len(p), nil
}

// mark returns a position in the log for since.
func (s *logSink) mark() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// since returns the log written after mark (from the file).
func (s *logSink) since(t testing.TB, mark int64) string {
	t.Helper()
	s.mu.Lock()
	n := s.bytes - mark
	s.mu.Unlock()
	b := make([]byte, n)
	if _, err := s.f.ReadAt(b, mark); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return string(b)
}

// stats returns the bytes and lines written so far and the longest line.
func (s *logSink) stats() (bytes, lines int64, maxLine int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes, s.lines, max(s.maxLine, s.curLine)
}

// metrics scrapes /metrics into series → value (labels kept in the name).
// Unlike scrape it accepts series it does not know: this file checks
// values, not the exposition.
func (h *attackHub) metrics() map[string]float64 {
	h.t.Helper()
	series, _ := scrapeSeries(h.t, h.addr)
	return series
}

// metric is one series, failing if the hub does not export it.
func (h *attackHub) metric(name string) float64 {
	h.t.Helper()
	v, ok := h.metrics()[name]
	if !ok {
		h.t.Fatalf("/metrics has no %s", name)
	}
	return v
}

// healthz returns /healthz's status code and how long it took.
func healthz(addr string) (int, time.Duration, error) {
	cl := http.Client{Timeout: timeout}
	start := time.Now()
	resp, err := cl.Get("http://" + addr + "/healthz")
	if err != nil {
		return 0, 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(start), nil
}

// healthzCodes asks /healthz n times and counts the answers by status
// code (0: no answer); slowest is the longest answer.
func healthzCodes(addr string, n int) (codes map[int]int, slowest time.Duration) {
	codes = map[int]int{}
	for range n {
		code, d, err := healthz(addr)
		if err != nil {
			code = 0
		}
		codes[code]++
		slowest = max(slowest, d)
	}
	return codes, slowest
}

// rssSampler samples the hub's VmRSS every 20 ms and keeps the peak.
type rssSampler struct {
	pid  int
	peak atomic.Int64
	background
}

func readRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return -1
}

func sampleRSS(t testing.TB, pid int) *rssSampler {
	s := &rssSampler{pid: pid, background: newBackground()}
	s.peak.Store(readRSS(pid))
	go s.every(20*time.Millisecond, func() bool {
		if n := readRSS(pid); n > s.peak.Load() {
			s.peak.Store(n)
		}
		return true
	})
	t.Cleanup(func() { s.end() })
	return s
}

// end stops sampling and returns the peak in KiB.
func (s *rssSampler) end() int64 {
	s.halt()
	return s.peak.Load()
}

// sibling is a worker (the real client package) on its own channel, fed a
// paced stream of payload NOTIFYs "seq sentUnixNano" by its own Postgres
// connection: the bystander every attack must leave unharmed.
type sibling struct {
	t    testing.TB
	q    string
	c    *client.Conn
	pg   *pgconn.PgConn
	rate int

	mu        sync.Mutex
	got       []int
	lat       []time.Duration
	unhealthy int
	durables  int // resync wakes (after a reconnect)
	bad       []string

	sent atomic.Int64
	background
	err error // the pacer's, valid once done is closed
}

// startSibling subscribes q through the hub and starts the pacer at rate
// NOTIFYs per second (none for 0).
func startSibling(t testing.TB, socket, q string, rate int) *sibling {
	t.Helper()
	s := &sibling{t: t, q: q, rate: rate, background: newBackground()}
	c, err := client.Dial(context.Background(), client.Options{
		SocketPath: socket,
		AckTimeout: timeout,
	}, client.Handlers{OnWake: s.onWake, OnStatus: func(ok bool) {
		if !ok {
			s.mu.Lock()
			s.unhealthy++
			s.mu.Unlock()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s.c = c
	if err := c.Subscribe(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	if rate == 0 { // no pacer: a bystander that only listens
		close(s.done)
		return s
	}
	s.pg = notifier(t)
	go s.pace()
	t.Cleanup(s.halt)
	return s
}

func (s *sibling) onWake(w client.Wake) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.Durable && w.Name == s.q {
		s.durables++
		return
	}
	var seq int
	var ns int64
	if _, err := fmt.Sscanf(w.Payload, "%d %d", &seq, &ns); err != nil || w.Name != s.q {
		s.bad = append(s.bad, fmt.Sprintf("%q: %q", w.Name, w.Payload))
		return
	}
	s.got = append(s.got, seq)
	s.lat = append(s.lat, now.Sub(time.Unix(0, ns)))
}

func (s *sibling) pace() {
	defer close(s.done)
	tick := time.NewTicker(time.Second / time.Duration(s.rate))
	defer tick.Stop()
	for seq := 0; ; seq++ {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		sql := fmt.Sprintf("SELECT pg_notify('%s', '%d %d')", s.q, seq, time.Now().UnixNano())
		_, err := s.pg.Exec(ctx, sql).ReadAll()
		cancel()
		if err != nil {
			s.err = err
			return
		}
		s.sent.Add(1)
	}
}

// siblingReport is what the sibling saw.
type siblingReport struct {
	wakes          int
	p50, p99, peak time.Duration
}

func (r siblingReport) String() string {
	return fmt.Sprintf("%d payload wakes, none lost, latency p50 %v p99 %v max %v",
		r.wakes, r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.peak.Round(10*time.Microsecond))
}

// check stops the pacer and asserts that every wake sent arrived, once, in
// order, that the client is alive and never saw healthy:false, and that no
// wake took longer than maxLatency.
func (s *sibling) check(maxLatency time.Duration) siblingReport {
	s.t.Helper()
	s.halt()
	if s.err != nil {
		s.t.Fatalf("sibling's NOTIFY: %v", s.err)
	}
	n := int(s.sent.Load())
	testutil.WaitFor(s.t, timeout, fmt.Sprintf("the sibling's %d wakes", n), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.got) >= n || s.c.Err() != nil
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.c.Err(); err != nil {
		s.t.Fatalf("sibling client dead: %v", err)
	}
	if s.unhealthy > 0 {
		s.t.Fatalf("sibling saw healthy:false %d times", s.unhealthy)
	}
	if len(s.bad) > 0 || s.durables > 0 {
		s.t.Fatalf("sibling got unexpected wakes: %v and %d durable ones", s.bad, s.durables)
	}
	for i, seq := range s.got {
		if seq != i {
			s.t.Fatalf("sibling wake %d has seq %d: lost, duplicated or reordered (%d sent)", i, seq, n)
		}
	}
	if len(s.got) != n || n == 0 {
		s.t.Fatalf("sibling got %d wakes, %d sent", len(s.got), n)
	}
	lat := slices.Clone(s.lat)
	slices.Sort(lat)
	r := siblingReport{wakes: n, p50: lat[len(lat)/2], p99: lat[len(lat)*99/100], peak: lat[len(lat)-1]}
	if r.peak > maxLatency {
		s.t.Fatalf("sibling: a wake took %v (bound %v): %v", r.peak, maxLatency, r)
	}
	return r
}

// seen returns how many healthy:false and durable wakes the sibling got.
func (s *sibling) seen() (unhealthy, durables int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unhealthy, s.durables
}

// await waits until the sibling has received n more wakes: an attack that
// is over quickly is held while the sibling's stream runs through it.
func (s *sibling) await(n int) {
	s.t.Helper()
	s.mu.Lock()
	want := len(s.got) + n
	s.mu.Unlock()
	testutil.WaitFor(s.t, timeout, fmt.Sprintf("%d more sibling wakes", n), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.got) >= want
	})
}

// pipeSubs writes a sub for every name in one go (the hub reads them as
// fast as it can) without reading anything back.
func pipeSubs(t testing.TB, c net.Conn, names []string) {
	t.Helper()
	var b []byte
	for _, q := range names {
		b = frame.AppendSub(b, q)
	}
	c.SetWriteDeadline(time.Now().Add(time.Minute))
	if _, err := c.Write(b); err != nil {
		t.Fatalf("writing %d subs: %v", len(names), err)
	}
}

// names returns n subscription names with the prefix.
func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// healthyThroughout asserts that the hub has evicted nobody and never lost
// its Postgres connection (a failed health check included).
func (h *attackHub) healthyThroughout() {
	h.t.Helper()
	if n := h.metrics()["listenhub_evictions_total"]; n != 0 {
		h.t.Fatalf("%v evictions, want 0", n)
	}
	if out := h.log.since(h.t, 0); strings.Contains(out, "evicted") {
		h.t.Fatalf("the hub logged an eviction:\n%s", tail(out, 4000))
	}
	h.postgresHealthyThroughout()
}

// postgresHealthyThroughout asserts that the hub never lost its Postgres
// connection (a failed health check included).
func (h *attackHub) postgresHealthyThroughout() {
	h.t.Helper()
	m := h.metrics()
	if m["listenhub_postgres_reconnects_total"] != 0 || m["listenhub_postgres_healthy"] != 1 {
		h.t.Fatalf("reconnects %v, healthy %v; want 0, 1",
			m["listenhub_postgres_reconnects_total"], m["listenhub_postgres_healthy"])
	}
	if out := h.log.since(h.t, 0); strings.Contains(out, "connection lost") {
		h.t.Fatalf("the hub lost its Postgres connection:\n%s", tail(out, 4000))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// waitMetricAny waits until the series reaches want (scrapeSeries: series other
// than docs/design.md's are fine here).
// terminateBackend ends the hub's one Postgres backend and returns when.
func (h *attackHub) terminateBackend() time.Time {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if n, err := needDB(h.t).Terminate(ctx, h.app); err != nil || n != 1 {
		h.t.Fatalf("terminate: %d, %v", n, err)
	}
	return time.Now()
}

// reconnectAfterTerminate is terminateBackend, then the wait (up to d) for
// the metrics to count the reconnect and say healthy; it returns how long
// that took.
func (h *attackHub) reconnectAfterTerminate(d time.Duration) time.Duration {
	h.t.Helper()
	start := h.terminateBackend()
	h.waitMetric("listenhub_postgres_reconnects_total", 1, d)
	h.waitMetric("listenhub_postgres_healthy", 1, d)
	return time.Since(start)
}

func (h *attackHub) waitMetric(name string, want float64, d time.Duration) {
	h.t.Helper()
	var got float64
	defer func() {
		if got != want {
			h.t.Logf("%s was %v, want %v", name, got, want)
		}
	}()
	testutil.WaitFor(h.t, d, fmt.Sprintf("%s == %v", name, want), func() bool {
		got = h.metrics()[name]
		return got == want
	})
}

// Attack a: one worker takes the whole --max-subscriptions (10,000) in one
// write and reads nothing until the hub has LISTENed them all, so 10,000
// acks wait for it, ten times --hard-queue-limit: acks do not count toward
// eviction. Five workers fill --max-channels (50,000, the default). The hub stays
// healthy (no health check failure while the LISTENs run), the sibling loses
// nothing. Past the caps: nack "too many subscriptions" / "too many
// channels", and the connection stays.
func TestAttackSubscriptionCaps(t *testing.T) {
	// The defaults: the design's promise is that 50,000 channels become
	// and stay healthy.
	const maxSubs, maxChannels = 10000, 50000
	h := startAttackHub(t, nil, "--max-subscriptions", strconv.Itoa(maxSubs), "--max-channels", strconv.Itoa(maxChannels))
	sib := startSibling(t, h.socket, "sib", 25)
	rss0 := h.rssKiB()
	sizes := []int{maxSubs, maxSubs, maxSubs, maxSubs, maxSubs - 1} // 1: the sibling's
	ws := make([]*worker, len(sizes))
	start := time.Now()
	for i, n := range sizes {
		ws[i] = dialBig(t, h.socket)
		pipeSubs(t, ws[i].c, names(fmt.Sprintf("a%d.", i), n))
	}
	h.waitMetric("listenhub_channels", maxChannels, 3*time.Minute)
	listened := time.Since(start)
	for i, w := range ws {
		if acks, nacks := w.answers(sizes[i], timeout); len(nacks) > 0 {
			t.Fatalf("worker %d: %d acks, nacks %v", i, acks, nacks)
		}
	}
	rss1 := h.rssKiB()

	// Past the caps: refused, the connection stays and is served.
	if m := ws[0].answer("a0.over"); m.Type != "nack" || m.Error != "too many subscriptions" {
		t.Fatalf("sub past --max-subscriptions: %+v", m)
	}
	if m := ws[4].answer("a4.over"); m.Type != "nack" || m.Error != "too many channels" {
		t.Fatalf("sub past --max-channels: %+v", m)
	}
	if m := ws[4].answer("a0.7"); m.Type != "ack" { // a channel the hub has: no new one
		t.Fatalf("sub of a listened channel at --max-channels: %+v", m)
	}
	if m := ws[0].answer("a0.9999"); m.Type != "ack" {
		t.Fatalf("sub after the nack: %+v", m)
	}
	notify(t, "NOTIFY \"a0.9999\", 'still served'")
	if m := ws[0].nextMessage(); m.Type != "wake" || m.Payload != "still served" {
		t.Fatalf("worker at the cap: %+v", m)
	}
	// Stays healthy: a few health-check intervals at --max-channels.
	time.Sleep(2 * time.Second)
	h.healthyThroughout()
	// Postgres delivers a NOTIFY between commands only, so the sibling's
	// wakes wait for the LISTEN batch in flight: up to 0.75 s seen.
	r := sib.check(5 * time.Second)
	t.Logf("%d channels LISTENed in %v (%d workers, acks read only at the end); hub RSS %d → %d KiB; sibling: %v",
		maxChannels, listened.Round(time.Millisecond), len(ws), rss0, rss1, r)
}

// Attack d: a fast worker subscribing 20,000 names, through two
// connections (--max-subscriptions is 10,000), all in one write each, not
// reading until every LISTEN is done: never evicted, every name acked.
func TestAttackFastSubscriber(t *testing.T) {
	h := startAttackHub(t, nil)
	sib := startSibling(t, h.socket, "sib", 25)
	ws := []*worker{dialBig(t, h.socket), dialBig(t, h.socket)}
	start := time.Now()
	for i, w := range ws {
		pipeSubs(t, w.c, names(fmt.Sprintf("d%d.", i), 10000))
	}
	h.waitMetric("listenhub_channels", 20001, 3*time.Minute)
	listened := time.Since(start)
	for i, w := range ws {
		if acks, nacks := w.answers(10000, timeout); len(nacks) > 0 {
			t.Fatalf("worker %d: %d acks, nacks %v", i, acks, nacks)
		}
	}
	acked := time.Since(start)
	notify(t, "NOTIFY \"d1.9999\", 'x'")
	if m := ws[1].nextMessage(); m.Type != "wake" || m.Name != "d1.9999" {
		t.Fatalf("got %+v", m)
	}
	h.healthyThroughout()
	r := sib.check(5 * time.Second) // as in TestAttackSubscriptionCaps
	t.Logf("20,000 subs in 2 writes: all LISTENed after %v, all acks read after %v, 0 evictions; sibling: %v",
		listened.Round(time.Millisecond), acked.Round(time.Millisecond), r)
}

// Attack g: a name that is not valid UTF-8 is refused with a nack; the
// connection stays and is served.
func TestAttackInvalidUTF8(t *testing.T) {
	h := startAttackHub(t, nil)
	sib := startSibling(t, h.socket, "sib", 25)
	w := dialWorker(t, h.socket)
	for _, body := range []string{
		"{\"t\":\"sub\",\"q\":\"bad\xff\xfe\"}",
		"{\"t\":\"sub\",\"q\":\"\xc3\"}",          // a truncated sequence
		"{\"t\":\"sub\",\"q\":\"\xed\xa0\x80x\"}", // an encoded surrogate
	} {
		if _, err := w.c.Write(rawBody(body)); err != nil {
			t.Fatal(err)
		}
		m := w.nextMessage()
		if m.Type != "nack" || !strings.Contains(m.Error, "UTF-8") {
			t.Fatalf("sub %q: %+v, want a nack about UTF-8", body, m)
		}
	}
	sib.await(25)
	w.sub("utf8.ok")
	notify(t, "NOTIFY \"utf8.ok\", 'served'")
	if m := w.nextMessage(); m.Type != "wake" || m.Payload != "served" {
		t.Fatalf("after the nacks: %+v", m)
	}
	if n := h.metric("listenhub_protocol_errors_total"); n != 0 {
		t.Fatalf("%v protocol errors: the nack must not sever", n)
	}
	h.healthyThroughout()
	t.Logf("3 invalid UTF-8 names nacked, connection kept; sibling: %v", sib.check(2*time.Second))
}

// prober measures the hub loop's responsiveness: every interval it sends a
// sub whose name no channel can carry, which the hub nacks from the loop
// without asking Postgres, and times the round trip.
type prober struct {
	w    *worker
	mu   sync.Mutex
	rtts []time.Duration
	at   []time.Time // when each probe was sent
	err  error
	background
}

func startProber(t testing.TB, socket string, every time.Duration) *prober {
	t.Helper()
	p := &prober{w: dialWorker(t, socket), background: newBackground()}
	q := strings.Repeat("p", 64)
	sub := frame.AppendSub(nil, q)
	go p.every(every, func() bool {
		start := time.Now()
		if _, err := p.w.c.Write(sub); err != nil {
			p.fail(err)
			return false
		}
		for {
			m, err := p.w.read(timeout)
			if err != nil {
				p.fail(err)
				return false
			}
			if m.Type == "nack" && m.Name == q {
				break
			}
		}
		d := time.Since(start)
		p.mu.Lock()
		p.rtts = append(p.rtts, d)
		p.at = append(p.at, start)
		p.mu.Unlock()
		return true
	})
	t.Cleanup(p.halt)
	return p
}

// count is the number of round trips so far.
func (p *prober) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.rtts)
}

func (p *prober) fail(err error) {
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
}

// slow returns the probes slower than d, as "+offset: rtt" from t0.
func (p *prober) slow(t0 time.Time, d time.Duration) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for i, r := range p.rtts {
		if r > d {
			out = append(out, fmt.Sprintf("+%v: %v", p.at[i].Sub(t0).Round(time.Millisecond), r.Round(time.Millisecond)))
		}
	}
	return out
}

// result stops probing and returns the count, p50, p99 and max round trip.
func (p *prober) result(t testing.TB) (n int, p50, p99, peak time.Duration) {
	t.Helper()
	p.halt()
	if p.err != nil {
		t.Fatalf("prober: %v", p.err)
	}
	r := slices.Clone(p.rtts)
	if len(r) == 0 {
		t.Fatal("prober: no round trip")
	}
	slices.Sort(r)
	return len(r), r[len(r)/2], r[len(r)*99/100], r[len(r)-1]
}

// Attack b: 300 connections each send the header of a maximal frame (64
// KiB) and most of its body, then stall; 300 more announce a 4 MiB frame
// (the protocol's cap, past the hub's inbound cap). The oversized ones are
// severed at once, the stalled ones after --frame-timeout; the hub's RSS
// stays bounded, and goes back down within a minute of the attack's end.
func TestAttackIncompleteFrames(t *testing.T) {
	const conns = 300
	const frameTimeout = 2 * time.Second
	h := startAttackHub(t, nil, "--frame-timeout", frameTimeout.String())
	sib := startSibling(t, h.socket, "sib", 25)
	base := int64(h.rssKiB())
	rss := sampleRSS(t, h.pid())
	perr0 := h.metric("listenhub_protocol_errors_total")

	dial := func() *net.UnixConn {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: h.socket, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	body := make([]byte, 64<<10-1) // one byte short of complete
	copy(body, `{"t":"sub","q":"`)
	for i := len(`{"t":"sub","q":"`); i < len(body); i++ {
		body[i] = 'x'
	}
	stalled := make([]*net.UnixConn, conns)
	start := time.Now()
	for i := range stalled {
		c := dial()
		c.SetWriteDeadline(time.Now().Add(timeout))
		if _, err := c.Write(append(frameHeader(64<<10), body...)); err != nil {
			t.Fatalf("stalled connection %d: %v", i, err)
		}
		stalled[i] = c
	}
	big := make([]*net.UnixConn, conns)
	bigStart := time.Now()
	for i := range big {
		c := dial()
		c.SetWriteDeadline(time.Now().Add(timeout))
		c.Write(append(frameHeader(frame.MaxLen), body...)) // may fail: severed already
		big[i] = c
	}
	// Each connection is closed by the hub: EOF (or ECONNRESET) after the
	// status frame.
	severed := func(c *net.UnixConn, since time.Time) time.Duration {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(frameTimeout + timeout))
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("connection not severed: %v", err)
		}
		return time.Since(since)
	}
	var bigLast time.Duration
	for _, c := range big {
		bigLast = max(bigLast, severed(c, bigStart))
	}
	// Measured from before the first connect, so never shorter than the
	// hub's own clock, which starts at its first read of each frame.
	var stallFirst, stallLast time.Duration = time.Hour, 0
	for _, c := range stalled {
		d := severed(c, start)
		stallFirst, stallLast = min(stallFirst, d), max(stallLast, d)
	}
	if stallFirst < frameTimeout {
		t.Fatalf("a stalled connection was severed after %v, before --frame-timeout %v", stallFirst, frameTimeout)
	}
	if bigLast >= frameTimeout {
		t.Fatalf("oversized frames severed only after %v: they must not wait for --frame-timeout", bigLast)
	}
	peak := rss.end()
	h.waitMetric("listenhub_protocol_errors_total", perr0+2*conns, timeout)
	h.waitMetric("listenhub_workers", 1, timeout) // the sibling
	t.Logf("%d × 64 KiB stalled frames and %d × 4 MiB headers: oversized severed within %v, stalled between %v and %v (--frame-timeout %v); hub RSS %d KiB at start, peak %d KiB (+%d KiB)",
		conns, conns, bigLast.Round(time.Millisecond), stallFirst.Round(time.Millisecond), stallLast.Round(time.Millisecond),
		frameTimeout, base, peak, peak-base)
	// Bounded: 300 partial frames of 64 KiB are 19 MiB; allow the
	// decoder's slack, never the 1.2 GB 300 frames of 4 MiB would be.
	if grow := peak - base; grow > 64<<10 {
		t.Fatalf("hub RSS grew %d KiB (from %d to %d)", grow, base, peak)
	}
	h.healthyThroughout()
	t.Logf("sibling: %v", sib.check(2*time.Second))
	// Given back: the hub's memory returner looks every 10 s and gives a
	// burst's memory back once the process is quiet; the design's target
	// is a minute.
	freed := time.Now()
	var now int64
	testutil.WaitFor(t, 60*time.Second, "hub RSS back within 8 MiB of its start", func() bool {
		now = int64(h.rssKiB())
		return now-base < 8<<10
	})
	t.Logf("hub RSS %d KiB %v after the last sever (%d KiB at start)", now, time.Since(freed).Round(100*time.Millisecond), base)
}

// Attack c: log floods. For a few seconds, at once: one connection sends
// refused subs as fast as it can (names no channel can carry), another
// sends 60 KB names and 1 MB frames, and a third churns connections that
// each send one malformed frame. The hub's log stays small (rate-limited
// per kind of event, with "suppressed" counts) and no line is long (names
// cut to 100 bytes).
func TestAttackLogFlood(t *testing.T) {
	const flood = 5 * time.Second
	h := startAttackHub(t, nil)
	sib := startSibling(t, h.socket, "sib", 25)
	mark := h.log.mark()
	b0, l0, _ := h.log.stats()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var refusedSubs, bigNames, bigFrames, churned atomic.Int64
	errs := make(chan error, 8)
	attacker := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := f(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	dial := func() (*net.UnixConn, error) {
		return net.DialUnix("unix", nil, &net.UnixAddr{Name: h.socket, Net: "unix"})
	}
	// drain reads c until it is closed.
	drain := func(c net.Conn) { go io.Copy(io.Discard, c) }

	// 1. Refused subs, 1,000 per write, as fast as the hub takes them.
	// Its nacks are read, but it may send faster than it reads them; past
	// its ring's cap the hub evicts it (its own cost), and it comes back.
	var c1 net.Conn
	defer func() {
		if c1 != nil {
			c1.Close()
		}
	}()
	var flooderEvicted atomic.Int64
	var batch []byte
	for i := range 1000 {
		batch = frame.AppendSub(batch, fmt.Sprintf("%064d", i))
	}
	attacker(func() error {
		if c1 == nil {
			c, err := dial()
			if err != nil {
				return err
			}
			c1 = c
			drain(c1)
		}
		c1.SetWriteDeadline(time.Now().Add(timeout))
		if _, err := c1.Write(batch); err != nil {
			if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
				return fmt.Errorf("refused-sub flooder: %w", err)
			}
			flooderEvicted.Add(1)
			c1.Close()
			c1 = nil
			return nil
		}
		refusedSubs.Add(1000)
		return nil
	})
	// 2. 60 KB names (refused, fit in a frame) and 1 MB frames (severed).
	long := frame.AppendSub(nil, strings.Repeat("n", 60<<10))
	huge := rawBody(`{"t":"sub","q":"` + strings.Repeat("m", 1<<20) + `"}`)
	attacker(func() error {
		c, err := dial()
		if err != nil {
			return err
		}
		defer c.Close()
		drain(c)
		c.SetWriteDeadline(time.Now().Add(timeout))
		for range 20 {
			if _, err := c.Write(long); err != nil {
				return fmt.Errorf("long-name sender: %w", err)
			}
			bigNames.Add(1)
		}
		c.Write(huge) // severed at its header: the write may fail
		bigFrames.Add(1)
		return nil
	})
	// 3. Connect, one malformed frame, severed; again.
	garbage := rawBody(`not json at all`)
	attacker(func() error {
		c, err := dial()
		if err != nil {
			return err
		}
		defer c.Close()
		c.Write(garbage)
		c.SetReadDeadline(time.Now().Add(timeout))
		io.Copy(io.Discard, c)
		churned.Add(1)
		return nil
	})
	time.Sleep(flood)
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	// The suppressed counts are written once a kind has been quiet for a
	// second (on the status tick).
	testutil.WaitFor(t, timeout, "suppressed counts in the log", func() bool {
		return strings.Contains(h.log.since(t, mark), `"suppressed"`)
	})
	events := refusedSubs.Load() + bigNames.Load() + bigFrames.Load() + 2*churned.Load()
	countSuppressed := func(logged string) (n int64) {
		sc := bufio.NewScanner(strings.NewReader(logged))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var l struct{ Suppressed int64 }
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				n += l.Suppressed
			}
		}
		return n
	}
	// Let every kind's count come out: 2 s at least, longer (up to
	// timeout) while the counts are short of what is checked below, as
	// on a loaded machine whose status ticks run late.
	time.Sleep(2 * time.Second)
	logged := h.log.since(t, mark)
	suppressed := countSuppressed(logged)
	for deadline := time.Now().Add(timeout); suppressed < events/2 && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		logged = h.log.since(t, mark)
		suppressed = countSuppressed(logged)
	}
	b1, l1, maxLine := h.log.stats()
	if strings.Contains(logged, strings.Repeat("n", 101)) || strings.Contains(logged, strings.Repeat("m", 101)) {
		t.Fatal("a name longer than 100 bytes in the log")
	}
	perSec := float64(b1-b0) / (flood + 3*time.Second).Seconds()
	t.Logf("%v of flood: %d refused subs, %d 60 KB names, %d 1 MB frames, %d connect/bad-frame cycles; log: %d bytes in %d lines (%.0f B/s), longest line %d bytes, %d lines suppressed",
		flood, refusedSubs.Load(), bigNames.Load(), bigFrames.Load(), churned.Load(), b1-b0, l1-l0, perSec, maxLine, suppressed)
	if maxLine > 2048 {
		t.Fatalf("a log line of %d bytes", maxLine)
	}
	// Per kind of event: a burst and ~10 lines/s; a few kinds are in play.
	if b1-b0 > 256<<10 {
		t.Fatalf("%d bytes of log for %v of flood (%d events)", b1-b0, flood, events)
	}
	if suppressed < events/2 {
		t.Fatalf("%d lines suppressed for %d events", suppressed, events)
	}
	// Evictions here are the flooder's, for not reading its nacks as fast
	// as it sends subs: its own cost. The sibling is checked below.
	if ev := h.metric("listenhub_evictions_total"); ev != float64(flooderEvicted.Load()) {
		t.Fatalf("%v evictions, the flooder's connection was closed %d times", ev, flooderEvicted.Load())
	}
	h.postgresHealthyThroughout()
	t.Logf("refused-sub flooder evicted %d times; sibling: %v", flooderEvicted.Load(), sib.check(2*time.Second))
}

// Attack e: the hub runs with 256 descriptors (ulimit -n) and 1,000
// workers connect. It serves as many as its descriptors allow, keeping a
// reserve: the rest are accepted and closed at once, and counted
// (listenhub_connections_refused_total). Then its Postgres backend is
// terminated: the reconnect still gets a descriptor, and /healthz answers.
func TestAttackEMFILE(t *testing.T) {
	const fdLimit, conns = 256, 1000
	h := startAttackHub(t, func(bin string, args []string) (string, []string) {
		return "/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, fdLimit), bin}, args...)
	})
	sib := startSibling(t, h.socket, "sib", 25)
	ws := make([]*worker, 0, conns)
	var refused int
	for i := range conns {
		w, ok, nack := dialRaw(t, h.socket, i)
		switch {
		case ok:
			ws = append(ws, w)
		case nack != "":
			// The refusal, told (docs/protocol.md), then EOF.
			if !strings.Contains(nack, "too many workers") && !strings.Contains(nack, "file descriptors") {
				t.Fatalf("connection %d refused with %q", i, nack)
			}
			w.eofWithin(timeout)
			refused++
		default:
			refused++ // shed before its nack fit (never expected, harmless)
		}
	}
	fds := h.fds()
	if len(ws)+1 > fdLimit-64 || refused == 0 {
		t.Fatalf("%d of %d admitted, %d refused, with %d descriptors", len(ws), conns, refused, fdLimit)
	}
	h.waitMetric("listenhub_connections_refused_total", float64(refused), timeout)
	h.waitMetric("listenhub_workers", float64(len(ws)+1), timeout)
	ws[0].sub("emfile")
	sib.await(50) // with every descriptor taken
	r := sib.check(2 * time.Second)

	// Postgres backend gone: the reconnect needs a descriptor.
	reconnect := h.reconnectAfterTerminate(30 * time.Second)
	ws[0].status(true)
	if m := ws[0].expect("wake"); m.Name != "emfile" || m.HasPayload {
		t.Fatalf("resync wake %+v", m)
	}
	var worst time.Duration
	for range 20 {
		code, d, err := healthz(h.addr)
		if err != nil || code != 200 {
			t.Fatalf("/healthz: %d, %v", code, err)
		}
		worst = max(worst, d)
	}
	notify(t, "NOTIFY emfile, 'after'")
	if m := ws[0].expect("wake"); m.Payload != "after" {
		t.Fatalf("after the reconnect: %+v", m)
	}
	if strings.Contains(h.log.since(t, 0), "too many open files") {
		t.Logf("log mentions EMFILE:\n%s", tail(h.log.since(t, 0), 4000))
	}
	t.Logf("ulimit -n %d, %d connections: %d admitted (+ the sibling), %d refused and counted, hub holds %d fds; backend terminated: healthy again after %v, /healthz 200 (slowest of 20: %v); sibling before: %v",
		fdLimit, conns, len(ws), refused, fds, reconnect.Round(time.Millisecond), worst.Round(time.Microsecond), r)
}

// Attack f: Postgres stopped while workers pile up 40,000 subs (four
// workers at --max-subscriptions): every sub waits, none is nacked, and
// once Postgres is back every one is acked (LISTENed in bounded batches);
// the loop never stalls — a prober's round trip through the loop (a sub
// the hub nacks without Postgres, every 10 ms) stays short throughout.
// The sibling is resynced.
func TestAttackPostgresDownPendingSubs(t *testing.T) {
	c := ownDB(t, "cannot stop an external server")
	const workers, perWorker = 4, 10000
	h := startAttackHub(t, nil)
	sib := startSibling(t, h.socket, "sib", 0)
	// Control: the same probe on the idle hub, for the machine's noise.
	ctl := startProber(t, h.socket, 10*time.Millisecond)
	time.Sleep(2 * time.Second)
	cn, c50, c99, cmax := ctl.result(t)
	// A second control, in the attack's window: an idle hub of the same
	// build (started while Postgres is up: it reports ready only then),
	// probed alongside, so that a burst of the machine's load during the
	// attack is told apart from a stall of the attacked loop.
	idle := startAttackHub(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			c.Start(context.Background())
		}
	})
	testutil.WaitFor(t, timeout, "the sibling told healthy:false", func() bool { u, _ := sib.seen(); return u > 0 })
	during := startProber(t, idle.socket, 10*time.Millisecond)
	pr := startProber(t, h.socket, 10*time.Millisecond)
	ws := make([]*worker, workers)
	start := time.Now()
	for i := range ws {
		ws[i] = dialBig(t, h.socket)
		pipeSubs(t, ws[i].c, names(fmt.Sprintf("f%d.", i), perWorker))
	}
	// The subs wait for Postgres: the prober's nacks (a name refused
	// without Postgres) are the only ones, for as long as the server is
	// down. The window is what the hub would have nacked them after with
	// a command timeout (5 s).
	nacks0, probes0 := h.metric("listenhub_nacks_total"), pr.count()
	window := time.Now().Add(6 * time.Second)
	for time.Now().Before(window) {
		if got, probed := h.metric("listenhub_nacks_total")-nacks0, pr.count()-probes0; got > float64(probed+1) {
			t.Fatalf("%v nacks for %d probes while Postgres is down: the workers' subs were refused", got, probed)
		}
		time.Sleep(100 * time.Millisecond) // the pace of the look, not a wait for anything
	}
	logBytes, _, _ := h.log.stats()
	metricsLat := time.Duration(0)
	for range 10 {
		s := time.Now()
		h.metrics()
		metricsLat = max(metricsLat, time.Since(s))
	}
	// The attack is the pile-up while Postgres is down: the loop is judged
	// over it. (Re-LISTENing 40,000 names once it is back is bounded by
	// the listener's batches, internal/pglisten's TestLargeSetBoundedBatches.)
	slow := pr.slow(start, 20*time.Millisecond)
	n, p50, p99, peak := pr.result(t)
	_, _, _, dmax := during.result(t)
	up := time.Now()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	for i, w := range ws {
		acked := 0
		for acked < perWorker {
			m, err := w.read(time.Minute)
			if err != nil {
				t.Fatalf("worker %d after %d acks: %v", i, acked, err)
			}
			switch m.Type {
			case "ack":
				acked++
			case "status":
			case "wake":
				if m.HasPayload {
					t.Fatalf("worker %d: %+v, a payload from nowhere", i, m)
				}
				// The resync's durable wake (rule 7): harmless.
			default:
				t.Fatalf("worker %d: %+v, want acks once Postgres is back", i, m)
			}
		}
	}
	answered := time.Since(up)
	testutil.WaitFor(t, time.Minute, "the sibling resynced", func() bool { _, d := sib.seen(); return d > 0 })
	us := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
	t.Logf("%d subs pending with Postgres down (since %v), none nacked, all acked %v after it came back; loop round trip (%d probes): p50 %v p99 %v max %v (idle hub, %d probes: p50 %v p99 %v max %v; an idle hub meanwhile: max %v); probes over 20 ms: %v; /metrics slowest of 10: %v; log %d bytes",
		workers*perWorker, up.Sub(start).Round(time.Millisecond), answered.Round(time.Millisecond), n, us(p50), us(p99), us(peak), cn, us(c50), us(c99), us(cmax), us(dmax),
		slow, us(metricsLat), logBytes)
	if logBytes > 256<<10 {
		t.Fatalf("%d bytes of log for %d pending LISTENs", logBytes, workers*perWorker)
	}
	// The target is no stall over 50 ms, but on a loaded 2-core machine
	// an idle hub's probes alone reach 100 ms now and then (the control
	// above): assert what separates a bounded loop from a stalled one
	// (a one-pass expiry of 100,000 commands stalled it 600 ms). When the
	// idle control itself saw a longer pause than 400 ms, before or
	// during the attack, the machine's noise sets the bound: twice the
	// controls' worst.
	if bound := max(400*time.Millisecond, 2*cmax, 2*dmax); p50 > 5*time.Millisecond || peak > bound {
		t.Fatalf("the loop stalled: round trip p50 %v, max %v (bound %v; idle control max %v)", p50, peak, bound, cmax)
	}
}
