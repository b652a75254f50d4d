package frame

import "github.com/listenhub/listenhub/internal/wire"

// Decoder splits a byte stream into frames and decodes them: a worker in Go
// that speaks the protocol itself reads its socket into a buffer, feeds the
// bytes, and takes whole messages out. It is fed the bytes as they come, in
// chunks of any size (one byte at a time works).
//
// The zero value is ready to use and accepts bodies up to MaxLen. A Decoder
// is not safe for concurrent use.
type Decoder struct {
	s wire.Decoder
}

// Feed appends a copy of b to the bytes waiting to be decoded, so the caller
// may reuse b at once (a socket read buffer). Call Next until it reports
// ok=false after each Feed. After Next has returned an error, Feed discards
// its input: nothing more will be decoded, and a hostile peer must not be
// able to make the buffer grow.
//
// A header announcing a body above MaxLen is refused here, before b is
// copied: the error is then what the next Next returns.
func (d *Decoder) Feed(b []byte) { d.s.Feed(b) }

// Next decodes the next frame. ok is false, with a nil error, when the next
// frame is not complete yet: Feed more bytes and call again. A header whose
// length is above MaxLen is an error matching ErrTooLarge as soon as its 4
// bytes are in, before anything is allocated for the body; a bad body is an
// error matching ErrMalformed (see Decode). Errors are sticky: a stream
// cannot be resynchronised after a bad frame, so the connection must go.
//
// The message's strings are copies: they stay valid after the next Feed.
func (d *Decoder) Next() (m Message, ok bool, err error) {
	body, ok, err := d.s.Next()
	if err != nil {
		if le := fromWire(err); le != err {
			d.s.Fail(le) // the same error from now on
			return Message{}, false, le
		}
		return Message{}, false, err
	}
	if !ok {
		return Message{}, false, nil
	}
	if m, err = Decode(body); err != nil {
		return Message{}, false, d.s.Fail(err)
	}
	return m, true, nil
}

// Buffered returns the number of bytes fed and not yet decoded: the start
// of a frame still to come.
func (d *Decoder) Buffered() int { return d.s.Buffered() }

// fromWire turns the splitter's error for an oversized header into an
// *Error matching ErrTooLarge; any other error is returned as it is.
func fromWire(err error) error {
	if le, ok := err.(*wire.LengthError); ok {
		return &Error{Err: ErrTooLarge, Offset: -1, Length: le.Length, Limit: le.Limit}
	}
	return err
}
