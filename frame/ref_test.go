package frame

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/listenhub/listenhub/internal/testutil"
)

// This file holds the oracles the tests compare the hand-written codec with:
// encoding/json, used the way a reflection-based implementation of the
// protocol would use it, and generators of awkward strings.

// refJSONString is s as an encoding/json Encoder with HTML escaping off
// writes it.
func refJSONString(s string) string { return testutil.JSONString(s) }

// refBody is m's body as encoding/json writes it (HTML escaping off), with
// struct fields in the protocol's key order.
func refBody(m Message) []byte {
	var v any
	switch m.Type {
	case TypeSub, TypeUnsub, TypeAck:
		v = struct {
			T string `json:"t"`
			Q string `json:"q"`
		}{m.Type, m.Name}
	case TypeNack:
		v = struct {
			T     string `json:"t"`
			Q     string `json:"q"`
			Error string `json:"error"`
		}{m.Type, m.Name, m.Error}
	case TypeWake:
		var p *string
		if m.HasPayload {
			p = &m.Payload
		}
		v = struct {
			T string  `json:"t"`
			Q string  `json:"q"`
			P *string `json:"p"`
		}{m.Type, m.Name, p}
	case TypeStatus:
		v = struct {
			T       string `json:"t"`
			Healthy bool   `json:"healthy"`
		}{m.Type, m.Healthy}
	default:
		v = struct {
			T string `json:"t"`
			Q string `json:"q,omitempty"`
		}{m.Type, m.Name}
	}
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		panic(err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// refDecode decodes body with encoding/json and applies the protocol's
// rules to the result; ok is false where Decode must return an error.
func refDecode(body []byte) (m Message, ok bool) {
	if !json.Valid(body) {
		return Message{}, false
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber() // 1e999 is valid JSON, but no float64
	var v any
	if err := d.Decode(&v); err != nil {
		return Message{}, false
	}
	obj, isObj := v.(map[string]any)
	if !isObj {
		return Message{}, false
	}
	t, isStr := obj["t"].(string)
	if !isStr {
		return Message{}, false
	}
	m.Type = t
	switch t {
	case TypeSub, TypeUnsub, TypeAck, TypeNack, TypeWake:
		q, isStr := obj["q"].(string)
		if !isStr {
			return Message{}, false
		}
		m.Name = q
		if m.NameNotUTF8 = refNotUTF8(body); m.NameNotUTF8 {
			m.NameRaw = refSent(body)
		}
		switch t {
		case TypeNack:
			switch e := obj["error"].(type) {
			case string:
				m.Error = e
			case nil:
			default:
				return Message{}, false
			}
		case TypeWake:
			switch p := obj["p"].(type) {
			case string:
				m.Payload, m.HasPayload = p, true
			case nil:
			default:
				return Message{}, false
			}
		}
	case TypeStatus:
		h, isBool := obj["healthy"].(bool)
		if !isBool {
			return Message{}, false
		}
		m.Healthy = h
	default:
		m.Name, _ = obj["q"].(string)
	}
	return m, true
}

// rawQ returns the JSON text of body's "q" string between its quotes.
func rawQ(body []byte) []byte {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		panic(err)
	}
	raw := obj["q"]
	return raw[1 : len(raw)-1]
}

// refSent is the oracle for Message.NameRaw: the last "q" of the object body
// as its sender meant the bytes, collected from the JSON text on its own:
// escapes decoded, raw bytes kept, a \u surrogate pair as its rune, and a
// surrogate outside a pair as its 3-byte (WTF-8) form.
func refSent(body []byte) string {
	raw := rawQ(body)
	wtf8 := func(u rune) []byte { return []byte{0xe0 | byte(u>>12), 0x80 | byte(u>>6)&0x3f, 0x80 | byte(u)&0x3f} }
	escapes := map[byte]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}
	var out []byte
	high := rune(-1)
	flush := func() {
		if high >= 0 {
			out = append(out, wtf8(high)...)
			high = -1
		}
	}
	for i := 0; i < len(raw); {
		if raw[i] == '\\' && raw[i+1] == 'u' {
			v, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
			if err != nil {
				panic(err)
			}
			u := rune(v)
			i += 6
			switch {
			case 0xd800 <= u && u < 0xdc00:
				flush()
				high = u
			case 0xdc00 <= u && u < 0xe000:
				if high >= 0 {
					out = utf8.AppendRune(out, 0x10000+(high-0xd800)<<10+(u-0xdc00))
					high = -1
				} else {
					out = append(out, wtf8(u)...)
				}
			default:
				flush()
				out = utf8.AppendRune(out, u)
			}
			continue
		}
		flush()
		if raw[i] == '\\' {
			out = append(out, escapes[raw[i+1]])
			i += 2
			continue
		}
		out = append(out, raw[i])
		i++
	}
	flush()
	return string(out)
}

// refNotUTF8 is the oracle for Message.NameNotUTF8: whether the last "q" of
// the object body, as written, is not valid UTF-8 (a byte outside UTF-8, or
// a \u escape of a surrogate not in a high-low pair). It collects the
// string as UTF-16 code units and bytes, the way a reader of the JSON text
// sees it, independently of the decoder's unescaper.
func refNotUTF8(body []byte) bool {
	raw := rawQ(body)
	var units []rune // code units; -1 stands for a non-surrogate
	for i := 0; i < len(raw); {
		switch {
		case raw[i] == '\\' && raw[i+1] == 'u':
			u, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
			if err != nil {
				panic(err)
			}
			units = append(units, rune(u))
			i += 6
		case raw[i] == '\\':
			units = append(units, -1)
			i += 2
		default:
			r, n := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && n == 1 {
				return true
			}
			units = append(units, -1)
			i += n
		}
	}
	for i := 0; i < len(units); i++ {
		u := units[i]
		switch {
		case 0xd800 <= u && u < 0xdc00:
			if i+1 == len(units) || units[i+1] < 0xdc00 || units[i+1] >= 0xe000 {
				return true
			}
			i++
		case 0xdc00 <= u && u < 0xe000:
			return true
		}
	}
	return false
}

// valid is s with every byte that is not part of valid UTF-8 replaced by
// U+FFFD, one per byte, which is what a JSON round trip makes of it.
func valid(s string) string { return string([]rune(s)) }

// normalize is what the wire keeps of m: the fields of its type, with valid
// UTF-8.
func normalize(m Message) Message {
	switch m.Type {
	case TypeSub, TypeUnsub, TypeAck:
		return Message{Type: m.Type, Name: valid(m.Name)}
	case TypeNack:
		return Message{Type: m.Type, Name: valid(m.Name), Error: valid(m.Error)}
	case TypeWake:
		if !m.HasPayload {
			return Message{Type: m.Type, Name: valid(m.Name)}
		}
		return Message{Type: m.Type, Name: valid(m.Name), Payload: valid(m.Payload), HasPayload: true}
	case TypeStatus:
		return Message{Type: m.Type, Healthy: m.Healthy}
	}
	return Message{Type: valid(m.Type), Name: valid(m.Name)}
}

// pieces are the building blocks of awkward strings: everything the
// escaper treats specially, and the UTF-8 that is not UTF-8.
var pieces = []string{
	"a", "Z", "0", " ", "chat", "pgmq.q_orders.INSERT",
	`"`, `\`, "/", "\b", "\f", "\n", "\r", "\t", "\x00", "\x01", "\x1f", "\x7f",
	"<", ">", "&", "<script>", "\u2028", "\u2029", "\u2027", "\u202a",
	"é", "ß", "€", "😀", "\U0010FFFF", "\uFFFD", "\uFEFF",
	"\x80", "\xff", "\xc3", "\xe2\x82", "\xf0\x9f\x98", "\xed\xa0\x80", "\xed\xbf\xbf",
	"\xc0\xaf", "\xf4\x90\x80\x80", `\u0041`, `\ud83d`, "null",
}

func randString(r *rand.Rand, maxPieces int) string {
	var b strings.Builder
	for n := r.IntN(maxPieces + 1); n > 0; n-- {
		if r.IntN(4) == 0 {
			b.WriteByte(byte(r.IntN(256)))
			continue
		}
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	return b.String()
}

var types = []string{TypeSub, TypeUnsub, TypeAck, TypeNack, TypeWake, TypeStatus, "hello", "", "Wake", "wake\x00", "\xff"}

func randMessage(r *rand.Rand) Message {
	return Message{
		Type:       types[r.IntN(len(types))],
		Name:       randString(r, 6),
		Payload:    randString(r, 20),
		HasPayload: r.IntN(2) == 0,
		Healthy:    r.IntN(2) == 0,
		Error:      randString(r, 6),
	}
}
