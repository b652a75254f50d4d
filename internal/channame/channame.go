// Package channame is the rule a Postgres channel name must follow to be
// LISTENed, NOTIFYed and named in a wake, shared by packages hub, listener
// and relay: one limit, one validator, one set of messages (the hub's nack
// texts, which workers see). Package client checks a subscription name
// against the same limit before the round trip, in the words of the
// other languages' clients.
package channame

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxLen is NAMEDATALEN-1, the longest channel name Postgres keeps: it
// silently truncates a longer identifier, which would make two names one
// channel.
const MaxLen = 63

// ErrInvalid is the error every refusal of Check wraps.
var ErrInvalid = errors.New("invalid channel")

// ErrNotUTF8 refuses a name that is not valid UTF-8 (the server refuses
// the whole query string for it, so the error could not be pinned on one
// command of a batch).
var ErrNotUTF8 = fmt.Errorf("%w: not valid UTF-8", ErrInvalid)

// Check reports why ch cannot be LISTENed to as given, or nil. Empty names
// are a syntax error in Postgres; names over MaxLen bytes would be truncated
// into another channel; NUL cannot travel in a query; invalid UTF-8 is
// refused by the server.
func Check(ch string) error {
	switch {
	case ch == "":
		return fmt.Errorf("%w: empty name", ErrInvalid)
	case len(ch) > MaxLen:
		return fmt.Errorf("%w: %d bytes, Postgres allows at most %d", ErrInvalid, len(ch), MaxLen)
	case strings.IndexByte(ch, 0) >= 0:
		return fmt.Errorf("%w: contains NUL", ErrInvalid)
	case !utf8.ValidString(ch):
		return ErrNotUTF8
	}
	return nil
}
