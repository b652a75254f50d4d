package main

// Black-box tests of `listenhub serve`: the built binary, driven only through
// what docs/design.md makes public — its command line and environment, the wire
// protocol on its Unix socket, and /metrics and /healthz. Nothing here
// reaches into the hub's state; the Postgres side is a real server. The
// helpers of main_test.go (serve, proc, worker, census) are reused; raw
// frames are read byte for byte where the contract fixes the bytes.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

// designMetrics are the metric names of docs/design.md ("Metrics"), all of them
// and nothing else.
var designMetrics = []string{
	"listenhub_workers",
	"listenhub_channels",
	"listenhub_postgres_healthy",
	"listenhub_socket_refusable",
	"listenhub_wakes_received_total",
	"listenhub_frames_sent_total",
	"listenhub_durable_coalesced_total",
	"listenhub_durable_dropped_total",
	"listenhub_evictions_total",
	"listenhub_protocol_errors_total",
	"listenhub_postgres_reconnects_total",
	"listenhub_accepts_total",
	"listenhub_upgrades_total",
	"listenhub_nacks_total",
	"listenhub_connections_refused_total",
	"listenhub_workers_shed_total",
	"listenhub_outbound_bytes",
	"listenhub_workers_paused",
	"listenhub_read_pauses_total",
	"listenhub_fanout_latency_seconds",
	"listenhub_ack_latency_seconds",
	"listenhub_build_info",
	"process_cpu_seconds_total",
	"process_open_fds",
	"process_max_fds",
	"process_virtual_memory_bytes",
	"process_resident_memory_bytes",
	"process_start_time_seconds",
}

func sp(s string) *string { return &s }

// notifier is a plain Postgres connection for NOTIFYs.
func notifier(t testing.TB) *pgconn.PgConn {
	t.Helper()
	return pgtesting.Connect(t, needDB(t).URL()).PgConn()
}

func pgExec(t testing.TB, c *pgconn.PgConn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Exec(ctx, sql).ReadAll(); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// The socket file exists only once the hub accepts: a supervisor that
// connects the moment the file appears is answered with a status frame,
// first. Postgres is reached in the background (docs/design.md, Lifecycle):
// that status may say healthy:false, and healthy:true follows with the
// backend in place.
func TestBlackboxReadiness(t *testing.T) {
	c := needDB(t)
	bin := hubBinary(t)
	for i := range 5 {
		path := sockPath(t)
		app := fmt.Sprintf("%s-%d", testApp(t), i)
		cmd := exec.Command(bin, "serve", "--socket", path, "--database-url", c.URL(), "--application-name", app)
		cmd.Env = cleanEnv()
		out := &syncBuf{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		deadline := time.Now().Add(timeout)
		for {
			if _, err := os.Lstat(path); err == nil {
				break
			}
			select {
			case err := <-done:
				t.Fatalf("serve exited before creating its socket (%v):\n%s", err, out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("no socket file after %v:\n%s", timeout, out.String())
			}
			runtime.Gosched() // poll as tightly as we can: no sleep
		}
		w := connectWorker(t, path) // at once: the file means "listening"
		got := w.nextBody(true)
		if got != `{"t":"status","healthy":false}` && got != `{"t":"status","healthy":true}` {
			t.Fatalf("first frame %s, want a status", got)
		}
		for got != `{"t":"status","healthy":true}` {
			got = w.nextBody(true)
		}
		if n := census(t, app); n != 1 {
			t.Fatalf("round %d: census %d while the socket exists, want 1", i, n)
		}
		cmd.Process.Signal(syscall.SIGTERM)
		if err := <-done; err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, out.String())
		}
	}
}

// The wire protocol as docs/design.md writes it, byte for byte: status first,
// ack after sub (and for a second sub), nack with "error" for a channel over
// 63 bytes (prefix+Q+suffix) or with NUL, no answer to unsub, durable and
// ephemeral wakes compact in key order t,q,p, unknown types skipped, field
// order and whitespace free on input.
func TestBlackboxProtocol(t *testing.T) {
	const prefix, suffix = "pfx_", ".sfx"
	path := sockPath(t)
	p := serve(t, path, nil, "--channel-prefix", prefix, "--channel-suffix", suffix,
		"--status-interval", "1h")
	p.ready()
	n := notifier(t)
	pg := func(q string) string { return `"` + prefix + q + suffix + `"` }

	w1 := connectWorker(t, path)
	if got := w1.nextBody(true); got != `{"t":"status","healthy":true}` {
		t.Fatalf("first frame %s, want the status", got)
	}
	w1.sub("a")
	w1.sub("a") // a second sub on a listening channel: acked (at once)
	w2 := subscribedWorker(t, path, "a")

	pgExec(t, n, "NOTIFY "+pg("a"))
	w1.expectBodies(bbWake("a", nil))
	w2.expectBodies(bbWake("a", nil))
	for _, payload := range []string{"plain", `he said "hi" \o/`, "tab\tnew\nline", "unicode é ✓ 🐘", "<&>"} {
		pgExec(t, n, "SELECT pg_notify('"+prefix+"a"+suffix+"', "+sqlString(payload)+")")
		w1.expectBodies(bbWake("a", sp(payload)))
		w2.expectBodies(bbWake("a", sp(payload)))
	}
	long := strings.Repeat("x", 7999)
	pgExec(t, n, "SELECT pg_notify('"+prefix+"a"+suffix+"', repeat('x', 7999))")
	w1.expectBodies(bbWake("a", &long))
	w2.expectBodies(bbWake("a", &long))

	// 63 bytes after mapping: fine; 64: refused; NUL: refused.
	fits := strings.Repeat("q", 63-len(prefix)-len(suffix))
	w1.sub(fits)
	nack := func(q string) {
		t.Helper()
		w1.send(frame.AppendSub(nil, q))
		got := w1.nextBody(false)
		var m map[string]any
		if err := json.Unmarshal([]byte(got), &m); err != nil {
			t.Fatal(err)
		}
		head := `{"t":"nack","q":` + jsonString(q) + `,"error":`
		if !strings.HasPrefix(got, head) || len(m) != 3 {
			t.Fatalf("sub %q: got %s, want %s\"…\"}", q, got, head)
		}
		if e, _ := m["error"].(string); e == "" {
			t.Fatalf("sub %q: nack without a reason: %s", q, got)
		}
	}
	nack(fits + "q")
	nack("nul\x00byte")
	nack(strings.Repeat("é", 30)) // 60 bytes + 8 of prefix and suffix

	// unsub: no answer (the next frame is the ack of the next sub), and
	// no more wakes for it to this worker; its sibling still gets them.
	w1.send(frame.AppendUnsub(nil, "a"))
	w1.sub("b")
	pgExec(t, n, "NOTIFY "+pg("a")+", 'after unsub'")
	pgExec(t, n, "NOTIFY "+pg("b")+", 'sentinel'")
	w2.expectBodies(bbWake("a", sp("after unsub")))
	w1.expectBodies(bbWake("b", sp("sentinel")))
	// unsub of a name never subscribed, or twice: nothing.
	w1.send(frame.AppendUnsub(nil, "never"))
	w1.send(frame.AppendUnsub(nil, "a"))

	// Unknown types are skipped, the connection stays; unknown fields,
	// field order and whitespace are free; hub-to-worker types are
	// unknown to the hub.
	w1.send(rawBody(`{"t":"hello"}`))
	w1.send(rawBody(`{"t":"ping","q":"x","extra":[1,{"y":null}]}`))
	w1.send(rawBody(`{"t":"ack","q":"a"}`))
	w1.send(rawBody(`{"q":"c","t":"sub"}`))
	w1.expectBodies(bbAck("c"))
	w1.send(rawBody(" {\n \"t\" : \"sub\" ,\t\"q\" : \"d\", \"v\": 2 } "))
	w1.expectBodies(bbAck("d"))
	// Several frames in one write, and one frame split over writes.
	both := append(frame.AppendSub(nil, "e"), frame.AppendSub(nil, "f")...)
	w1.send(both)
	w1.expectBodies(bbAck("e"), bbAck("f"))
	split := frame.AppendSub(nil, "g")
	w1.send(split[:2])
	w1.send(split[2:9])
	w1.send(split[9:])
	w1.expectBodies(bbAck("g"))
	// A frame of exactly 64 KiB (the most a worker may send) is allowed.
	body := `{"t":"sub","q":"big"}`
	body += strings.Repeat(" ", (64<<10)-len(body))
	w1.send(rawBody(body))
	w1.expectBodies(bbAck("big"))
	pgExec(t, n, "NOTIFY "+pg("big"))
	w1.expectBodies(bbWake("big", nil))
}

func sqlString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Rule 9 through the binary: every malformed input severs that one
// connection and is counted; a sibling on the same channel carries on.
func TestBlackboxMalformedSeversOne(t *testing.T) {
	path := sockPath(t)
	p, addr := serveMetrics(t, path, "--status-interval", "1h")
	n := notifier(t)
	sib := subscribedWorker(t, path, "m")
	cases := []struct {
		name  string
		input []byte
	}{
		{"length over 64 KiB", frameHeader((64 << 10) + 1)},
		{"length over 4 MiB", frameHeader(frame.MaxLen + 1)},
		{"length 0xffffffff", []byte{0xff, 0xff, 0xff, 0xff}},
		{"zero-length frame", frameHeader(0)},
		{"bad JSON", rawBody(`{"t":"sub","q":"m"`)},
		{"bad JSON token", rawBody(`{"t":"sub","q":'m'}`)},
		{"trailing garbage", rawBody(`{"t":"sub","q":"m"}x`)},
		{"not an object: array", rawBody(`["sub","m"]`)},
		{"not an object: string", rawBody(`"sub"`)},
		{"not an object: null", rawBody(`null`)},
		{"sub without q", rawBody(`{"t":"sub"}`)},
		{"sub with numeric q", rawBody(`{"t":"sub","q":1}`)},
		{"sub with null q", rawBody(`{"t":"sub","q":null}`)},
		{"unsub with array q", rawBody(`{"t":"unsub","q":["m"]}`)},
	}
	for i, c := range cases {
		bad := subscribedWorker(t, path, "m")
		bad.send(c.input)
		bad.eofWithin(timeout)
		payload := fmt.Sprint("after ", c.name)
		pgExec(t, n, "SELECT pg_notify('m', "+sqlString(payload)+")")
		sib.expectBodies(bbWake("m", &payload))
		waitMetric(t, addr, "listenhub_protocol_errors_total", float64(i+1))
	}
	m := scrape(t, addr)
	if m["listenhub_workers"] != 1 || m["listenhub_channels"] != 1 || m["listenhub_evictions_total"] != 0 {
		t.Fatalf("metrics after the bad inputs: %v", m)
	}
	// The log names the reason.
	if !strings.Contains(p.stderr.String(), `"reason"`) {
		t.Fatalf("no reason logged:\n%s", p.stderr.String())
	}
}

// Status is re-sent every 5 status intervals: with --status-interval 100ms
// (here through its environment variable) about every 500 ms.
func TestBlackboxStatusPeriod(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, []string{"LISTENHUB_STATUS_INTERVAL=100ms"})
	p.ready()
	w := connectWorker(t, path)
	var at []time.Time
	for len(at) < 6 {
		b, err := w.body(5 * time.Second)
		if err != nil {
			t.Fatalf("status %d: %v", len(at), err)
		}
		if b != `{"t":"status","healthy":true}` {
			t.Fatalf("got %s", b)
		}
		at = append(at, time.Now())
	}
	// at[0] is the status on connect; the periodic ones follow.
	var gaps []time.Duration
	for i := 2; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]))
	}
	mean := at[len(at)-1].Sub(at[1]) / time.Duration(len(at)-2)
	t.Logf("status gaps %v, mean %v", gaps, mean)
	if mean < 400*time.Millisecond || mean > 800*time.Millisecond {
		t.Fatalf("periodic status every %v on average, want about 500ms (gaps %v)", mean, gaps)
	}
	for _, g := range gaps {
		if g < 250*time.Millisecond {
			t.Fatalf("two periodic statuses %v apart (gaps %v)", g, gaps)
		}
	}
}

// Rule 7 through the binary: pg_terminate_backend on the hub's backend →
// healthy:false, healthy:true, then exactly one durable wake per subscribed
// channel to every subscriber; the reconnect is counted, NOTIFYs flow again.
func TestBlackboxResyncAfterTerminate(t *testing.T) {
	c := needDB(t)
	path := sockPath(t)
	p, addr := serveMetrics(t, path, "--status-interval", "1h")
	n := notifier(t)
	w1 := subscribedWorker(t, path, "r1")
	w1.sub("r2")
	w2 := subscribedWorker(t, path, "r2")
	idle := dialWorker(t, path) // subscribed to nothing: statuses only
	m := scrape(t, addr)
	if m["listenhub_channels"] != 2 || m["listenhub_postgres_reconnects_total"] != 0 || m["listenhub_postgres_healthy"] != 1 {
		t.Fatalf("metrics before: %v", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if k, err := c.Terminate(ctx, p.app); err != nil || k != 1 {
		t.Fatalf("terminated %d backends: %v", k, err)
	}
	for _, w := range []*worker{w1, w2, idle} {
		if got := w.nextBody(true); got != `{"t":"status","healthy":false}` {
			t.Fatalf("after the termination: %s", got)
		}
		if got := w.nextBody(true); got != `{"t":"status","healthy":true}` {
			t.Fatalf("after healthy:false: %s", got)
		}
	}
	got := []string{w1.nextBody(true), w1.nextBody(true)}
	slices.Sort(got)
	if want := []string{bbWake("r1", nil), bbWake("r2", nil)}; !slices.Equal(got, want) {
		t.Fatalf("w1 resync wakes %v, want %v", got, want)
	}
	w2.expectBodies(bbWake("r2", nil))
	// Exactly one per channel: the next frame is a fresh NOTIFY.
	pgExec(t, n, "NOTIFY r2, 'after'")
	w1.expectBodies(bbWake("r2", sp("after")))
	w2.expectBodies(bbWake("r2", sp("after")))
	pgExec(t, n, "NOTIFY r1, 'idle?'")
	w1.expectBodies(bbWake("r1", sp("idle?")))
	if b, err := idle.body(200 * time.Millisecond); err == nil {
		t.Fatalf("a worker subscribed to nothing got %s", b)
	}
	m = scrape(t, addr)
	if m["listenhub_postgres_reconnects_total"] != 1 || m["listenhub_postgres_healthy"] != 1 || m["listenhub_channels"] != 2 {
		t.Fatalf("metrics after: %v", m)
	}
	if k := census(t, p.app); k != 1 {
		t.Fatalf("census %d after the reconnect", k)
	}
}

// Rule 8 through the binary: a frozen backend (SIGSTOP: the connection is
// open and silent) is detected within interval + timeout and replaced.
func TestBlackboxHealthCheckFrozenBackend(t *testing.T) {
	c := ownDB(t, "external server: cannot freeze its backends")
	path := sockPath(t)
	p := serve(t, path, nil, "--health-check-interval", "100ms", "--health-check-timeout", "400ms",
		"--status-interval", "1h")
	p.ready()
	w := subscribedWorker(t, path, "hc")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pid := pgtesting.FreezeIdleOnly(ctx, t, c, p.app)
	frozen := time.Now()
	t.Cleanup(func() { c.Thaw(pid) })
	if got := w.nextBody(true); got != `{"t":"status","healthy":false}` {
		t.Fatalf("after the freeze: %s", got)
	}
	detected := time.Since(frozen)
	if got := w.nextBody(true); got != `{"t":"status","healthy":true}` {
		t.Fatalf("after healthy:false: %s", got)
	}
	w.expectBodies(bbWake("hc", nil))
	t.Logf("frozen backend detected after %v", detected)
	if detected > 5*time.Second {
		t.Fatalf("frozen backend detected after %v; interval + timeout is 500ms", detected)
	}
	c.Thaw(pid)
	pgExec(t, notifier(t), "NOTIFY hc, 'new backend'")
	w.expectBodies(bbWake("hc", sp("new backend")))
}

// Rule 3 through the binary: a worker that never reads is evicted once its
// backlog passes --hard-queue-limit frames (beyond what its socket took);
// the eviction is counted; the sibling gets every wake, in order.
func TestBlackboxEviction(t *testing.T) {
	path := sockPath(t)
	_, addr := serveMetrics(t, path, "--hard-queue-limit", "32",
		"--status-interval", "1h")
	n := notifier(t)
	wedged := subscribedWorker(t, path, "ev")
	sib := subscribedWorker(t, path, "ev")
	// 1,000 bytes a payload, 10 per transaction, the sibling reading each
	// batch before the next: about 200 frames fill the wedged worker's
	// socket, 32 more evict it. 600 frames are far beyond that.
	pad := strings.Repeat("p", 1000)
	const total, batch = 600, 10
	for i := 0; i < total; i += batch {
		pgExec(t, n, fmt.Sprintf("SELECT pg_notify('ev', i || '%s') FROM generate_series(%d, %d) i", pad, i, i+batch-1))
		for j := i; j < i+batch; j++ {
			sib.expectBodies(bbWake("ev", sp(fmt.Sprint(j)+pad)))
		}
	}
	waitMetric(t, addr, "listenhub_evictions_total", 1)
	// What the wedged worker reads now is what was written before the
	// close, in order, then EOF.
	for i := 0; ; i++ {
		b, err := wedged.body(timeout)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("evicted worker's connection still open")
			}
			t.Logf("evicted worker read %d wakes before the close", i)
			if i >= total {
				t.Fatalf("evicted worker got all %d wakes", i)
			}
			break
		}
		if want := bbWake("ev", sp(fmt.Sprint(i)+pad)); b != want {
			t.Fatalf("evicted worker's wake %d: %.40s…", i, b)
		}
	}
	m := scrape(t, addr)
	if m["listenhub_workers"] != 1 || m["listenhub_channels"] != 1 {
		t.Fatalf("metrics after the eviction: %v", m)
	}
	// The sibling is still served, the hub still accepts.
	pgExec(t, n, "NOTIFY ev, 'still'")
	sib.expectBodies(bbWake("ev", sp("still")))
	subscribedWorker(t, path, "ev") // a new worker is still accepted and acked
}

// Rule 3 for a worker that reads, through the binary: one transaction of
// 20,000 NOTIFYs, twenty times the frame limit, reaches a worker that keeps
// reading in full and in order, as its own LISTEN would have; a worker that
// stopped reading, beside it, is evicted once its socket took nothing for
// --stall-timeout.
func TestBlackboxBurstReachesAReadingWorker(t *testing.T) {
	path := sockPath(t)
	_, addr := serveMetrics(t, path, "--status-interval", "1h")
	n := notifier(t)
	reader := subscribedWorker(t, path, "burst")
	wedged := subscribedWorker(t, path, "burst")
	const total = 20000
	pgExec(t, n, fmt.Sprintf(`SELECT pg_notify('burst', '{"queue":"q' || i || '"}') FROM generate_series(1, %d) i`, total))
	for i := 1; i <= total; i++ {
		b, err := reader.body(timeout)
		if err != nil {
			t.Fatalf("reading worker at wake %d of %d: %v (metrics %v)", i, total, err, scrape(t, addr))
		}
		if want := bbWake("burst", sp(fmt.Sprintf(`{"queue":"q%d"}`, i))); b != want {
			t.Fatalf("wake %d: %.60s, want %.60s", i, b, want)
		}
	}
	waitMetric(t, addr, "listenhub_evictions_total", 1)
	m := scrape(t, addr)
	if m["listenhub_workers"] != 1 {
		t.Fatalf("metrics after the burst: %v, want the reader left", m)
	}
	// The wedged one reads what was written before its close, then EOF.
	for i := 0; ; i++ {
		if _, err := wedged.body(timeout); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the wedged worker's connection is still open")
			}
			if i >= total {
				t.Fatalf("the wedged worker got all %d wakes", i)
			}
			break
		}
	}
	pgExec(t, n, "NOTIFY burst, 'after'")
	reader.expectBodies(bbWake("burst", sp("after")))
}

// Rules 4 and 5 through the binary: to a worker whose socket is full,
// durable wakes for one channel coalesce into the pending one (keeping its
// place), past --durable-queue-limit pending durable frames they are
// dropped and counted, and none of that evicts; once it reads it gets
// everything in production order.
func TestBlackboxDurableCoalescingAndLimit(t *testing.T) {
	path := sockPath(t)
	_, addr := serveMetrics(t, path, "--durable-queue-limit", "3",
		"--status-interval", "1h")
	n := notifier(t)
	chans := []string{"fill", "d0", "d1", "d2", "d3", "d4", "d5"}
	wedged := dialWorker(t, path)
	sib := dialWorker(t, path)
	for _, q := range chans {
		wedged.sub(q)
		sib.sub(q)
	}
	// Fill the wedged worker's socket: 80 payloads of 7,999 bytes are
	// 640 KB, three times the default socket buffer; the rest is the
	// hub's backlog for it.
	const fill = 80
	pgExec(t, n, fmt.Sprintf("SELECT pg_notify('fill', lpad(i::text, 7999, '0')) FROM generate_series(1, %d) i", fill))
	for i := 1; i <= fill; i++ {
		sib.expectBodies(bbWake("fill", sp(fmt.Sprintf("%07999d", i))))
	}
	// Ten durable wakes on d0, one transaction each, the sibling reading
	// each one: the wedged worker's merge into its first, 9 coalesced.
	for range 10 {
		pgExec(t, n, "NOTIFY d0")
		sib.expectBodies(bbWake("d0", nil))
	}
	waitMetric(t, addr, "listenhub_durable_coalesced_total", 9)
	// d1..d5 at once: with d0 pending, d1 and d2 fill the limit of 3; d3,
	// d4 and d5 are dropped for the wedged worker, not for the sibling.
	pgExec(t, n, "NOTIFY d1; NOTIFY d2; NOTIFY d3; NOTIFY d4; NOTIFY d5")
	got := []string{}
	for range 5 {
		got = append(got, sib.nextBody(false))
	}
	slices.Sort(got)
	var want []string
	for _, q := range chans[2:] {
		want = append(want, bbWake(q, nil))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("sibling got %v, want %v", got, want)
	}
	waitMetric(t, addr, "listenhub_durable_dropped_total", 3)
	pgExec(t, n, "NOTIFY fill, 'end'")
	sib.expectBodies(bbWake("fill", sp("end")))
	m := scrape(t, addr)
	if m["listenhub_evictions_total"] != 0 || m["listenhub_workers"] != 2 {
		t.Fatalf("metrics: %v", m)
	}
	// The wedged worker reads now: the fill in order, d0 once in its
	// place, d1, d2, then the end marker, and nothing else.
	for i := 1; i <= fill; i++ {
		wedged.expectBodies(bbWake("fill", sp(fmt.Sprintf("%07999d", i))))
	}
	wedged.expectBodies(bbWake("d0", nil))
	got = []string{wedged.nextBody(false), wedged.nextBody(false)}
	slices.Sort(got)
	if want := []string{bbWake("d1", nil), bbWake("d2", nil)}; !slices.Equal(got, want) {
		t.Fatalf("wedged worker's durable wakes after d0: %v, want %v", got, want)
	}
	wedged.expectBodies(bbWake("fill", sp("end")))
}

// Rule 4 against rule 3 through the binary: with --hard-queue-limit below
// the durable limit, a worker whose socket is full and who then gets only
// durable wakes (on more channels than the hard limit) is not evicted by the
// status frames that follow them (here the healthy:false, healthy:true of a
// reconnect), and loses none of them.
func TestBlackboxDurableNeverEvicts(t *testing.T) {
	c := needDB(t)
	path := sockPath(t)
	p, addr := serveMetrics(t, path, "--hard-queue-limit", "8",
		"--status-interval", "1h")
	n := notifier(t)
	wedged := dialWorker(t, path)
	sib := dialWorker(t, path)
	const channels = 30
	for i := range channels {
		wedged.sub(fmt.Sprint("c", i))
	}
	wedged.sub("fill")
	sib.sub("fill")
	// Fill the wedged worker's socket one frame per loop iteration (the
	// sibling reads each before the next), until a frame to it stays
	// unwritten: frames_sent then lags one behind two per NOTIFY.
	pad := strings.Repeat("f", 2000)
	base := scrape(t, addr)["listenhub_frames_sent_total"]
	fills := 0
	for full := false; !full; {
		if fills == 2000 {
			t.Fatal("the wedged worker's socket never filled")
		}
		pgExec(t, n, fmt.Sprintf("SELECT pg_notify('fill', '%d%s')", fills, pad))
		sib.expectBodies(bbWake("fill", sp(fmt.Sprint(fills)+pad)))
		fills++
		want := base + float64(2*fills)
		full = true
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			if scrape(t, addr)["listenhub_frames_sent_total"] >= want {
				full = false
				break
			}
		}
	}
	t.Logf("socket full after %d frames of %d bytes", fills, len(pad))
	var sql []string
	for i := range channels {
		sql = append(sql, fmt.Sprintf("NOTIFY c%d", i))
	}
	received := scrape(t, addr)["listenhub_wakes_received_total"]
	pgExec(t, n, strings.Join(sql, "; ")) // 30 durable wakes, pending
	// Postgres hands NOTIFYs to the listening backend asynchronously: the
	// hub must have them all before its backend is terminated, or those
	// still in flight are lost with the connection (rule 7) and the order
	// checked below is not the one this test is about.
	testutil.WaitFor(t, timeout, "the hub to receive the 30 NOTIFYs", func() bool {
		return scrape(t, addr)["listenhub_wakes_received_total"] >= received+channels
	})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if k, err := c.Terminate(ctx, p.app); err != nil || k != 1 {
		t.Fatalf("terminated %d: %v", k, err)
	}
	if got := sib.nextBody(true); got != `{"t":"status","healthy":false}` {
		t.Fatalf("sibling: %s", got)
	}
	if got := sib.nextBody(true); got != `{"t":"status","healthy":true}` {
		t.Fatalf("sibling: %s", got)
	}
	m := scrape(t, addr)
	if m["listenhub_evictions_total"] != 0 || m["listenhub_durable_dropped_total"] != 0 {
		t.Fatalf("a worker pending only durable wakes was evicted or lost some: %v", m)
	}
	pgExec(t, n, "NOTIFY fill, 'end'")
	sib.expectBodies(bbWake("fill", nil), bbWake("fill", sp("end"))) // resync, then the NOTIFY
	// The wedged worker reads now: everything, in production order; the
	// resync wakes merged into the pending ones.
	for i := range fills {
		wedged.expectBodies(bbWake("fill", sp(fmt.Sprint(i)+pad)))
	}
	for i := range channels {
		wedged.expectBodies(bbWake(fmt.Sprint("c", i), nil))
	}
	if got := wedged.nextBody(true); got != `{"t":"status","healthy":false}` {
		t.Fatalf("wedged: %s", got)
	}
	if got := wedged.nextBody(true); got != `{"t":"status","healthy":true}` {
		t.Fatalf("wedged: %s", got)
	}
	wedged.expectBodies(bbWake("fill", nil), bbWake("fill", sp("end")))
}

// Rule 1 through the binary: every NOTIFY issued after the worker received
// its ack reaches it, for a fresh channel each round (ack after a real
// LISTEN), for a sub racing another worker's in-flight LISTEN, and for a sub
// right after the last unsub (UNLISTEN in flight).
func TestBlackboxAckMeansListening(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, nil, "--status-interval", "1h")
	p.ready()
	n := notifier(t)
	w1 := dialWorker(t, path)
	w2 := dialWorker(t, path)
	for i := range 40 {
		q := fmt.Sprint("ack", i)
		w1.send(frame.AppendSub(nil, q))
		w2.send(frame.AppendSub(nil, q))
		w1.expectBodies(bbAck(q))
		w2.expectBodies(bbAck(q))
		pgExec(t, n, "NOTIFY "+q+", 'x'")
		w1.expectBodies(bbWake(q, sp("x")))
		w2.expectBodies(bbWake(q, sp("x")))
		// Last subscribers leave and one comes straight back.
		w1.send(frame.AppendUnsub(nil, q))
		w2.send(frame.AppendUnsub(nil, q))
		w1.send(frame.AppendSub(nil, q))
		w1.expectBodies(bbAck(q))
		pgExec(t, n, "NOTIFY "+q+", 'y'")
		w1.expectBodies(bbWake(q, sp("y")))
		w1.send(frame.AppendUnsub(nil, q))
	}
}

// serveEnv starts `listenhub serve` configured by the environment alone
// (no flags at all).
func serveEnv(t *testing.T, env []string) *proc {
	t.Helper()
	p := &proc{t: t, stderr: &syncBuf{}, done: make(chan struct{})}
	p.cmd = exec.Command(hubBinary(t), "serve")
	p.cmd.Env = append(cleanEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stderr, p.stderr
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "LISTENHUB_SOCKET="); ok {
			p.socket = v
		}
		if v, ok := strings.CutPrefix(e, "LISTENHUB_APPLICATION_NAME="); ok {
			p.app = v
		}
	}
	p.start()
	return p
}

// Every flag of docs/design.md is also read from LISTENHUB_<FLAG>, and the
// database falls back from LISTENHUB_DATABASE_URL to DATABASE_URL to the
// libpq PG* variables.
func TestBlackboxEnvironment(t *testing.T) {
	c := needDB(t)
	cc, err := pgconn.ParseConfig(c.URL())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("every flag from the environment", func(t *testing.T) {
		path := sockPath(t)
		app := testApp(t)
		p := serveEnv(t, []string{
			"LISTENHUB_SOCKET=" + path,
			"LISTENHUB_DATABASE_URL=" + c.URL(),
			"DATABASE_URL=postgres://nobody@127.0.0.1:1/nothing?connect_timeout=1", // loses
			"LISTENHUB_CHANNEL_PREFIX=env_",
			"LISTENHUB_CHANNEL_SUFFIX=.evt",
			"LISTENHUB_APPLICATION_NAME=" + app,
			"LISTENHUB_DURABLE_QUEUE_LIMIT=7",
			"LISTENHUB_HARD_QUEUE_LIMIT=99",
			"LISTENHUB_STATUS_INTERVAL=50ms",
			"LISTENHUB_HEALTH_CHECK_INTERVAL=200ms",
			"LISTENHUB_HEALTH_CHECK_TIMEOUT=2s",
			"LISTENHUB_METRICS_ADDR=127.0.0.1:0",
			"LISTENHUB_LOG_FORMAT=json",
			"LISTENHUB_LOG_LEVEL=debug",
		})
		p.ready()
		addr := p.metricsAddr() // json log, found by its "msg": --log-format
		scrape(t, addr)         // --metrics-addr
		if k := census(t, app); k != 1 {
			t.Fatalf("census %d for %s", k, app) // --application-name, --database-url
		}
		w := subscribedWorker(t, path, "q")
		pgExec(t, notifier(t), `NOTIFY "env_q.evt", 'mapped'`) // prefix and suffix
		w.expectBodies(bbWake("q", sp("mapped")))
		// Status every 250 ms: two periodic ones well within a second.
		start := time.Now()
		for range 2 {
			if got := w.nextBody(true); got != `{"t":"status","healthy":true}` {
				t.Fatalf("got %s", got)
			}
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("two periodic statuses took %v with a 50ms interval", d)
		}
		// The second unknown frame of a connection is logged at debug.
		w.send(rawBody(`{"t":"x1"}`))
		w.send(rawBody(`{"t":"x2"}`))
		w.sub("after-unknown")
		// The hub's stderr is copied by another goroutine: the line may
		// land a moment after the ack.
		testutil.WaitFor(t, timeout, "a debug line with LISTENHUB_LOG_LEVEL=debug", func() bool {
			return strings.Contains(p.stderr.String(), `"level":"DEBUG"`)
		})
	})

	t.Run("DATABASE_URL", func(t *testing.T) {
		path := sockPath(t)
		app := testApp(t)
		p := serveEnv(t, []string{"LISTENHUB_SOCKET=" + path, "DATABASE_URL=" + c.URL(),
			"LISTENHUB_APPLICATION_NAME=" + app})
		p.ready()
		if k := census(t, app); k != 1 {
			t.Fatalf("census %d", k)
		}
	})

	t.Run("PG variables", func(t *testing.T) {
		path := sockPath(t)
		app := testApp(t)
		env := []string{"LISTENHUB_SOCKET=" + path, "LISTENHUB_APPLICATION_NAME=" + app,
			"PGHOST=" + cc.Host, "PGPORT=" + strconv.Itoa(int(cc.Port)), "PGUSER=" + cc.User,
			"PGDATABASE=" + cc.Database, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10"}
		if cc.Password != "" {
			env = append(env, "PGPASSWORD="+cc.Password)
		}
		p := serveEnv(t, env)
		p.ready()
		if k := census(t, app); k != 1 {
			t.Fatalf("census %d", k)
		}
		subscribedWorker(t, path, "pgvars") // acked: the hub listens through the PG* variables
	})

	// A bad value in each variable is reported as one line naming it (or
	// its flag), exit status non-zero: proof that every one is read.
	for _, c := range []struct{ env, want string }{
		{"LISTENHUB_DURABLE_QUEUE_LIMIT=lots", "LISTENHUB_DURABLE_QUEUE_LIMIT"},
		{"LISTENHUB_HARD_QUEUE_LIMIT=0", "--hard-queue-limit"},
		{"LISTENHUB_STATUS_INTERVAL=often", "LISTENHUB_STATUS_INTERVAL"},
		{"LISTENHUB_HEALTH_CHECK_INTERVAL=-1s", "--health-check-interval"},
		{"LISTENHUB_HEALTH_CHECK_TIMEOUT=x", "LISTENHUB_HEALTH_CHECK_TIMEOUT"},
		{"LISTENHUB_LOG_FORMAT=xml", "--log-format"},
		{"LISTENHUB_LOG_LEVEL=loud", "--log-level"},
		{"LISTENHUB_METRICS_ADDR=no-such-host.invalid:http", "--metrics-addr"},
		{"LISTENHUB_DATABASE_URL=postgres://%zz", "--database-url"},
		{"LISTENHUB_CHANNEL_PREFIX=" + strings.Repeat("p", 63), "prefix and suffix"},
		{"LISTENHUB_CHANNEL_SUFFIX=" + strings.Repeat("s", 63), "prefix and suffix"},
	} {
		t.Run(c.env, func(t *testing.T) {
			cmd := exec.Command(hubBinary(t), "serve")
			cmd.Env = append(cleanEnv(), "LISTENHUB_SOCKET="+sockPath(t), "LISTENHUB_DATABASE_URL=postgres://nobody@127.0.0.1:1/x?connect_timeout=1", c.env)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("exit %v, want non-zero; output %q", err, out)
			}
			if strings.Count(string(out), "\n") != 1 || !strings.Contains(string(out), c.want) {
				t.Fatalf("output %q, want one line with %q", out, c.want)
			}
		})
	}
}

// /metrics values follow what the hub does: workers and accepts, channels
// LISTENed now (up with the first subscriber, down with the last, whether
// it unsubscribes or disconnects), wakes received, frames sent; /healthz is
// 200 while Postgres is connected.
func TestBlackboxMetricsValues(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, nil, "--metrics-addr", "127.0.0.1:0", "--status-interval", "1h")
	p.ready() // one accept; one status frame, or two if Postgres was not reached yet
	addr := p.metricsAddr()
	waitMetric(t, addr, "listenhub_workers", 0)
	n := notifier(t)
	m := scrape(t, addr)
	if m["listenhub_accepts_total"] != 1 || m["listenhub_channels"] != 0 || m["listenhub_postgres_healthy"] != 1 {
		t.Fatalf("metrics at start: %v", m)
	}
	probe := m["listenhub_frames_sent_total"] // the probe is gone: final
	ws := subscribedWorkers(t, path, "shared", 3)
	for i, w := range ws {
		w.sub(fmt.Sprint("own", i))
	}
	m = scrape(t, addr)
	if m["listenhub_workers"] != 3 || m["listenhub_accepts_total"] != 4 || m["listenhub_channels"] != 4 {
		t.Fatalf("metrics with 3 workers on 4 channels: %v", m)
	}
	// Frames fully written: the ready probe's, then a status and two
	// acks per worker. (A frame is counted once write returned, which may
	// be just after the worker read it: wait, don't sample.)
	waitMetric(t, addr, "listenhub_frames_sent_total", probe+3*3)
	pgExec(t, n, "NOTIFY shared, 'x'")
	for _, w := range ws {
		w.expectBodies(bbWake("shared", sp("x")))
	}
	waitMetric(t, addr, "listenhub_frames_sent_total", probe+3*3+3)
	waitMetric(t, addr, "listenhub_wakes_received_total", 1)
	ws[0].send(frame.AppendUnsub(nil, "own0")) // last subscriber: UNLISTEN
	waitMetric(t, addr, "listenhub_channels", 3)
	ws[1].send(frame.AppendUnsub(nil, "shared")) // not the last one
	ws[1].c.Close()                              // own1 goes with it
	waitMetric(t, addr, "listenhub_channels", 2)
	waitMetric(t, addr, "listenhub_workers", 2)
	ws[0].c.Close()
	ws[2].c.Close()
	waitMetric(t, addr, "listenhub_channels", 0)
	waitMetric(t, addr, "listenhub_workers", 0)
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/healthz %d", resp.StatusCode)
	}
}

// SIGTERM with a worker whose socket is full and a backlog queued: the hub
// still stops at once — the worker sees EOF after what was written, the
// backend goes, the socket file is removed, exit 0.
func TestBlackboxSIGTERMWithBacklog(t *testing.T) {
	path := sockPath(t)
	p := serve(t, path, nil, "--status-interval", "1h")
	p.ready()
	wedged := subscribedWorker(t, path, "bl")
	other := subscribedWorker(t, path, "bl")
	pgExec(t, notifier(t), "SELECT pg_notify('bl', lpad(i::text, 7999, '0')) FROM generate_series(1, 60) i")
	for i := 1; i <= 60; i++ {
		other.expectBodies(bbWake("bl", sp(fmt.Sprintf("%07999d", i))))
	}
	start := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.exit(); code != 0 {
		t.Fatalf("exit %d", code)
	}
	t.Logf("exit 0 %v after SIGTERM with a backlog", time.Since(start))
	other.eofWithin(timeout)
	wedged.eofWithin(timeout)
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file left: %v", err)
	}
	testutil.WaitFor(t, timeout, "backend gone", func() bool { return census(t, p.app) == 0 })
}

// A stale socket file (bound once, nobody accepting) is replaced, and the
// new socket is 0600 even under umask 000.
func TestBlackboxStaleSocketUmask(t *testing.T) {
	c := needDB(t)
	path := sockPath(t)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if _, err := net.Dial("unix", path); err == nil {
		t.Fatal("stale socket accepts")
	}
	p := &proc{t: t, socket: path, app: testApp(t), stderr: &syncBuf{}, done: make(chan struct{})}
	p.cmd = exec.Command("/bin/sh", "-c", `umask 000; exec "$0" "$@"`, hubBinary(t), "serve",
		"--socket", path, "--database-url", c.URL(), "--application-name", p.app)
	p.cmd.Env = cleanEnv()
	p.cmd.Stdout, p.cmd.Stderr = p.stderr, p.stderr
	p.start()
	p.ready()
	checkSocketMode(t, path, " under umask 000")
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("socket directory holds %v", ents)
	}
	p.cmd.Process.Signal(syscall.SIGINT)
	if code := p.exit(); code != 0 {
		t.Fatalf("exit %d after SIGINT", code)
	}
}

// census and version, through the binary.
func TestBlackboxCensusAndVersion(t *testing.T) {
	c := needDB(t)
	out, err := exec.Command(hubBinary(t), "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "listenhub ") || strings.Count(string(out), "\n") != 1 {
		t.Fatalf("version: %q %v", out, err)
	}
	app := testApp(t)
	if k := census(t, app); k != 0 {
		t.Fatalf("census %d before the hub", k)
	}
	path := sockPath(t)
	p := serve(t, path, nil, "--application-name", app)
	p.ready()
	if k := census(t, app); k != 1 {
		t.Fatalf("census %d with the hub", k)
	}
	// DATABASE_URL works for census too, and an unreachable database is
	// one line, non-zero.
	cmd := exec.Command(hubBinary(t), "census", "--application-name", app)
	cmd.Env = append(cleanEnv(), "DATABASE_URL="+c.URL())
	if out, err := cmd.Output(); err != nil || string(out) != fmt.Sprintf("backends with application_name %q: 1\n", app) {
		t.Fatalf("census with DATABASE_URL: %q %v", out, err)
	}
	cmd = exec.Command(hubBinary(t), "census", "--database-url", "postgres://u@127.0.0.1:1/x?connect_timeout=2")
	cmd.Env = cleanEnv()
	out, err = cmd.CombinedOutput()
	if err == nil || strings.Count(string(out), "\n") != 1 {
		t.Fatalf("census on an unreachable database: %q %v", out, err)
	}
}
