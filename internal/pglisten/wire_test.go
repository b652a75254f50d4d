package pglisten

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/loop"
)

// Backend message builders shared by the unit tests.

func backendMsg(typ byte, body []byte) []byte {
	m := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(m[1:], uint32(4+len(body)))
	return append(m, body...)
}

func notificationMsg(pid uint32, ch, payload string) []byte {
	b := binary.BigEndian.AppendUint32(nil, pid)
	b = append(append(b, ch...), 0)
	b = append(append(b, payload...), 0)
	return backendMsg('A', b)
}

func ccMsg(tag string) []byte { return backendMsg('C', append([]byte(tag), 0)) }
func rfqMsg() []byte          { return backendMsg('Z', []byte{'I'}) }
func emptyQueryMsg() []byte   { return backendMsg('I', nil) }

func errorFields(typ byte, severity, code, message string) []byte {
	var b []byte
	b = append(append(append(b, 'S'), severity...), 0)
	b = append(append(append(b, 'V'), severity...), 0)
	b = append(append(append(b, 'C'), code...), 0)
	b = append(append(append(b, 'M'), message...), 0)
	b = append(b, 0)
	return backendMsg(typ, b)
}

func errorMsg(severity, code, message string) []byte {
	return errorFields('E', severity, code, message)
}
func noticeMsg(message string) []byte { return errorFields('N', "NOTICE", "00000", message) }
func paramStatusMsg(name, value string) []byte {
	return backendMsg('S', append(append(append([]byte(name), 0), value...), 0))
}

func TestNextMessage(t *testing.T) {
	msg := notificationMsg(7, "chan", "payload")
	for i := 0; i < len(msg); i++ {
		_, _, n, want, err := nextMessage(msg[:i])
		if err != nil || n != 0 {
			t.Fatalf("prefix %d: n=%d err=%v, want incomplete", i, n, err)
		}
		if i >= 5 && want != len(msg) {
			t.Fatalf("prefix %d: want=%d, want %d", i, want, len(msg))
		}
	}
	typ, body, n, _, err := nextMessage(append(msg, 'Z'))
	if err != nil || typ != 'A' || n != len(msg) || len(body) != len(msg)-5 {
		t.Fatalf("whole: typ=%q n=%d body=%d err=%v", typ, n, len(body), err)
	}
	ch, payload, ok := parseNotification(body)
	if !ok || string(ch) != "chan" || string(payload) != "payload" {
		t.Fatalf("parse: %q %q %v", ch, payload, ok)
	}
	for _, l := range []uint32{0, 3, maxMessageLen + 1, 1 << 31} {
		bad := []byte{'A', 0, 0, 0, 0}
		binary.BigEndian.PutUint32(bad[1:], l)
		if _, _, _, _, err := nextMessage(bad); !errors.Is(err, errProtocol) {
			t.Errorf("length %d: err=%v, want protocol error", l, err)
		}
	}
}

func TestParseNotificationMalformed(t *testing.T) {
	for _, body := range [][]byte{nil, {0, 0, 0}, {0, 0, 0, 1, 'a'}, {0, 0, 0, 1, 'a', 0, 'b'}} {
		if _, _, ok := parseNotification(body); ok {
			t.Errorf("%q parsed", body)
		}
	}
	ch, p, ok := parseNotification([]byte{0, 0, 0, 1, 'a', 0, 0})
	if !ok || string(ch) != "a" || len(p) != 0 {
		t.Errorf("empty payload: %q %q %v", ch, p, ok)
	}
}

func TestQuoteIdentifier(t *testing.T) {
	for in, want := range map[string]string{
		`a`:                    `"a"`,
		`a"b`:                  `"a""b"`,
		`"; DROP TABLE x; --`:  `"""; DROP TABLE x; --"`,
		`""`:                   `""""""`,
		`Mixed Case.INSERT`:    `"Mixed Case.INSERT"`,
		`pgmq.q_orders.INSERT`: `"pgmq.q_orders.INSERT"`,
		"日本":                   "\"日本\"",
	} {
		if got := QuoteIdentifier(in); got != want {
			t.Errorf("QuoteIdentifier(%q) = %s, want %s", in, got, want)
		}
	}
	got := string(appendCommand(nil, true, `a"b`)) + ";" + string(appendCommand(nil, false, "c"))
	if got != `LISTEN "a""b";UNLISTEN "c"` {
		t.Errorf("commands: %s", got)
	}
}

func TestValidChannel(t *testing.T) {
	ok := []string{"a", strings.Repeat("x", 63), `"; DROP TABLE t; --`, "日本語"}
	bad := []string{"", strings.Repeat("x", 64), "a\x00b", "\xff\xfe"}
	for _, ch := range ok {
		if err := ValidChannel(ch); err != nil {
			t.Errorf("ValidChannel(%q) = %v", ch, err)
		}
	}
	for _, ch := range bad {
		if err := ValidChannel(ch); !errors.Is(err, ErrInvalidChannel) {
			t.Errorf("ValidChannel(%q) = %v, want ErrInvalidChannel", ch, err)
		}
	}
}

func TestQueryFraming(t *testing.T) {
	buf, start := beginQuery([]byte("prefix"))
	buf = append(buf, `LISTEN "a"`...)
	buf = finishQuery(buf, start)
	want := appendQuery([]byte("prefix"), []byte(`LISTEN "a"`))
	if string(buf) != string(want) {
		t.Fatalf("got %q want %q", buf, want)
	}
	if string(emptyQuery) != "Q\x00\x00\x00\x05\x00" {
		t.Fatalf("empty query %q", emptyQuery)
	}
}

func TestSettle(t *testing.T) {
	cases := []struct {
		n, cc  int
		failed bool
		v      verdict
		idx    int
	}{
		{3, 3, false, allDone, -1},
		{1, 0, true, oneFailed, 0},
		{3, 0, true, isolateOne, -1},
		{3, 1, true, oneFailed, 1},
		{3, 2, true, oneFailed, 2},
		{3, 3, true, allFailed, -1},
	}
	for _, c := range cases {
		v, idx := settle(c.n, c.cc, c.failed)
		if v != c.v || idx != c.idx {
			t.Errorf("settle(%d,%d,%v) = %d,%d want %d,%d", c.n, c.cc, c.failed, v, idx, c.v, c.idx)
		}
	}
}

func TestParseConfig(t *testing.T) {
	for _, k := range []string{"PGAPPNAME", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGSSLMODE"} {
		t.Setenv(k, "")
	}
	cfg := mustParseConfig(t, "postgres://u:secret@db.example:6543/app?sslmode=disable", "")
	if cfg.Host != "db.example" || cfg.Port != 6543 || cfg.User != "u" || cfg.Database != "app" ||
		cfg.RuntimeParams["application_name"] != DefaultApplicationName {
		t.Errorf("URL: %+v %v", cfg, cfg.RuntimeParams)
	}
	cfg = mustParseConfig(t, "host=h1 port=5999 user=v dbname=d sslmode=disable application_name=mine", "other")
	if cfg.Host != "h1" || cfg.Port != 5999 || cfg.RuntimeParams["application_name"] != "mine" {
		t.Errorf("DSN: %+v %v", cfg, cfg.RuntimeParams)
	}
	cfg = mustParseConfig(t, "host=h1 sslmode=disable", "flagname")
	if cfg.RuntimeParams["application_name"] != "flagname" {
		t.Errorf("argument: %v", cfg.RuntimeParams)
	}
	t.Setenv("PGHOST", "envhost")
	t.Setenv("PGPORT", "7777")
	t.Setenv("PGAPPNAME", "fromenv")
	t.Setenv("PGSSLMODE", "disable")
	cfg = mustParseConfig(t, "", "listenhub")
	if cfg.Host != "envhost" || cfg.Port != 7777 || cfg.RuntimeParams["application_name"] != "fromenv" {
		t.Errorf("env: %+v %v", cfg, cfg.RuntimeParams)
	}
	_, err := ParseConfig("postgres://u:hunter2@h:notaport/db", "")
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("bad URL: %v (must fail without the password)", err)
	}
}

// benchConn is a Conn that is up, with no transport: received is fed
// directly from rbuf.
func benchConn(tb testing.TB, onNote func(ch, p []byte)) *Conn {
	l, err := loop.New(loop.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	c := newConn(l, Config{OnNotification: onNote})
	c.state = stateUp
	return c
}

// TestParseAllocs checks the hot path: notifications parsed from the read
// buffer reach the callback without any allocation.
func TestParseAllocs(t *testing.T) {
	var n int
	c := benchConn(t, func(ch, p []byte) { n++ })
	var stream []byte
	for i := 0; i < 200; i++ {
		stream = append(stream, notificationMsg(1, "orders", "some payload 123")...)
	}
	stream = append(stream, paramStatusMsg("TimeZone", "UTC")...)
	copy(c.rbuf, stream)
	allocs := testing.AllocsPerRun(100, func() {
		c.rpos, c.rend = 0, len(stream)
		c.received()
	})
	if allocs != 0 {
		t.Errorf("%v allocations per 200 notifications, want 0", allocs)
	}
	if n != 101*200 {
		t.Errorf("%d notifications, want %d", n, 101*200)
	}
}

// BenchmarkParseNotifications measures the loop's read path from buffered
// bytes to the OnNotification callback, per notification.
func BenchmarkParseNotifications(b *testing.B) {
	for _, size := range []int{16, 1024, 7999} {
		b.Run(strconv.Itoa(size)+"B", func(b *testing.B) {
			var got int
			c := benchConn(b, func(ch, p []byte) { got += len(p) })
			msg := notificationMsg(1, "pgmq.q_orders.INSERT", strings.Repeat("p", size))
			per := max(1, len(c.rbuf)/len(msg))
			var stream []byte
			for i := 0; i < per; i++ {
				stream = append(stream, msg...)
			}
			copy(c.rbuf, stream)
			b.ReportAllocs()
			b.SetBytes(int64(len(msg)))
			b.ResetTimer()
			for done := 0; done < b.N; done += per {
				c.rpos, c.rend = 0, len(stream)
				c.received()
			}
		})
	}
}
