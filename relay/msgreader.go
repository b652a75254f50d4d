package relay

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
)

// msgReader reads backend messages (a type byte, a length that counts its
// own 4 bytes, the body) off the replication connection, and never loses
// its place in the stream: a read cut short, by the deadline that turns
// the walsender's silence into a probe or by anything else, consumes
// nothing it has not returned, so the next call goes on where the stream
// is. pgproto3's chunkreader keeps the same rule. (Reading the header
// first and the body after lost the header whenever the body was late: the
// next call took body bytes for a header, and either misread a length or
// never read the stream again.)
//
// A message that fits the buffer is returned in place (valid until the
// next call); a larger one is copied into a body of its own as it
// arrives, and kept across calls until it is whole.
type msgReader struct {
	src countingReader
	br  *bufio.Reader

	// A message larger than br's buffer while it arrives: its type, the
	// whole body's storage, and how much of it has come (big is nil
	// between such messages).
	bigTyp byte
	big    []byte
	have   int
}

// countingReader counts the bytes read through it: how the stream loop
// tells a message still arriving from silence.
type countingReader struct {
	r io.Reader
	n uint64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += uint64(n)
	return n, err
}

// msgBufferSize is the reader's buffer: large enough that a burst of small
// messages is one read(2).
const msgBufferSize = 256 << 10

func newMsgReader(r io.Reader) *msgReader {
	m := &msgReader{src: countingReader{r: r}}
	m.br = bufio.NewReaderSize(&m.src, msgBufferSize)
	return m
}

// Buffered reports whether bytes of a next message are at hand already.
func (m *msgReader) Buffered() int { return m.br.Buffered() }

// Taken is the number of bytes read off the connection so far.
func (m *msgReader) Taken() uint64 { return m.src.n }

// Next returns the next message. On an error nothing is lost: the same
// call again, once the connection can be read, returns that message.
// A length no server sends is an error the stream cannot recover from.
func (m *msgReader) Next() (typ byte, body []byte, err error) {
	if m.big == nil {
		hdr, err := m.br.Peek(5)
		if err != nil {
			return 0, nil, err
		}
		typ = hdr[0]
		n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
		if n < 0 || n > maxMessage {
			return 0, nil, fmt.Errorf("relay: bad message length %d (type %q)", n, typ)
		}
		if 5+n <= m.br.Size() {
			msg, err := m.br.Peek(5 + n)
			if err != nil {
				return 0, nil, err // nothing consumed: the header stays
			}
			_, _ = m.br.Discard(5 + n)
			return typ, msg[5:], nil
		}
		_, _ = m.br.Discard(5)
		m.bigTyp, m.big, m.have = typ, make([]byte, n), 0
	}
	for m.have < len(m.big) {
		k, err := m.br.Read(m.big[m.have:])
		m.have += k
		if err != nil && m.have < len(m.big) {
			return 0, nil, err // m.big keeps what came
		}
	}
	typ, body = m.bigTyp, m.big
	m.big, m.have = nil, 0
	return typ, body, nil
}
