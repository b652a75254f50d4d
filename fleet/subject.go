package fleet

import (
	"errors"
	"strings"
)

// DefaultPrefix is the subjects' first token when Options leave it empty.
const DefaultPrefix = "listenhub"

// Subjects are the NATS subjects of one database of one fleet.
type Subjects struct {
	prefix string // PREFIX.DB, both encoded
}

// NewSubjects returns the subjects of database under prefix (DefaultPrefix
// when empty). A prefix may hold several tokens ("acme.prod"); each is
// checked, not encoded.
func NewSubjects(prefix, database string) (Subjects, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	for _, tok := range strings.Split(prefix, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return Subjects{}, errors.New("fleet: subject prefix " + quote(prefix) + " is not a NATS subject (empty tokens, wildcards or spaces)")
		}
	}
	if database == "" {
		return Subjects{}, errors.New("fleet: no database name for the subjects")
	}
	return Subjects{prefix: prefix + "." + EncodeToken(database)}, nil
}

// Notify is the subject of channel's notifications.
func (s Subjects) Notify(channel string) string { return s.prefix + ".n." + EncodeToken(channel) }

// Heartbeat is the active bridge's heartbeat subject.
func (s Subjects) Heartbeat() string { return s.prefix + ".hb" }

// Interest is the subject hubs register their channels on.
func (s Subjects) Interest() string { return s.prefix + ".interest" }

// Channel returns the channel of a Notify subject, and false for a subject
// that is not one of these subjects' (another database, a foreign message).
func (s Subjects) Channel(subject string) (string, bool) {
	tok, ok := strings.CutPrefix(subject, s.prefix+".n.")
	if !ok || strings.Contains(tok, ".") {
		return "", false
	}
	ch, err := DecodeToken(tok)
	if err != nil || ch == "" {
		return "", false
	}
	return ch, true
}

const hexDigits = "0123456789ABCDEF"

// EncodeToken maps name to one NATS subject token: [A-Za-z0-9_-] as they
// are, every other byte (dots, wildcards, spaces, '~' itself, UTF-8) as ~XX.
func EncodeToken(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('~')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

var errToken = errors.New("fleet: not an encoded name")

// DecodeToken is EncodeToken's inverse; a token EncodeToken cannot have
// written is an error.
func DecodeToken(tok string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-':
			b.WriteByte(c)
		case c == '~' && i+2 < len(tok):
			hi, lo := strings.IndexByte(hexDigits, tok[i+1]), strings.IndexByte(hexDigits, tok[i+2])
			if hi < 0 || lo < 0 {
				return "", errToken
			}
			v := byte(hi<<4 | lo)
			if v >= 'a' && v <= 'z' || v >= 'A' && v <= 'Z' || v >= '0' && v <= '9' || v == '_' || v == '-' {
				return "", errToken // EncodeToken keeps these as they are
			}
			b.WriteByte(v)
			i += 2
		default:
			return "", errToken
		}
	}
	return b.String(), nil
}

func quote(s string) string { return "\"" + s + "\"" }
