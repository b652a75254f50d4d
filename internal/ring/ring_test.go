package ring

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// pending returns Peek's two slices joined.
// append16 appends frame to buf 16 times.
func append16(b *testing.B, buf *Buffer, frame []byte) {
	for i := 0; i < 16; i++ {
		if err := buf.Append(frame); err != nil {
			b.Fatal(err)
		}
	}
}

// randSize is a random size below one of the limits, each limit as likely.
func randSize(rng *rand.Rand, limits ...int) int {
	return rng.IntN(limits[rng.IntN(len(limits))])
}

func pending(b *Buffer) []byte {
	first, second := b.Peek()
	return append(append([]byte{}, first...), second...)
}

// fill returns n bytes of a pattern starting at seed, so that misordered
// copies show.
func fill(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7)
	}
	return p
}

func mustAppend(t *testing.T, b *Buffer, p []byte) {
	t.Helper()
	if err := b.Append(p); err != nil {
		t.Fatalf("Append(%d bytes) with Len %d Max %d: %v", len(p), b.Len(), b.Max, err)
	}
}

func TestZeroValue(t *testing.T) {
	var b Buffer
	if b.Len() != 0 || b.Frames() != 0 || b.Cap() != 0 || b.Written() != 0 || b.Appended() != 0 {
		t.Fatalf("zero Buffer not empty: len %d frames %d cap %d", b.Len(), b.Frames(), b.Cap())
	}
	if f, s := b.Peek(); f != nil || s != nil {
		t.Fatalf("Peek on empty = %q, %q", f, s)
	}
	b.Discard(0)
	if err := b.Append(nil); err != nil || b.Frames() != 0 || b.Cap() != 0 {
		t.Fatalf("Append(nil) = %v, frames %d cap %d; want a no-op", err, b.Frames(), b.Cap())
	}
	mustAppend(t, &b, []byte("hello"))
	if b.Cap() != minSlab || b.Len() != 5 || b.Frames() != 1 {
		t.Fatalf("after one Append: cap %d len %d frames %d", b.Cap(), b.Len(), b.Frames())
	}
}

func TestWrapAround(t *testing.T) {
	b := New(0)
	a := fill(3000, 1)
	mustAppend(t, b, a)
	b.Discard(2500)
	c := fill(3000, 2)
	mustAppend(t, b, c)
	if b.Cap() != minSlab {
		t.Fatalf("cap %d, want %d: 3500 bytes fit without growing", b.Cap(), minSlab)
	}
	first, second := b.Peek()
	if len(second) == 0 {
		t.Fatalf("Peek did not wrap: first %d second %d", len(first), len(second))
	}
	if len(first)+len(second) != 3500 {
		t.Fatalf("Peek lengths %d+%d, want 3500", len(first), len(second))
	}
	want := append(append([]byte{}, a[2500:]...), c...)
	if !bytes.Equal(pending(b), want) {
		t.Fatal("wrapped contents differ")
	}
	// Growing while wrapped must unwrap in order.
	d := fill(2000, 3)
	mustAppend(t, b, d)
	if b.Cap() != 2*minSlab {
		t.Fatalf("cap %d after growth, want %d", b.Cap(), 2*minSlab)
	}
	want = append(want, d...)
	if !bytes.Equal(pending(b), want) {
		t.Fatal("contents differ after growing a wrapped buffer")
	}
	if _, second := b.Peek(); second != nil {
		t.Fatal("grown buffer still wrapped")
	}
	if b.Frames() != 3 {
		t.Fatalf("frames %d, want 3", b.Frames())
	}
}

func TestCap(t *testing.T) {
	b := New(100)
	mustAppend(t, b, fill(60, 1))
	before := pending(b)
	if err := b.Append(fill(41, 2)); !errors.Is(err, ErrFull) {
		t.Fatalf("Append over cap = %v, want ErrFull", err)
	}
	if b.Len() != 60 || b.Frames() != 1 || b.Appended() != 60 || !bytes.Equal(pending(b), before) {
		t.Fatalf("a refused Append changed the buffer: len %d frames %d appended %d", b.Len(), b.Frames(), b.Appended())
	}
	mustAppend(t, b, fill(40, 3)) // exactly at the cap
	if b.Len() != 100 || b.Frames() != 2 {
		t.Fatalf("len %d frames %d, want 100, 2", b.Len(), b.Frames())
	}
	if err := b.Append([]byte{1}); !errors.Is(err, ErrFull) {
		t.Fatalf("Append to a full buffer = %v, want ErrFull", err)
	}
	b.Discard(100)
	if err := b.Append(fill(101, 4)); !errors.Is(err, ErrFull) {
		t.Fatalf("Append of a frame larger than the cap = %v, want ErrFull", err)
	}
	if b.Cap() != 0 {
		t.Fatalf("refused Append on an empty buffer borrowed storage: cap %d", b.Cap())
	}

	// Growth is clamped to the cap instead of doubling past it.
	b = New(10000)
	mustAppend(t, b, fill(4000, 5))
	mustAppend(t, b, fill(5000, 6))
	if b.Cap() != 10000 {
		t.Fatalf("cap %d, want growth clamped to Max 10000", b.Cap())
	}
	mustAppend(t, b, fill(1000, 7))
	if err := b.Append([]byte{1}); !errors.Is(err, ErrFull) {
		t.Fatalf("Append past the cap = %v, want ErrFull", err)
	}
	if b.Cap() != 10000 {
		t.Fatalf("cap %d, want 10000", b.Cap())
	}

	// Lowering Max never drops what is held.
	b.SetMax(10)
	if b.Len() != 10000 {
		t.Fatalf("SetMax dropped bytes: len %d", b.Len())
	}
	if err := b.Append([]byte{1}); !errors.Is(err, ErrFull) {
		t.Fatalf("Append after lowering Max = %v, want ErrFull", err)
	}
}

func TestShrink(t *testing.T) {
	b := New(0)
	for i := 0; i < 64; i++ {
		mustAppend(t, b, fill(1024, byte(i)))
	}
	if b.Cap() != 64<<10 {
		t.Fatalf("cap %d, want 64 KiB", b.Cap())
	}
	endsCap := len(b.st.ends)
	if endsCap < 64 {
		t.Fatalf("frame-end ring %d < 64 frames", endsCap)
	}
	want := pending(b)
	// Write most of it in odd-sized pieces; storage shrinks on the way.
	for b.Len() > 1500 {
		b.Discard(1000 + b.Len()%7)
		want = want[len(want)-b.Len():]
		if !bytes.Equal(pending(b), want) {
			t.Fatalf("contents differ after shrinking to cap %d", b.Cap())
		}
		if b.Len() > 0 && b.Cap() > minSlab && b.Len() <= b.Cap()/4 {
			t.Fatalf("len %d in cap %d: did not shrink", b.Len(), b.Cap())
		}
	}
	if b.Cap() != minSlab {
		t.Fatalf("cap %d with %d pending, want %d", b.Cap(), b.Len(), minSlab)
	}
	if len(b.st.ends) >= endsCap || len(b.st.ends) < b.Frames() {
		t.Fatalf("frame-end ring %d (was %d) for %d frames: did not shrink", len(b.st.ends), endsCap, b.Frames())
	}
	b.Discard(b.Len())
	if b.Cap() != 0 || b.st != nil || b.Frames() != 0 {
		t.Fatalf("drained buffer holds cap %d, store %v, frames %d", b.Cap(), b.st != nil, b.Frames())
	}
	if b.Written() != 64<<10 || b.Appended() != 64<<10 {
		t.Fatalf("written %d appended %d, want 65536 both", b.Written(), b.Appended())
	}

	// Reset returns storage and counts the rest as written.
	mustAppend(t, b, fill(10, 1))
	b.Reset()
	if b.Cap() != 0 || b.Len() != 0 || b.Frames() != 0 || b.Written() != b.Appended() {
		t.Fatalf("after Reset: cap %d len %d frames %d written %d appended %d",
			b.Cap(), b.Len(), b.Frames(), b.Written(), b.Appended())
	}
}

func TestFrameCounting(t *testing.T) {
	b := New(0)
	sizes := []int{10, 20, 5, 1, 100}
	for i, n := range sizes {
		mustAppend(t, b, fill(n, byte(i)))
	}
	if b.Frames() != 5 {
		t.Fatalf("frames %d, want 5", b.Frames())
	}
	// Frame ends: 10, 30, 35, 36, 136.
	steps := []struct {
		discard, frames int
	}{
		{9, 5},  // 9 of the first 10: still pending
		{1, 4},  // first frame done
		{19, 4}, // one byte of the second left
		{2, 3},  // second done, 1 byte of the 5-byte third gone
		{4, 2},  // third done exactly
		{0, 2},  // no-op
		{1, 1},  // the 1-byte fourth
		{99, 1}, // one byte of the fifth left
		{1, 0},
	}
	for i, s := range steps {
		b.Discard(s.discard)
		if b.Frames() != s.frames {
			t.Fatalf("step %d: after Discard(%d) written %d: frames %d, want %d", i, s.discard, b.Written(), b.Frames(), s.frames)
		}
	}
}

func TestWholeUnsent(t *testing.T) {
	// The hub's coalescing rule: a frame that started at offset s is still
	// wholly unsent while Written() <= s.
	b := New(0)
	mustAppend(t, b, fill(10, 1))
	s := b.Appended()
	mustAppend(t, b, fill(10, 2))
	b.Discard(10)
	if !(b.Written() <= s) {
		t.Fatal("second frame reported as partly sent")
	}
	b.Discard(1)
	if b.Written() <= s {
		t.Fatal("second frame reported as wholly unsent after a byte of it left")
	}
}

func TestDiscardTooMuchPanics(t *testing.T) {
	for _, n := range []int{-1, 4} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Discard(%d) with 3 pending did not panic", n)
				}
			}()
			b := New(0)
			mustAppend(t, b, []byte("abc"))
			b.Discard(n)
		}()
	}
}

// TestModel runs random operations against a plain []byte model.
func TestModel(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7919))
		max := 0
		if seed%2 == 0 {
			max = 1 + rng.IntN(200000)
		}
		b := New(max)
		var model []byte
		var ends []uint64 // absolute end offsets of frames not fully written
		var written, appended uint64
		for op := 0; op < 5000; op++ {
			switch r := rng.IntN(10); {
			case r < 5:
				n := randSize(rng, 8, 300, 5000, 40000)
				p := fill(n, byte(op))
				err := b.Append(p)
				if max > 0 && len(model)+n > max {
					if !errors.Is(err, ErrFull) {
						t.Fatalf("seed %d op %d: Append(%d) at %d/%d = %v, want ErrFull", seed, op, n, len(model), max, err)
					}
					break
				}
				if err != nil {
					t.Fatalf("seed %d op %d: Append(%d) at %d/%d: %v", seed, op, n, len(model), max, err)
				}
				if n > 0 {
					model = append(model, p...)
					appended += uint64(n)
					ends = append(ends, appended)
				}
			case r < 9:
				n := 0
				if len(model) > 0 {
					n = rng.IntN(len(model) + 1)
					if rng.IntN(4) == 0 {
						n = len(model)
					}
				}
				b.Discard(n)
				model = model[n:]
				written += uint64(n)
				for len(ends) > 0 && ends[0] <= written {
					ends = ends[1:]
				}
			default:
				if rng.IntN(10) == 0 {
					b.Reset()
					model, ends = nil, nil
					written = appended
				}
			}
			if b.Len() != len(model) || b.Frames() != len(ends) || b.Written() != written || b.Appended() != appended {
				t.Fatalf("seed %d op %d: len %d frames %d written %d appended %d; model %d %d %d %d",
					seed, op, b.Len(), b.Frames(), b.Written(), b.Appended(), len(model), len(ends), written, appended)
			}
			if !bytes.Equal(pending(b), model) {
				t.Fatalf("seed %d op %d: contents differ from model (len %d)", seed, op, len(model))
			}
			if (b.Cap() == 0) != (b.Len() == 0) {
				t.Fatalf("seed %d op %d: cap %d with len %d", seed, op, b.Cap(), b.Len())
			}
			if b.Cap() > minSlab && b.Len() <= b.Cap()/8 {
				t.Fatalf("seed %d op %d: cap %d holds only %d", seed, op, b.Cap(), b.Len())
			}
			if max > minSlab && b.Cap() > max {
				t.Fatalf("seed %d op %d: cap %d above Max %d", seed, op, b.Cap(), max)
			}
		}
	}
}

func TestNoAllocsSteadyState(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items on purpose under the race detector")
	}
	b := New(1 << 20)
	frame := fill(128, 1)
	cycle := func() {
		for i := 0; i < 16; i++ {
			if err := b.Append(frame); err != nil {
				t.Fatal(err)
			}
		}
		for b.Len() > 0 {
			f, _ := b.Peek()
			b.Discard(min(len(f), 700))
		}
	}
	cycle()
	if n := testing.AllocsPerRun(1000, cycle); n != 0 {
		t.Fatalf("%v allocs per append/peek/discard cycle, want 0", n)
	}
}

// BenchmarkCycle: 16 wake-sized frames appended, then written out in one go,
// which is the hub's flush when the kernel takes everything.
func BenchmarkCycle(b *testing.B) {
	buf := New(1 << 20)
	frame := fill(128, 1)
	b.ReportAllocs()
	b.SetBytes(16 * 128)
	for b.Loop() {
		append16(b, buf, frame)
		first, second := buf.Peek()
		buf.Discard(len(first) + len(second))
	}
}

// BenchmarkBacklog: a worker that is always behind; the kernel takes a bit
// less than was appended, so the buffer wraps and stays around one size.
func BenchmarkBacklog(b *testing.B) {
	buf := New(1 << 20)
	frame := fill(128, 1)
	for i := 0; i < 100; i++ {
		_ = buf.Append(frame)
	}
	b.ReportAllocs()
	b.SetBytes(16 * 128)
	for b.Loop() {
		append16(b, buf, frame)
		first, _ := buf.Peek()
		buf.Discard(min(len(first), 16*128))
	}
}

// BenchmarkForeignFirstAppend: the first wake after a hot upgrade for a
// worker whose 6.5 MB backlog was pre-copied and adopted as foreign
// storage: adopt, one wake-sized Append, Reset.
func BenchmarkForeignFirstAppend(b *testing.B) {
	data := fill(6500<<10, 1)
	ends := evenEnds(len(data), 4096)
	frame := fill(128, 2)
	var buf Buffer
	b.ReportAllocs()
	for b.Loop() {
		if err := buf.AdoptForeign(data, ends, func() {}); err != nil {
			b.Fatal(err)
		}
		if err := buf.Append(frame); err != nil {
			b.Fatal(err)
		}
		buf.Reset()
	}
}

// A Retain buffer keeps its smallest-class storage across drains, gives
// back larger storage at once, and Release frees it when empty only.
func TestRetainKeepsSmallStorageUntilRelease(t *testing.T) {
	b := New(1 << 20)
	b.Retain = true
	frame := make([]byte, 100)
	for i := 0; i < 3; i++ {
		if err := b.Append(frame); err != nil {
			t.Fatal(err)
		}
		b.Discard(b.Len())
		if b.Cap() != minSlab {
			t.Fatalf("drain %d: Cap() = %d, want %d kept", i, b.Cap(), minSlab)
		}
		if b.Frames() != 0 || b.Len() != 0 {
			t.Fatalf("drain %d: %d frames, %d bytes left", i, b.Frames(), b.Len())
		}
	}
	// Offsets stay absolute across retained drains.
	if b.Written() != 300 || b.Appended() != 300 {
		t.Fatalf("offsets %d/%d, want 300/300", b.Written(), b.Appended())
	}
	b.Append(frame)
	b.Release() // pending bytes: no-op
	if b.Cap() == 0 || b.Len() != 100 {
		t.Fatalf("Release with bytes pending freed storage (cap %d, len %d)", b.Cap(), b.Len())
	}
	if first, _ := b.Peek(); len(first) != 100 {
		t.Fatalf("Peek after retained drains: %d bytes, want 100", len(first))
	}
	b.Discard(100)
	b.Release()
	if b.Cap() != 0 {
		t.Fatalf("Release of an empty buffer left Cap() = %d", b.Cap())
	}
	// Grown past the smallest class: returned on drain even with Retain.
	big := make([]byte, 3*minSlab)
	b.Append(big)
	b.Discard(b.Len())
	if b.Cap() != 0 {
		t.Fatalf("large storage kept on drain: Cap() = %d", b.Cap())
	}
}

// TestAdopt: a received buffer becomes the storage as it is (no copy), its
// frames counted and ends kept in Appended terms; appending grows it, and
// ends that do not describe the bytes are refused without a change.
func TestAdopt(t *testing.T) {
	var b Buffer
	if err := b.Append(fill(10, 1)); err != nil {
		t.Fatal(err)
	}
	b.Discard(10)
	data := fill(300, 7)
	want := append([]byte{}, data...)
	if err := b.Adopt(data, []uint64{5, 100, 300}); err != nil {
		t.Fatal(err)
	}
	if first, _ := b.Peek(); &first[0] != &data[0] {
		t.Error("Adopt copied the bytes")
	}
	if b.Len() != 300 || b.Frames() != 3 || b.Appended() != 310 || b.Written() != 10 {
		t.Fatalf("Len %d Frames %d Appended %d Written %d", b.Len(), b.Frames(), b.Appended(), b.Written())
	}
	if got := b.FrameEnds(nil); len(got) != 3 || got[0] != 15 || got[1] != 110 || got[2] != 310 {
		t.Fatalf("FrameEnds %v", got)
	}
	if err := b.Append(fill(50, 9)); err != nil {
		t.Fatal(err)
	}
	want = append(want, fill(50, 9)...)
	if !bytes.Equal(pending(&b), want) || b.Frames() != 4 {
		t.Fatalf("after Append: %d bytes, %d frames", b.Len(), b.Frames())
	}
	b.Discard(100)
	if b.Frames() != 2 || !bytes.Equal(pending(&b), want[100:]) {
		t.Fatalf("after Discard: %d frames", b.Frames())
	}
	if err := b.Adopt(fill(4, 1), []uint64{4}); err == nil {
		t.Error("Adopt into a non-empty buffer")
	}
	b.Reset()
	for _, ends := range [][]uint64{nil, {2}, {2, 2, 4}, {5}, {3, 2, 4}} {
		if err := b.Adopt(fill(4, 1), ends); err == nil || b.Len() != 0 {
			t.Errorf("Adopt with ends %v: %v, Len %d", ends, err, b.Len())
		}
	}
	if err := b.Adopt(nil, nil); err != nil || b.Len() != 0 {
		t.Errorf("Adopt(nil): %v", err)
	}
	big := make([]uint64, 100)
	for i := range big {
		big[i] = uint64(i + 1)
	}
	if err := b.Adopt(fill(100, 3), big); err != nil || b.Frames() != 100 {
		t.Fatalf("100 frames: %v, %d", err, b.Frames())
	}
	b.Discard(100)
	if b.Len() != 0 || b.Frames() != 0 {
		t.Fatalf("drained: Len %d Frames %d", b.Len(), b.Frames())
	}
}

// foreign maps n read-only bytes of a pattern outside the Go heap, as a
// hot upgrade's pre-copied backlog is: a write to them, or a read after
// free unmapped them, crashes the test. freed counts free's calls.
func foreign(t *testing.T, n int, seed byte) (data []byte, free func(), freed *int) {
	t.Helper()
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	copy(m, fill(n, seed))
	if err := unix.Mprotect(m, unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	freed = new(int)
	return m, func() {
		*freed++
		if *freed == 1 {
			unix.Munmap(m)
		}
	}, freed
}

// evenEnds are frame ends every step bytes up to n.
func evenEnds(n, step int) []uint64 {
	var ends []uint64
	for e := step; e < n; e += step {
		ends = append(ends, uint64(e))
	}
	return append(ends, uint64(n))
}

// TestAdoptForeign: foreign storage is read where it lies (no copy), never
// written to, and given back exactly once whichever way the buffer lets go
// of it (drained, drained across into frames appended behind it, a shrink
// moving the rest to storage of its own, Reset, a Retain buffer drained),
// never to a pool: the pools' slabs are written after it was unmapped.
func TestAdoptForeign(t *testing.T) {
	const n = 64 << 10
	for _, tc := range []struct {
		name string
		// let makes b let go of the foreign bytes; want is what is
		// pending afterwards, given what was adopted.
		let  func(t *testing.T, b *Buffer)
		want func(adopted []byte) []byte
	}{
		{"drained", func(t *testing.T, b *Buffer) {
			b.Discard(100)
			b.Discard(b.Len())
		}, func([]byte) []byte { return nil }},
		{"across", func(t *testing.T, b *Buffer) {
			b.Discard(1000) // room in front: a ring's Append would wrap into it
			mustAppend(t, b, fill(300, 9))
			b.Discard(n - 1000 + 50) // the rest of the head and 50 of the tail
		}, func(a []byte) []byte { return fill(300, 9)[50:] }},
		{"shrink", func(t *testing.T, b *Buffer) {
			b.Discard(n - n/4)
		}, func(a []byte) []byte { return append([]byte{}, a[n-n/4:]...) }},
		{"reset", func(t *testing.T, b *Buffer) { b.Reset() }, func([]byte) []byte { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, free, freed := foreign(t, n, 5)
			adopted := append([]byte{}, data...)
			var b Buffer
			b.Max = 1 << 20
			mustAppend(t, &b, fill(10, 1))
			b.Discard(10)
			if err := b.AdoptForeign(data, evenEnds(n, 512), free); err != nil {
				t.Fatal(err)
			}
			if first, second := b.Peek(); &first[0] != &data[0] || len(first) != n || len(second) != 0 {
				t.Fatal("AdoptForeign copied the bytes")
			}
			if b.Appended() != 10+n || b.Written() != 10 || b.Frames() != n/512 {
				t.Fatalf("Appended %d Written %d Frames %d", b.Appended(), b.Written(), b.Frames())
			}
			if *freed != 0 {
				t.Fatal("freed on adoption")
			}
			tc.let(t, &b)
			if *freed != 1 {
				t.Fatalf("free called %d times, want once", *freed)
			}
			want := tc.want(adopted)
			if got := pending(&b); !bytes.Equal(got, want) {
				t.Fatalf("pending %d bytes, want %d", len(got), len(want))
			}
			// What is pending is the buffer's own now: it goes on as
			// any buffer would, and free is not called again.
			mustAppend(t, &b, fill(100, 3))
			b.Discard(b.Len())
			b.Reset()
			if *freed != 1 {
				t.Fatalf("free called %d times, want once", *freed)
			}
		})
	}

	t.Run("retain", func(t *testing.T) {
		data, free, freed := foreign(t, minSlab, 5) // a retained size
		var b Buffer
		b.Retain = true
		if err := b.AdoptForeign(data, []uint64{minSlab}, free); err != nil {
			t.Fatal(err)
		}
		b.Discard(minSlab)
		if *freed != 1 || b.Cap() != 0 {
			t.Fatalf("drained Retain buffer: free called %d times, Cap %d; want 1, 0", *freed, b.Cap())
		}
		mustAppend(t, &b, fill(100, 3)) // into storage of its own
		if *freed != 1 || !bytes.Equal(pending(&b), fill(100, 3)) {
			t.Fatalf("after Append: free called %d times", *freed)
		}
	})

	t.Run("full", func(t *testing.T) {
		data, free, freed := foreign(t, 1000, 5)
		b := New(1000)
		if err := b.AdoptForeign(data, []uint64{1000}, free); err != nil {
			t.Fatal(err)
		}
		if err := b.Append(fill(10, 1)); !errors.Is(err, ErrFull) {
			t.Fatalf("Append past the cap: %v, want ErrFull", err)
		}
		if first, _ := b.Peek(); &first[0] != &data[0] || *freed != 0 {
			t.Fatalf("a refused Append moved the foreign bytes (free called %d times)", *freed)
		}
		b.Reset()
		if *freed != 1 {
			t.Fatalf("free called %d times, want once", *freed)
		}
	})

	t.Run("refused", func(t *testing.T) {
		data, free, freed := foreign(t, 1000, 5)
		var b Buffer
		for _, c := range []struct {
			data []byte
			ends []uint64
			free func()
		}{
			{data, []uint64{1000}, nil},
			{data[:0], nil, free},
			{data, []uint64{999}, free},
			{data, []uint64{500, 400, 1000}, free},
		} {
			if err := b.AdoptForeign(c.data, c.ends, c.free); err == nil || b.Len() != 0 {
				t.Errorf("AdoptForeign(%d bytes, ends %v, free %v): %v, Len %d", len(c.data), c.ends, c.free != nil, err, b.Len())
			}
		}
		mustAppend(t, &b, fill(10, 1))
		if err := b.AdoptForeign(data, []uint64{1000}, free); err == nil {
			t.Error("AdoptForeign into a non-empty buffer")
		}
		if *freed != 0 {
			t.Errorf("a refused adoption called free %d times", *freed)
		}
		free()
	})

	// Every pooled slab class is written once more: had foreign storage
	// gone to a pool, this writes to unmapped memory.
	for c := range byteClasses {
		var b Buffer
		mustAppend(t, &b, fill(minSlab<<c, 1))
		b.Reset()
	}
}

// fifo is the model of a Buffer: its pending bytes as a plain slice, the
// absolute ends of the frames not fully written, and the two offsets.
type fifo struct {
	bytes             []byte
	ends              []uint64
	written, appended uint64
}

func (m *fifo) append(p []byte) {
	m.bytes = append(m.bytes, p...)
	m.appended += uint64(len(p))
	m.ends = append(m.ends, m.appended)
}

// adopt is m.append of data as frames ending at ends (relative to data).
func (m *fifo) adopt(data []byte, ends []uint64) {
	base := m.appended
	m.bytes = append(m.bytes, data...)
	for _, e := range ends {
		m.ends = append(m.ends, base+e)
	}
	m.appended += uint64(len(data))
}

func (m *fifo) discard(n int) {
	m.bytes = m.bytes[n:]
	m.written += uint64(n)
	for len(m.ends) > 0 && m.ends[0] <= m.written {
		m.ends = m.ends[1:]
	}
}

func (m *fifo) reset() {
	m.bytes, m.ends, m.written = nil, nil, m.appended
}

// check fails t unless b holds what m does, Peek's two slices in order
// with the first empty only when nothing is pending.
func (m *fifo) check(t *testing.T, b *Buffer, where string) {
	t.Helper()
	if b.Len() != len(m.bytes) || b.Frames() != len(m.ends) || b.Written() != m.written || b.Appended() != m.appended {
		t.Fatalf("%s: len %d frames %d written %d appended %d; model %d %d %d %d", where,
			b.Len(), b.Frames(), b.Written(), b.Appended(), len(m.bytes), len(m.ends), m.written, m.appended)
	}
	first, second := b.Peek()
	if (len(first) == 0) != (len(m.bytes) == 0) {
		t.Fatalf("%s: Peek %d+%d bytes with %d pending", where, len(first), len(second), len(m.bytes))
	}
	if !bytes.Equal(append(append([]byte{}, first...), second...), m.bytes) {
		t.Fatalf("%s: contents differ from the model (%d bytes)", where, len(m.bytes))
	}
	if got := b.FrameEnds(nil); !slices.Equal(got, m.ends) {
		t.Fatalf("%s: FrameEnds %v, model %v", where, got, m.ends)
	}
}

// TestForeignHeadTakesAppends: frames appended behind foreign bytes go to
// storage of the buffer's own; the foreign head is never copied for them
// (Peek's first slice stays the mapping, and the storage held is the
// mapping plus what the tail needs) nor written (the mapping is
// read-only), Max counts head and tail, and free is called once, when
// the head is sent; from then on the buffer is an ordinary one, wrapping
// and draining.
func TestForeignHeadTakesAppends(t *testing.T) {
	const n = 256 << 10
	data, free, freed := foreign(t, n, 5)
	var m fifo
	m.adopt(fill(n, 5), evenEnds(n, 4096))
	var b Buffer
	if err := b.AdoptForeign(data, evenEnds(n, 4096), free); err != nil {
		t.Fatal(err)
	}
	var headHeld func(where string) // head without the contents
	// Room for a tail larger than what is left of the head once it is
	// nearly sent, so that no shrink lets go of the head early.
	b.Max = n + 512<<10
	sent := 0 // bytes of data discarded
	head := func(where string) {
		t.Helper()
		m.check(t, &b, where)
		headHeld(where)
	}
	headHeld = func(where string) {
		t.Helper()
		first, _ := b.Peek()
		if *freed != 0 || &first[0] != &data[sent] || len(first) != n-sent {
			t.Fatalf("%s: head not the mapping at %d (free called %d times)", where, sent, *freed)
		}
		if tail := b.Len() - (n - sent); b.Cap()-n > max(2*tail, minSlab) {
			t.Fatalf("%s: cap %d for a %d-byte tail behind %d foreign bytes", where, b.Cap(), tail, n)
		}
	}

	mustAppend(t, &b, fill(100, 1))
	m.append(fill(100, 1))
	head("first Append")
	if b.Cap() != n+minSlab {
		t.Fatalf("cap %d after the first Append, want the mapping and a %d-byte slab", b.Cap(), minSlab)
	}

	// Appends until the cap, growing the tail through several classes,
	// with discards from the head between, which leave room in front.
	for i := 0; ; i++ {
		p := fill(50+i*37%1500, byte(i))
		if err := b.Append(p); len(m.bytes)+len(p) > b.Max {
			if !errors.Is(err, ErrFull) {
				t.Fatalf("Append(%d) at %d/%d = %v, want ErrFull", len(p), b.Len(), b.Max, err)
			}
			head("refused Append")
			break
		} else if err != nil {
			t.Fatalf("Append(%d) at %d/%d: %v", len(p), b.Len(), b.Max, err)
		}
		m.append(p)
		if i%8 == 0 {
			b.Discard(333)
			m.discard(333)
			sent += 333
		}
		if i%32 == 0 {
			head(fmt.Sprintf("append %d", i))
		} else {
			headHeld(fmt.Sprintf("append %d", i))
		}
	}
	if tail := b.Len() - (n - sent); tail < 384<<10 {
		t.Fatalf("the tail reached only %d bytes", tail)
	}

	// Up to the head's last byte: still held.
	b.Discard(n - sent - 1)
	m.discard(n - sent - 1)
	sent = n - 1
	head("one head byte left")
	// Across the boundary: the head is let go of, once.
	b.Discard(1 + 7)
	m.discard(1 + 7)
	if *freed != 1 {
		t.Fatalf("free called %d times once the head was sent, want once", *freed)
	}
	m.check(t, &b, "head sent")

	// An ordinary buffer now: it shrinks, wraps, and drains to nothing.
	b.Discard(b.Len() - 3000)
	m.discard(len(m.bytes) - 3000)
	m.check(t, &b, "shrunk")
	if b.Cap() > 2*minSlab {
		t.Fatalf("cap %d holding 3000 bytes", b.Cap())
	}
	wrapped := false
	for i := 0; i < 2000; i++ {
		p := fill(100+i%900, byte(i))
		if err := b.Append(p); err != nil {
			t.Fatalf("Append(%d) at %d/%d: %v", len(p), b.Len(), b.Max, err)
		}
		m.append(p)
		d := min(b.Len(), 150+i%1000)
		b.Discard(d)
		m.discard(d)
		m.check(t, &b, fmt.Sprintf("ordinary %d", i))
		if _, second := b.Peek(); len(second) > 0 {
			wrapped = true
		}
	}
	if !wrapped {
		t.Error("the buffer never wrapped after the head was sent")
	}
	b.Discard(b.Len())
	m.discard(len(m.bytes))
	m.check(t, &b, "drained")
	if b.Cap() != 0 || *freed != 1 {
		t.Fatalf("drained: cap %d, free called %d times", b.Cap(), *freed)
	}
	b.Reset()
	if *freed != 1 {
		t.Fatalf("free called %d times after Reset, want once", *freed)
	}

	// Reset and Release with frames behind a foreign head.
	data, free, freed = foreign(t, 10000, 3)
	b = Buffer{}
	if err := b.AdoptForeign(data, []uint64{10000}, free); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, &b, fill(5000, 1))
	b.Discard(100)
	b.Release() // bytes pending: a no-op
	if *freed != 0 || b.Len() != 9900+5000 {
		t.Fatalf("Release with bytes pending: free called %d times, Len %d", *freed, b.Len())
	}
	b.Reset()
	if *freed != 1 || b.Cap() != 0 || b.Len() != 0 || b.Frames() != 0 || b.Written() != b.Appended() {
		t.Fatalf("after Reset: free called %d times, cap %d len %d frames %d", *freed, b.Cap(), b.Len(), b.Frames())
	}
}

// TestForeignModel runs random operations on buffers that adopt foreign
// bytes (read-only mappings) whenever they are empty, against the fifo
// model: contents and counts always agree; while the foreign bytes are
// held Peek's first slice is the mapping where it was (no copy) and an
// Append never lets go of it; free is called exactly once, when the head
// is sent, on Reset, or when a shrink finds at most a quarter of the
// storage held pending; Max counts head and tail.
func TestForeignModel(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*104729))
		var b Buffer
		b.Retain = seed%3 == 0
		var m fifo
		// The foreign bytes adopted last: data, at absolute [start, end).
		var data []byte
		var freed *int
		var start, end uint64
		frees := 0 // free's calls for the mappings before data's
		adopt := func() {
			size := 1 + rng.IntN(100000)
			d, free, f := foreign(t, size, byte(rng.IntN(256)))
			var ends []uint64
			for e := 0; e < size; {
				e = min(size, e+1+rng.IntN(3000))
				ends = append(ends, uint64(e))
			}
			if err := b.AdoptForeign(d, ends, free); err != nil {
				t.Fatalf("seed %d: AdoptForeign(%d bytes): %v", seed, size, err)
			}
			if freed != nil {
				frees += *freed
			}
			data, freed, start, end = d, f, m.appended, m.appended+uint64(size)
			m.adopt(fill(size, d[0]), ends)
			switch rng.IntN(4) {
			case 0:
				b.Max = 0
			case 1:
				b.Max = size / 2 // no room until the head is mostly sent
			default:
				b.Max = size + rng.IntN(150000)
			}
		}
		adopt()
		adoptions := 1
		for op := 0; op < 1500; op++ {
			where := fmt.Sprintf("seed %d op %d", seed, op)
			held := *freed == 0
			capBefore := b.Cap()
			switch r := rng.IntN(20); {
			case r < 10:
				n := randSize(rng, 300, 5000, 20000)
				p := fill(n, byte(op))
				err := b.Append(p)
				if n > 0 && b.Max > 0 && len(m.bytes)+n > b.Max {
					if !errors.Is(err, ErrFull) {
						t.Fatalf("%s: Append(%d) at %d/%d = %v, want ErrFull", where, n, len(m.bytes), b.Max, err)
					}
					break
				}
				if err != nil {
					t.Fatalf("%s: Append(%d) at %d/%d: %v", where, n, len(m.bytes), b.Max, err)
				}
				if n > 0 {
					m.append(p)
				}
				if held && *freed != 0 {
					t.Fatalf("%s: Append(%d) let go of the foreign bytes", where, n)
				}
			case r < 18:
				n := 0
				if len(m.bytes) > 0 {
					switch rng.IntN(4) {
					case 0:
						n = len(m.bytes)
					case 1: // to the end of the head, or a bit either side
						if head := int(min(end-min(end, m.written), uint64(len(m.bytes)))); head > 0 {
							n = max(0, min(len(m.bytes), head+rng.IntN(5)-2))
						}
					default:
						n = rng.IntN(len(m.bytes) + 1)
					}
				}
				b.Discard(n)
				m.discard(n)
				if held && *freed != 0 && m.written < end && b.Len() > capBefore/4 {
					t.Fatalf("%s: Discard(%d) let go of the foreign bytes with %d of %d held pending",
						where, n, b.Len(), capBefore)
				}
			case r < 19:
				b.Release()
				if held && *freed != 0 && len(m.bytes) > 0 {
					t.Fatalf("%s: Release with bytes pending let go of the foreign bytes", where)
				}
			default:
				if rng.IntN(4) == 0 {
					b.Reset()
					m.reset()
				}
			}
			if *freed > 1 {
				t.Fatalf("%s: free called %d times", where, *freed)
			}
			if m.written >= end && *freed != 1 {
				t.Fatalf("%s: the foreign bytes were sent, free called %d times", where, *freed)
			}
			m.check(t, &b, where) // reads unmapped memory if freed early
			if *freed == 0 {
				first, _ := b.Peek()
				if off := m.written - start; &first[0] != &data[off] || len(first) != int(end-m.written) {
					t.Fatalf("%s: Peek's first slice is not the mapping at %d", where, off)
				}
				if tail := int(m.appended - end); b.Cap()-len(data) > max(2*tail, minSlab) {
					t.Fatalf("%s: cap %d for a %d-byte tail behind %d foreign bytes", where, b.Cap(), tail, len(data))
				}
			}
			if len(m.bytes) == 0 && rng.IntN(3) == 0 {
				adopt()
				adoptions++
			}
		}
		b.Reset()
		if frees += *freed; frees != adoptions {
			t.Fatalf("seed %d: %d adoptions, %d frees", seed, adoptions, frees)
		}
	}
}
