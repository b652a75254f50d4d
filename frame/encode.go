package frame

import (
	"encoding/base64"
	"encoding/binary"

	"github.com/listenhub/listenhub/internal/jsonstr"
)

// The encoders below each append one whole frame, header included, to dst and
// return the extended slice, like strconv.AppendInt. They allocate nothing when
// dst has the capacity, so the hub can encode a wake once into a reused
// buffer and copy those bytes to every subscriber.
//
// The output is compact JSON with the keys in the order the pgbus hub writes
// them, so listenhub's frames are the very bytes a pgbus worker already
// receives.
//
// The encoders do not check MaxLen: their inputs are bounded by the callers
// (a channel name is at most 63 bytes, a NOTIFY payload at most 8000, so a
// wake is under 50 KiB even if every payload byte needs a 6-byte escape).

// AppendSub appends {"t":"sub","q":Q}.
func AppendSub(dst []byte, q string) []byte {
	return appendQ(dst, `{"t":"sub","q":`, q)
}

// AppendUnsub appends {"t":"unsub","q":Q}.
func AppendUnsub(dst []byte, q string) []byte {
	return appendQ(dst, `{"t":"unsub","q":`, q)
}

// AppendAck appends {"t":"ack","q":Q}.
func AppendAck(dst []byte, q string) []byte {
	return appendQ(dst, `{"t":"ack","q":`, q)
}

// AppendNack appends {"t":"nack","q":Q,"error":REASON}.
func AppendNack(dst []byte, q, reason string) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = append(dst, `{"t":"nack","q":`...)
	dst = jsonstr.Append(dst, q)
	dst = append(dst, `,"error":`...)
	dst = jsonstr.Append(dst, reason)
	dst = append(dst, '}')
	return finish(dst, start)
}

// AppendNackRaw is AppendNack for a sub whose name was not valid UTF-8
// (Message.NameNotUTF8): {"t":"nack","q":Q,"q64":base64(sent),"error":R},
// where q is the name as decoded (U+FFFD in place of what was not UTF-8)
// and sent the name's bytes as sent (Message.NameRaw), in standard base64
// with padding, so that the peer can match the nack to its sub.
func AppendNackRaw(dst []byte, q, sent, reason string) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = append(dst, `{"t":"nack","q":`...)
	dst = jsonstr.Append(dst, q)
	dst = append(dst, `,"q64":"`...)
	dst = base64.StdEncoding.AppendEncode(dst, []byte(sent))
	dst = append(dst, `","error":`...)
	dst = jsonstr.Append(dst, reason)
	dst = append(dst, '}')
	return finish(dst, start)
}

// AppendWake appends {"t":"wake","q":Q,"p":P}, with "p":null when !hasP (a
// durable wake). The payload is a byte slice because that is how it comes
// out of the Postgres NotificationResponse; taking it as is saves the hub a
// string conversion per notification.
func AppendWake(dst []byte, q string, p []byte, hasP bool) []byte {
	return appendWake(dst, q, p, hasP)
}

// AppendStatus appends {"t":"status","healthy":true} (or false).
func AppendStatus(dst []byte, healthy bool) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	if healthy {
		dst = append(dst, `{"t":"status","healthy":true}`...)
	} else {
		dst = append(dst, `{"t":"status","healthy":false}`...)
	}
	return finish(dst, start)
}

// Append appends m encoded by its type, writing only the fields that type
// carries (see Message). A message of an unknown type is written as
// {"t":T,"q":Q}, with "q" left out when Q is empty, which is all that
// Decode keeps of such a message; so for every message Decode returns,
// Decode(Append(nil, m)[4:]) == m.
func Append(dst []byte, m Message) []byte {
	switch m.Type {
	case TypeSub:
		return AppendSub(dst, m.Name)
	case TypeUnsub:
		return AppendUnsub(dst, m.Name)
	case TypeAck:
		return AppendAck(dst, m.Name)
	case TypeNack:
		return AppendNack(dst, m.Name, m.Error)
	case TypeWake:
		return appendWake(dst, m.Name, m.Payload, m.HasPayload)
	case TypeStatus:
		return AppendStatus(dst, m.Healthy)
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = append(dst, `{"t":`...)
	dst = jsonstr.Append(dst, m.Type)
	if m.Name != "" {
		dst = append(dst, `,"q":`...)
		dst = jsonstr.Append(dst, m.Name)
	}
	dst = append(dst, '}')
	return finish(dst, start)
}

func appendQ(dst []byte, prefix, q string) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = append(dst, prefix...)
	dst = jsonstr.Append(dst, q)
	dst = append(dst, '}')
	return finish(dst, start)
}

func appendWake[P []byte | string](dst []byte, q string, p P, hasP bool) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = append(dst, `{"t":"wake","q":`...)
	dst = jsonstr.Append(dst, q)
	if hasP {
		dst = append(dst, `,"p":`...)
		dst = jsonstr.Append(dst, p)
		dst = append(dst, '}')
	} else {
		dst = append(dst, `,"p":null}`...)
	}
	return finish(dst, start)
}

// finish fills in the length header reserved at dst[start:start+4].
func finish(dst []byte, start int) []byte {
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}
