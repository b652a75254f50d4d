package jsonstr

import (
	"bytes"
	"encoding/json"
	"testing"
)

// ref is s as encoding/json writes it, HTML escaping on or off.
func ref(t testing.TB, s string, html bool) string {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(html)
	if err := e.Encode(s); err != nil {
		t.Fatal(err)
	}
	return string(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
}

func check(t testing.TB, s string) {
	t.Helper()
	if got, want := string(Append(nil, s)), ref(t, s, false); got != want {
		t.Fatalf("Append(%q) = %s, encoding/json %s", s, got, want)
	}
	if got, want := string(AppendHTML(nil, []byte(s))), ref(t, s, true); got != want {
		t.Fatalf("AppendHTML(%q) = %s, encoding/json %s", s, got, want)
	}
}

// Every byte, and every rune up to U+3000 and a few past it, escapes as
// encoding/json escapes it, with HTML escaping off (Append) and on
// (AppendHTML). Package frame's tests check Append further.
func TestMatchesEncodingJSON(t *testing.T) {
	for c := 0; c < 256; c++ {
		check(t, string([]byte{byte(c)}))
		check(t, "x"+string([]byte{byte(c)})+"y")
	}
	for r := rune(0); r < 0x3000; r++ {
		check(t, string(r))
	}
	for _, r := range []rune{0xD7FF, 0xE000, 0xFFFD, 0xFFFE, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF} {
		check(t, string(r))
	}
	check(t, `<a href="x">&amp;</a>`+"\u2028\xff")
}

func FuzzMatchesEncodingJSON(f *testing.F) {
	for _, s := range []string{"", "<&>", "a\xed\xa0\x80b", "\u2028\u2029", "\x00\x1f\x7f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { check(t, s) })
}
