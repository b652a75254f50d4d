package relay

import (
	"errors"
	"fmt"
	"strings"
)

// Template is a parsed channel template: literal text and the placeholders
// {schema}, {table} and {op}.
type Template struct {
	src   string
	parts []tmplPart
}

type tmplPart struct {
	lit string
	ph  byte // 0: literal; 's' schema, 't' table, 'o' op
}

// ParseTemplate parses a channel template. Braces other than the three
// placeholders are refused: a typo such as {tabel} would otherwise become
// part of every channel name.
func ParseTemplate(s string) (Template, error) {
	t := Template{src: s}
	rest := s
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			t.parts = append(t.parts, tmplPart{lit: rest})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, tmplPart{lit: rest[:i]})
		}
		rest = rest[i:]
		var ph byte
		switch {
		case strings.HasPrefix(rest, "{schema}"):
			ph = 's'
		case strings.HasPrefix(rest, "{table}"):
			ph = 't'
		case strings.HasPrefix(rest, "{op}"):
			ph = 'o'
		default:
			return Template{}, fmt.Errorf("channel template %q: unknown placeholder at %q (want {schema}, {table} or {op})", s, rest)
		}
		t.parts = append(t.parts, tmplPart{ph: ph})
		rest = rest[strings.IndexByte(rest, '}')+1:]
	}
	if s == "" {
		return Template{}, errors.New("channel template is empty")
	}
	return t, nil
}

// String returns the template as written.
func (t Template) String() string { return t.src }

// channel renders the channel of a change of op on schema.table.
func (t Template) channel(schema, table string, o op) string {
	var b strings.Builder
	for _, p := range t.parts {
		switch p.ph {
		case 0:
			b.WriteString(p.lit)
		case 's':
			b.WriteString(schema)
		case 't':
			b.WriteString(table)
		case 'o':
			b.WriteString(opNames[o])
		}
	}
	return b.String()
}

// has reports whether the template uses placeholder ph.
func (t Template) has(ph byte) bool {
	for _, p := range t.parts {
		if p.ph == ph {
			return true
		}
	}
	return false
}

// Ops is a set of row-change kinds the relay NOTIFYs for.
type Ops uint8

const (
	OpInsert   Ops = 1 << opInsert
	OpUpdate   Ops = 1 << opUpdate
	OpDelete   Ops = 1 << opDelete
	OpTruncate Ops = 1 << opTruncate
)

func (s Ops) has(o op) bool { return s&(1<<o) != 0 }

// ParseOps parses a comma-separated list of insert, update, delete and
// truncate (any case), or "all".
func ParseOps(s string) (Ops, error) {
	var ops Ops
	for _, f := range strings.Split(s, ",") {
		switch strings.ToLower(strings.TrimSpace(f)) {
		case "insert":
			ops |= OpInsert
		case "update":
			ops |= OpUpdate
		case "delete":
			ops |= OpDelete
		case "truncate":
			ops |= OpTruncate
		case "all":
			ops |= OpInsert | OpUpdate | OpDelete | OpTruncate
		case "":
		default:
			return 0, fmt.Errorf("unknown op %q (want insert, update, delete, truncate or all)", strings.TrimSpace(f))
		}
	}
	if ops == 0 {
		return 0, errors.New("no op given (want insert, update, delete, truncate or all)")
	}
	return ops, nil
}

// String lists the set the way ParseOps reads it.
func (s Ops) String() string {
	var names []string
	for o := op(0); o < numOps; o++ {
		if s.has(o) {
			names = append(names, strings.ToLower(opNames[o]))
		}
	}
	return strings.Join(names, ",")
}
