// Package frame is the listenhub wire codec: each frame is a 4-byte
// big-endian body length followed by that many bytes of UTF-8 JSON holding
// one object, whose "t" field names the message type (docs/protocol.md).
// A worker in Go may speak it directly: Append* writes frames, Decoder
// reads a stream of them.
//
// The codec is byte-compatible with the pgbus streams hub (Ruby), so a pgbus
// worker can talk to listenhub unchanged. It does no I/O: the hub reads a
// socket into its own buffer and hands the bytes to a Decoder, and writes the
// bytes the Append functions produce.
//
// The hub decodes and encodes on its single loop thread for every worker, so
// both directions are written for that setting: encoders append to the
// caller's buffer and allocate nothing, and decoding a message allocates one
// string backing for the strings it returns. The JSON is scanned by hand,
// without reflection and without encoding/json, for that reason; the tests
// check the output against encoding/json byte for byte.
package frame

import (
	"errors"
	"strconv"

	"github.com/listenhub/listenhub/internal/wire"
)

// MaxLen is the largest body a frame may carry: 4 MiB, as in the pgbus hub.
// Postgres caps a NOTIFY payload at 8000 bytes, so a legitimate frame is far
// below it even fully escaped; a larger length is a broken or hostile peer,
// and the reader severs the connection without allocating the body.
const MaxLen = wire.MaxLen

// Message types the protocol defines. Decode returns these very strings as
// Message.Type, so decoding a known type allocates nothing for it.
const (
	TypeSub    = "sub"
	TypeUnsub  = "unsub"
	TypeAck    = "ack"
	TypeNack   = "nack"
	TypeWake   = "wake"
	TypeStatus = "status"
)

// Message is one decoded frame. Only the fields of its type are set; a field
// another type carries is ignored on input like any unknown field, so that
// decoding and re-encoding a message gives the same message back.
//
//	sub, unsub, ack   Type, Name
//	nack              Type, Name, Error
//	wake              Type, Name, Payload, HasPayload
//	status            Type, Healthy
//	anything else     Type, and Name when "q" is a string (for the log line)
type Message struct {
	// Type is the message type. For the six known types it is one of the
	// Type* constants; any other string is an unknown type, which readers
	// log and skip (newer peers may send types this version does not know).
	Type string
	// Name is the subscription name.
	Name string
	// Payload is the NOTIFY payload, when HasPayload.
	Payload string
	// HasPayload is true when "p" is a JSON string (an ephemeral wake, whose
	// payload may be the only copy of the message) and false when it is
	// null or absent (a durable wake: "something changed, re-read"). An
	// empty payload string is still HasPayload.
	HasPayload bool
	// Healthy is the hub's view of its Postgres connection (status).
	Healthy bool
	// Error is why a subscription was refused (nack).
	Error string
	// NameNotUTF8 is true when the "q" the peer sent was not valid UTF-8: it
	// held bytes that are not UTF-8, or a \u escape of a surrogate that is
	// not half of a pair. Name then holds U+FFFD in their place, as
	// encoding/json decodes them, and is not the name the peer meant: an
	// ack for Name would never match the peer's own name. The hub refuses
	// such a sub with nack. The encoders never produce such a frame (they
	// write U+FFFD), so it does not survive a round trip.
	NameNotUTF8 bool
	// NameRaw, set only with NameNotUTF8, is the name as the peer sent it:
	// escapes decoded, bytes that are not UTF-8 kept as they are, and a \u
	// escape of a surrogate outside a pair as that surrogate's 3-byte form
	// (WTF-8, which is what Python's "surrogatepass" and Node write for
	// it). The hub's nack for such a name carries these bytes ("q64",
	// AppendNackRaw), so that the peer can match it to its sub.
	NameRaw string
}

var (
	// ErrTooLarge matches (errors.Is) the error for a frame header whose
	// length is above MaxLen. It is reported as soon as the 4 header bytes
	// are in, before anything is allocated for the body.
	ErrTooLarge = errors.New("frame: body length above MaxLen")
	// ErrMalformed matches (errors.Is) the error for a body that is not a
	// valid message: empty, bad JSON, not an object, "t" missing or not a
	// string, "q" missing or not a string where the type needs it, or a
	// known field of the wrong JSON type.
	ErrMalformed = errors.New("frame: malformed message")
)

// Error is the error Decode and Decoder.Next return for a rejected frame.
// It says why, so that the hub can log the reason when it severs the
// connection (docs/protocol.md).
type Error struct {
	// Err is ErrTooLarge or ErrMalformed; Unwrap returns it.
	Err error
	// Reason says what is wrong, e.g. `missing "q"` or `control character
	// in string`. Empty for ErrTooLarge.
	Reason string
	// Offset is the byte offset in the body at which the problem was
	// found, or -1 when it concerns the message as a whole (a missing
	// field, a field of the wrong type) or the header (ErrTooLarge).
	Offset int
	// Length is the body length the header announced (ErrTooLarge only).
	Length uint32
	// Limit is the largest body the reader accepted (ErrTooLarge only):
	// MaxLen, or the lower limit the hub reads workers with.
	Limit uint32
}

func (e *Error) Error() string {
	if e.Err == ErrTooLarge {
		s := "frame: body length " + strconv.FormatUint(uint64(e.Length), 10)
		if e.Limit == 0 || e.Limit == MaxLen {
			return s + " above MaxLen " + strconv.Itoa(MaxLen)
		}
		return s + " above the limit " + strconv.FormatUint(uint64(e.Limit), 10)
	}
	s := e.Err.Error() + ": " + e.Reason
	if e.Offset >= 0 {
		s += " at offset " + strconv.Itoa(e.Offset)
	}
	return s
}

// Unwrap returns ErrTooLarge or ErrMalformed.
func (e *Error) Unwrap() error { return e.Err }

func malformed(offset int, reason string) *Error {
	return &Error{Err: ErrMalformed, Reason: reason, Offset: offset}
}
