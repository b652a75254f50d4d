// Package wire splits a listenhub byte stream into frame bodies, with the
// knobs the hub needs and a worker does not: a lower body limit, decoding
// straight from the caller's read buffer, giving an idle peer's buffer back,
// and handing a partial frame to a new process in a hot upgrade. frame.Decoder
// is the public decoder built on it.
package wire

import (
	"encoding/binary"
	"strconv"
)

// MaxLen is the protocol's largest body (frame.MaxLen).
const MaxLen = 4 << 20

// LengthError is a header announcing a body above the limit. Its text is
// frame.Error's for ErrTooLarge, so that the hub's log says the same thing
// whichever decoder refused the frame.
type LengthError struct {
	Length, Limit uint32
}

func (e *LengthError) Error() string {
	s := "frame: body length " + strconv.FormatUint(uint64(e.Length), 10)
	if e.Limit == 0 || e.Limit == MaxLen {
		return s + " above MaxLen " + strconv.Itoa(MaxLen)
	}
	return s + " above the limit " + strconv.FormatUint(uint64(e.Limit), 10)
}

// KeepCap is the largest buffer a Decoder keeps between frames. Workers send
// a few small frames (sub, unsub) now and then, so a small buffer is reused
// while they do; a buffer that grew for a burst or a large frame is dropped
// (or its remainder moved to a small one) as soon as the large frame is
// decoded, and Release drops even the small one of an idle peer.
const KeepCap = 4 << 10

// Decoder splits a byte stream into frame bodies. It is fed the bytes as
// they come off the socket, in chunks of any size (one byte at a time
// works), and yields whole bodies for frame.Decode.
//
// The zero value is ready to use and accepts bodies up to MaxLen. A Decoder
// is not safe for concurrent use; the hub keeps one per worker on its loop
// thread.
type Decoder struct {
	// Max, when positive and below MaxLen, is the largest body accepted
	// instead of MaxLen. The hub reads workers with a far lower limit
	// than the protocol's (a legitimate sub is a few hundred bytes), so
	// that a peer cannot make it hold megabytes of a partial frame.
	Max int

	// buf[r:] holds the bytes fed and not yet decoded: at most one partial
	// frame plus whatever complete frames the last Feed brought. While
	// borrowed, buf is the caller's slice from FeedBorrowed, not a copy.
	buf      []byte
	r        int32
	borrowed bool
	// err, once set, is returned by every Next: the stream cannot be
	// resynchronised after a bad frame, so the connection must go.
	err error
}

// limit is the largest body this decoder accepts.
func (d *Decoder) limit() uint32 {
	if d.Max > 0 && d.Max < MaxLen {
		return uint32(d.Max)
	}
	return MaxLen
}

// Feed appends a copy of b to the bytes waiting to be decoded, so the caller
// may reuse b at once (a socket read buffer). Call Next until it reports
// ok=false after each Feed. After Next has returned an error, Feed discards
// its input: nothing more will be decoded, and a hostile peer must not be
// able to make the buffer grow.
//
// A header announcing a body above the limit (completed by b, or fed before
// and not seen by Next yet) is refused here, before b is copied: the error
// is then what the next Next returns.
func (d *Decoder) Feed(b []byte) {
	if d.err != nil || len(b) == 0 {
		return
	}
	if d.borrowed {
		d.own(0)
	}
	// The frame under way, once its header is in: a body above the
	// limit is refused before b is copied (a peer must not make the
	// buffer grow for it, whether or not Next saw the header yet), and
	// a buffer that must grow grows once to what the frame needs.
	frameLen := -1
	if have := len(d.buf) - int(d.r); have+len(b) >= 4 {
		var hdr [4]byte
		copy(hdr[copy(hdr[:], d.buf[d.r:]):], b)
		n := binary.BigEndian.Uint32(hdr[:])
		if n > d.limit() {
			d.fail(&LengthError{Length: n, Limit: d.limit()})
			return
		}
		frameLen = 4 + int(n)
	}
	switch {
	case int(d.r) == len(d.buf):
		d.buf, d.r = d.buf[:0], 0
	case d.r > 0 && len(b) > cap(d.buf)-len(d.buf):
		// Move the partial frame to the front rather than grow: it is
		// at most one frame, and usually a few bytes.
		n := copy(d.buf, d.buf[d.r:])
		d.buf, d.r = d.buf[:n], 0
	}
	if need := len(d.buf) + len(b); need > cap(d.buf) {
		// Grow once to what the frame under way needs, when its header
		// says: append's doubling would leave a large frame in a buffer
		// up to twice its size, after copying it on the way.
		size := max(need, minBuf, int(d.r)+frameLen)
		grown := make([]byte, len(d.buf), size)
		copy(grown, d.buf)
		d.buf = grown
	}
	d.buf = append(d.buf, b...)
}

// minBuf is the smallest buffer a Decoder allocates.
const minBuf = 256

// FeedBorrowed is Feed without the copy, for a caller that decodes every
// whole frame at once (the hub, after each read): the decoder works on b
// itself until Next reports ok=false or an error, and only the incomplete
// frame left at the end, if any, is copied into storage of its own. A peer
// that sends whole frames, as workers do, then costs no buffer at all,
// and no garbage per read. b must not change until that Next; calling Feed
// or FeedBorrowed before it copies what is left of b first.
func (d *Decoder) FeedBorrowed(b []byte) {
	if d.err != nil || len(b) == 0 {
		return
	}
	if d.borrowed || int(d.r) < len(d.buf) {
		d.Feed(b) // bytes are waiting: the new ones go after a copy of them
		return
	}
	d.buf, d.r, d.borrowed = b, 0, true
}

// own copies the undecoded bytes of a borrowed buffer into the decoder's own
// storage, with room for a frame of frameLen bytes (header included) when
// that is known, and ends the borrow. Exactly that room: a peer that sends
// the start of a frame and goes away (or sends the rest at once) should not
// cost a buffer of minBuf; a later Feed grows it if need be.
func (d *Decoder) own(frameLen int) {
	rest := d.buf[d.r:]
	if len(rest) == 0 {
		d.buf, d.r, d.borrowed = nil, 0, false
		return
	}
	owned := make([]byte, len(rest), max(len(rest), frameLen))
	copy(owned, rest)
	d.buf, d.r, d.borrowed = owned, 0, false
}

// Next returns the next frame's body. ok is false, with a nil error, when
// the next frame is not complete yet: Feed more bytes and call again. A
// header whose length is above the limit (MaxLen, or Max) is a *LengthError
// as soon as its 4 bytes are in, before anything is allocated for the body.
// Errors are sticky; Fail makes a caller's own error (a body that does not
// decode) sticky too.
//
// The body is valid until the next Feed: decode it before that.
func (d *Decoder) Next() (body []byte, ok bool, err error) {
	if d.err != nil {
		return nil, false, d.err
	}
	avail := d.buf[d.r:]
	if len(avail) < 4 {
		if d.borrowed {
			d.own(0)
		}
		return nil, false, nil
	}
	n := binary.BigEndian.Uint32(avail)
	if lim := d.limit(); n > lim {
		return nil, false, d.fail(&LengthError{Length: n, Limit: lim})
	}
	if uint64(len(avail)-4) < uint64(n) {
		if d.borrowed {
			d.own(4 + int(n))
		}
		return nil, false, nil
	}
	body = avail[4 : 4+n : 4+n]
	d.r += 4 + int32(n)
	switch rest := len(d.buf) - int(d.r); {
	case d.borrowed:
		if rest == 0 {
			// Done with the caller's bytes: hold no reference to them.
			d.buf, d.r, d.borrowed = nil, 0, false
		}
	case rest == 0:
		if cap(d.buf) > KeepCap {
			d.buf = nil
		}
		d.buf, d.r = d.buf[:0], 0
	case cap(d.buf) > KeepCap && rest <= KeepCap/2:
		// A large buffer with little left in it (the start of the next
		// frame after a large one): keep the rest in a small buffer, so
		// that a large frame's storage does not outlive it.
		small := make([]byte, rest, KeepCap)
		copy(small, d.buf[d.r:])
		d.buf, d.r = small, 0
	}
	return body, true, nil
}

// Buffered returns the number of bytes fed and not yet decoded.
func (d *Decoder) Buffered() int { return len(d.buf) - int(d.r) }

// Unread returns the bytes fed and not yet decoded (after Next reported
// ok=false: the start of a partial frame). The slice is valid until the next
// Feed or Next. A hot upgrade hands them to the new process, which Feeds them
// to its own Decoder before the first byte it reads itself.
func (d *Decoder) Unread() []byte { return d.buf[d.r:] }

// Cap returns the size of the buffer the decoder holds: what it costs in
// memory beyond the struct, Buffered or more.
func (d *Decoder) Cap() int {
	if d.borrowed {
		return 0
	}
	return cap(d.buf)
}

// Release drops the decoder's buffer if it holds no undecoded byte, so that
// an idle peer costs no buffer at all. The next Feed allocates a new one.
func (d *Decoder) Release() {
	if int(d.r) == len(d.buf) {
		d.buf, d.r, d.borrowed = nil, 0, false
	}
}

// Fail makes err the error every later Next returns, and drops the buffer:
// a body that did not decode leaves a stream that cannot be resynchronised.
func (d *Decoder) Fail(err error) error { return d.fail(err) }

func (d *Decoder) fail(err error) error {
	d.err = err
	d.buf, d.r, d.borrowed = nil, 0, false
	return err
}
