package hub

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

func nack(q, reason string) string {
	return string(frame.AppendNack(nil, q, reason)[4:])
}

// A length header above maxInboundFrame severs that worker before its body
// is buffered (the bytes that came with it are not copied), and a sibling
// carries on; a frame of exactly maxInboundFrame is served.
func TestInboundFrameCap(t *testing.T) {
	e := newEnv(t, nil)
	e.do(func() { e.pg.auto = true })
	sib := e.dial()
	sib.subscribe("a")

	body := `{"t":"sub","q":"big"}`
	body += strings.Repeat(" ", maxInboundFrame-len(body))
	sib.send(rawFrame(body))
	sib.expect(ack("big"))

	// Each bad worker sends a header above the cap and 60 KiB of its body
	// in one write: the hub reads them together, and must not copy them.
	const bad = 20
	chunk := append(rawFrame("")[:0], 0, 0, 0, 0)
	chunk = append(chunk, bytes.Repeat([]byte("x"), 60<<10)...)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range bad {
		n := uint32(maxInboundFrame + 1)
		if i%2 == 1 {
			n = frame.MaxLen // the protocol's own limit is no longer the hub's
		}
		chunk[0], chunk[1], chunk[2], chunk[3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
		// A bare connection: the test worker's own 64 KiB read buffer
		// would be counted too.
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: e.path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(chunk); err != nil {
			// Severed before the kernel took the whole chunk (the hub
			// read the header first): what the cap promises.
			if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatal(err)
			}
			c.Close()
			continue
		}
		c.SetReadDeadline(time.Now().Add(timeout))
		var small [512]byte
		for {
			if _, err := c.Read(small[:]); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatal("not severed")
				}
				break
			}
		}
		c.Close()
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > bad*60<<10/2 {
		t.Fatalf("%d oversized frames made the process allocate %d bytes; their bodies were buffered", bad, got)
	}
	if s := e.h.Stats(); s.ProtocolErrors != bad || s.Workers != 1 {
		t.Fatalf("stats %+v", s)
	}
	if !strings.Contains(e.logs.String(), "above the limit 65536") {
		t.Fatalf("the log does not give the reason:\n%s", e.logs.String())
	}
	e.notify("a", "still here")
	sib.expect(wake("a", ptr("still here")))
}

// A frame still incomplete FrameTimeout after its first byte severs the
// worker; one sent slowly but completed in time does not, and neither does
// a worker that keeps completing frames.
func TestFrameTimeout(t *testing.T) {
	const ft = 400 * time.Millisecond
	e := newEnv(t, func(c *Config) { c.FrameTimeout = ft })
	e.do(func() { e.pg.auto = true })

	stuck := e.dial()
	start := time.Now()
	stuck.send(frame.AppendSub(nil, "a")[:7])
	stuck.eof()
	if d := time.Since(start); d < ft {
		t.Fatalf("severed after %v, before the %v timeout", d, ft)
	}
	if s := e.h.Stats(); s.ProtocolErrors != 1 || s.Workers != 0 {
		t.Fatalf("stats %+v", s)
	}
	if !strings.Contains(e.logs.String(), "reason=\"frame timeout\"") {
		t.Fatalf("no frame timeout logged:\n%s", e.logs.String())
	}

	// Slow but in time, over and over: 3 pieces ft/4 apart per frame,
	// the next frame's first piece in the write that completes the last.
	slow := e.dial()
	var stream []byte
	for i := range 4 {
		stream = frame.AppendSub(stream, fmt.Sprint("s", i))
	}
	deadline := time.Now().Add(2 * ft)
	for len(stream) > 0 {
		n := min(len(stream), 12)
		slow.send(stream[:n])
		stream = stream[n:]
		time.Sleep(ft / 4)
	}
	if time.Now().Before(deadline) {
		t.Fatal("the slow sender was not slow enough to matter")
	}
	for i := range 4 {
		slow.expect(ack(fmt.Sprint("s", i)))
	}
	e.sync()
	e.do(func() {
		if len(e.h.partial.workers) != 0 {
			t.Errorf("%d workers still tracked with a partial frame", len(e.h.partial.workers))
		}
	})
	if s := e.h.Stats(); s.ProtocolErrors != 1 || s.Workers != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Answers never count toward the hard limits: a worker that subscribes far
// more names at once than HardQueueLimit, and reads its acks only after
// sending every sub, is not evicted.
func TestAnswersDoNotCountTowardHardLimit(t *testing.T) {
	const n = 3000
	e := newEnv(t, func(c *Config) { c.HardQueueLimit = 16; c.StatusInterval = time.Hour })
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	var subs []byte
	for i := range n {
		subs = frame.AppendSub(subs, fmt.Sprint("q", i))
	}
	w.send(subs)
	for i := range n {
		// Wait until the hub has produced every answer before reading any.
		if i == 0 {
			testutil.WaitFor(t, timeout, "every LISTEN issued", func() bool { return len(e.issued()) == n })
			e.sync()
		}
		w.expect(ack(fmt.Sprint("q", i)))
	}
	if s := e.h.Stats(); s.Evictions != 0 || s.Workers != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Past MaxSubscriptions a sub is nacked "too many subscriptions" and the
// connection stays usable; a sub of a name already held is still acked,
// and an unsub makes room.
func TestMaxSubscriptions(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxSubscriptions = 3 })
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	for _, q := range []string{"a", "b", "c"} {
		w.sub(q)
		w.expect(ack(q))
	}
	w.sub("d")
	w.expect(nack("d", "too many subscriptions"))
	w.subscribe("a")
	w.unsub("a")
	w.subscribe("d")
	e.notify("d", "x")
	w.expect(wake("d", ptr("x")))
	if s := e.h.Stats(); s.Nacks != 1 || s.Workers != 1 {
		t.Fatalf("stats %+v", s)
	}

	// Repeating a sub whose LISTEN is in flight owes an answer each time:
	// those count too, so the waiter list stays bounded.
	e.do(func() { e.pg.auto = false })
	w2 := e.dial()
	for range 5 {
		w2.sub("slow")
	}
	w2.expect(nack("slow", "too many subscriptions"), nack("slow", "too many subscriptions"))
	e.complete("LISTEN", "slow", nil)
	w2.expect(ack("slow"), ack("slow"), ack("slow"))
	if s := e.h.Stats(); s.Nacks != 3 {
		t.Fatalf("stats %+v", s)
	}
}

// Past MaxChannels a sub that would add a channel is nacked "too many
// channels"; subs of channels already LISTENed are served, and the
// connection stays usable.
func TestMaxChannels(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxChannels = 2 })
	e.do(func() { e.pg.auto = true })
	w1, w2 := e.dial(), e.dial()
	w1.subscribe("a")
	w1.subscribe("b")
	w2.sub("c")
	w2.expect(nack("c", "too many channels"))
	w2.subscribe("a")
	// Once a channel is UNLISTENed there is room again.
	w1.unsub("b")
	testutil.WaitFor(t, timeout, "b UNLISTENed", func() bool {
		n := 0
		e.do(func() { n = len(e.h.channels) })
		return n == 1
	})
	w2.subscribe("c")
	if s := e.h.Stats(); s.Nacks != 1 || s.Workers != 2 || s.Channels != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// Past MaxWorkers a connection is accepted and closed at once, counted and
// logged; once a worker leaves, the next one is served.
func TestMaxWorkers(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxWorkers = 2 })
	w1 := e.dial()
	e.dial()
	refused := dialRaw(t, e.path)
	expectRefusal(t, refused, "too many workers: this hub serves at most 2 (--max-workers)")
	if s := e.h.Stats(); s.ConnectionsRefused != 1 || s.Workers != 2 || s.Accepts != 3 {
		t.Fatalf("stats %+v", s)
	}
	testutil.WaitFor(t, timeout, "refusal logged", func() bool {
		return strings.Contains(e.logs.String(), `reason="too many workers"`)
	})
	w1.c.Close()
	testutil.WaitFor(t, timeout, "worker 1 gone", func() bool { return e.h.Stats().Workers == 1 })
	e.dial()
}

// The cap in force is lowered to what RLIMIT_NOFILE leaves after the
// descriptors open at Start and fdReserve.
func TestMaxWorkersFollowsFDLimit(t *testing.T) {
	e := newEnv(t, nil)
	var got int
	e.do(func() { got = e.h.fds.maxWorkers })
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	want := min(defaultMaxWorkers, int(lim.Cur)-testutil.FDCount()-fdReserve)
	// FDCount now and at Start differ by the test's own descriptors.
	if got > defaultMaxWorkers || got < want-8 || got > want+8 {
		t.Fatalf("max workers in force %d, want about %d (limit %d)", got, want, lim.Cur)
	}
}

// The reserve grows with --postgres-connections: K connections may all
// reconnect at once, each with a new socket.
func TestFDReserveGrowsWithPostgresConnections(t *testing.T) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = testutil.Rlim(testutil.FDCount()+400, low.Cur)
	if low.Cur >= lim.Cur {
		t.Skipf("RLIMIT_NOFILE %d leaves no room to lower it", lim.Cur)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &lim) })
	capWith := func(k int) (got int) {
		// A subtest each: the first hub is stopped (its descriptors
		// closed) before the second starts.
		t.Run(fmt.Sprintf("K=%d", k), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.PostgresConnections = k })
			e.do(func() { got = e.h.fds.maxWorkers })
		})
		return got
	}
	one, sixteen := capWith(1), capWith(16)
	if one >= defaultMaxWorkers || one > 400-fdReserve {
		t.Fatalf("cap %d with K=1 under a limit 400 above the open descriptors: not lowered", one)
	}
	// The two hubs open the same descriptors; 15 more are kept back.
	if d := one - sixteen; d < 13 || d > 17 {
		t.Fatalf("cap %d with K=1, %d with K=16: %d fewer, want 15", one, sixteen, d)
	}
}

// A sub whose name is not valid UTF-8 (raw bytes, or an escaped lone
// surrogate) is nacked, and the connection stays usable.
func TestInvalidUTF8Nacked(t *testing.T) {
	e := newEnv(t, nil)
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	// The nack carries the name as sent, in base64 ("q64"): raw bytes
	// as they came, an escaped lone surrogate in its 3-byte form.
	w.send(rawFrame("{\"t\":\"sub\",\"q\":\"a\xffb\"}"))
	if got, want := w.rawBody(), "{\"t\":\"nack\",\"q\":\"a\uFFFDb\",\"q64\":\"Yf9i\",\"error\":\"invalid channel: not valid UTF-8\"}"; got != want {
		t.Fatalf("nack %s, want %s", got, want)
	}
	w.send(rawFrame(`{"t":"sub","q":"x\ud800"}`))
	if got, want := w.rawBody(), "{\"t\":\"nack\",\"q\":\"x\uFFFD\",\"q64\":\"eO2ggA==\",\"error\":\"invalid channel: not valid UTF-8\"}"; got != want {
		t.Fatalf("nack %s, want %s", got, want)
	}
	w.send(rawFrame("{\"t\":\"unsub\",\"q\":\"a\xffb\"}"))
	// U+FFFD itself is a valid name.
	w.subscribe("x\uFFFD")
	if s := e.h.Stats(); s.Nacks != 2 || s.Workers != 1 || s.ProtocolErrors != 0 {
		t.Fatalf("stats %+v", s)
	}
}

var suppressedRE = regexp.MustCompile(`suppressed=(\d+)`)

// A flood of refused subs writes a bounded number of log lines, with names
// cut to 100 bytes; the suppressed lines are counted in later lines, and
// written lines plus suppressed add up to the flood.
func TestLogRateLimited(t *testing.T) {
	const n = 5000
	e := newEnv(t, func(c *Config) { c.StatusInterval = 100 * time.Millisecond })
	w := e.dial()
	long := strings.Repeat("n", 1000)
	var flood []byte
	for range n {
		flood = frame.AppendSub(flood, long)
	}
	start := time.Now()
	// Sent while the nacks are read: the hub stops reading a worker
	// whose unread answers pile up (outbudget.go), so a worker that wrote
	// all of it before reading would wait for ever.
	go w.c.Write(flood)
	for range n {
		m, err := w.read(timeout)
		if err != nil || m.Type != "nack" {
			t.Fatalf("got %+v, %v", m, err)
		}
	}
	elapsed := time.Since(start)
	lines := e.logs.count(`msg="sub refused"`)
	if max := logBurst + int(elapsed.Seconds()*logRate) + 1; lines > max {
		t.Fatalf("%d sub-refused lines for %d refusals in %v, want at most %d", lines, n, elapsed, max)
	}
	for _, l := range strings.Split(e.logs.String(), "\n") {
		if len(l) > 600 {
			t.Fatalf("a %d-byte log line: %.200s…", len(l), l)
		}
	}
	if !strings.Contains(e.logs.String(), "…[1000 bytes]") {
		t.Fatal("long names are not marked as cut")
	}
	// The status tick reports what is left once the flood is over.
	testutil.WaitFor(t, timeout, "suppressed count reported", func() bool {
		e.advance(100 * time.Millisecond)
		return e.logs.count(`msg="log lines suppressed" kind=refused_sub`) == 1
	})
	total := e.logs.count(`msg="sub refused"`)
	for _, m := range suppressedRE.FindAllStringSubmatch(e.logs.String(), -1) {
		k, _ := strconv.Atoi(m[1])
		total += k
	}
	if total != n {
		t.Fatalf("%d lines + suppressed counts = %d, want %d\n%s", e.logs.count(`msg="sub refused"`), total, n, e.logs.String())
	}
}

// An idle worker's decoder holds no buffer: a partial frame's buffer is
// given back once the frame is complete and the worker quiet, and a large
// frame's right away.
func TestDecoderBufferReleased(t *testing.T) {
	e := newEnv(t, nil)
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	sub := frame.AppendSub(nil, "a")
	w.send(sub[:5])
	e.sync()
	held := func() (n int) {
		e.workerState(1, func(w *worker) { n = w.dec.Cap() })
		return n
	}
	if held() == 0 {
		t.Fatal("no buffer for a partial frame")
	}
	w.send(sub[5:])
	w.expect(ack("a"))
	body := `{"t":"sub","q":"big"}` + strings.Repeat(" ", 60<<10)
	w.send(rawFrame(body))
	w.expect(ack("big"))
	if n := held(); n > 4<<10 {
		t.Fatalf("decoder holds %d bytes after a 60 KiB frame", n)
	}
	e.advance(2 * defaultStatusInterval)
	e.advance(defaultStatusInterval)
	if n := held(); n != 0 {
		t.Fatalf("idle worker's decoder holds %d bytes", n)
	}
}

// Past the hub-wide budget for partial frames, a worker holding a large
// partial frame is severed; one holding a small one is not, and the
// workers within the budget complete their frames.
func TestInboundBudget(t *testing.T) {
	e := newEnv(t, nil)
	e.do(func() { e.pg.auto = true; setMaxPartialBytes(t, 100<<10) })
	body := `{"t":"sub","q":"big"}` + strings.Repeat(" ", 60<<10)
	frame := rawFrame(body)
	first, second := e.dial(), e.dial()
	small := e.dial()
	small.send(frame[:smallFrame-100])
	first.send(frame[:len(frame)-1])
	// One readiness reads at most readSize: wait until the hub holds
	// both partial frames whole, so that the second is the one past the
	// budget.
	testutil.WaitFor(t, timeout, "first's and small's partial frames read", func() bool {
		var held int
		e.do(func() { held = e.h.partial.bytes })
		return held == len(frame)-1+smallFrame-100
	})
	second.send(frame[:len(frame)-1]) // 120 KiB held with the first's
	second.eof()
	if s := e.h.Stats(); s.ProtocolErrors != 1 || s.Workers != 2 {
		t.Fatalf("stats %+v", s)
	}
	if !strings.Contains(e.logs.String(), `reason="inbound budget"`) {
		t.Fatalf("no inbound budget logged:\n%s", e.logs.String())
	}
	first.send(frame[len(frame)-1:])
	first.expect(ack("big"))
	small.send(frame[smallFrame-100:])
	small.expect(ack("big"))
	e.do(func() {
		if e.h.partial.bytes != 0 {
			t.Errorf("partial bytes %d with no partial frame", e.h.partial.bytes)
		}
	})
}

// shouldRelease: only a quiet process (few accepts, heap not growing much) whose
// heap holds more than twice what it held after the last release.
func TestShouldRelease(t *testing.T) {
	const mb = 1 << 20
	for _, c := range []struct {
		name      string
		prev, cur memSample
		live      uint64
		want      bool
	}{
		{"burst over", memSample{heap: 400 * mb, accepts: 300}, memSample{heap: 400 * mb, accepts: 300}, 2 * mb, true},
		{"still accepting", memSample{heap: 400 * mb, accepts: 300}, memSample{heap: 400 * mb, accepts: 400}, 2 * mb, false},
		{"a few accepts", memSample{heap: 400 * mb, accepts: 300}, memSample{heap: 400 * mb, accepts: 310}, 2 * mb, true},
		{"heap growing", memSample{heap: 300 * mb, accepts: 300}, memSample{heap: 400 * mb, accepts: 300}, 2 * mb, false},
		{"heap growing a little", memSample{heap: 300 * mb, accepts: 300}, memSample{heap: 310 * mb, accepts: 300}, 2 * mb, true},
		{"heap near live", memSample{heap: 40 * mb, accepts: 3}, memSample{heap: 40 * mb, accepts: 3}, 20 * mb, false},
		{"small heap", memSample{heap: 10 * mb}, memSample{heap: 10 * mb}, 1 * mb, false},
	} {
		if got := shouldRelease(c.prev, c.cur, c.live); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// With ReleaseMemory, the heap a burst of connections took (each with a
// partial frame) goes back to the OS once the burst is over.
func TestReleaseMemoryAfterBurst(t *testing.T) {
	old := memCheckEvery
	memCheckEvery = 100 * time.Millisecond
	t.Cleanup(func() { memCheckEvery = old })
	// What the tests before this one left is not this hub's to return:
	// start from a heap that holds only live data, as a fresh process does.
	debug.FreeOSMemory()
	e := newEnv(t, func(c *Config) { c.ReleaseMemory = true })
	e.do(func() { setMaxPartialBytes(t, 1<<30) })
	const burst = 1000
	body := append(rawFrame("")[:0], 0, 0, 0xff, 0xff)
	body = append(body, bytes.Repeat([]byte(" "), 60<<10)...)
	var conns []*net.UnixConn
	for range burst {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: e.path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(body); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	testutil.WaitFor(t, timeout, "every partial frame held", func() bool {
		n := 0
		e.do(func() { n = e.h.partial.bytes })
		return n >= burst*60<<10
	})
	for _, c := range conns {
		c.Close()
	}
	testutil.WaitFor(t, timeout, "memory returned", func() bool {
		return e.logs.count(`msg="memory returned to the OS"`) > 0
	})
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if idle := ms.HeapIdle - ms.HeapReleased; idle > 32<<20 {
		t.Fatalf("%d MB of free heap not returned after the release", idle>>20)
	}
}
