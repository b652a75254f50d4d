package frame

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestDecodeAccepts(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Message
	}{
		{"pgbus sub", `{"t":"sub","q":"chat"}`, Message{Type: "sub", Name: "chat"}},
		{"key order free", `{"q":"chat","t":"sub"}`, Message{Type: "sub", Name: "chat"}},
		{"whitespace free", " \t\r\n{ \"t\" :\n\"unsub\" ,\t\"q\":\"chat\" }\n ", Message{Type: "unsub", Name: "chat"}},
		{"unknown fields", `{"id":7,"t":"ack","x":{"a":[1,2,{"b":null}],"c":"}"},"q":"chat","n":-1.5e+10,"e":[],"o":{},"z":false}`,
			Message{Type: "ack", Name: "chat"}},
		{"field of another type ignored", `{"t":"sub","q":"a","p":{"x":1},"healthy":"yes","error":7}`, Message{Type: "sub", Name: "a"}},
		{"durable wake null", `{"t":"wake","q":"a","p":null}`, Message{Type: "wake", Name: "a"}},
		{"durable wake absent", `{"t":"wake","q":"a"}`, Message{Type: "wake", Name: "a"}},
		{"ephemeral wake", `{"t":"wake","q":"a","p":"{\"id\":1}"}`, Message{Type: "wake", Name: "a", Payload: `{"id":1}`, HasPayload: true}},
		{"empty payload", `{"t":"wake","q":"a","p":""}`, Message{Type: "wake", Name: "a", HasPayload: true}},
		{"empty q", `{"t":"sub","q":""}`, Message{Type: "sub"}},
		{"nack", `{"t":"nack","q":"a","error":"too long"}`, Message{Type: "nack", Name: "a", Error: "too long"}},
		{"nack no reason", `{"t":"nack","q":"a"}`, Message{Type: "nack", Name: "a"}},
		{"nack null reason", `{"t":"nack","q":"a","error":null}`, Message{Type: "nack", Name: "a"}},
		{"status", `{"t":"status","healthy":true}`, Message{Type: "status", Healthy: true}},
		{"status false", `{"healthy":false,"t":"status"}`, Message{Type: "status"}},
		{"status q ignored", `{"t":"status","healthy":true,"q":5}`, Message{Type: "status", Healthy: true}},
		{"unknown type", `{"t":"ping","q":"x","p":1}`, Message{Type: "ping", Name: "x"}},
		{"unknown type q not a string", `{"t":"ping","q":[]}`, Message{Type: "ping"}},
		{"unknown type no q", `{"t":"ping"}`, Message{Type: "ping"}},
		{"empty type", `{"t":""}`, Message{Type: ""}},
		{"type case matters", `{"t":"Sub"}`, Message{Type: "Sub"}},
		{"key case matters", `{"t":"ping","Q":"x"}`, Message{Type: "ping"}},
		{"duplicate key: last wins", `{"t":"sub","q":"a","q":"b"}`, Message{Type: "sub", Name: "b"}},
		{"duplicate p: last wins", `{"t":"wake","q":"a","p":"x","p":null}`, Message{Type: "wake", Name: "a"}},
		{"duplicate t: last wins", `{"t":5,"t":"ack","q":"a"}`, Message{Type: "ack", Name: "a"}},
		{"escaped key", `{"\u0074":"sub","\u0071":"a"}`, Message{Type: "sub", Name: "a"}},
		{"escaped type", `{"t":"\u0073\u0074\u0061\u0074\u0075\u0073","healthy":true}`, Message{Type: "status", Healthy: true}},
		{"escapes", `{"t":"wake","q":"a","p":"\"\\\/\b\f\n\r\t\u0000\u00e9\u20AC"}`,
			Message{Type: "wake", Name: "a", Payload: "\"\\/\b\f\n\r\t\x00é€", HasPayload: true}},
		{"surrogate pair", `{"t":"sub","q":"\ud83d\ude00"}`, Message{Type: "sub", Name: "😀"}},
		{"upper-case hex", `{"t":"sub","q":"\uD83D\uDE00"}`, Message{Type: "sub", Name: "😀"}},
		{"lone high surrogate", `{"t":"sub","q":"a\ud83db"}`, Message{Type: "sub", Name: "a\uFFFDb", NameNotUTF8: true, NameRaw: "a\xed\xa0\xbdb"}},
		{"lone high at end", `{"t":"sub","q":"\ud83d"}`, Message{Type: "sub", Name: "\uFFFD", NameNotUTF8: true, NameRaw: "\xed\xa0\xbd"}},
		{"lone low surrogate", `{"t":"sub","q":"\ude00"}`, Message{Type: "sub", Name: "\uFFFD", NameNotUTF8: true, NameRaw: "\xed\xb8\x80"}},
		{"high high low", `{"t":"sub","q":"\ud83d\ud83d\ude00"}`, Message{Type: "sub", Name: "\uFFFD😀", NameNotUTF8: true, NameRaw: "\xed\xa0\xbd😀"}},
		{"high then escape", `{"t":"sub","q":"\ud83d\u0041"}`, Message{Type: "sub", Name: "\uFFFDA", NameNotUTF8: true, NameRaw: "\xed\xa0\xbdA"}},
		{"high then newline", `{"t":"sub","q":"\ud83d\n"}`, Message{Type: "sub", Name: "\uFFFD\n", NameNotUTF8: true, NameRaw: "\xed\xa0\xbd\n"}},
		{"raw UTF-8", `{"t":"sub","q":"é€😀"}`, Message{Type: "sub", Name: "é€😀"}},
		{"invalid UTF-8", "{\"t\":\"sub\",\"q\":\"a\xffb\xed\xa0\x80\"}", Message{Type: "sub", Name: "a\uFFFDb\uFFFD\uFFFD\uFFFD", NameNotUTF8: true, NameRaw: "a\xffb\xed\xa0\x80"}},
		{"invalid UTF-8 and escapes", "{\"t\":\"wake\",\"q\":\"\xc3\",\"p\":\"\\n\xc3\"}",
			Message{Type: "wake", Name: "\uFFFD", Payload: "\n\uFFFD", HasPayload: true, NameNotUTF8: true, NameRaw: "\xc3"}},
		{"U+FFFD itself is valid", "{\"t\":\"sub\",\"q\":\"\uFFFD\\ufffd\\uFFFD\"}", Message{Type: "sub", Name: "\uFFFD\uFFFD\uFFFD"}},
		{"unknown type q not judged", "{\"t\":\"ping\",\"q\":\"\xff\"}", Message{Type: "ping", Name: "\uFFFD"}},
		{"U+2028 raw", "{\"t\":\"sub\",\"q\":\"\u2028\"}", Message{Type: "sub", Name: "\u2028"}},
		{"numbers", `{"a":0,"b":-0,"c":1.0,"d":1e5,"e":1E-5,"f":-12.34e+56,"g":1e999,"t":"ping"}`, Message{Type: "ping"}},
		{"deep but within limit", `{"t":"ping","x":` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `}`,
			Message{Type: "ping"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode([]byte(tc.body))
			if err != nil {
				t.Fatalf("Decode(%q): %v", tc.body, err)
			}
			if m != tc.want {
				t.Fatalf("Decode(%q)\n got %#v\nwant %#v", tc.body, m, tc.want)
			}
			if ref, ok := refDecode([]byte(tc.body)); !ok || ref != m {
				t.Fatalf("encoding/json reads %q as %#v (ok %v)", tc.body, ref, ok)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, tc := range []struct {
		name, body, reason string
	}{
		{"empty", ``, "empty body"},
		{"whitespace", " \n", "only whitespace"},
		{"array", `[{"t":"sub","q":"a"}]`, "not an object"},
		{"string", `"sub"`, "not an object"},
		{"number", `12`, "not an object"},
		{"null", `null`, "not an object"},
		{"bad JSON", `{"t":"sub","q":"a"`, "unexpected end"},
		{"bad JSON not object", `[1,`, "unexpected end"},
		{"garbage", `hello`, "want a JSON value"},
		{"bad literal at top", `nul`, "unexpected end"},
		{"trailing data", `{"t":"sub","q":"a"} {}`, "data after the top-level value"},
		{"trailing comma", `{"t":"sub","q":"a",}`, "want a string for an object key"},
		{"missing colon", `{"t" "sub"}`, "want ':'"},
		{"missing comma", `{"t":"sub" "q":"a"}`, "want ',' or '}'"},
		{"single quotes", `{'t':'sub'}`, "want a string for an object key"},
		{"unquoted key", `{t:"sub"}`, "want a string for an object key"},
		{"missing t", `{"q":"a"}`, `missing "t"`},
		{"empty object", `{}`, `missing "t"`},
		{"t number", `{"t":1,"q":"a"}`, `"t" is a number, want a string`},
		{"t null", `{"t":null}`, `"t" is null, want a string`},
		{"t object", `{"t":{"x":"sub"}}`, `"t" is an object`},
		{"missing q sub", `{"t":"sub"}`, `missing "q" in sub`},
		{"missing q unsub", `{"t":"unsub"}`, `missing "q" in unsub`},
		{"missing q ack", `{"t":"ack"}`, `missing "q" in ack`},
		{"missing q nack", `{"t":"nack","error":"x"}`, `missing "q" in nack`},
		{"missing q wake", `{"t":"wake","p":null}`, `missing "q" in wake`},
		{"q number", `{"t":"sub","q":1}`, `"q" is a number, want a string`},
		{"q null", `{"t":"wake","q":null}`, `"q" is null, want a string`},
		{"q array", `{"t":"ack","q":["a"]}`, `"q" is an array, want a string`},
		{"q bool", `{"t":"unsub","q":true}`, `"q" is a bool, want a string`},
		{"p number", `{"t":"wake","q":"a","p":1}`, `"p" is a number, want a string or null`},
		{"p bool", `{"t":"wake","q":"a","p":false}`, `"p" is a bool, want a string or null`},
		{"healthy missing", `{"t":"status"}`, `missing "healthy"`},
		{"healthy string", `{"t":"status","healthy":"true"}`, `"healthy" is a string, want a bool`},
		{"healthy number", `{"t":"status","healthy":1}`, `"healthy" is a number, want a bool`},
		{"healthy null", `{"t":"status","healthy":null}`, `"healthy" is null, want a bool`},
		{"error number", `{"t":"nack","q":"a","error":1}`, `"error" is a number, want a string`},
		{"control char in string", "{\"t\":\"sub\",\"q\":\"a\nb\"}", "control character in string"},
		{"tab in string", "{\"t\":\"sub\",\"q\":\"a\tb\"}", "control character in string"},
		{"bad escape", `{"t":"sub","q":"\x41"}`, "invalid escape"},
		{"short unicode escape", `{"t":"sub","q":"\u12"}`, `invalid character in \u escape`},
		{"bad hex", `{"t":"sub","q":"\u12g4"}`, `invalid character in \u escape`},
		{"truncated escape", `{"t":"sub","q":"\`, "unexpected end"},
		{"unterminated string", `{"t":"sub","q":"abc`, "unexpected end"},
		{"leading zero", `{"t":"sub","q":"a","n":01}`, "want ',' or '}'"},
		{"plus sign", `{"t":"sub","q":"a","n":+1}`, "want a JSON value"},
		{"bare dot", `{"t":"sub","q":"a","n":1.}`, "want a digit"},
		{"bare exponent", `{"t":"sub","q":"a","n":1e}`, "want a digit"},
		{"minus alone", `{"t":"sub","q":"a","n":-}`, "want a digit"},
		{"NaN", `{"t":"sub","q":"a","n":NaN}`, "want a JSON value"},
		{"bad literal", `{"t":"sub","q":"a","n":tru}`, "invalid character in literal true"},
		{"literal cut", `{"t":"sub","q":"a","n":nul`, "unexpected end"},
		{"unclosed array", `{"t":"sub","q":"a","n":[1,2}`, "want ',' or ']'"},
		{"unclosed nested object", `{"t":"sub","q":"a","n":{"a":1]}`, "want ',' or '}'"},
		{"array trailing comma", `{"t":"sub","q":"a","n":[1,]}`, "want a JSON value"},
		{"nested key not string", `{"t":"sub","q":"a","n":{1:2}}`, "want a string for an object key"},
		{"comment", `{"t":"sub","q":"a"/*x*/}`, "want ',' or '}'"},
		{"too deep", `{"t":"ping","x":` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`, "nesting too deep"},
		{"too deep top level", strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1), "nesting too deep"},
		{"NUL byte", "{\"t\":\"sub\",\"q\":\"a\"}\x00", "data after"},
		{"BOM", "\uFEFF{\"t\":\"sub\",\"q\":\"a\"}", "want a JSON value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode([]byte(tc.body))
			if err == nil {
				t.Fatalf("Decode(%q) = %#v, want an error", tc.body, m)
			}
			if !errors.Is(err, ErrMalformed) || errors.Is(err, ErrTooLarge) {
				t.Fatalf("Decode(%q): %v does not match ErrMalformed", tc.body, err)
			}
			var fe *Error
			if !errors.As(err, &fe) || fe.Reason == "" {
				t.Fatalf("Decode(%q): %#v is not an *Error with a reason", tc.body, err)
			}
			if !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("Decode(%q): %q does not say %q", tc.body, err, tc.reason)
			}
			if m != (Message{}) {
				t.Fatalf("Decode(%q) returned %#v with its error", tc.body, m)
			}
			if _, ok := refDecode([]byte(tc.body)); ok {
				t.Fatalf("encoding/json accepts %q", tc.body)
			}
		})
	}
}

func TestErrorText(t *testing.T) {
	_, err := Decode([]byte(`{"t":"sub","q":"a`))
	if got, want := err.Error(), "frame: malformed message: unexpected end of JSON at offset 17"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	_, err = Decode([]byte(`{"t":"sub"}`))
	if got, want := err.Error(), `frame: malformed message: missing "q" in sub`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// Random JSON strings full of escapes unescape exactly as encoding/json
// unescapes them.
func TestUnescapeMatchesEncodingJSON(t *testing.T) {
	escapes := []string{`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u0000`, `\u001F`, `\u0041`, `\u00e9`,
		`\u20ac`, `\u2028`, `\uFFFD`, `\uFFFF`, `\ud83d`, `\ude00`, `\uD83D\uDE00`, `\udbff\udfff`, `\ud800\udc00`,
		`\udc00\ud800`, "a", "é", "😀", "\xff", "\xed\xa0\x80", "\xe2\x82", "\u2028"}
	r := rand.New(rand.NewPCG(9, 10))
	for range 50000 {
		var b strings.Builder
		for n := r.IntN(8); n > 0; n-- {
			b.WriteString(escapes[r.IntN(len(escapes))])
		}
		body := `{"t":"wake","q":"` + b.String() + `","p":"` + b.String() + `"}`
		m, err := Decode([]byte(body))
		if err != nil {
			t.Fatalf("Decode(%q): %v", body, err)
		}
		var want string
		if err := json.Unmarshal([]byte(`"`+b.String()+`"`), &want); err != nil {
			t.Fatal(err)
		}
		if m.Name != want || m.Payload != want {
			t.Fatalf("Decode(%q): q %+q p %+q, encoding/json %+q", body, m.Name, m.Payload, want)
		}
	}
}

// randValue writes a random JSON value, nested up to depth levels.
func randValue(r *rand.Rand, b *strings.Builder, depth int) {
	switch n := r.IntN(10); {
	case n < 4:
		b.WriteString(refJSONString(randString(r, 4)))
	case n == 4:
		b.WriteString([]string{"null", "true", "false", "0", "-1.5e3", "12345678901234567890", "1e999"}[r.IntN(7)])
	case n == 5:
		b.WriteString(`"` + []string{`\u0074`, `\ud83d`, `\ud83d\ude00`, `\n`, `\"`, "\xff", `\/`}[r.IntN(7)] + `"`)
	case n < 8 && depth > 0:
		b.WriteByte('[')
		for i := r.IntN(3); i > 0; i-- {
			randValue(r, b, depth-1)
			if i > 1 {
				b.WriteByte(',')
			}
		}
		b.WriteByte(']')
	case depth > 0:
		randObject(r, b, depth-1)
	default:
		b.WriteString(`"leaf"`)
	}
}

var keys = []string{`"t"`, `"q"`, `"p"`, `"healthy"`, `"error"`, `"x"`, `"\u0074"`, `"\u0071"`, `"T"`, `""`}

// randObject writes a random object, biased towards the known keys with
// values of the right types.
func randObject(r *rand.Rand, b *strings.Builder, depth int) {
	b.WriteByte('{')
	for i := r.IntN(6); i > 0; i-- {
		k := keys[r.IntN(len(keys))]
		b.WriteString([]string{"", " ", "\n\t"}[r.IntN(3)])
		b.WriteString(k)
		b.WriteByte(':')
		switch r.IntN(3) {
		case 0:
			b.WriteString(refJSONString(types[r.IntN(len(types))]))
		case 1:
			randValue(r, b, depth)
		default:
			b.WriteString([]string{`"chat"`, "true", "false", "null"}[r.IntN(4)])
		}
		if i > 1 {
			b.WriteByte(',')
		}
	}
	b.WriteByte('}')
}

// Random documents, valid and broken, are accepted or rejected as the
// encoding/json reference decides, with the same result.
func TestDecodeAgreesWithEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	accepted, rejected := 0, 0
	for range 200000 {
		var sb strings.Builder
		randObject(r, &sb, 3)
		body := []byte(sb.String())
		// Break some of them: drop, flip or insert a byte.
		for n := r.IntN(4) - 1; n > 0 && len(body) > 0; n-- {
			i := r.IntN(len(body))
			switch r.IntN(3) {
			case 0:
				body = append(body[:i], body[i+1:]...)
			case 1:
				body[i] = byte(r.IntN(256))
			default:
				body = append(body[:i], append([]byte{`{}[],:"\\ 0e.-`[r.IntN(14)]}, body[i:]...)...)
			}
		}
		m, err := Decode(body)
		ref, ok := refDecode(body)
		if (err == nil) != ok || m != ref {
			t.Fatalf("Decode(%q) = %#v, %v; encoding/json: %#v, ok %v", body, m, err, ref, ok)
		}
		if ok {
			accepted++
		} else {
			rejected++
		}
	}
	if accepted < 10000 || rejected < 10000 {
		t.Fatalf("%d random documents accepted, %d rejected; the generator is too one-sided", accepted, rejected)
	}
	t.Logf("%d accepted, %d rejected", accepted, rejected)
}

// Decoding returns copies: the body can be reused at once.
func TestDecodeCopies(t *testing.T) {
	body := []byte(`{"t":"wake","q":"chat","p":"payload"}`)
	m, err := Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 'X'
	}
	if m.Name != "chat" || m.Payload != "payload" {
		t.Fatalf("message changed with its body: %#v", m)
	}
}

// A wake or sub costs one allocation (both strings share it); a status none.
func TestDecodeAllocs(t *testing.T) {
	for _, tc := range []struct {
		body   string
		allocs float64
	}{
		{`{"t":"status","healthy":true}`, 0},
		{`{"t":"sub","q":"chat"}`, 1},
		{`{"t":"wake","q":"chat","p":null}`, 1},
		{`{"t":"wake","q":"chat","p":"` + strings.Repeat("x", 128) + `"}`, 1},
		{`{"t":"wake","q":"chat","p":"esc\"aped\u00e9"}`, 1},
		{`{"t":"nack","q":"chat","error":"no","x":[1,{"y":2}]}`, 1},
		{`{"t":"ping","q":"chat"}`, 1},
	} {
		body := []byte(tc.body)
		if n := testing.AllocsPerRun(100, func() { _, _ = Decode(body) }); n != tc.allocs {
			t.Errorf("Decode(%s): %v allocs, want %v", tc.body, n, tc.allocs)
		}
	}
}
