package frame

import "encoding/binary"

// keepCap is the largest buffer a Decoder keeps once it has handed out every
// byte it was fed. Workers send a few small frames (sub, unsub) now and then,
// so a small buffer is reused for good; a buffer that grew for a burst or a
// large frame is dropped, so that an idle connection holds little memory.
const keepCap = 4 << 10

// Decoder splits a byte stream into frames and decodes them. It is fed the
// bytes as they come off the socket, in chunks of any size (one byte at a
// time works), and yields whole messages.
//
// The zero value is ready to use. A Decoder is not safe for concurrent use;
// the hub keeps one per worker on its loop thread.
type Decoder struct {
	// buf[r:] holds the bytes fed and not yet decoded: at most one partial
	// frame plus whatever complete frames the last Feed brought.
	buf []byte
	r   int
	// err, once set, is returned by every Next: the stream cannot be
	// resynchronised after a bad frame, so the connection must go.
	err error
}

// Feed appends a copy of b to the bytes waiting to be decoded, so the caller
// may reuse b at once (a socket read buffer). Call Next until it reports
// ok=false after each Feed. After Next has returned an error, Feed discards
// its input: nothing more will be decoded, and a hostile peer must not be
// able to make the buffer grow.
func (d *Decoder) Feed(b []byte) {
	if d.err != nil || len(b) == 0 {
		return
	}
	switch {
	case d.r == len(d.buf):
		d.buf, d.r = d.buf[:0], 0
	case d.r > 0 && len(b) > cap(d.buf)-len(d.buf):
		// Move the partial frame to the front rather than grow: it is
		// at most one frame, and usually a few bytes.
		n := copy(d.buf, d.buf[d.r:])
		d.buf, d.r = d.buf[:n], 0
	}
	d.buf = append(d.buf, b...)
}

// Next decodes the next frame. ok is false, with a nil error, when the next
// frame is not complete yet: Feed more bytes and call again. A header whose
// length is above MaxLen is an error (matching ErrTooLarge) as soon as its 4
// bytes are in, before anything is allocated for the body; a bad body is an
// error matching ErrMalformed (see Decode). Errors are sticky.
//
// The message's strings are copies: they stay valid after the next Feed.
func (d *Decoder) Next() (m Message, ok bool, err error) {
	if d.err != nil {
		return Message{}, false, d.err
	}
	avail := d.buf[d.r:]
	if len(avail) < 4 {
		return Message{}, false, nil
	}
	n := binary.BigEndian.Uint32(avail)
	if n > MaxLen {
		return Message{}, false, d.fail(&Error{Err: ErrTooLarge, Offset: -1, Length: n})
	}
	if uint64(len(avail)-4) < uint64(n) {
		return Message{}, false, nil
	}
	m, err = Decode(avail[4 : 4+n])
	d.r += 4 + int(n)
	if err != nil {
		return Message{}, false, d.fail(err)
	}
	if d.r == len(d.buf) {
		if cap(d.buf) > keepCap {
			d.buf = nil
		}
		d.buf, d.r = d.buf[:0], 0
	}
	return m, true, nil
}

// Buffered returns the number of bytes fed and not yet decoded.
func (d *Decoder) Buffered() int { return len(d.buf) - d.r }

// Unread returns the bytes fed and not yet decoded (after Next reported
// ok=false: the start of a partial frame). The slice is valid until the next
// Feed or Next. A hot upgrade hands them to the new process, which Feeds them
// to its own Decoder before the first byte it reads itself.
func (d *Decoder) Unread() []byte { return d.buf[d.r:] }

func (d *Decoder) fail(err error) error {
	d.err = err
	d.buf, d.r = nil, 0
	return err
}
