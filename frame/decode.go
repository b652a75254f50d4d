package frame

import (
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds the nesting of objects and arrays inside an (ignored) field
// value. It is encoding/json's limit, so both accept the same documents; the
// scanner skips nested values without recursion, so the bound is about
// agreeing with encoding/json, not about the stack.
const maxDepth = 10000

// Decode decodes one frame body (the JSON object, without the length header).
//
// Field order and whitespace are free, unknown fields are ignored whatever
// their value (objects and arrays included), and so are known fields that the
// message's type does not carry. A field that appears twice counts with its
// last value, as in encoding/json. Keys are matched exactly (case-sensitive),
// after unescaping, so "\u0074" is "t". Strings are unescaped as
// encoding/json does: \uXXXX surrogate pairs are joined, a lone or
// mismatched surrogate becomes U+FFFD, and so does each byte that is not
// valid UTF-8.
//
// The error, always an *Error matching ErrMalformed, says why the body was
// rejected. Decode never panics, whatever body holds.
//
// The message's strings are copies and stay valid after body is reused. They
// share one allocation, and for a known type Type is a constant, so decoding a
// wake or a sub allocates once and a status not at all.
func Decode(body []byte) (Message, error) {
	if len(body) == 0 {
		return Message{}, malformed(-1, "empty body")
	}
	s := scanner{b: body}
	s.ws()
	if s.eof() {
		return Message{}, malformed(s.pos, "no JSON value, only whitespace")
	}
	var f fields
	if body[s.pos] == '{' {
		if err := s.object(&f); err != nil {
			return Message{}, err
		}
	} else {
		// Scan it anyway, so that the reason says which of the two it is:
		// broken JSON, or valid JSON that is not an object.
		if _, err := s.value(0); err != nil {
			return Message{}, err
		}
		if err := s.end(); err != nil {
			return Message{}, err
		}
		return Message{}, malformed(-1, "JSON value is not an object")
	}
	if err := s.end(); err != nil {
		return Message{}, err
	}
	return f.message(body)
}

// kind is the JSON type of a value, as far as the known fields care.
type kind uint8

const (
	kindAbsent kind = iota
	kindString
	kindNull
	kindTrue
	kindFalse
	kindNumber
	kindObject
	kindArray
)

func (k kind) String() string {
	switch k {
	case kindString:
		return "a string"
	case kindNull:
		return "null"
	case kindTrue, kindFalse:
		return "a bool"
	case kindNumber:
		return "a number"
	case kindObject:
		return "an object"
	case kindArray:
		return "an array"
	}
	return "absent"
}

// Indexes of the known keys in fields.
const (
	keyT = iota
	keyQ
	keyP
	keyHealthy
	keyError
	numKeys
)

var keyNames = [numKeys]string{`"t"`, `"q"`, `"p"`, `"healthy"`, `"error"`}

// field remembers where the last value of a known key was, so that nothing
// is copied until the whole object has been scanned and the type (which may
// come last) says which fields count.
type field struct {
	kind       kind
	start, end int  // string contents, between the quotes (kindString)
	esc, high  bool // the contents hold escapes / bytes from 0x80 up
}

type fields [numKeys]field

func lookupKey(raw []byte) int {
	switch string(raw) {
	case "t":
		return keyT
	case "q":
		return keyQ
	case "p":
		return keyP
	case "healthy":
		return keyHealthy
	case "error":
		return keyError
	}
	return -1
}

func lookupType(raw []byte) string {
	switch string(raw) {
	case TypeSub:
		return TypeSub
	case TypeUnsub:
		return TypeUnsub
	case TypeAck:
		return TypeAck
	case TypeNack:
		return TypeNack
	case TypeWake:
		return TypeWake
	case TypeStatus:
		return TypeStatus
	}
	return ""
}

// maxEscapedName bounds the raw form of a key or type name worth unescaping
// to match it: the longest known name, "healthy", written as seven 6-byte
// \u escapes.
const maxEscapedName = 7 * 6

// unescapedName unescapes a key or type name that holds escapes into buf,
// for matching it against the known names; ok is false when it is too long
// to be one of them.
func unescapedName(buf *[3 * maxEscapedName]byte, raw []byte) (name []byte, ok bool) {
	if len(raw) > maxEscapedName {
		return nil, false
	}
	return appendUnescaped(buf[:0], raw), true
}

func (f *fields) message(body []byte) (Message, error) {
	ft := &f[keyT]
	if ft.kind == kindAbsent {
		return Message{}, malformed(-1, `missing "t"`)
	}
	if ft.kind != kindString {
		return Message{}, wrongType(keyT, ft.kind)
	}
	// typ is the Type* constant for a known type, "" for any other.
	var typ string
	if !ft.esc {
		typ = lookupType(body[ft.start:ft.end])
	} else {
		var buf [3 * maxEscapedName]byte
		if name, ok := unescapedName(&buf, body[ft.start:ft.end]); ok {
			typ = lookupType(name)
		}
	}

	// The strings to return: Name and, by type, Payload or Error; for an
	// unknown type, Type and (if a string) Name. first and second are where they go.
	var first, second *field
	var firstDst, secondDst *string
	var m Message
	m.Type = typ
	switch typ {
	case TypeSub, TypeUnsub, TypeAck, TypeNack, TypeWake:
		fq := &f[keyQ]
		if fq.kind == kindAbsent {
			return Message{}, malformed(-1, `missing "q" in `+typ)
		}
		if fq.kind != kindString {
			return Message{}, wrongType(keyQ, fq.kind)
		}
		first, firstDst = fq, &m.Name
		if fq.esc || fq.high {
			if m.NameNotUTF8 = !exactUTF8(body[fq.start:fq.end]); m.NameNotUTF8 {
				m.NameRaw = string(appendSent(nil, body[fq.start:fq.end]))
			}
		}
		switch typ {
		case TypeNack:
			// A nack without a reason is still a refusal; null reads as
			// no reason, like a missing field.
			switch fe := &f[keyError]; fe.kind {
			case kindString:
				second, secondDst = fe, &m.Error
			case kindAbsent, kindNull:
			default:
				return Message{}, wrongType(keyError, fe.kind)
			}
		case TypeWake:
			switch fp := &f[keyP]; fp.kind {
			case kindString:
				m.HasPayload = true
				second, secondDst = fp, &m.Payload
			case kindAbsent, kindNull:
			default:
				return Message{}, malformed(-1, `"p" is `+fp.kind.String()+", want a string or null")
			}
		}
	case TypeStatus:
		switch fh := &f[keyHealthy]; fh.kind {
		case kindTrue:
			m.Healthy = true
		case kindFalse:
		case kindAbsent:
			return Message{}, malformed(-1, `missing "healthy" in status`)
		default:
			return Message{}, wrongType(keyHealthy, fh.kind)
		}
		return m, nil
	default:
		// Unknown type: keep Type, and Name when it is a string, for the caller's
		// log line. Whatever else it holds is not ours to judge.
		first, firstDst = ft, &m.Type
		if fq := &f[keyQ]; fq.kind == kindString {
			second, secondDst = fq, &m.Name
		}
	}

	// One allocation for both strings. The unescaped form is rarely longer
	// than the raw one (only invalid UTF-8 grows, 1 byte to 3); when it is,
	// the Builder grows, which costs an allocation, never correctness.
	size := first.end - first.start
	if second != nil {
		size += second.end - second.start
	}
	var b strings.Builder
	b.Grow(size)
	first.writeTo(&b, body)
	cut := b.Len()
	if second != nil {
		second.writeTo(&b, body)
	}
	all := b.String()
	*firstDst = all[:cut]
	if second != nil {
		*secondDst = all[cut:]
	}
	return m, nil
}

// writeTo writes the string value of f to b: the raw bytes when they need
// no change, which is the common case, else their unescaped form.
func (f *field) writeTo(b *strings.Builder, body []byte) {
	raw := body[f.start:f.end]
	if !f.esc && (!f.high || utf8.Valid(raw)) {
		b.Write(raw)
		return
	}
	// A typical payload is unescaped on the stack and written to b once:
	// each write through b costs a GC write barrier while the collector
	// runs, and a JSON payload has an escaped quote every few bytes. Each
	// raw byte yields at most 3 bytes (an invalid byte becomes U+FFFD), so
	// the scratch cannot overflow.
	var scratch [1024]byte
	if len(raw) <= len(scratch)/3 {
		b.Write(appendUnescaped(scratch[:0], raw))
		return
	}
	unescapeTo(b, raw)
}

func wrongType(key int, k kind) *Error {
	want := "a string"
	if key == keyHealthy {
		want = "a bool"
	}
	return malformed(-1, keyNames[key]+" is "+k.String()+", want "+want)
}

// unescapeTo writes the value of the JSON string contents raw, which the
// scanner has already validated, to b. Runs that need no change are written
// in one piece.
func unescapeTo(b *strings.Builder, raw []byte) {
	start := 0
	for i := 0; i < len(raw); {
		if c := raw[i]; c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		r, n, verbatim := unit(raw, i)
		if !verbatim {
			b.Write(raw[start:i])
			b.WriteRune(r)
			start = i + n
		}
		i += n
	}
	b.Write(raw[start:])
}

// appendUnescaped is unescapeTo for a byte slice.
func appendUnescaped(dst, raw []byte) []byte {
	start := 0
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c == '\\' {
			// The common escapes in a JSON payload (\" above all) need
			// no rune decoding.
			if e := simpleEscapes[raw[i+1]]; e != 0 {
				dst = append(dst, raw[start:i]...)
				dst = append(dst, e)
				i += 2
				start = i
				continue
			}
		}
		r, n, verbatim := unit(raw, i)
		if !verbatim {
			dst = append(dst, raw[start:i]...)
			dst = utf8.AppendRune(dst, r)
			start = i + n
		}
		i += n
	}
	return append(dst, raw[start:]...)
}

// simpleEscapes maps the letter after a backslash to the byte it stands
// for, for every escape but \u.
var simpleEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// unit decodes the escape or non-ASCII sequence at raw[i], mirroring
// encoding/json's unquote: r is the rune it stands for, n its length in raw,
// and verbatim is true when raw[i:i+n] already is r in UTF-8 (a valid
// multi-byte sequence), so that it can stay in a run.
//
// A surrogate pair \uD83D\uDE00 is one rune; a surrogate that is not half of
// a valid pair is U+FFFD, and an escape after it is read on its own. Each
// byte that is not valid UTF-8 is U+FFFD.
func unit(raw []byte, i int) (r rune, n int, verbatim bool) {
	if raw[i] != '\\' {
		r, n = utf8.DecodeRune(raw[i:])
		return r, n, r != utf8.RuneError || n != 1
	}
	switch e := raw[i+1]; e {
	case 'b':
		return '\b', 2, false
	case 'f':
		return '\f', 2, false
	case 'n':
		return '\n', 2, false
	case 'r':
		return '\r', 2, false
	case 't':
		return '\t', 2, false
	case 'u':
		r = hex4(raw[i+2:])
		if !utf16.IsSurrogate(r) {
			return r, 6, false
		}
		if j := i + 6; j+6 <= len(raw) && raw[j] == '\\' && raw[j+1] == 'u' {
			if dec := utf16.DecodeRune(r, hex4(raw[j+2:])); dec != utf8.RuneError {
				return dec, 12, false
			}
		}
		return utf8.RuneError, 6, false
	default: // '"', '\\', '/'
		return rune(e), 2, false
	}
}

// appendSent appends the bytes the JSON string contents raw, which the
// scanner has validated, were meant to be (Message.NameRaw): escapes decoded,
// other bytes copied as they are, valid or not, and a \u escape of a
// surrogate outside a pair as its 3-byte form.
func appendSent(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		if raw[i+1] == 'u' {
			if r := hex4(raw[i+2:]); utf16.IsSurrogate(r) {
				if j := i + 6; j+6 <= len(raw) && raw[j] == '\\' && raw[j+1] == 'u' {
					if dec := utf16.DecodeRune(r, hex4(raw[j+2:])); dec != utf8.RuneError {
						dst = utf8.AppendRune(dst, dec)
						i += 12
						continue
					}
				}
				dst = append(dst, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
				i += 6
				continue
			}
		}
		r, n, _ := unit(raw, i)
		dst = utf8.AppendRune(dst, r)
		i += n
	}
	return dst
}

// exactUTF8 reports whether the JSON string contents raw, which the scanner
// has validated, stand for a string that is valid UTF-8: no byte outside
// valid UTF-8 and no \u escape of a surrogate outside a valid pair. Where it
// is false, unescaping put U+FFFD in place of what the sender wrote.
func exactUTF8(raw []byte) bool {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c < utf8.RuneSelf && c != '\\' {
			i++
			continue
		}
		if c == '\\' && raw[i+1] != 'u' {
			i += 2
			continue
		}
		r, n, verbatim := unit(raw, i)
		if r == utf8.RuneError {
			// U+FFFD itself, written as such or as \ufffd, is fine; a
			// replacement is not.
			if c == '\\' {
				if n != 6 || hex4(raw[i+2:]) != utf8.RuneError {
					return false
				}
			} else if !verbatim {
				return false
			}
		}
		i += n
	}
	return true
}

// hex4 reads the 4 hex digits the scanner has checked are there.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		r = r<<4 | rune(unhex(c))
	}
	return r
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10
	}
	return 0xff
}

// scanner validates JSON (RFC 8259, as strictly as encoding/json) and
// records the known top-level fields. It allocates nothing but the *Error
// it may return.
type scanner struct {
	b   []byte
	pos int
	// esc and high describe the string str last scanned.
	esc, high bool
}

func (s *scanner) eof() bool { return s.pos >= len(s.b) }

func (s *scanner) ws() {
	for s.pos < len(s.b) {
		switch s.b[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *scanner) unexpectedEnd() *Error {
	return malformed(len(s.b), "unexpected end of JSON")
}

// end checks that nothing but whitespace follows the top-level value.
func (s *scanner) end() *Error {
	s.ws()
	if !s.eof() {
		return malformed(s.pos, "data after the top-level value")
	}
	return nil
}

// object scans the top-level object starting at s.pos, recording the known
// keys' values in f.
func (s *scanner) object(f *fields) *Error {
	s.pos++ // '{'
	s.ws()
	if s.eof() {
		return s.unexpectedEnd()
	}
	if s.b[s.pos] == '}' {
		s.pos++
		return nil
	}
	for {
		if s.eof() {
			return s.unexpectedEnd()
		}
		if s.b[s.pos] != '"' {
			return malformed(s.pos, "want a string for an object key")
		}
		ks := s.pos + 1
		if err := s.str(); err != nil {
			return err
		}
		raw := s.b[ks : s.pos-1]
		key := -1
		if !s.esc {
			key = lookupKey(raw)
		} else {
			var buf [3 * maxEscapedName]byte
			if name, ok := unescapedName(&buf, raw); ok {
				key = lookupKey(name)
			}
		}
		if err := s.colon(); err != nil {
			return err
		}
		vs := s.pos
		k, err := s.value(1)
		if err != nil {
			return err
		}
		if key >= 0 {
			f[key] = field{kind: k, start: vs + 1, end: s.pos - 1, esc: s.esc, high: s.high}
		}
		s.ws()
		if s.eof() {
			return s.unexpectedEnd()
		}
		switch s.b[s.pos] {
		case ',':
			s.pos++
			s.ws()
		case '}':
			s.pos++
			return nil
		default:
			return malformed(s.pos, "want ',' or '}' after an object value")
		}
	}
}

// colon skips the ':' between a key and its value, and the whitespace
// around it.
func (s *scanner) colon() *Error {
	s.ws()
	if s.eof() {
		return s.unexpectedEnd()
	}
	if s.b[s.pos] != ':' {
		return malformed(s.pos, "want ':' after an object key")
	}
	s.pos++
	s.ws()
	return nil
}

// value scans one value of any type at s.pos. depth is the number of
// containers around it.
func (s *scanner) value(depth int) (kind, *Error) {
	if s.eof() {
		return kindAbsent, s.unexpectedEnd()
	}
	switch s.b[s.pos] {
	case '{':
		return kindObject, s.nested(depth)
	case '[':
		return kindArray, s.nested(depth)
	}
	return s.scalar()
}

// scalar scans a string, number or literal at s.pos.
func (s *scanner) scalar() (kind, *Error) {
	switch c := s.b[s.pos]; c {
	case '"':
		return kindString, s.str()
	case 't':
		return kindTrue, s.literal("true")
	case 'f':
		return kindFalse, s.literal("false")
	case 'n':
		return kindNull, s.literal("null")
	default:
		if c == '-' || '0' <= c && c <= '9' {
			return kindNumber, s.number()
		}
	}
	return kindAbsent, malformed(s.pos, "invalid character, want a JSON value")
}

func (s *scanner) literal(word string) *Error {
	if len(s.b)-s.pos < len(word) || string(s.b[s.pos:s.pos+len(word)]) != word {
		for i := 0; i < len(word); i++ {
			if s.pos+i >= len(s.b) {
				return s.unexpectedEnd()
			}
			if s.b[s.pos+i] != word[i] {
				return malformed(s.pos+i, "invalid character in literal "+word)
			}
		}
	}
	s.pos += len(word)
	return nil
}

// number scans -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?. What follows
// is the caller's business ("01" is the number 0 followed by junk).
func (s *scanner) number() *Error {
	b, i := s.b, s.pos
	if b[i] == '-' {
		i++
	}
	digits := func() *Error {
		if i >= len(b) {
			return s.unexpectedEnd()
		}
		if b[i] < '0' || b[i] > '9' {
			return malformed(i, "invalid character in number, want a digit")
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return nil
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if err := digits(); err != nil {
		return err
	}
	if i < len(b) && b[i] == '.' {
		i++
		if err := digits(); err != nil {
			return err
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if err := digits(); err != nil {
			return err
		}
	}
	s.pos = i
	return nil
}

// plain[c] is true for the bytes a string's fast loop passes over: printable
// ASCII other than '"' and '\\'.
var plain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str scans the string starting at s.pos (a '"') and leaves s.pos after the
// closing quote. Invalid UTF-8 is not an error: it reads as U+FFFD, as in
// encoding/json.
func (s *scanner) str() *Error {
	b := s.b
	i := s.pos + 1
	s.esc, s.high = false, false
	for {
		for i < len(b) && plain[b[i]] {
			i++
		}
		if i >= len(b) {
			return s.unexpectedEnd()
		}
		switch c := b[i]; {
		case c == '"':
			s.pos = i + 1
			return nil
		case c == '\\':
			s.esc = true
			if i+1 >= len(b) {
				return s.unexpectedEnd()
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for j := i + 2; j < i+6; j++ {
					if j >= len(b) {
						return s.unexpectedEnd()
					}
					if unhex(b[j]) == 0xff {
						return malformed(j, `invalid character in \u escape, want a hex digit`)
					}
				}
				i += 6
			default:
				return malformed(i+1, "invalid escape in string")
			}
		case c >= utf8.RuneSelf:
			s.high = true
			i++
		default:
			return malformed(i, "control character in string")
		}
	}
}

// nested skips the object or array at s.pos, validating it, without
// recursion: containerIsArray records, one bit per open container, which
// kind it is, so a hostile 4 MiB of '[' costs neither stack nor heap.
// depth is the number of containers around the one at s.pos.
func (s *scanner) nested(depth int) *Error {
	var arrays [maxDepth/64 + 1]uint64
	n := 0 // containers open
	isArray := func(i int) bool { return arrays[i>>6]&(1<<(i&63)) != 0 }
	for {
		// s.pos is at the '{' or '[' of a container to open.
		if depth+n >= maxDepth {
			return malformed(s.pos, "nesting too deep")
		}
		open := s.b[s.pos]
		if open == '[' {
			arrays[n>>6] |= 1 << (n & 63)
		} else {
			arrays[n>>6] &^= 1 << (n & 63)
		}
		n++
		s.pos++
		s.ws()
		if s.eof() {
			return s.unexpectedEnd()
		}
		if c := s.b[s.pos]; c == ']' && open == '[' || c == '}' && open == '{' {
			s.pos++
			n--
		} else {
			opened, err := s.element(open == '[')
			if err != nil {
				return err
			}
			if opened {
				continue
			}
		}
		// After a value: a ',' and the next element, or the closer.
		for {
			if n == 0 {
				return nil
			}
			arr := isArray(n - 1)
			s.ws()
			if s.eof() {
				return s.unexpectedEnd()
			}
			c := s.b[s.pos]
			if c == ',' {
				s.pos++
				s.ws()
				opened, err := s.element(arr)
				if err != nil {
					return err
				}
				if opened {
					break
				}
				continue
			}
			if arr && c == ']' || !arr && c == '}' {
				s.pos++
				n--
				continue
			}
			if arr {
				return malformed(s.pos, "want ',' or ']' after an array element")
			}
			return malformed(s.pos, "want ',' or '}' after an object value")
		}
	}
}

// element scans an array element, or an object member's key and value, up
// to and excluding a nested container: for that it returns opened with
// s.pos on its bracket.
func (s *scanner) element(inArray bool) (opened bool, err *Error) {
	if !inArray {
		if s.eof() {
			return false, s.unexpectedEnd()
		}
		if s.b[s.pos] != '"' {
			return false, malformed(s.pos, "want a string for an object key")
		}
		if err := s.str(); err != nil {
			return false, err
		}
		if err := s.colon(); err != nil {
			return false, err
		}
	}
	if s.eof() {
		return false, s.unexpectedEnd()
	}
	switch s.b[s.pos] {
	case '{', '[':
		return true, nil
	}
	_, err = s.scalar()
	return false, err
}
