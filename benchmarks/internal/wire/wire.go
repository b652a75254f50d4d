// Package wire is the benchmarks' own small codec for the listenhub wire
// protocol (docs/design.md, v1): a 4-byte big-endian length, then one compact JSON
// object. The benchmarks speak the protocol directly so that the workers and
// the baselines measure the protocol, not a client library, and so that the
// harness builds while the main module's packages are still being written.
//
// The worker side decodes wakes with a fast path: the hub's output is compact
// in a fixed key order ({"t":"wake","q":"Q","p":"…"}), and benchmark payloads
// have no escapes, so a wake is recognised by its prefix and its payload is
// sliced out without encoding/json. Anything else goes through encoding/json.
// On 2 cores the workers compete with the hub for CPU; a worker that spends
// 1 µs per frame in encoding/json would measure itself, not the hub.
package wire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// MaxLen is the protocol's maximum body length (4 MiB).
const MaxLen = 4 << 20

// ErrTooLarge is returned for a length header above MaxLen.
var ErrTooLarge = errors.New("wire: frame longer than 4 MiB")

// Message is one decoded frame.
type Message struct {
	T       string
	Q       string
	HasQ    bool // q was a JSON string
	P       string
	HasP    bool // p was a JSON string (false: null or absent, a durable wake)
	Healthy bool
	Error   string
}

type jsonMessage struct {
	T       *string `json:"t"`
	Q       *string `json:"q"`
	P       *string `json:"p"`
	Healthy bool    `json:"healthy"`
	Error   string  `json:"error"`
}

func appendHeader(dst []byte) ([]byte, int) {
	n := len(dst)
	return append(dst, 0, 0, 0, 0), n
}

func finish(dst []byte, at int) []byte {
	binary.BigEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
	return dst
}

// appendJSONString appends s as a JSON string (escapes per RFC 8259).
func appendJSONString(dst []byte, s []byte) []byte {
	for _, c := range s {
		if c < 0x20 || c == '"' || c == '\\' || c >= 0x7f {
			b, _ := json.Marshal(string(s))
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// AppendSub appends {"t":"sub","q":"Q"}.
func AppendSub(dst []byte, q string) []byte {
	dst, at := appendHeader(dst)
	dst = append(dst, `{"t":"sub","q":`...)
	dst = appendJSONString(dst, []byte(q))
	return finish(append(dst, '}'), at)
}

// AppendUnsub appends {"t":"unsub","q":"Q"}.
func AppendUnsub(dst []byte, q string) []byte {
	dst, at := appendHeader(dst)
	dst = append(dst, `{"t":"unsub","q":`...)
	dst = appendJSONString(dst, []byte(q))
	return finish(append(dst, '}'), at)
}

// AppendAck appends {"t":"ack","q":"Q"}.
func AppendAck(dst []byte, q string) []byte {
	dst, at := appendHeader(dst)
	dst = append(dst, `{"t":"ack","q":`...)
	dst = appendJSONString(dst, []byte(q))
	return finish(append(dst, '}'), at)
}

// AppendNack appends {"t":"nack","q":"Q","error":"…"}.
func AppendNack(dst []byte, q, reason string) []byte {
	dst, at := appendHeader(dst)
	dst = append(dst, `{"t":"nack","q":`...)
	dst = appendJSONString(dst, []byte(q))
	dst = append(dst, `,"error":`...)
	dst = appendJSONString(dst, []byte(reason))
	return finish(append(dst, '}'), at)
}

// AppendWake appends {"t":"wake","q":"Q","p":null|"…"}.
func AppendWake(dst []byte, q string, p []byte, hasP bool) []byte {
	dst, at := appendHeader(dst)
	dst = append(dst, `{"t":"wake","q":`...)
	dst = appendJSONString(dst, []byte(q))
	dst = append(dst, `,"p":`...)
	if hasP {
		dst = appendJSONString(dst, p)
	} else {
		dst = append(dst, "null"...)
	}
	return finish(append(dst, '}'), at)
}

// AppendStatus appends {"t":"status","healthy":B}.
func AppendStatus(dst []byte, healthy bool) []byte {
	dst, at := appendHeader(dst)
	dst = append(dst, `{"t":"status","healthy":`...)
	dst = strconv.AppendBool(dst, healthy)
	return finish(append(dst, '}'), at)
}

// Reader reads frames from a stream.
type Reader struct {
	r   *bufio.Reader
	buf []byte
}

// NewReader wraps r with a read buffer of size bytes.
func NewReader(r io.Reader, size int) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, size)}
}

// Reset makes r read from a new stream, keeping its buffer.
func (r *Reader) Reset(rd io.Reader) { r.r.Reset(rd) }

// Take returns a copy of the bytes r has buffered and not returned yet
// (for handing the stream over to another reader).
func (r *Reader) Take() []byte {
	b, _ := r.r.Peek(r.r.Buffered())
	return append([]byte(nil), b...)
}

// Next returns the next frame's body. It is valid until the next call.
func (r *Reader) Next() ([]byte, error) {
	hdr, err := r.r.Peek(4)
	if err != nil {
		if err == io.EOF && len(hdr) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr)
	r.r.Discard(4)
	if n > MaxLen {
		return nil, ErrTooLarge
	}
	// Zero copy when the body is already buffered: the common case, since
	// one read brings many frames.
	if int(n) <= r.r.Size() {
		b, err := r.r.Peek(int(n))
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		r.r.Discard(int(n))
		return b, nil
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	r.buf = r.buf[:n]
	if _, err := io.ReadFull(r.r, r.buf); err != nil {
		return nil, err
	}
	return r.buf, nil
}

var wakePrefix = []byte(`{"t":"wake","q":"`)

// FastWake recognises a compact wake with an escape-free payload and returns
// its payload (a sub-slice of body). ok is false for anything else, which the
// caller then decodes with Decode.
func FastWake(body []byte) (p []byte, hasP, ok bool) {
	if !bytes.HasPrefix(body, wakePrefix) {
		return nil, false, false
	}
	rest := body[len(wakePrefix):]
	i := bytes.IndexByte(rest, '"')
	if i < 0 || bytes.IndexByte(rest[:i], '\\') >= 0 {
		return nil, false, false
	}
	rest = rest[i+1:]
	switch {
	case bytes.HasPrefix(rest, []byte(`,"p":null}`)):
		return nil, false, true
	case bytes.HasPrefix(rest, []byte(`,"p":"`)):
		rest = rest[len(`,"p":"`):]
		j := bytes.IndexByte(rest, '"')
		if j < 0 || bytes.IndexByte(rest[:j], '\\') >= 0 || !bytes.Equal(rest[j:], []byte(`"}`)) {
			return nil, false, false
		}
		return rest[:j], true, true
	}
	return nil, false, false
}

// Decode decodes one body with encoding/json.
func Decode(body []byte) (Message, error) {
	var j jsonMessage
	if err := json.Unmarshal(body, &j); err != nil {
		return Message{}, fmt.Errorf("wire: bad frame %.80q: %w", body, err)
	}
	if j.T == nil {
		return Message{}, fmt.Errorf("wire: frame without a string t: %.80q", body)
	}
	m := Message{T: *j.T, Healthy: j.Healthy, Error: j.Error}
	if j.Q != nil {
		m.Q, m.HasQ = *j.Q, true
	}
	if j.P != nil {
		m.P, m.HasP = *j.P, true
	}
	return m, nil
}
