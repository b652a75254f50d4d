package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/internal/jsonstr"
)

// FuzzDecode: decoding arbitrary bytes never panics, accepts exactly what
// the encoding/json reference accepts with the same result, and every
// decoded message survives a round trip. The same bytes read as a stream
// decode the same whatever the chunking. Seed corpus: testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"t":"sub","q":"chat"}`,
		`{"t":"wake","q":"chat","p":null}`,
		`{"t":"wake","q":"chat","p":"{\"id\":1}"}`,
		`{"t":"nack","q":"chat","error":"too long"}`,
		`{"t":"status","healthy":true}`,
		`{"q":"c\u00e9\ud83d\ude00\ud800x","t":"unsub","x":[1,{"a":[]}],"n":-1.5e3}`,
		"\x00\x00\x00\x16{\"t\":\"sub\",\"q\":\"chat\"}\x00\x00\x00\x12{\"t\":\"ack\",\"q\":\"a\"}",
		"\xff\xff\xff\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		ref, ok := refDecode(data)
		if (err == nil) != ok || m != ref {
			t.Fatalf("Decode(%q) = %#v, %v; encoding/json: %#v, ok %v", data, m, err, ref, ok)
		}
		if err != nil {
			var fe *Error
			if !errors.Is(err, ErrMalformed) || !errors.As(err, &fe) || fe.Reason == "" || fe.Offset > len(data) {
				t.Fatalf("Decode(%q): bad error %#v", data, err)
			}
		} else {
			frame := Append(nil, m)
			if n := binary.BigEndian.Uint32(frame); int(n) != len(frame)-4 {
				t.Fatalf("header %d for a %d-byte body", n, len(frame)-4)
			}
			m2, err := Decode(frame[4:])
			want := m
			want.NameNotUTF8, want.NameRaw = false, "" // the encoders write U+FFFD
			if err != nil || m2 != want {
				t.Fatalf("round trip of %#v: %q decodes to %#v, %v", m, frame[4:], m2, err)
			}
		}

		// The body as one frame through a Decoder: the same as Decode.
		framed := binary.BigEndian.AppendUint32(nil, uint32(len(data)))
		framed = append(framed, data...)
		res := decodeStream(framed, func() int { return len(framed) })
		if err == nil && (len(res.msgs) != 1 || res.msgs[0] != m || res.err != "") ||
			err != nil && (len(res.msgs) != 0 || res.err != err.Error()) {
			t.Fatalf("Decoder on framed %q: %#v, %q; Decode: %#v, %v", data, res.msgs, res.err, m, err)
		}

		// The bytes as a stream of frames: chunking changes nothing.
		whole := decodeStream(data, func() int { return len(data) })
		for _, chunk := range []int{1, 3, 7} {
			if got := decodeStream(data, func() int { return chunk }); !sameResult(got, whole) {
				t.Fatalf("stream %q in chunks of %d: %#v; whole: %#v", data, chunk, got, whole)
			}
		}

		// Fed borrowed, as the hub feeds it: the same again.
		for _, chunk := range []int{1, 4, 9, len(data)} {
			if got := decodeStreamBorrowed(data, 0, func() int { return chunk }); !sameResult(got, whole) {
				t.Fatalf("stream %q borrowed in chunks of %d: %#v; whole: %#v", data, chunk, got, whole)
			}
		}

		// With a lower Max: the same frames up to the first one above it,
		// then ErrTooLarge; chunking changes nothing there either.
		const max = 32
		lim := decodeStreamMax(data, max, func() int { return len(data) })
		if k := len(lim.msgs); k > len(whole.msgs) || !sameResult(streamResult{msgs: lim.msgs}, streamResult{msgs: whole.msgs[:k]}) {
			t.Fatalf("stream %q with Max %d: %#v; without: %#v", data, max, lim, whole)
		}
		if lim.err != whole.err && !strings.Contains(lim.err, "above the limit 32") {
			t.Fatalf("stream %q with Max %d: error %q; without: %q", data, max, lim.err, whole.err)
		}
		for _, chunk := range []int{1, 5} {
			if got := decodeStreamMax(data, max, func() int { return chunk }); !sameResult(got, lim) {
				t.Fatalf("stream %q with Max %d in chunks of %d: %#v; whole: %#v", data, max, chunk, got, lim)
			}
			if got := decodeStreamBorrowed(data, max, func() int { return chunk }); !sameResult(got, lim) {
				t.Fatalf("stream %q with Max %d borrowed in chunks of %d: %#v; whole: %#v", data, max, chunk, got, lim)
			}
		}
	})
}

// FuzzRoundTrip: whatever the strings, the encoders write what encoding/json
// writes (HTML escaping off) and Decode gives the message back, with invalid
// UTF-8 replaced. Seed corpus: testdata/fuzz/FuzzRoundTrip.
func FuzzRoundTrip(f *testing.F) {
	f.Add("wake", "chat", "{\"id\":1}", true, false, "")
	f.Add("nack", "q\xff", "", false, false, "bad \"name\"\n")
	f.Add("status", "", "", false, true, "")
	f.Add("sub", "\u2028<&>\x00", "", false, false, "")
	f.Fuzz(func(t *testing.T, typ, q, p string, hasP, healthy bool, reason string) {
		m := Message{Type: typ, Name: q, Payload: p, HasPayload: hasP, Healthy: healthy, Error: reason}
		frame := Append(nil, m)
		if n := binary.BigEndian.Uint32(frame); int(n) != len(frame)-4 {
			t.Fatalf("header %d for a %d-byte body", n, len(frame)-4)
		}
		if want := refBody(m); !bytes.Equal(frame[4:], want) {
			t.Fatalf("Append(%#v)\n got %q\nwant %q", m, frame[4:], want)
		}
		got, err := Decode(frame[4:])
		if want := normalize(m); err != nil || got != want {
			t.Fatalf("round trip of %#v: %#v, %v; want %#v", m, got, err, want)
		}
		if typ == TypeWake {
			if w := AppendWake(nil, q, []byte(p), hasP); !bytes.Equal(w, frame) {
				t.Fatalf("AppendWake = %q, Append = %q", w, frame)
			}
		}
		for _, s := range []string{typ, q, p, reason} {
			if got, want := string(jsonstr.Append(nil, []byte(s))), refJSONString(s); got != want {
				t.Fatalf("jsonstr.Append(%q) = %s, encoding/json %s", s, got, want)
			}
		}
	})
}
