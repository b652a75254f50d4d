package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/internal/wire"
)

// streamResult is everything a Decoder made of a stream.
type streamResult struct {
	msgs     []Message
	err      string
	buffered int
}

// decodeStream feeds stream to a fresh Decoder in chunks of the sizes next
// returns, calling Next after every Feed as the hub does.
func decodeStream(stream []byte, next func() int) streamResult {
	return decodeStreamMax(stream, 0, next)
}

// decodeStreamMax is decodeStream with a Decoder whose Max is limit.
func decodeStreamMax(stream []byte, limit int, next func() int) streamResult {
	var d Decoder
	d.s.Max = limit
	var res streamResult
	for len(stream) > 0 && res.err == "" {
		n := min(max(next(), 1), len(stream))
		d.Feed(stream[:n])
		stream = stream[n:]
		drain(&d, &res)
	}
	res.buffered = d.Buffered()
	return res
}

// decodeStreamBorrowed is decodeStreamMax fed with FeedBorrowed, as the
// hub feeds it: each chunk is read into one scratch buffer, which is
// scribbled over as soon as Next has reported ok=false, so that a decoder
// still holding the caller's bytes shows.
func decodeStreamBorrowed(stream []byte, limit int, next func() int) streamResult {
	var d Decoder
	d.s.Max = limit
	var res streamResult
	scratch := make([]byte, 64)
	for len(stream) > 0 && res.err == "" {
		n := min(max(next(), 1), len(stream))
		if n > len(scratch) {
			scratch = make([]byte, n)
		}
		copy(scratch, stream[:n])
		d.s.FeedBorrowed(scratch[:n])
		stream = stream[n:]
		drain(&d, &res)
		for i := range scratch {
			scratch[i] = 0xff
		}
	}
	res.buffered = d.Buffered()
	return res
}

// drain calls Next until it reports ok=false or an error, recording both.
func drain(d *Decoder, res *streamResult) {
	for {
		m, ok, err := d.Next()
		if err != nil {
			res.err = err.Error()
			return
		}
		if !ok {
			return
		}
		res.msgs = append(res.msgs, m)
	}
}

func sameResult(a, b streamResult) bool {
	if a.err != b.err || a.buffered != b.buffered || len(a.msgs) != len(b.msgs) {
		return false
	}
	for i := range a.msgs {
		if a.msgs[i] != b.msgs[i] {
			return false
		}
	}
	return true
}

func randStream(r *rand.Rand, n int) (stream []byte, msgs []Message) {
	for range n {
		m := normalize(randMessage(r))
		stream = Append(stream, m)
		msgs = append(msgs, m)
	}
	return stream, msgs
}

func TestDecoderOneByteAtATime(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	stream, msgs := randStream(r, 2000)
	res := decodeStream(stream, func() int { return 1 })
	want := streamResult{msgs: msgs}
	if !sameResult(res, want) {
		t.Fatalf("byte-at-a-time: %d messages, err %q, %d buffered; want %d messages", len(res.msgs), res.err, res.buffered, len(msgs))
	}
	for _, chunk := range []int{2, 3, 4, 5, 7, 64, 4096, len(stream)} {
		if res := decodeStream(stream, func() int { return chunk }); !sameResult(res, want) {
			t.Fatalf("chunks of %d: %d messages, err %q", chunk, len(res.msgs), res.err)
		}
	}
	if res := decodeStream(stream, func() int { return r.IntN(300) }); !sameResult(res, want) {
		t.Fatalf("random chunks: %d messages, err %q", len(res.msgs), res.err)
	}
}

func TestDecoderPartial(t *testing.T) {
	var d Decoder
	frame := AppendWake(nil, "chat", []byte("hello"), true)
	for i, c := range frame {
		if _, ok, err := d.Next(); ok || err != nil {
			t.Fatalf("after %d bytes: ok %v err %v", i, ok, err)
		}
		if d.Buffered() != i {
			t.Fatalf("Buffered() = %d after %d bytes", d.Buffered(), i)
		}
		d.Feed([]byte{c})
	}
	m, ok, err := d.Next()
	if !ok || err != nil || m != (Message{Type: "wake", Name: "chat", Payload: "hello", HasPayload: true}) {
		t.Fatalf("Next = %#v, %v, %v", m, ok, err)
	}
	if d.Buffered() != 0 {
		t.Fatalf("Buffered() = %d after the whole frame", d.Buffered())
	}
	if _, ok, err := d.Next(); ok || err != nil {
		t.Fatalf("Next on empty: ok %v err %v", ok, err)
	}
}

// Feed copies: the caller's read buffer is reused at once.
func TestDecoderFeedCopies(t *testing.T) {
	var d Decoder
	buf := AppendSub(nil, "chat")
	d.Feed(buf[:10])
	for i := range buf {
		buf[i] = 0xff
	}
	buf = AppendSub(buf[:0], "chat")
	d.Feed(buf[10:])
	m, ok, err := d.Next()
	if !ok || err != nil || m != (Message{Type: "sub", Name: "chat"}) {
		t.Fatalf("Next = %#v, %v, %v", m, ok, err)
	}
}

func header(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

// A length above MaxLen is an error as soon as the header is in, without
// waiting for (or making room for) the body.
func TestDecoderTooLarge(t *testing.T) {
	for _, n := range []uint32{MaxLen + 1, 1 << 30, 0xffffffff} {
		var d Decoder
		d.Feed(header(n)[:3])
		if _, ok, err := d.Next(); ok || err != nil {
			t.Fatalf("3 header bytes: ok %v err %v", ok, err)
		}
		d.Feed(header(n)[3:])
		d.Feed([]byte(`{"t":`))
		_, ok, err := d.Next()
		if ok || !errors.Is(err, ErrTooLarge) || errors.Is(err, ErrMalformed) {
			t.Fatalf("length %d: ok %v err %v, want ErrTooLarge", n, ok, err)
		}
		var fe *Error
		if !errors.As(err, &fe) || fe.Length != n {
			t.Fatalf("length %d: error %#v does not carry the length", n, err)
		}
		if want := "above MaxLen 4194304"; !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not say %q", err, want)
		}
		if d.s.Cap() > 64 {
			t.Fatalf("length %d: buffer grew to %d bytes", n, d.s.Cap())
		}
		// Sticky, and later input is dropped, not buffered.
		d.Feed(make([]byte, 1<<20))
		if _, _, err2 := d.Next(); err2 != err {
			t.Fatalf("error not sticky: %v then %v", err, err2)
		}
		if d.Buffered() != 0 || d.s.Cap() != 0 {
			t.Fatalf("Feed after the error buffered %d bytes (cap %d)", d.Buffered(), d.s.Cap())
		}
	}
}

// Rejecting a huge length allocates only the errors: neither the body nor a
// buffer of its size.
func TestDecoderTooLargeDoesNotAllocate(t *testing.T) {
	hdr := header(0xffffffff)
	backing := make([]byte, 4)
	allocs := testing.AllocsPerRun(100, func() {
		var d Decoder
		d.Feed(append(backing[:0], hdr...))
		if _, _, err := d.Next(); err == nil {
			t.Fatal("no error")
		}
	})
	if allocs > 2 {
		t.Fatalf("%v allocs per rejected header, want at most 2 (the splitter's error and frame's)", allocs)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		var d Decoder
		d.Feed(hdr)
		if _, _, err := d.Next(); !errors.Is(err, ErrTooLarge) {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 100*1024 {
		t.Fatalf("100 rejected headers allocated %d bytes", got)
	}
}

// A body of exactly MaxLen is accepted.
func TestDecoderMaxLen(t *testing.T) {
	prefix, suffix := `{"t":"wake","q":"big","p":"`, `"}`
	p := strings.Repeat("x", MaxLen-len(prefix)-len(suffix))
	frame := AppendWake(nil, "big", []byte(p), true)
	if len(frame) != 4+MaxLen {
		t.Fatalf("test frame is %d bytes", len(frame))
	}
	var d Decoder
	for chunk := frame; len(chunk) > 0; {
		n := min(len(chunk), 65536)
		d.Feed(chunk[:n])
		chunk = chunk[n:]
		m, ok, err := d.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ok != (len(chunk) == 0) {
			t.Fatalf("ok %v with %d bytes to go", ok, len(chunk))
		}
		if ok && (m.Name != "big" || m.Payload != p) {
			t.Fatalf("wrong message: q %q, %d payload bytes", m.Name, len(m.Payload))
		}
	}
	// The 4 MiB buffer is not kept once drained.
	if d.s.Cap() > wire.KeepCap {
		t.Fatalf("decoder still holds %d bytes after the frame", d.s.Cap())
	}
	// One byte more is refused.
	var d2 Decoder
	d2.Feed(header(MaxLen + 1))
	if _, _, err := d2.Next(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("MaxLen+1: %v", err)
	}
}

// A bad body stops the stream: the frames before it are delivered, then the
// error, for good.
func TestDecoderMalformedIsSticky(t *testing.T) {
	stream := AppendSub(nil, "a")
	stream = append(stream, header(8)...)
	stream = append(stream, `{"t":42}`...)
	stream = AppendSub(stream, "b")
	for _, chunk := range []int{1, len(stream)} {
		res := decodeStream(stream, func() int { return chunk })
		if len(res.msgs) != 1 || res.msgs[0] != (Message{Type: "sub", Name: "a"}) {
			t.Fatalf("chunks of %d: messages %#v", chunk, res.msgs)
		}
		if !strings.Contains(res.err, `"t" is a number`) {
			t.Fatalf("chunks of %d: error %q", chunk, res.err)
		}
	}
	var d Decoder
	d.Feed(header(0))
	_, _, err := d.Next()
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "empty body") {
		t.Fatalf("zero-length frame: %v", err)
	}
	if _, _, err2 := d.Next(); err2 != err {
		t.Fatalf("not sticky: %v then %v", err, err2)
	}
}

// Unknown types come out as messages, for the caller to log and skip; the
// stream goes on.
func TestDecoderUnknownType(t *testing.T) {
	body := `{"t":"hello","q":"x","version":2,"caps":["a","b"]}`
	stream := append(header(uint32(len(body))), body...)
	stream = AppendAck(stream, "x")
	res := decodeStream(stream, func() int { return 5 })
	want := []Message{{Type: "hello", Name: "x"}, {Type: "ack", Name: "x"}}
	if !sameResult(res, streamResult{msgs: want}) {
		t.Fatalf("got %#v, err %q", res.msgs, res.err)
	}
}

// A drained decoder keeps a small buffer for reuse, but not a big one.
func TestDecoderReleasesBigBuffers(t *testing.T) {
	var d Decoder
	small := AppendSub(nil, "chat")
	d.Feed(small)
	if _, ok, _ := d.Next(); !ok {
		t.Fatal("no message")
	}
	if c := d.s.Cap(); c == 0 || c > wire.KeepCap {
		t.Fatalf("small buffer: cap %d", c)
	}
	allocs := testing.AllocsPerRun(100, func() {
		d.Feed(small)
		if m, ok, err := d.Next(); !ok || err != nil || m.Name != "chat" {
			t.Fatal(m, ok, err)
		}
	})
	if allocs != 1 { // the message's string
		t.Fatalf("steady state: %v allocs per frame, want 1", allocs)
	}
	big := AppendWake(nil, "chat", bytes.Repeat([]byte("x"), 3*wire.KeepCap), true)
	d.Feed(big)
	if _, ok, _ := d.Next(); !ok {
		t.Fatal("no message")
	}
	if c := d.s.Cap(); c > wire.KeepCap {
		t.Fatalf("big buffer kept: cap %d", c)
	}
}

// Feeding many frames and a partial one in one chunk, then the rest, keeps
// the partial frame intact across compaction.
func TestDecoderCompaction(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	stream, msgs := randStream(r, 500)
	for range 200 {
		if res := decodeStream(stream, func() int { return 1 + r.IntN(2*wire.KeepCap) }); !sameResult(res, streamResult{msgs: msgs}) {
			t.Fatalf("%d messages, err %q", len(res.msgs), res.err)
		}
	}
}

// A Decoder with a lower Max refuses a larger header as soon as it is in,
// whether it comes whole, split, or after complete frames, and without
// copying what follows it in the same Feed.
func TestDecoderMax(t *testing.T) {
	const max = 64 << 10
	for _, n := range []uint32{max + 1, MaxLen, MaxLen + 1} {
		var d Decoder
		d.s.Max = max
		chunk := append(header(n), make([]byte, 60<<10)...)
		d.Feed(chunk)
		if d.s.Cap() != 0 {
			t.Fatalf("length %d: Feed copied %d bytes of a refused frame", n, d.s.Cap())
		}
		_, ok, err := d.Next()
		var fe *Error
		if ok || !errors.Is(err, ErrTooLarge) || !errors.As(err, &fe) || fe.Length != n || fe.Limit != max {
			t.Fatalf("length %d: ok %v err %#v", n, ok, err)
		}
		if want := "above the limit 65536"; !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not say %q", err, want)
		}
	}
	// Split header, and a header after a complete frame in one chunk.
	stream := AppendSub(nil, "a")
	stream = append(stream, header(max+1)...)
	stream = append(stream, "xxxx"...)
	for _, chunk := range []int{1, 2, 3, len(stream)} {
		res := decodeStreamMax(stream, max, func() int { return chunk })
		if len(res.msgs) != 1 || res.msgs[0] != (Message{Type: "sub", Name: "a"}) || !strings.Contains(res.err, "above the limit") {
			t.Fatalf("chunks of %d: %#v", chunk, res)
		}
	}
	// Exactly max is fine.
	body := `{"t":"sub","q":"big"}`
	body += strings.Repeat(" ", max-len(body))
	frame := append(header(max), body...)
	res := decodeStreamMax(frame, max, func() int { return 4096 })
	if len(res.msgs) != 1 || res.err != "" {
		t.Fatalf("a body of exactly Max: %#v", res)
	}
	// Max above MaxLen does not raise the protocol's limit.
	var d Decoder
	d.s.Max = 2 * MaxLen
	d.Feed(header(MaxLen + 1))
	if _, _, err := d.Next(); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "above MaxLen") {
		t.Fatalf("Max above MaxLen: %v", err)
	}
}

// A large frame's buffer does not outlive it, even when the start of the
// next frame came in the same chunk; Release drops the small buffer of an
// idle decoder, and never undecoded bytes.
func TestDecoderGivesBackMemory(t *testing.T) {
	big := AppendWake(nil, "chat", bytes.Repeat([]byte("x"), 16*wire.KeepCap), true)
	next := AppendSub(nil, "after")
	var d Decoder
	d.Feed(append(big, next[:7]...))
	if _, ok, err := d.Next(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if d.Buffered() != 7 || d.s.Cap() > wire.KeepCap {
		t.Fatalf("after the large frame: %d buffered, cap %d", d.Buffered(), d.s.Cap())
	}
	d.s.Release()
	if d.Buffered() != 7 {
		t.Fatalf("Release dropped undecoded bytes")
	}
	d.Feed(next[7:])
	if m, ok, err := d.Next(); !ok || err != nil || m.Name != "after" {
		t.Fatal(m, ok, err)
	}
	if d.s.Cap() == 0 {
		t.Fatal("a small buffer is kept between frames until Release")
	}
	d.s.Release()
	if d.s.Cap() != 0 {
		t.Fatalf("Release kept %d bytes", d.s.Cap())
	}
	d.Feed(next)
	if m, ok, err := d.Next(); !ok || err != nil || m.Name != "after" {
		t.Fatal("after Release:", m, ok, err)
	}
}

// A frame fed in pieces is held in one buffer of its own size, allocated
// when its header arrives: not doubled on the way (a partial frame costs
// its length, not up to twice that).
func TestDecoderSizesBufferToFrame(t *testing.T) {
	big := AppendWake(nil, "chat", bytes.Repeat([]byte("x"), 60<<10), true)
	var d Decoder
	d.Feed(big[:2])
	for rest := big[2:]; len(rest) > 0; {
		n := min(len(rest), 4<<10)
		d.Feed(rest[:n])
		rest = rest[n:]
		if c := d.s.Cap(); c != len(big) {
			t.Fatalf("%d bytes to go: buffer cap %d, want the frame's %d", len(rest), c, len(big))
		}
	}
	if _, ok, err := d.Next(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// A header over the limit fed twice before Next is refused, not
	// made room for.
	d = Decoder{}
	d.s.Max = 1 << 10
	d.Feed(header(1 << 30)[:2])
	d.Feed(header(1 << 30)[2:])
	d.Feed(make([]byte, 100))
	if d.s.Cap() > 64 {
		t.Fatalf("buffer cap %d for a refused header", d.s.Cap())
	}
	if _, _, err := d.Next(); !errors.Is(err, ErrTooLarge) {
		t.Fatal(err)
	}
}

// FeedBorrowed decodes what Feed decodes, whatever the chunking, and keeps
// nothing of the caller's buffer once Next has said ok=false (the helper
// scribbles over it then).
func TestDecoderFeedBorrowed(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	stream, msgs := randStream(r, 2000)
	want := streamResult{msgs: msgs}
	for _, chunk := range []int{1, 2, 3, 5, 7, 64, 4096, len(stream)} {
		if res := decodeStreamBorrowed(stream, 0, func() int { return chunk }); !sameResult(res, want) {
			t.Fatalf("borrowed, chunks of %d: %d messages, err %q, %d buffered", chunk, len(res.msgs), res.err, res.buffered)
		}
	}
	if res := decodeStreamBorrowed(stream, 0, func() int { return r.IntN(300) }); !sameResult(res, want) {
		t.Fatalf("borrowed, random chunks: %d messages, err %q", len(res.msgs), res.err)
	}
}

// The point of FeedBorrowed: a peer that sends whole frames costs no
// buffer, before, during or after, and the only allocation per frame is the
// name the message carries.
func TestDecoderFeedBorrowedWholeFramesHoldNoBuffer(t *testing.T) {
	var d Decoder
	two := AppendSub(AppendSub(nil, "chat"), "mail")
	allocs := testing.AllocsPerRun(100, func() {
		d.s.FeedBorrowed(two)
		for {
			_, ok, err := d.Next()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
		}
		if d.s.Cap() != 0 || d.Buffered() != 0 {
			t.Fatalf("after whole frames: Cap %d, Buffered %d; want 0, 0", d.s.Cap(), d.Buffered())
		}
	})
	if allocs > 2 {
		t.Fatalf("%.1f allocations for two whole frames; want at most 2 (the two names)", allocs)
	}

	// A frame cut short is copied, sized to the frame, and the rest of it
	// completes it through either Feed.
	d.s.FeedBorrowed(two[:5])
	if _, ok, err := d.Next(); ok || err != nil {
		t.Fatalf("partial: ok %v err %v", ok, err)
	}
	if d.Buffered() != 5 || d.s.Cap() < len(two)/2 {
		t.Fatalf("partial: Buffered %d, Cap %d; want 5, at least the frame (%d)", d.Buffered(), d.s.Cap(), len(two)/2)
	}
	d.s.FeedBorrowed(two[5:])
	for _, q := range []string{"chat", "mail"} {
		m, ok, err := d.Next()
		if !ok || err != nil || m != (Message{Type: "sub", Name: q}) {
			t.Fatalf("Next = %#v, %v, %v; want sub %s", m, ok, err, q)
		}
	}
}
