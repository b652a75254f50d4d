// Package pgquote quotes SQL identifiers and string literals for the
// queries the module builds itself (LISTEN, NOTIFY, the relay's slot and
// publication statements, the fixes it prints), so that no name can end
// its quotes and inject SQL. One helper for the module: the rule is
// Postgres', and it must not differ from one package to the next.
package pgquote

import "strings"

// Ident returns s as a quoted identifier: wrapped in double quotes, every
// double quote doubled. s must not contain NUL (not representable).
func Ident(s string) string { return string(AppendIdent(make([]byte, 0, len(s)+2), s)) }

// AppendIdent appends Ident(s) to dst without allocating beyond dst's
// growth.
func AppendIdent(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' {
			dst = append(dst, '"')
		}
		dst = append(dst, s[i])
	}
	return append(dst, '"')
}

// Literal returns s as a string literal: wrapped in single quotes, every
// single quote doubled (standard_conforming_strings is on, so a backslash
// is an ordinary character).
func Literal(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }
