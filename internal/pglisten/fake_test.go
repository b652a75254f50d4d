package pglisten

// Tests against a scripted fake server on a socketpair: the batching, error
// and health paths, byte by byte, without Postgres.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

const fakeTimeout = 10 * time.Second

// fakeServer is the server end of one connection.
type fakeServer struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

// readMsg reads one frontend message: its type and body.
func (s *fakeServer) readMsg() (byte, []byte) {
	s.t.Helper()
	s.conn.SetReadDeadline(time.Now().Add(fakeTimeout))
	var hdr [5]byte
	if _, err := io.ReadFull(s.r, hdr[:]); err != nil {
		s.t.Fatalf("fake server: read: %v", err)
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[1:])-4)
	if _, err := io.ReadFull(s.r, body); err != nil {
		s.t.Fatalf("fake server: read body: %v", err)
	}
	return hdr[0], body
}

// readQuery reads a Query message and returns its SQL.
// serveQuery is expectQuery, then the answer that every statement of
// want succeeded.
func (s *fakeServer) serveQuery(want string) {
	s.t.Helper()
	s.expectQuery(want)
	s.answer(want)
}

// expectQuery reads the next query and fails the test unless it is want.
func (s *fakeServer) expectQuery(want string) {
	s.t.Helper()
	if sql := s.readQuery(); sql != want {
		s.t.Fatalf("query %q, want %q", sql, want)
	}
}

func (s *fakeServer) readQuery() string {
	s.t.Helper()
	typ, body := s.readMsg()
	if typ != 'Q' {
		s.t.Fatalf("fake server: got message %q, want Query", typ)
	}
	return strings.TrimSuffix(string(body), "\x00")
}

func (s *fakeServer) send(msgs ...[]byte) {
	s.t.Helper()
	var b []byte
	for _, m := range msgs {
		b = append(b, m...)
	}
	if _, err := s.conn.Write(b); err != nil {
		s.t.Fatalf("fake server: write: %v", err)
	}
}

// answer answers a batch whose every statement succeeds.
func (s *fakeServer) answer(sql string) {
	s.t.Helper()
	var msgs [][]byte
	for _, st := range strings.Split(sql, ";") {
		msgs = append(msgs, ccMsg(strings.Fields(st)[0]))
	}
	s.send(append(msgs, rfqMsg())...)
}

type note struct{ ch, payload string }

// harness runs a loop with a Conn whose every (re)connect is a new
// socketpair; the server ends arrive on servers.
type harness struct {
	t       *testing.T
	l       *loop.Loop
	c       *Conn
	servers chan *fakeServer
	dialErr func() error // when set and non-nil, reconnects fail with it

	mu     sync.Mutex
	notes  []note
	health []bool
	fatals []error    // OnFatal reports
	conns  []net.Conn // server ends, closed at cleanup
	closed bool       // cleanup ran: dials fail
}

// testLogger discards the listener's logs unless -v.
func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.Default()
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newHarness(t *testing.T, cfg Config) *harness {
	return newHarnessMode(t, cfg, false, nil)
}

func newHarnessMode(t *testing.T, cfg Config, startMode bool, dialErr func() error) *harness {
	t.Helper()
	testutil.CheckFDs(t, 5*time.Second)
	h := &harness{t: t, servers: make(chan *fakeServer, 4), dialErr: dialErr}
	l, err := loop.New(loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.l = l
	go l.Run()
	t.Cleanup(func() {
		l.Stop()
		<-l.Done()
		h.mu.Lock()
		h.closed = true
		conns := h.conns
		h.mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	cfg.OnNotification = func(ch, p []byte) {
		h.mu.Lock()
		h.notes = append(h.notes, note{string(ch), string(p)})
		h.mu.Unlock()
	}
	cfg.OnHealth = func(ok bool) {
		h.mu.Lock()
		h.health = append(h.health, ok)
		h.mu.Unlock()
	}
	cfg.OnFatal = func(err error) {
		h.mu.Lock()
		h.fatals = append(h.fatals, err)
		h.mu.Unlock()
	}
	h.c = newConn(l, cfg)
	testOf(h.c).dialer = h.dial
	testOf(h.c).noCheck = true // the scripts answer only what each test expects
	if startMode {
		h.c.start()
		return h
	}
	tr, err := h.dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.begin(tr); err != nil {
		t.Fatal(err)
	}
	return h
}

// newStartHarness is newHarness through Start: no connection yet, the first
// one is dialed on the loop (through dialErr, like a reconnect).
func newStartHarness(t *testing.T, cfg Config, dialErr func() error) *harness {
	return newHarnessMode(t, cfg, true, dialErr)
}

func (h *harness) dial(context.Context) (transport, error) {
	if h.dialErr != nil {
		if err := h.dialErr(); err != nil {
			return nil, err
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errors.New("test over")
	}
	fds, err := testutil.Socketpair(unix.SOCK_STREAM, true)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fds[1]), "fake-server")
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[0])
		return nil, err
	}
	h.conns = append(h.conns, conn)
	select {
	case h.servers <- &fakeServer{t: h.t, conn: conn, r: bufio.NewReader(conn)}:
	default: // nobody is going to read it: the test is past caring
	}
	return &fdTransport{fd: fds[0], pid: 42}, nil
}

func (h *harness) server() *fakeServer {
	h.t.Helper()
	return testutil.Recv(h.t, h.servers, fakeTimeout, "no connection from the listener")
}

// setLen is the number of channels in the connection's set.
// expectSetLen reports an error unless the connection's set has n channels.
func (h *harness) expectSetLen(n int) {
	h.t.Helper()
	if got := h.setLen(); got != n {
		h.t.Errorf("set has %d channels, want %d", got, n)
	}
}

func (h *harness) setLen() (n int) {
	h.on(func() { n = len(h.c.set) })
	return n
}

// listen issues a Listen of each of names on the loop, reporting to r.
func (h *harness) listen(r *results, names ...string) {
	h.on(func() {
		for _, n := range names {
			h.c.Listen(n, r.done(n))
		}
	})
}

// on runs f on the loop and waits for it.
func (h *harness) on(f func()) {
	h.t.Helper()
	done := make(chan struct{})
	if err := h.l.Post(func() { f(); close(done) }); err != nil {
		h.t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(fakeTimeout):
		h.t.Fatal("loop did not run the post")
	}
}

// results collects done callbacks by name.
type results struct {
	mu  sync.Mutex
	got map[string]error
	seq []string
}

func newResults() *results { return &results{got: map[string]error{}} }

func (r *results) done(name string) func(error) {
	return func(err error) {
		r.mu.Lock()
		r.got[name] = err
		r.seq = append(r.seq, name)
		r.mu.Unlock()
	}
}

func (r *results) has(name string) (error, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	err, ok := r.got[name]
	return err, ok
}

// noErrors fails t for each of names that was done with an error.
func (r *results) noErrors(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if err, _ := r.has(n); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}

func (r *results) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seq)
}

func (h *harness) notesLen() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.notes)
}

func (h *harness) healthSeq() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return fmt.Sprint(h.health)
}

// barrier sends a notification and waits for it: everything the server sent
// before has been processed by the loop.
func (h *harness) barrier(s *fakeServer) {
	h.t.Helper()
	n := h.notesLen()
	s.send(notificationMsg(1, "barrier", ""))
	testutil.WaitFor(h.t, fakeTimeout, "barrier notification", func() bool { return h.notesLen() > n })
}

func TestFakeBatchOneQuery(t *testing.T) {
	h := newHarness(t, Config{HealthCheckInterval: time.Hour})
	s := h.server()
	r := newResults()
	h.on(func() {
		h.c.Listen("a", r.done("a"))
		h.c.Listen(`we"ird;ch`, r.done("weird"))
		h.c.Unlisten("b", r.done("b"))
	})
	sql := s.readQuery()
	if want := `LISTEN "a";LISTEN "we""ird;ch";UNLISTEN "b"`; sql != want {
		t.Fatalf("query %q, want %q", sql, want)
	}
	// CommandCompletes alone do not complete anything: the ack is the
	// ReadyForQuery.
	s.send(ccMsg("LISTEN"), ccMsg("LISTEN"), ccMsg("UNLISTEN"))
	h.barrier(s)
	if n := r.count(); n != 0 {
		t.Fatalf("%d commands done before ReadyForQuery", n)
	}
	s.send(rfqMsg())
	testutil.WaitFor(t, fakeTimeout, "3 done", func() bool { return r.count() == 3 })
	r.noErrors(t, "a", "weird", "b")
	if fmt.Sprint(r.seq) != "[a weird b]" {
		t.Errorf("order %v", r.seq)
	}
	h.expectSetLen(2)
}

// TestFakeBatchError: statement 2 of 3 fails. Postgres rolled back the first
// (one implicit transaction) and skipped the third: only the second fails,
// the others are sent again, and the connection carries on.
func TestFakeBatchError(t *testing.T) {
	h := newHarness(t, Config{HealthCheckInterval: time.Hour})
	s := h.server()
	r := newResults()
	h.listen(r, "a", "b", "c")
	s.expectQuery(`LISTEN "a";LISTEN "b";LISTEN "c"`)
	// Commands issued while the batch is in flight wait for it.
	h.on(func() { h.c.Listen("d", r.done("d")) })
	s.send(ccMsg("LISTEN"), errorMsg("ERROR", "55000", "cannot listen to b"), rfqMsg())
	testutil.WaitFor(t, fakeTimeout, "b failed", func() bool { _, ok := r.has("b"); return ok })
	var pgErr *pgconn.PgError
	if err, _ := r.has("b"); !errors.As(err, &pgErr) || pgErr.Code != "55000" {
		t.Fatalf("b: %v", err)
	}
	sql := s.readQuery()
	if sql != `LISTEN "a";LISTEN "c";LISTEN "d"` {
		t.Fatalf("retry query %q", sql)
	}
	if r.count() != 1 {
		t.Fatalf("%d done before the retry was answered", r.count())
	}
	s.answer(sql)
	testutil.WaitFor(t, fakeTimeout, "all done", func() bool { return r.count() == 4 })
	r.noErrors(t, "a", "c", "d")
	h.expectSetLen(3)
}

// TestFakeBatchErrorBeforeAnyComplete: an error before the first
// CommandComplete may be the whole query's (syntax, encoding); the first
// command is retried alone to find out.
func TestFakeBatchErrorBeforeAnyComplete(t *testing.T) {
	h := newHarness(t, Config{HealthCheckInterval: time.Hour})
	s := h.server()
	r := newResults()
	h.listen(r, "a", "b", "c")
	s.readQuery()
	s.send(errorMsg("ERROR", "42601", "syntax error"), rfqMsg())
	s.serveQuery(`LISTEN "a"`)
	sql := s.readQuery()
	if sql != `LISTEN "b";LISTEN "c"` {
		t.Fatalf("rest %q", sql)
	}
	s.send(errorMsg("ERROR", "42601", "syntax error"), rfqMsg())
	s.expectQuery(`LISTEN "b"`)
	s.send(errorMsg("ERROR", "42601", "b is bad"), rfqMsg())
	s.serveQuery(`LISTEN "c"`)
	testutil.WaitFor(t, fakeTimeout, "all done", func() bool { return r.count() == 3 })
	if err, _ := r.has("a"); err != nil {
		t.Errorf("a: %v", err)
	}
	if err, _ := r.has("b"); err == nil || !strings.Contains(err.Error(), "b is bad") {
		t.Errorf("b: %v", err)
	}
	if err, _ := r.has("c"); err != nil {
		t.Errorf("c: %v", err)
	}
}

// TestFakeCommitError: an error after every statement completed comes from
// the commit: all of them failed.
func TestFakeCommitError(t *testing.T) {
	h := newHarness(t, Config{HealthCheckInterval: time.Hour})
	s := h.server()
	r := newResults()
	h.listen(r, "a", "b")
	s.readQuery()
	s.send(ccMsg("LISTEN"), ccMsg("LISTEN"), errorMsg("ERROR", "53200", "out of memory"), rfqMsg())
	testutil.WaitFor(t, fakeTimeout, "both done", func() bool { return r.count() == 2 })
	for _, n := range []string{"a", "b"} {
		if err, _ := r.has(n); err == nil {
			t.Errorf("%s succeeded", n)
		}
	}
}

func TestFakeInvalidChannel(t *testing.T) {
	h := newHarness(t, Config{HealthCheckInterval: time.Hour})
	s := h.server()
	r := newResults()
	h.on(func() {
		h.c.Listen(strings.Repeat("x", 64), r.done("long"))
		h.c.Listen("nul\x00", r.done("nul"))
		h.c.Listen("", r.done("empty"))
		h.c.Listen("ok", r.done("ok"))
	})
	s.expectQuery(`LISTEN "ok"`)
	testutil.WaitFor(t, fakeTimeout, "refusals", func() bool { return r.count() == 3 })
	for _, n := range []string{"long", "nul", "empty"} {
		if err, _ := r.has(n); !errors.Is(err, ErrInvalidChannel) {
			t.Errorf("%s: %v", n, err)
		}
	}
}

// TestFakeStream feeds notifications (a 7,999-byte one among them), notices
// and parameter statuses in chunks of every size from 1 byte up, and all at
// once.
func TestFakeStream(t *testing.T) {
	h := newHarness(t, Config{HealthCheckInterval: time.Hour})
	s := h.server()
	var stream []byte
	var want []note
	big := strings.Repeat("é", 3999) + "x" // 7,999 bytes
	for i := 0; i < 300; i++ {
		p := fmt.Sprintf("payload-%d", i)
		switch i % 50 {
		case 7:
			p = big
		case 8:
			p = ""
		case 9:
			stream = append(stream, noticeMsg("hello")...)
		case 10:
			stream = append(stream, paramStatusMsg("application_name", "x")...)
		}
		ch := fmt.Sprintf("ch%d", i%7)
		stream = append(stream, notificationMsg(uint32(i), ch, p)...)
		want = append(want, note{ch, p})
	}
	for _, chunk := range []int{1, 2, 3, 5, 7, 64, 1000, 4096, len(stream)} {
		h.mu.Lock()
		h.notes = nil
		h.mu.Unlock()
		for off := 0; off < len(stream); off += chunk {
			s.send(stream[off:min(off+chunk, len(stream))])
		}
		testutil.WaitFor(t, fakeTimeout, "all notifications", func() bool { return h.notesLen() >= len(want) })
		h.mu.Lock()
		got := h.notes
		h.mu.Unlock()
		if len(got) != len(want) {
			t.Fatalf("chunk %d: %d notifications, want %d", chunk, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("chunk %d: notification %d = %.40q, want %.40q", chunk, i, got[i], want[i])
			}
		}
	}
}

// TestFakeHealthProbe: an idle connection is probed with an empty query; an
// answered probe keeps it; an unanswered one kills it, and the reconnect
// re-LISTENs the set in one query before reporting healthy.
func TestFakeHealthProbe(t *testing.T) {
	h := newHarness(t, Config{HealthCheckInterval: 50 * time.Millisecond, HealthCheckTimeout: 200 * time.Millisecond,
		ReconnectMin: time.Millisecond, ReconnectMax: 5 * time.Millisecond})
	s := h.server()
	r := newResults()
	h.listen(r, "a", "b")
	s.answer(s.readQuery())
	testutil.WaitFor(t, fakeTimeout, "listens", func() bool { return r.count() == 2 })
	for i := 0; i < 3; i++ {
		s.expectQuery("")
		s.send(emptyQueryMsg(), rfqMsg())
	}
	start := time.Now()
	s.expectQuery("") // not answered
	// Meanwhile a command waits for the new connection.
	h.on(func() { h.c.Listen("c", r.done("c")) })
	s2 := h.server()
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("declared dead after %v, before the 200ms deadline", d)
	}
	if got := h.healthSeq(); got != "[true false]" {
		t.Errorf("health %s", got)
	}
	sql := s2.readQuery()
	if sql != `LISTEN "a";LISTEN "b";LISTEN "c"` && sql != `LISTEN "b";LISTEN "a";LISTEN "c"` {
		t.Fatalf("resync %q", sql)
	}
	s2.answer(sql)
	testutil.WaitFor(t, fakeTimeout, "healthy again", func() bool { return h.healthSeq() == "[true false true]" })
	testutil.WaitFor(t, fakeTimeout, "c done", func() bool { return r.count() == 3 })
	// Busy connections are never probed: traffic counts as an answer.
	var before, after int
	h.on(func() { before = testOf(h.c).probes })
	for i := 0; i < 10; i++ {
		s2.send(notificationMsg(1, "a", "x"))
		time.Sleep(20 * time.Millisecond) // pacing the fake server's traffic, not waiting for a result
	}
	h.on(func() { after = testOf(h.c).probes })
	if after != before {
		t.Errorf("%d probes sent on a busy connection", after-before)
	}
}

// TestFakeEOF: the server hanging up (after FATAL) is a loss; commands in
// flight are sent again on the new connection, and commands issued while down
// fail after CommandTimeout when no connection comes.
func TestFakeEOF(t *testing.T) {
	var mu sync.Mutex
	refuse := false
	h := newHarness(t, Config{HealthCheckInterval: time.Hour, CommandTimeout: 100 * time.Millisecond,
		ReconnectMin: time.Millisecond, ReconnectMax: 20 * time.Millisecond})
	h.dialErr = func() error {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			return errors.New("connection refused")
		}
		return nil
	}
	s := h.server()
	r := newResults()
	h.on(func() { h.c.Listen("a", r.done("a")) })
	s.readQuery()
	s.send(errorMsg("FATAL", "57P01", "terminating connection due to administrator command"))
	s.conn.Close()
	s2 := h.server()
	s2.serveQuery(`LISTEN "a"`)
	testutil.WaitFor(t, fakeTimeout, "a done", func() bool { return r.count() == 1 })
	if err, _ := r.has("a"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, fakeTimeout, "healthy", func() bool { return h.healthSeq() == "[true false true]" })

	mu.Lock()
	refuse = true
	mu.Unlock()
	s2.conn.Close()
	testutil.WaitFor(t, fakeTimeout, "unhealthy", func() bool { return h.healthSeq() == "[true false true false]" })
	h.on(func() { h.c.Listen("b", r.done("b")) })
	testutil.WaitFor(t, fakeTimeout, "b timed out", func() bool { _, ok := r.has("b"); return ok })
	if err, _ := r.has("b"); !errors.Is(err, ErrCommandTimeout) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("b: %v", err)
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	s3 := h.server()
	s3.serveQuery(`LISTEN "a"`)
	testutil.WaitFor(t, fakeTimeout, "healthy", func() bool { return h.healthSeq() == "[true false true false true]" })
}

func TestFakeClose(t *testing.T) {
	h := newHarness(t, Config{HealthCheckInterval: time.Hour})
	s := h.server()
	r := newResults()
	h.on(func() { h.c.Listen("a", r.done("a")) })
	s.answer(s.readQuery())
	testutil.WaitFor(t, fakeTimeout, "a", func() bool { return r.count() == 1 })
	closed := make(chan struct{})
	h.on(func() {
		h.c.Listen("late", r.done("late")) // pending: fails with ErrClosed
		h.c.Close(func() { close(closed) })
		h.c.Listen("after", r.done("after"))
	})
	s.expectQuery("UNLISTEN *")
	if typ, _ := s.readMsg(); typ != 'X' {
		t.Fatalf("message %q, want Terminate", typ)
	}
	s.send(ccMsg("UNLISTEN"), rfqMsg())
	testutil.WaitClosed(t, closed, fakeTimeout, "Close did not finish")
	for _, n := range []string{"late", "after"} {
		if err, _ := r.has(n); !errors.Is(err, ErrClosed) {
			t.Errorf("%s: %v", n, err)
		}
	}
	s.conn.SetReadDeadline(time.Now().Add(fakeTimeout))
	if _, err := s.r.ReadByte(); err != io.EOF {
		t.Errorf("after close: %v, want EOF", err)
	}
}

// TestFakeListenFromLateHook: a Listen issued by an AfterIteration hook that
// runs after the Conn's own flush still goes out promptly (the loop must not
// sleep with the batch unsent).
func TestFakeListenFromLateHook(t *testing.T) {
	h := newHarness(t, Config{HealthCheckInterval: time.Hour})
	s := h.server()
	r := newResults()
	trigger := false
	h.on(func() {
		h.l.AfterIteration(func() {
			if trigger {
				trigger = false
				h.c.Listen("late", r.done("late"))
			}
		})
	})
	h.on(func() { trigger = true })
	s.serveQuery(`LISTEN "late"`)
	testutil.WaitFor(t, fakeTimeout, "late done", func() bool { return r.count() == 1 })
}

// TestFakeCloseWithBatchInFlight: Close while a batch is unanswered fails the
// batch with ErrClosed, and the batch's ReadyForQuery is not mistaken for the
// close query's.
func TestFakeCloseWithBatchInFlight(t *testing.T) {
	h := newHarness(t, Config{HealthCheckInterval: time.Hour, HealthCheckTimeout: time.Hour})
	s := h.server()
	r := newResults()
	h.on(func() { h.c.Listen("a", r.done("a")) })
	s.readQuery()
	closed := make(chan struct{})
	h.on(func() { h.c.Close(func() { close(closed) }) })
	if err, _ := r.has("a"); !errors.Is(err, ErrClosed) {
		t.Fatalf("a: %v", err)
	}
	s.expectQuery("UNLISTEN *")
	s.send(ccMsg("LISTEN"), rfqMsg())
	var state connState
	testutil.WaitFor(t, fakeTimeout, "the batch's ReadyForQuery processed", func() bool {
		var n int
		h.on(func() { state, n = h.c.state, len(h.c.inflight) })
		return n == 1 || state == stateClosed
	})
	if state != stateClosing {
		t.Fatalf("state %v after the batch's ReadyForQuery, want closing", state)
	}
	s.send(ccMsg("UNLISTEN"), rfqMsg())
	testutil.WaitClosed(t, closed, fakeTimeout, "Close did not finish")
}

// TestFakeBigBatch: a batch bigger than the socket buffer is written in part,
// the rest buffered and sent as the socket drains (Writable armed only
// meanwhile); a batch over maxBatchBytes is split in two queries.
func TestFakeBigBatch(t *testing.T) {
	h := newHarness(t, Config{HealthCheckInterval: time.Hour})
	s := h.server()
	r := newResults()
	const n = 5000
	name := func(i int) string { return fmt.Sprintf("%s_%05d", strings.Repeat("c", 50), i) }
	h.on(func() {
		for i := 0; i < n; i++ {
			h.c.Listen(name(i), r.done(name(i)))
		}
	})
	var buffered int
	h.on(func() { buffered = len(h.c.tr.(*fdTransport).out) })
	if buffered == 0 {
		t.Log("the whole batch fit in the socket buffer; buffering path not exercised")
	}
	got := 0
	for got < n {
		sql := s.readQuery()
		if len(sql) > maxBatchBytes+200 {
			t.Fatalf("batch of %d bytes", len(sql))
		}
		stmts := strings.Split(sql, ";")
		for j, st := range stmts {
			if want := `LISTEN "` + name(got+j) + `"`; st != want {
				t.Fatalf("statement %d: %q, want %q", got+j, st, want)
			}
		}
		got += len(stmts)
		s.answer(sql)
	}
	testutil.WaitFor(t, fakeTimeout, "all done", func() bool { return r.count() == n })
	var out int
	h.on(func() { out = len(h.c.tr.(*fdTransport).out) })
	if out != 0 {
		t.Errorf("%d bytes still buffered", out)
	}
	t.Logf("%d bytes were buffered after the first write; %d batches", buffered, testOf(h.c).batches)
}

// lockedBuffer is a log destination the loop writes and a test reads.
type lockedBuffer = testutil.SyncBuffer

// TestFakeFailedCommandLoggedOnce: a failed command with a done callback is
// its owner's to log (the hub logs it rate-limited), so the Conn writes no
// line per command for it; one nobody waits for is logged here, since
// nobody else will.
func TestFakeFailedCommandLoggedOnce(t *testing.T) {
	var logs lockedBuffer
	h := newHarness(t, Config{HealthCheckInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	s := h.server()
	r := newResults()
	h.on(func() {
		h.c.Listen("a", r.done("a"))
		h.c.Listen("b", r.done("b"))
		h.c.Unlisten("c", nil)
	})
	s.readQuery()
	s.send(ccMsg("LISTEN"), ccMsg("LISTEN"), ccMsg("UNLISTEN"), errorMsg("ERROR", "53200", "out of memory"), rfqMsg())
	testutil.WaitFor(t, fakeTimeout, "the owner's commands done", func() bool { return r.count() == 2 })
	testutil.WaitFor(t, fakeTimeout, "the ownerless command logged", func() bool {
		return strings.Contains(logs.String(), "command failed")
	})
	h.on(func() {}) // the batch's callbacks and log lines are all out
	var failed []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "command failed") {
			failed = append(failed, l)
		}
	}
	if len(failed) != 1 || !strings.Contains(failed[0], "q=c") || !strings.Contains(failed[0], "out of memory") {
		t.Fatalf("logged %q, want one line for c (a and b are their owner's to log)", failed)
	}
	for _, n := range []string{"a", "b"} {
		if err, _ := r.has(n); err == nil {
			t.Errorf("%s succeeded", n)
		}
	}
}

// sameIterationTransport answers every probe (the empty query) at once,
// from a post: the answer is fed in the very loop iteration that sent the
// probe, as the TLS bridge's reader can when the server is quick (its post
// runs after the timers that sent the probe, at the same loop time).
type sameIterationTransport struct {
	c   *Conn
	gen uint64
}

func (s *sameIterationTransport) start(c *Conn, gen uint64) error { s.c, s.gen = c, gen; return nil }
func (s *sameIterationTransport) write(b []byte) error {
	if string(b) == string(emptyQuery) {
		answer := append(emptyQueryMsg(), rfqMsg()...)
		return s.c.l.Post(func() { (&bridge{c: s.c, gen: s.gen}).feed(answer) })
	}
	return nil
}
func (s *sameIterationTransport) close()             {}
func (s *sameIterationTransport) discard()           {}
func (s *sameIterationTransport) backendPID() uint32 { return 42 }
func (s *sameIterationTransport) isTLS() bool        { return true }

// TestFakeProbeAnsweredInSameIteration: a probe answered within the loop
// iteration that sent it counts as answered (the answer and the probe have
// the same loop time); the connection stays healthy.
func TestFakeProbeAnsweredInSameIteration(t *testing.T) {
	l, err := loop.New(loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	go l.Run()
	t.Cleanup(func() { l.Stop(); <-l.Done() })
	var mu sync.Mutex
	var health []bool
	c := newConn(l, Config{HealthCheckInterval: 5 * time.Millisecond, HealthCheckTimeout: 100 * time.Millisecond,
		Logger: testLogger(), OnNotification: func(ch, p []byte) {},
		OnHealth: func(ok bool) { mu.Lock(); health = append(health, ok); mu.Unlock() }})
	testOf(c).noCheck = true
	testOf(c).dialer = func(context.Context) (transport, error) { return nil, errors.New("no second connection in this test") }
	if err := c.begin(&sameIterationTransport{}); err != nil {
		t.Fatal(err)
	}
	probes := func() (n int) {
		done := make(chan struct{})
		l.Post(func() { n = testOf(c).probes; close(done) })
		<-done
		return n
	}
	testutil.WaitFor(t, fakeTimeout, "60 probes", func() bool { return probes() >= 60 })
	mu.Lock()
	defer mu.Unlock()
	if len(health) != 1 || !health[0] {
		t.Fatalf("health reports %v over 60 probes answered at once, want [true]", health)
	}
}
