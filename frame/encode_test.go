package frame

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/quick"

	"github.com/listenhub/listenhub/internal/jsonstr"
)

// The exact frames a pgbus worker and hub exchange. The header of the first
// is 00 00 00 16: the 22 bytes of {"t":"sub","q":"chat"}.
func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		name  string
		frame []byte
		body  string
		msg   Message
	}{
		{"sub", AppendSub(nil, "chat"), `{"t":"sub","q":"chat"}`, Message{Type: "sub", Name: "chat"}},
		{"unsub", AppendUnsub(nil, "chat"), `{"t":"unsub","q":"chat"}`, Message{Type: "unsub", Name: "chat"}},
		{"ack", AppendAck(nil, "chat"), `{"t":"ack","q":"chat"}`, Message{Type: "ack", Name: "chat"}},
		{"nack", AppendNack(nil, "chat", "channel name too long"),
			`{"t":"nack","q":"chat","error":"channel name too long"}`,
			Message{Type: "nack", Name: "chat", Error: "channel name too long"}},
		{"wake durable", AppendWake(nil, "chat", nil, false), `{"t":"wake","q":"chat","p":null}`,
			Message{Type: "wake", Name: "chat"}},
		{"wake ephemeral", AppendWake(nil, "chat", []byte(`{"id":42}`), true),
			`{"t":"wake","q":"chat","p":"{\"id\":42}"}`, Message{Type: "wake", Name: "chat", Payload: `{"id":42}`, HasPayload: true}},
		{"wake empty payload", AppendWake(nil, "chat", []byte{}, true), `{"t":"wake","q":"chat","p":""}`,
			Message{Type: "wake", Name: "chat", HasPayload: true}},
		{"status healthy", AppendStatus(nil, true), `{"t":"status","healthy":true}`,
			Message{Type: "status", Healthy: true}},
		{"status unhealthy", AppendStatus(nil, false), `{"t":"status","healthy":false}`,
			Message{Type: "status"}},
		{"unknown", Append(nil, Message{Type: "ping"}), `{"t":"ping"}`, Message{Type: "ping"}},
		{"unknown with q", Append(nil, Message{Type: "ping", Name: "x", Payload: "dropped"}), `{"t":"ping","q":"x"}`,
			Message{Type: "ping", Name: "x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := binary.BigEndian.AppendUint32(nil, uint32(len(tc.body)))
			want = append(want, tc.body...)
			if !bytes.Equal(tc.frame, want) {
				t.Fatalf("frame\n got % x\nwant % x", tc.frame, want)
			}
			if got := Append(nil, tc.msg); !bytes.Equal(got, want) {
				t.Fatalf("Append(%+v)\n got %q\nwant %q", tc.msg, got, want)
			}
			m, err := Decode(tc.frame[4:])
			if err != nil || m != tc.msg {
				t.Fatalf("Decode = %+v, %v; want %+v", m, err, tc.msg)
			}
		})
	}
	sub := AppendSub(nil, "chat")
	want := []byte{0x00, 0x00, 0x00, 0x16, '{', '"', 't', '"', ':', '"', 's', 'u', 'b', '"', ',',
		'"', 'q', '"', ':', '"', 'c', 'h', 'a', 't', '"', '}'}
	if !bytes.Equal(sub, want) || len(sub) != 4+22 {
		t.Fatalf("sub frame % x, want % x", sub, want)
	}
}

func TestAppendKeepsDst(t *testing.T) {
	dst := []byte("prefix")
	dst = AppendAck(dst, "a")
	dst = AppendStatus(dst, true)
	want := "prefix" + "\x00\x00\x00\x13" + `{"t":"ack","q":"a"}` + "\x00\x00\x00\x1d" + `{"t":"status","healthy":true}`
	if string(dst) != want {
		t.Fatalf("got %q\nwant %q", dst, want)
	}
}

func TestEscapingTable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{`say "hi"`, `"say \"hi\""`},
		{`C:\dir`, `"C:\\dir"`},
		{"a/b", `"a/b"`},
		{"\n\r\t", `"\n\r\t"`},
		{"\b\f", `"\b\f"`}, // encoding/json (Go ≥ 1.22) and Ruby's JSON both use the short forms
		{"\x00\x01\x1f", `"\u0000\u0001\u001f"`},
		{"\x7f", "\"\x7f\""},
		{"<a href=x>&amp;</a>", `"<a href=x>&amp;</a>"`}, // no HTML escaping, like pgbus
		{"\u2028\u2029", `"\u2028\u2029"`},
		{"é😀", `"é😀"`},
		{"\xff", `"\ufffd"`},
		{"a\xed\xa0\x80b", `"a\ufffd\ufffd\ufffdb"`}, // an encoded surrogate is 3 invalid bytes
		{"\xe2\x82", `"\ufffd\ufffd"`},
		{"\uFFFD", "\"\uFFFD\""},
	} {
		if got := string(jsonstr.Append(nil, tc.in)); got != tc.want {
			t.Errorf("jsonstr.Append(%q) = %s, want %s", tc.in, got, tc.want)
		}
		if got := string(jsonstr.Append(nil, []byte(tc.in))); got != tc.want {
			t.Errorf("jsonstr.Append([]byte(%q)) = %s, want %s", tc.in, got, tc.want)
		}
		if ref := refJSONString(tc.in); ref != tc.want {
			t.Errorf("encoding/json writes %q as %s, the table says %s", tc.in, ref, tc.want)
		}
	}
}

// Every byte, and every rune near the special ones, escapes as encoding/json
// escapes it.
func TestEscapingMatchesEncodingJSON(t *testing.T) {
	check := func(s string) {
		t.Helper()
		if got, want := string(jsonstr.Append(nil, s)), refJSONString(s); got != want {
			t.Fatalf("jsonstr.Append(%q) = %s, encoding/json %s", s, got, want)
		}
	}
	for c := 0; c < 256; c++ {
		check(string([]byte{byte(c)}))
		check("x" + string([]byte{byte(c)}) + "y")
	}
	for r := rune(0); r < 0x3000; r++ {
		check(string(r))
	}
	for _, r := range []rune{0xD7FF, 0xE000, 0xFFFD, 0xFFFE, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF} {
		check(string(r))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		check(randString(r, 12))
	}
}

// Whole bodies are what encoding/json writes for the same fields in the
// same order.
func TestBodiesMatchEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		m := randMessage(r)
		frame := Append(nil, m)
		if n := binary.BigEndian.Uint32(frame); int(n) != len(frame)-4 {
			t.Fatalf("header says %d, body is %d bytes", n, len(frame)-4)
		}
		if want := refBody(m); !bytes.Equal(frame[4:], want) {
			t.Fatalf("Append(%#v)\n got %s\nwant %s", m, frame[4:], want)
		}
		if m.Type == TypeWake {
			if w := AppendWake(nil, m.Name, []byte(m.Payload), m.HasPayload); !bytes.Equal(w, frame) {
				t.Fatalf("AppendWake(%q, %q, %v) = %q, Append gives %q", m.Name, m.Payload, m.HasPayload, w, frame)
			}
		}
	}
}

// decode(encode(m)) is m, as far as the wire carries it.
func TestRoundTrip(t *testing.T) {
	roundTrip := func(m Message) bool {
		frame := Append(nil, m)
		got, err := Decode(frame[4:])
		if err != nil {
			t.Logf("Decode(%q): %v", frame[4:], err)
			return false
		}
		if want := normalize(m); got != want {
			t.Logf("round trip of %#v\n got %#v\nwant %#v", m, got, want)
			return false
		}
		return true
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 50000 {
		if m := randMessage(r); !roundTrip(m) {
			t.Fatalf("round trip failed for %#v", m)
		}
	}
	// testing/quick's own strings: random runes of all planes.
	err := quick.Check(func(typ uint8, q, p, e string, hasP, healthy bool) bool {
		return roundTrip(Message{Type: types[int(typ)%len(types)], Name: q, Payload: p, HasPayload: hasP, Healthy: healthy, Error: e})
	}, &quick.Config{MaxCount: 20000})
	if err != nil {
		t.Fatal(err)
	}
}

func TestEncodersDoNotAllocate(t *testing.T) {
	payload := []byte(strings.Repeat(`{"id":1,"note":"<é\n>"}`, 8))
	buf := make([]byte, 0, 4096)
	for name, f := range map[string]func(){
		"AppendSub":    func() { buf = AppendSub(buf[:0], "chat") },
		"AppendUnsub":  func() { buf = AppendUnsub(buf[:0], "chat") },
		"AppendAck":    func() { buf = AppendAck(buf[:0], "chat") },
		"AppendNack":   func() { buf = AppendNack(buf[:0], "chat", "no \"such\" channel") },
		"AppendWake":   func() { buf = AppendWake(buf[:0], "chat", payload, true) },
		"AppendWake/0": func() { buf = AppendWake(buf[:0], "chat", nil, false) },
		"AppendWake/!": func() { buf = AppendWake(buf[:0], "chat", []byte("\xff\u2028"), true) },
		"AppendStatus": func() { buf = AppendStatus(buf[:0], true) },
		"Append":       func() { buf = Append(buf[:0], Message{Type: "wake", Name: "chat", Payload: "hi", HasPayload: true}) },
		"Append/other": func() { buf = Append(buf[:0], Message{Type: "ping", Name: "chat"}) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocs per run, want 0", name, n)
		}
	}
}

// The encoders' output is valid JSON for any input, which a reader in any
// language can parse.
func TestOutputIsValidJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 5000 {
		frame := Append(nil, randMessage(r))
		if !json.Valid(frame[4:]) {
			t.Fatalf("invalid JSON: %q", frame[4:])
		}
	}
}

// The nack for a name that was not valid UTF-8 carries the name's bytes as
// sent, in base64: decoding the sub and answering with its NameRaw gives the
// peer back exactly the bytes it wrote.
func TestAppendNackRaw(t *testing.T) {
	for _, tc := range []struct{ sub, q64 string }{
		{"{\"t\":\"sub\",\"q\":\"a\xffb\"}", "Yf9i"},
		{`{"t":"sub","q":"x\ud83d"}`, "eO2gvQ=="},
		{"{\"t\":\"sub\",\"q\":\"\xed\xa0\xbd\\\"\"}", "7aC9Ig=="},
	} {
		m, err := Decode([]byte(tc.sub))
		if err != nil || !m.NameNotUTF8 {
			t.Fatalf("%q: %+v, %v", tc.sub, m, err)
		}
		b := AppendNackRaw(nil, m.Name, m.NameRaw, "invalid channel: not valid UTF-8")
		if n := binary.BigEndian.Uint32(b); int(n) != len(b)-4 {
			t.Fatalf("header %d for a %d-byte body", n, len(b)-4)
		}
		var got struct{ T, Q, Q64, Error string }
		if err := json.Unmarshal(b[4:], &got); err != nil {
			t.Fatal(err)
		}
		if got.T != "nack" || got.Q != m.Name || got.Q64 != tc.q64 || got.Error != "invalid channel: not valid UTF-8" {
			t.Fatalf("%q: nack %s, want q64 %s", tc.sub, b[4:], tc.q64)
		}
		if d, err := Decode(b[4:]); err != nil || d.Type != "nack" || d.Name != m.Name || d.Error != got.Error {
			t.Fatalf("the nack decodes to %+v, %v", d, err)
		}
	}
}
