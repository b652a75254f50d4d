package hub

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
)

// A worker that floods refused subs and never reads its nacks is paused,
// not evicted: the hub holds at most answerPause and one read's answers
// for it, its sibling is served meanwhile, and once it reads, it gets every
// nack and is read again.
func TestAnswersBackpressure(t *testing.T) {
	e := newEnv(t, nil)
	flood, sib := e.dial(), e.dial()
	sib.sub("s")
	e.complete("LISTEN", "s", nil)
	sib.expect(ack("s"))

	const n = 20000
	bad := strings.Repeat("b", 64) // one byte too long: nacked from the loop
	var subs []byte
	for range n {
		subs = frame.AppendSub(subs, bad)
	}
	wrote := make(chan error, 1)
	go func() {
		flood.c.SetWriteDeadline(time.Now().Add(time.Minute))
		_, err := flood.c.Write(subs)
		wrote <- err
	}()
	testutil.WaitFor(t, timeout, "the flooder paused", func() bool { return e.h.Stats().ReadsPaused == 1 })
	e.sync()
	s := e.h.Stats()
	// One 4 KiB read of 64-byte names is 46 subs, about 6 KiB of nacks.
	if bound := int64(answerPause + 16<<10); s.OutboundBytes > bound {
		t.Fatalf("hub holds %d bytes for a worker that reads nothing, want at most %d", s.OutboundBytes, bound)
	}
	if s.Evictions != 0 || s.Workers != 2 {
		t.Fatalf("stats %+v: the flooder must be paused, not evicted", s)
	}
	// Still paused: no more of its input is read.
	nacks := s.Nacks
	e.sync()
	if got := e.h.Stats().Nacks; got != nacks {
		t.Fatalf("a paused worker's subs were read: %d nacks, then %d", nacks, got)
	}
	e.notify("s", "1")
	sib.expect(wake("s", ptr("1")))

	for i := range n {
		m, err := flood.read(timeout)
		if err != nil || m.Type != "nack" || m.Name != bad {
			t.Fatalf("answer %d: %+v, %v", i, m, err)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatalf("flooder's write: %v", err)
	}
	testutil.WaitFor(t, timeout, "the flooder read again", func() bool { return e.h.Stats().ReadsPaused == 0 })
	flood.sub("ok")
	e.complete("LISTEN", "ok", nil)
	flood.expect(ack("ok"))
	if s := e.h.Stats(); s.ReadPauses == 0 || s.Evictions != 0 || s.Nacks != n {
		t.Fatalf("stats %+v", s)
	}
	testutil.WaitFor(t, timeout, "nothing held", func() bool { return e.h.Stats().OutboundBytes == 0 })
}

// A paused worker's partial frame is not on the frame clock: the frame is
// incomplete because the hub stopped reading.
func TestPausedWorkerKeepsItsPartialFrame(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.FrameTimeout = 200 * time.Millisecond })
	w := e.dial()
	bad := strings.Repeat("b", 64)
	var subs []byte
	n := 0
	for len(subs) < 4*answerPause {
		subs = frame.AppendSub(subs, bad)
		n++
	}
	cut := frame.AppendSub(nil, "cut")
	subs = append(subs, cut[:8]...) // a partial frame last
	wrote := make(chan error, 1)
	go func() { _, err := w.c.Write(subs); wrote <- err }()
	testutil.WaitFor(t, timeout, "paused", func() bool { return e.h.Stats().ReadsPaused == 1 })
	// The fake clock drives the status timer only; the frame timer is
	// the loop's own. Five timeouts pass.
	time.Sleep(time.Second)
	e.sync()
	if s := e.h.Stats(); s.Workers != 1 || s.ProtocolErrors != 0 {
		t.Fatalf("stats %+v: a paused worker was severed", s)
	}
	// Read, it is read again, and the frame it held completes (under a
	// long timeout now: the machine may be slow to read n answers).
	if err := e.h.SetLive(context.Background(), Live{FrameTimeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if m, err := w.read(timeout); err != nil || m.Type != "nack" || m.Name != bad {
			t.Fatalf("answer %d: %+v, %v", i, m, err)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write: %v", err)
	}
	e.do(func() { e.pg.auto = true })
	if _, err := w.c.Write(cut[8:]); err != nil {
		t.Fatal(err)
	}
	w.expect(ack("cut"))
}

// The outbound budget: past MaxOutboundBytes the worker holding the most
// unsent bytes is evicted, whichever worker's frame crossed the line; a
// wedged worker with a small backlog and a reading sibling keep theirs.
func TestOutboundBudgetEvictsLargest(t *testing.T) {
	const budget = 1 << 20
	e := budgetEnv(t, budget, budget)
	big, small, sib := e.dial(), e.dial(), e.dial()
	big.subscribe("big")
	small.subscribe("small")
	sib.subscribe("s")
	held := e.held
	payload := strings.Repeat("p", 7000)
	sentSmall := 0
	// small falls 100 KB behind, big 850 KB (each past what its socket
	// took): 950 KB of the 1 MiB.
	for i := 0; held(2) < 100<<10; i++ {
		if i > 1000 {
			t.Fatal("small never fell behind")
		}
		e.notify("small", payload)
		sentSmall++
	}
	for i := 0; held(1) < 850<<10; i++ {
		if i > 1000 {
			t.Fatal("big never fell behind")
		}
		e.notify("big", payload)
	}
	if s := e.h.Stats(); s.Evictions != 0 {
		t.Fatalf("evicted under the budget: %+v", s)
	}
	// small's wakes cross the budget: big, which holds the most, pays.
	for i := 0; e.h.Stats().Evictions == 0; i++ {
		if i > 100 {
			t.Fatalf("never evicted; hub holds %d of %d", e.h.Stats().OutboundBytes, budget)
		}
		e.notify("small", payload)
		sentSmall++
	}
	big.c.SetReadDeadline(time.Now().Add(timeout))
	if _, err := copyAll(big.c); err != nil {
		t.Fatalf("big not closed: %v", err)
	}
	// The close is seen before the iteration that made it has published
	// its figures: wait for that iteration to end.
	e.sync()
	if s := e.h.Stats(); s.Evictions != 1 || s.Workers != 2 || s.OutboundBytes > budget {
		t.Fatalf("stats %+v", s)
	}
	if e.logs.count(`limit=max-outbound-bytes`) != 1 {
		t.Fatalf("eviction not logged with its limit:\n%s", e.logs.String())
	}
	e.notify("s", "1")
	sib.expect(wake("s", ptr("1")))
	// small is served: everything it was sent arrives.
	go e.notify("small", "last")
	got := 0
	small.readUntilLast(func(m frame.Message) {
		if m.Type == "wake" && m.Payload == payload {
			got++
		}
	})
	if got != sentSmall {
		t.Fatalf("small got %d of the %d wakes it was sent", got, sentSmall)
	}
}

// budgetEnv is a hub with a byte cap of hard per worker (and no frame cap
// to speak of), an outbound budget of budget, and every LISTEN answered.
func budgetEnv(t *testing.T, hard, budget int) *env {
	e := newEnv(t, func(c *Config) {
		c.HardQueueBytes = hard
		c.HardQueueLimit = 1 << 20
		c.MaxOutboundBytes = budget
	})
	e.do(func() { e.pg.auto = true })
	return e
}

// copyAll reads c to EOF (or a reset) and returns the bytes read.
func copyAll(c net.Conn) (int, error) {
	buf := make([]byte, 64<<10)
	total := 0
	for {
		n, err := c.Read(buf)
		total += n
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
				return total, nil
			}
			return total, err
		}
	}
}

func TestDefaultMaxOutboundBytes(t *testing.T) {
	for _, c := range []struct {
		mem  uint64
		want int
	}{
		{0, 64 << 20},
		{256 << 20, 64 << 20},
		{2 << 30, 256 << 20},
		{64 << 30, 4 << 30},
	} {
		if got := outboundFor(c.mem); got != c.want {
			t.Errorf("outboundFor(%d) = %d, want %d", c.mem, got, c.want)
		}
	}
	if d := defaultMaxOutboundBytes(); d < 64<<20 || d > 4<<30 {
		t.Fatalf("defaultMaxOutboundBytes() = %d", d)
	}
	if _, err := New(Config{SocketPath: "x", HardQueueBytes: 1 << 20, MaxOutboundBytes: 1 << 19}); err == nil {
		t.Fatal("a budget below HardQueueBytes was accepted")
	}
	// The default is never below HardQueueBytes (above the largest
	// default here): a large hard cap alone is not an error.
	h, err := New(Config{SocketPath: "x", HardQueueBytes: 5 << 30})
	if err != nil {
		t.Fatalf("HardQueueBytes 5 GiB with the default budget: %v", err)
	}
	if h.cfg.MaxOutboundBytes != 5<<30 {
		t.Fatalf("default budget %d under HardQueueBytes 5 GiB", h.cfg.MaxOutboundBytes)
	}
}

// A durable wake that would cross the budget for the worker that holds the
// most is dropped (counted), never a reason to evict it (rule 4).
func TestOutboundBudgetDropsDurable(t *testing.T) {
	const budget = 1 << 20
	e := budgetEnv(t, budget, budget)
	w := e.dial()
	names := []string{"e"}
	for i := range 40 {
		names = append(names, "d"+strconv.Itoa(i))
	}
	for _, q := range names {
		w.sub(q)
		w.expect(ack(q))
	}
	payload := strings.Repeat("p", 7000)
	for i := 0; ; i++ {
		var held int
		e.do(func() { held = e.h.out.bytes })
		if held+2*7100 > budget {
			break
		}
		if i > 1000 {
			t.Fatal("never filled")
		}
		e.notify("e", payload)
	}
	for i := 0; ; i++ { // then to within 800 bytes of it
		var held int
		e.do(func() { held = e.h.out.bytes })
		if held+200 > budget-800 {
			break
		}
		if i > 1000 {
			t.Fatal("never filled")
		}
		e.notify("e", payload[:100])
	}
	for _, q := range names[1:] { // 40 of about 40 bytes
		e.notify(q, "") // durable
	}
	s := e.h.Stats()
	if s.Evictions != 0 || s.Workers != 1 || s.DurableDropped == 0 {
		t.Fatalf("stats %+v: want durable wakes dropped, nobody evicted", s)
	}
	if s.OutboundBytes > budget {
		t.Fatalf("hub holds %d, budget %d", s.OutboundBytes, budget)
	}
}

// A budget lowered by SetLive below what the hub holds is enforced at once,
// at the end of that iteration, as the budget always is: the worker holding
// the most is evicted, the one that then fits keeps its backlog.
func TestSetLiveLowersBudget(t *testing.T) {
	const hard = 512 << 10
	e := budgetEnv(t, hard, 4*hard)
	big, small := e.dial(), e.dial()
	big.subscribe("big")
	small.subscribe("small")
	held := e.held
	payload := strings.Repeat("p", 7000)
	for _, x := range []struct {
		id   uint64
		q    string
		want int
	}{{1, "big", 400 << 10}, {2, "small", 200 << 10}} {
		for i := 0; held(x.id) < x.want; i++ {
			if i > 1000 {
				t.Fatalf("%s never fell behind", x.q)
			}
			e.notify(x.q, payload)
		}
	}
	if s := e.h.Stats(); s.Evictions != 0 {
		t.Fatalf("evicted under the budget: %+v", s)
	}
	if err := e.h.SetLive(context.Background(), Live{HardQueueBytes: hard, HardQueueLimit: 1 << 20, MaxOutboundBytes: hard}); err != nil {
		t.Fatal(err)
	}
	big.c.SetReadDeadline(time.Now().Add(timeout))
	if _, err := copyAll(big.c); err != nil {
		t.Fatalf("big not closed: %v", err)
	}
	// The close is seen before the iteration that made it has published
	// its figures: wait for that iteration to end.
	e.sync()
	if s := e.h.Stats(); s.Evictions != 1 || s.Workers != 1 || s.OutboundBytes > hard || held(2) < 200<<10 {
		t.Fatalf("stats %+v, small holds %d", s, held(2))
	}
}

// held is the bytes queued on worker id's ring.
func (e *env) held(id uint64) (n int) {
	e.workerState(id, func(w *worker) { n = w.out.Len() })
	return n
}
