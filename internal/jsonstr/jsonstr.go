// Package jsonstr appends Go strings as JSON strings without encoding/json's
// reflection and allocations: Append as the wire's frames need them (no HTML
// escaping, pgbus's bytes) and AppendHTML as encoding/json's default writes
// them. Both replace invalid UTF-8 by U+FFFD and escape U+2028 and U+2029.
package jsonstr

import "unicode/utf8"

const hexDigits = "0123456789abcdef"

// safe[c] is true for the ASCII bytes a JSON string may hold unescaped: all
// but the control characters, '"' and '\\'. Bytes from 0x80 up are false so
// that they take the UTF-8 path.
//
// Unlike encoding/json's default, '<', '>' and '&' are safe here. Go escapes
// them (as \u003c, \u003e, \u0026) in case the JSON is pasted into HTML; the
// pgbus hub's Ruby JSON.generate does not, and no browser reads the wire's
// frames, so escaping them would only make listenhub's bytes differ from
// pgbus's. The output is what an encoding/json Encoder with
// SetEscapeHTML(false) writes, byte for byte (package frame's tests check
// it).
var safe = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// Append appends s as a JSON string, escaped exactly as encoding/json does
// with HTML escaping off (the wire's frames, see package frame):
//   - '"' and '\\' as \" and \\;
//   - \b, \f, \n, \r and \t by their short escapes, the other control
//     characters below 0x20 as \u00XX (lower-case hex);
//   - U+2028 and U+2029 as \u2028 and \u2029: valid in JSON but line
//     terminators in JavaScript, so a consumer that evaluates JSON as
//     JavaScript would break on them;
//   - every byte that is not part of valid UTF-8 as \ufffd, one per byte,
//     so the output is always valid UTF-8 (a NOTIFY payload is whatever
//     bytes the sender's client encoding allowed);
//   - everything else as is, including DEL and '<', '>', '&'.
func Append[S []byte | string](dst []byte, s S) []byte {
	return appendEscaped(dst, s, &safe)
}

// htmlSafe is safe with '<', '>' and '&' taken out: escaped as \u003c,
// \u003e and \u0026, as encoding/json does by default.
var htmlSafe = func() (t [256]bool) {
	t = safe
	t['<'], t['>'], t['&'] = false, false, false
	return t
}()

// AppendHTML appends s as a JSON string escaped as encoding/json does by
// default: as Append, and '<', '>' and '&' escaped too (the monitoring
// endpoints' JSON, which a browser may show).
func AppendHTML[S []byte | string](dst []byte, s S) []byte {
	return appendEscaped(dst, s, &htmlSafe)
}

// appendEscaped appends s quoted, the ASCII bytes not in safe escaped.
func appendEscaped[S []byte | string](dst []byte, s S, safe *[256]bool) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if safe[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		// Converting at most 4 bytes keeps the conversion on the stack for
		// a []byte s (no allocation), and is free for a string s.
		r, size := utf8.DecodeRuneInString(string(s[i:min(len(s), i+utf8.UTFMax)]))
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
