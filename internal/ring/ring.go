// Package ring is the hub's per-worker outbound byte buffer.
//
// A Buffer holds the bytes the kernel did not take yet, in order, and remembers
// where each frame ends so that the hub can count pending frames (its hard
// queue limit is in frames) as well as bytes. It is built for a hub with many
// mostly idle workers: an empty Buffer holds no storage at all; storage is
// borrowed from a process-wide pool on the first Append, grows on demand
// (copying the pending bytes, in order) up to the byte cap, and goes back to the
// pool as soon as everything was written. In steady state (append, peek,
// discard at a stable size) it allocates nothing. A process taking over
// another's buffers (a hot upgrade) can make received bytes the storage
// (Adopt), or bytes it does not own, such as a mapping (AdoptForeign),
// which are only read and given back once.
//
// Foreign bytes are a read-only head in front of the ring: frames appended
// meanwhile go to the ring (the tail), and the two are what Peek returns,
// still two slices at most. The head is never copied to make room for an
// Append: a hub that took over many wedged workers' backlogs would
// otherwise copy all of them on its first wake, hundreds of megabytes in
// one loop iteration, and hold them twice. The head goes back to its owner
// once sent (the tail is then the ordinary ring) or, like any storage,
// when a shrink moves what is left to a slab of the Buffer's own.
//
// A Buffer is not safe for concurrent use; in the hub it belongs to the loop
// goroutine. It must not be copied after first use.
package ring

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
)

// ErrFull is returned by Append when the frame does not fit under the byte cap.
// Nothing was copied; the caller decides what that means (the hub evicts the
// worker for an ephemeral wake and drops a durable one).
var ErrFull = errors.New("ring: buffer full")

const (
	// minSlab is the smallest byte storage borrowed: a page holds ~30 typical
	// wake frames, enough that a worker which keeps up never grows past it.
	minSlab = 4 << 10
	// byteClasses pooled slab sizes: 4 KiB, 8 KiB, ... 16 MiB. Larger storage
	// (only a worker far behind with a cap above 16 MiB) is allocated and
	// dropped to the GC, which is fine for a rare, pathological case.
	byteClasses = 13
	// minEnds is the smallest frame-end ring; 32 entries are 256 bytes.
	minEnds = 32
	// endClasses pooled frame-end ring sizes: 32 ... 32<<15 (1 Mi frames).
	endClasses = 16
)

// Pools of slabs by size class. They hold pointers to slices so that Get and
// Put do not allocate (a slice stored in an interface would be boxed).
var (
	bytePools [byteClasses]sync.Pool
	endPools  [endClasses]sync.Pool
)

// Buffer is a FIFO of whole frames, stored as a ring of bytes.
//
// The zero value is an empty buffer with no byte cap; set Max (or use New)
// before the first Append.
type Buffer struct {
	// Max is the byte cap: Append fails with ErrFull when Len()+len(frame)
	// would exceed it. Zero or negative means no cap. Changing it never drops
	// bytes already held.
	Max int

	// Retain keeps a drained buffer's storage, when it is of the smallest
	// size classes, instead of returning it to the pool at once: for a
	// caller that knows more frames follow soon (the hub sets it for
	// workers busy over the last status intervals), it saves a pool Get
	// and Put per drain. Release gives the storage back. Larger storage
	// is returned on drain whatever Retain says, so a retaining buffer
	// holds at most minSlab + minEnds*8 bytes while empty.
	Retain bool

	// written and appended are absolute byte offsets: bytes ever discarded
	// and ever appended. appended-written == Len() always.
	written, appended uint64

	// st is everything else, nil while the buffer is empty and holds no
	// storage: an idle worker's Buffer is these 40 bytes. It comes from
	// (and goes back to) a pool with the slabs.
	st *store
}

// store is a non-empty (or retaining) Buffer's positions and storage.
type store struct {
	// buf is the storage; len(buf) is its capacity. slab is the pool
	// handle buf came from (nil when buf was allocated outside the pools,
	// e.g. clamped to Max or above the largest class).
	buf  []byte
	slab *[]byte
	// head indexes the first pending byte in buf; n bytes are pending
	// there, the rest wrapping around to buf[0:].
	head, n int

	// free, when set, means foreign bytes (AdoptForeign) are pending in
	// front of buf's: fore is their unsent part, never empty, and fcap
	// the length adopted. They are only read, never pooled, and free is
	// called once when the buffer lets go of them. Meanwhile buf's bytes
	// (the tail) start at buf[0] and do not wrap: nothing of the tail is
	// discarded before the head is gone.
	free func()
	fore []byte
	fcap int

	// ends is a ring of the absolute end offsets (in appended terms) of the
	// frames not fully written, oldest at ends[ehead], en entries. Its length
	// is a power of two so indexing is a mask. endSlab is its pool handle.
	ends    []uint64
	endSlab *[]uint64
	ehead   int
	en      int
}

var storePool = sync.Pool{New: func() any { return new(store) }}

// New returns an empty Buffer with byte cap maxBytes (<= 0: no cap).
func New(maxBytes int) *Buffer { return &Buffer{Max: maxBytes} }

// SetMax sets the byte cap; see Max.
func (b *Buffer) SetMax(maxBytes int) { b.Max = maxBytes }

// Len returns the number of bytes pending.
func (b *Buffer) Len() int { return int(b.appended - b.written) }

// Frames returns the number of frames not yet fully written. A frame of which
// only a prefix was discarded still counts.
func (b *Buffer) Frames() int {
	if b.st == nil {
		return 0
	}
	return b.st.en
}

// Written returns the absolute count of bytes ever discarded.
func (b *Buffer) Written() uint64 { return b.written }

// Appended returns the absolute count of bytes ever appended. A caller that
// records Appended() before an Append knows the frame starts at that offset,
// and that the frame is still wholly unsent while Written() <= that offset.
func (b *Buffer) Appended() uint64 { return b.appended }

// Cap returns the byte storage held now (0 when empty), foreign bytes
// included.
func (b *Buffer) Cap() int {
	if b.st == nil {
		return 0
	}
	return len(b.st.buf) + b.st.fcap
}

// Append queues one whole frame. It returns ErrFull, copying nothing, when
// Len()+len(frame) would exceed Max. An empty frame is a no-op: it has no
// bytes to send and is not counted. Foreign bytes pending stay where they
// are: the frame goes to the tail behind them.
func (b *Buffer) Append(frame []byte) error {
	if len(frame) == 0 {
		return nil
	}
	n := b.Len()
	if need := n + len(frame); need < n || (b.Max > 0 && need > b.Max) {
		return ErrFull
	}
	if b.st == nil {
		b.st = storePool.Get().(*store)
	}
	s := b.st
	need := s.n + len(frame) // the ring's bytes, without a foreign head
	if need > len(s.buf) {
		b.grow(need)
	}
	if s.en == len(s.ends) {
		s.growEnds()
	}
	// Copy into the free region, which starts at tail and may wrap.
	tail := s.head + s.n
	if tail >= len(s.buf) {
		tail -= len(s.buf)
	}
	c := copy(s.buf[tail:], frame)
	if c < len(frame) {
		copy(s.buf, frame[c:])
	}
	s.n = need
	b.appended += uint64(len(frame))
	s.ends[(s.ehead+s.en)&(len(s.ends)-1)] = b.appended
	s.en++
	return nil
}

// Peek returns the pending bytes, in order, as up to two slices (the second is
// non-empty only when the data wraps around, or follows foreign bytes), ready
// for write or writev; the first is empty only when nothing is pending. They
// alias the storage: valid until the next Append, Discard or Reset.
func (b *Buffer) Peek() (first, second []byte) {
	if s := b.st; s != nil {
		if s.free == nil {
			return s.ring()
		}
		return s.fore, s.buf[:s.n] // the tail does not wrap meanwhile
	}
	return
}

// ring returns the bytes in buf, in order, as Peek does.
func (s *store) ring() (first, second []byte) {
	end := s.head + s.n
	if end <= len(s.buf) {
		return s.buf[s.head:end], nil
	}
	return s.buf[s.head:], s.buf[:end-len(s.buf)]
}

// Discard drops the first n pending bytes: the kernel took them. When nothing
// is left the storage goes back to the pool; when much less than the storage
// is left it moves to a smaller slab. It panics if n is negative or more than
// Len(), which is a bug in the caller.
func (b *Buffer) Discard(n int) {
	if n < 0 || n > b.Len() {
		panic(fmt.Sprintf("ring: Discard(%d) with %d bytes pending", n, b.Len()))
	}
	if n == 0 {
		return
	}
	s := b.st
	if s.free != nil {
		if n < len(s.fore) {
			b.discardForeign(n)
			return
		}
		// The foreign head is sent: the tail is the ring from now on,
		// and what is left of n comes out of it.
		f := len(s.fore)
		b.written += uint64(f)
		n -= f
		s.dropForeign()
	}
	b.written += uint64(n)
	s.n -= n
	if s.n == 0 {
		if b.Retain && len(s.buf) == minSlab && len(s.ends) == minEnds {
			s.head, s.ehead, s.en = 0, 0, 0
			return
		}
		b.release()
		return
	}
	s.head += n
	if s.head >= len(s.buf) {
		s.head -= len(s.buf)
	}
	s.popEnds(b.written)
	// Shrink with hysteresis: only at a quarter full, to a slab at most half
	// full, so a buffer oscillating around one size never copies back and forth.
	if len(s.buf) > minSlab && s.n <= len(s.buf)/4 {
		s.resize(slabSize(2 * s.n))
	}
	if len(s.ends) > minEnds && s.en <= len(s.ends)/4 {
		s.resizeEnds(len(s.ends) / 2)
	}
}

// discardForeign drops the first n pending bytes, fewer than the foreign
// head holds. The shrink rule is the ring's, on all the storage held (the
// whole mapping stays until free): at a quarter of it, what is pending
// moves to a slab of the Buffer's own and the foreign bytes are let go.
func (b *Buffer) discardForeign(n int) {
	s := b.st
	b.written += uint64(n)
	s.fore = s.fore[n:]
	s.popEnds(b.written)
	if held, left := s.fcap+len(s.buf), b.Len(); held > minSlab && left <= held/4 {
		buf, slab := getSlab(slabSize(2 * left))
		copy(buf[copy(buf, s.fore):], s.buf[:s.n])
		s.dropForeign()
		s.putSlab()
		s.buf, s.slab, s.head, s.n = buf, slab, 0, left
	}
	if len(s.ends) > minEnds && s.en <= len(s.ends)/4 {
		s.resizeEnds(len(s.ends) / 2)
	}
}

// popEnds drops the frame ends at or before written: those frames are sent.
func (s *store) popEnds(written uint64) {
	mask := len(s.ends) - 1
	for s.en > 0 && s.ends[s.ehead] <= written {
		s.ehead = (s.ehead + 1) & mask
		s.en--
	}
}

// Release returns the storage of an empty buffer to the pool (a no-op
// while bytes are pending): for a Retain buffer whose owner went idle.
func (b *Buffer) Release() {
	if b.Len() == 0 {
		b.release()
	}
}

// Reset drops everything pending (counting it as written, so offsets stay
// monotonic) and returns the storage. Use it when the worker goes away.
func (b *Buffer) Reset() {
	b.written = b.appended
	b.release()
}

// release returns both slabs and the store to their pools (and foreign
// storage to its owner).
func (b *Buffer) release() {
	s := b.st
	if s == nil {
		return
	}
	s.dropForeign()
	s.putSlab()
	if s.endSlab != nil {
		endPools[bits.TrailingZeros(uint(len(s.ends)/minEnds))].Put(s.endSlab)
	}
	*s = store{}
	storePool.Put(s)
	b.st = nil
}

// slabSize is the smallest pooled size class holding n bytes.
func slabSize(n int) int {
	if n <= minSlab {
		return minSlab
	}
	return 1 << bits.Len(uint(n-1))
}

// grow moves the ring's bytes (the tail, behind foreign bytes) into storage
// holding at least need bytes: the next size class, clamped to what Max
// leaves so that a buffer near its cap never holds up to twice the cap.
func (b *Buffer) grow(need int) {
	s := b.st
	size := slabSize(need)
	if size < 2*len(s.buf) {
		size = 2 * len(s.buf)
	}
	if b.Max > minSlab {
		if lim := max(b.Max-len(s.fore), minSlab); size > lim && need <= lim {
			size = lim
		}
	}
	s.resize(size)
}

// resize moves the bytes in buf (all that is pending, or the tail behind
// foreign bytes, which stay where they are), in order, to the start of a
// slab of size bytes and returns the old slab.
func (s *store) resize(size int) {
	buf, slab := getSlab(size)
	first, second := s.ring()
	copy(buf[copy(buf, first):], second)
	s.putSlab()
	s.buf, s.slab, s.head = buf, slab, 0
}

// getSlab returns size bytes of storage, from a pool when size is a class
// (slab is then the pool handle, nil otherwise).
func getSlab(size int) (buf []byte, slab *[]byte) {
	if c := bits.TrailingZeros(uint(size / minSlab)); size >= minSlab && size == minSlab<<c && c < byteClasses {
		if p, _ := bytePools[c].Get().(*[]byte); p != nil {
			slab = p
		} else {
			s := make([]byte, size)
			slab = &s
		}
		return *slab, slab
	}
	return make([]byte, size), nil
}

// putSlab returns buf to its pool, if it came from one; buf must be
// replaced afterwards.
func (s *store) putSlab() {
	if s.slab != nil {
		bytePools[bits.TrailingZeros(uint(len(s.buf)/minSlab))].Put(s.slab)
	}
}

// dropForeign gives the foreign bytes back to their owner, once: they must
// not be used afterwards.
func (s *store) dropForeign() {
	if s.free != nil {
		free := s.free
		s.free, s.fore, s.fcap = nil, nil, 0
		free()
	}
}

// growEnds doubles the frame-end ring (or borrows the first one).
func (s *store) growEnds() {
	if len(s.ends) == 0 {
		s.resizeEnds(minEnds)
		return
	}
	s.resizeEnds(2 * len(s.ends))
}

// resizeEnds moves the pending frame ends, in order, to a ring of size entries
// (a power of two, at least minEnds).
func (s *store) resizeEnds(size int) {
	var ends []uint64
	var slab *[]uint64
	if c := bits.TrailingZeros(uint(size / minEnds)); c < endClasses {
		if p, _ := endPools[c].Get().(*[]uint64); p != nil {
			slab = p
		} else {
			e := make([]uint64, size)
			slab = &e
		}
		ends = *slab
	} else {
		ends = make([]uint64, size)
	}
	mask := len(s.ends) - 1
	for i := 0; i < s.en; i++ {
		ends[i] = s.ends[(s.ehead+i)&mask]
	}
	if s.endSlab != nil {
		endPools[bits.TrailingZeros(uint(len(s.ends)/minEnds))].Put(s.endSlab)
	}
	s.ends, s.endSlab, s.ehead = ends, slab, 0
}

// Adopt makes an empty buffer hold data as its pending bytes, without
// copying them: data becomes the storage (sized exactly, so the next Append
// grows it once). ends are the frames' end offsets relative to the start of
// data, ascending, the last one len(data); the first frame may be partly
// written already (its start is not recorded). It is for a process taking
// over another's buffer (a hot upgrade), which received data in one piece.
// The caller must not use data afterwards. It returns an error, adopting
// nothing, when the buffer is not empty or the ends do not describe data.
func (b *Buffer) Adopt(data []byte, ends []uint64) error {
	return b.adopt(data, ends, nil)
}

// AdoptForeign is Adopt for storage the Buffer does not own: a mapping of
// another process's bytes, say (a hot upgrade's pre-copied backlog). The
// Buffer only reads data, and never copies it to make room: frames
// appended meanwhile queue behind it in storage of the Buffer's own (Max
// counts both), and Peek returns what is left of data then those. free is
// called exactly once, on the Buffer's goroutine, when it lets go of data:
// once the bytes are written, when a shrink moves what is left to storage
// of its own, or on Reset. Foreign storage never goes to a pool. On an
// error nothing was adopted, free is not called and data is still the
// caller's.
func (b *Buffer) AdoptForeign(data []byte, ends []uint64, free func()) error {
	if free == nil {
		return errors.New("ring: AdoptForeign without free")
	}
	if len(data) == 0 {
		return errors.New("ring: AdoptForeign: no bytes")
	}
	return b.adopt(data, ends, free)
}

func (b *Buffer) adopt(data []byte, ends []uint64, free func()) error {
	if b.Len() != 0 {
		return errors.New("ring: Adopt into a non-empty buffer")
	}
	if len(data) == 0 {
		if len(ends) != 0 {
			return errors.New("ring: Adopt: frame ends without bytes")
		}
		return nil
	}
	prev := uint64(0)
	for _, e := range ends {
		if e <= prev || e > uint64(len(data)) {
			return fmt.Errorf("ring: Adopt: frame end %d after %d in %d bytes", e, prev, len(data))
		}
		prev = e
	}
	if prev != uint64(len(data)) {
		return fmt.Errorf("ring: Adopt: frames end at %d of %d bytes", prev, len(data))
	}
	b.release()
	s := storePool.Get().(*store)
	b.st = s
	if free != nil {
		s.fore, s.fcap, s.free = data[:len(data):len(data)], len(data), free
	} else {
		s.buf, s.slab, s.head, s.n = data[:len(data):len(data)], nil, 0, len(data)
	}
	size := minEnds
	for size < len(ends) {
		size *= 2
	}
	s.resizeEnds(size)
	base := b.appended
	for i, e := range ends {
		s.ends[i] = base + e
	}
	s.en = len(ends)
	b.appended += uint64(len(data))
	return nil
}

// FrameEnds appends to dst the absolute end offsets (in Appended terms) of the
// frames not fully written, oldest first, and returns it. With Written and
// Peek it describes the pending bytes frame by frame: what a process handing
// its buffer to another needs to rebuild it there (the first frame may be
// partly written already).
func (b *Buffer) FrameEnds(dst []uint64) []uint64 {
	s := b.st
	if s == nil {
		return dst
	}
	mask := len(s.ends) - 1
	for i := 0; i < s.en; i++ {
		dst = append(dst, s.ends[(s.ehead+i)&mask])
	}
	return dst
}
