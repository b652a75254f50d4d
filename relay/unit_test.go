package relay

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/histogram"
	"github.com/listenhub/listenhub/latency"
)

func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestParseTemplate(t *testing.T) {
	for _, c := range []struct {
		tmpl, schema, table string
		o                   op
		want                string
	}{
		{"{schema}.{table}.{op}", "pgmq", "q_jobs", opInsert, "pgmq.q_jobs.INSERT"},
		{"wake_{table}", "s", "t", opTruncate, "wake_t"},
		{"{table}:{op}:{op}", "s", "t", opDelete, "t:DELETE:DELETE"},
	} {
		tm, err := ParseTemplate(c.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		if got := tm.channel(c.schema, c.table, c.o); got != c.want {
			t.Errorf("%q: %q, want %q", c.tmpl, got, c.want)
		}
	}
	for _, bad := range []string{"", "{schema", "{tabel}", "x}", "{}"} {
		if _, err := ParseTemplate(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseOps(t *testing.T) {
	for in, want := range map[string]Ops{
		"insert":               OpInsert,
		"INSERT, truncate":     OpInsert | OpTruncate,
		"all":                  OpInsert | OpUpdate | OpDelete | OpTruncate,
		"update,delete,update": OpUpdate | OpDelete,
	} {
		got, err := ParseOps(in)
		if err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
		if back, _ := ParseOps(got.String()); back != got {
			t.Errorf("%q: String %q does not parse back", in, got.String())
		}
	}
	for _, bad := range []string{"", "upsert", "insert,nope", ","} {
		if _, err := ParseOps(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestTextArray(t *testing.T) {
	got := string(textArray([]string{`a.b`, `q"x`, `back\slash`, `sp ace`}))
	if want := `{"a.b","q\"x","back\\slash","sp ace"}`; got != want {
		t.Errorf("%s, want %s", got, want)
	}
}

func TestLSN(t *testing.T) {
	lsn := uint64(0x16)<<32 | 0xB374D848
	if s := formatLSN(lsn); s != "16/B374D848" {
		t.Errorf("formatLSN: %s", s)
	}
	if v, err := parseLSN("16/B374D848"); err != nil || v != lsn {
		t.Errorf("parseLSN: %x %v", v, err)
	}
}

// stream is a synthetic walsender stream: CopyData messages as the
// reader gets them.
type stream struct{ bytes.Buffer }

func (s *stream) copyData(payload []byte) {
	s.WriteByte('d')
	binary.Write(&s.Buffer, binary.BigEndian, uint32(4+len(payload)))
	s.Write(payload)
}

func (s *stream) xlog(msg []byte) {
	p := append([]byte{'w'}, make([]byte, 24)...)
	s.copyData(append(p, msg...))
}

func (s *stream) relation(id uint32, schema, name string) {
	m := binary.BigEndian.AppendUint32([]byte{'R'}, id)
	m = append(append(m, schema...), 0)
	m = append(append(m, name...), 0)
	m = append(m, 'd', 0, 0) // replica identity, no columns
	s.xlog(m)
}

func (s *stream) tx(xid uint32, end uint64, rel uint32, rows int, row []byte) {
	b := binary.BigEndian.AppendUint64([]byte{'B'}, end)
	b = binary.BigEndian.AppendUint64(b, 0)
	s.xlog(binary.BigEndian.AppendUint32(b, xid))
	for i := 0; i < rows; i++ {
		m := binary.BigEndian.AppendUint32([]byte{'I'}, rel)
		s.xlog(append(append(m, 'N'), row...))
	}
	c := []byte{'C', 0}
	c = binary.BigEndian.AppendUint64(c, end-1)
	c = binary.BigEndian.AppendUint64(c, end)
	s.xlog(binary.BigEndian.AppendUint64(c, 0))
}

// fakeConn is a net.Conn reading a fixed stream.
type fakeConn struct {
	net.Conn
	r io.Reader
}

func (c fakeConn) Read(p []byte) (int, error)      { return c.r.Read(p) }
func (c fakeConn) SetReadDeadline(time.Time) error { return nil }
func (c fakeConn) Close() error                    { return nil }

func newTestRelay(t testing.TB, ops Ops) *Relay {
	r, err := New(Options{ConnConfig: nil})
	if err == nil {
		t.Fatal("New without ConnConfig")
	}
	tm, _ := ParseTemplate(defaultChannelTemplate)
	o, _ := Options{Ops: ops}.withDefaults()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r = &Relay{opts: o, tmpl: tm, log: o.Logger, hist: histogram.New(commitToNotifyBounds), decodeHist: histogram.New(commitToNotifyBounds)}
	return r
}

// TestReaderDecodes runs the reader over a synthetic stream: one event
// per transaction, its channels distinct, changes counted, a Relation
// message after "DDL" renaming the channel.
func TestReaderDecodes(t *testing.T) {
	var st stream
	st.relation(1, "pgmq", "q_a")
	st.relation(2, "pgmq", "q_b")
	st.tx(100, 1000, 1, 3, []byte("row"))
	st.tx(101, 2000, 2, 1, []byte("row"))
	st.relation(1, "pgmq", "q_renamed")
	st.tx(102, 3000, 1, 2, []byte("row"))
	r := newTestRelay(t, OpInsert)
	s := &session{r: r, rc: fakeConn{r: &st}}
	s.mr = newMsgReader(s.rc)
	events := make(chan event, 10)
	err := s.read(t.Context(), events)
	if err != io.EOF {
		t.Fatalf("read: %v, want EOF at the end of the stream", err)
	}
	close(events)
	var got []string
	for ev := range events {
		got = append(got, strings.Join(ev.chans, "+")+":"+string(rune('0'+ev.changes)))
	}
	want := []string{"pgmq.q_a.INSERT:3", "pgmq.q_b.INSERT:1", "pgmq.q_renamed.INSERT:2"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("events %q, want %q", got, want)
	}
}

// BenchmarkReaderInsert decodes transactions of 100 inserts of 200-byte
// rows: the cost per change, and no allocation per change (the tuple is
// never read).
func BenchmarkReaderInsert(b *testing.B) {
	var st stream
	st.relation(1, "pgmq", "q_jobs")
	row := bytes.Repeat([]byte("x"), 200)
	const perTx = 100
	for i := 0; i < 100; i++ {
		st.tx(uint32(1000+i), uint64(1000*(i+1)), 1, perTx, row)
	}
	data := st.Bytes()
	r := newTestRelay(b, OpInsert)
	events := make(chan event, 200)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := &session{r: r, rc: fakeConn{r: bytes.NewReader(data)}}
		s.mr = newMsgReader(s.rc)
		s.read(b.Context(), events)
		for len(events) > 0 {
			<-events
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100*perTx), "ns/change")
}

// TestCommitToNotifyBoundsMinutes: a delay of a minute (a stalled relay
// until wal_sender_timeout) lands in a bucket of its own size, not in a
// 10 s top bucket.
func TestCommitToNotifyBoundsMinutes(t *testing.T) {
	b := commitToNotifyBounds
	if last := b[len(b)-1]; last < time.Hour {
		t.Fatalf("the top bucket is %v, want at least an hour", last)
	}
	h := latency.Histogram{Bounds: b, Counts: make([]uint64, len(b)), Count: 10}
	for i, bound := range b {
		if bound >= 57*time.Second {
			h.Counts[i] = 10 // ten delays of 57 s
		}
	}
	if p := h.Quantile(0.99); p != time.Minute {
		t.Errorf("p99 of 57 s delays: %v, want 1m0s", p)
	}
}

// A slot found past the position this relay confirmed last moved without
// it: logged, and a resync owed. At or before it, or with nothing
// confirmed by this relay (a start, after standing by), nothing is said.
func TestMovedSlot(t *testing.T) {
	for _, c := range []struct {
		own   uint64
		slot  string
		moved bool
	}{
		{0x1_00000100, "1/200", true},
		{0x1_00000100, "1/100", false},
		{0x1_00000100, "0/FFFFFFFF", false},
		{0, "5/0", false},
		{0x100, "", false},
	} {
		var buf bytes.Buffer
		r := &Relay{opts: Options{Slot: "s"}, log: slog.New(slog.NewTextHandler(&buf, nil)), ownConfirmed: c.own}
		s := &session{r: r, confirmedLSN: c.slot}
		s.movedSlot()
		if got := r.resyncOwed.Load(); got != c.moved {
			t.Errorf("own %X, slot %q: resync owed %v, want %v", c.own, c.slot, got, c.moved)
		}
		if logged := strings.Contains(buf.String(), "the slot moved past what this relay confirmed"); logged != c.moved {
			t.Errorf("own %X, slot %q: logged %v, want %v: %s", c.own, c.slot, logged, c.moved, buf.String())
		}
	}
}
