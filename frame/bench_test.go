package frame

import (
	"bytes"
	"testing"
)

// payload128 is a typical ephemeral payload: 128 bytes of JSON, whose
// quotes need escaping.
var payload128 = func() []byte {
	p := []byte(`{"id":12345,"queue":"orders","event":"INSERT","at":"2025-01-01T00:00:00Z","note":"`)
	p = append(p, bytes.Repeat([]byte("x"), 128-len(p)-2)...)
	return append(p, `"}`...)
}()

func BenchmarkAppendWake(b *testing.B) {
	if len(payload128) != 128 {
		b.Fatalf("payload is %d bytes", len(payload128))
	}
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	b.SetBytes(int64(len(AppendWake(nil, "orders", payload128, true))))
	for b.Loop() {
		buf = AppendWake(buf[:0], "orders", payload128, true)
	}
}

func BenchmarkAppendWakeDurable(b *testing.B) {
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendWake(buf[:0], "orders", nil, false)
	}
}

func BenchmarkAppendSub(b *testing.B) {
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendSub(buf[:0], "orders")
	}
}

func BenchmarkAppendStatus(b *testing.B) {
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendStatus(buf[:0], true)
	}
}

func BenchmarkDecodeWake(b *testing.B) {
	body := AppendWake(nil, "orders", payload128, true)[4:]
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Decode(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeSub(b *testing.B) {
	body := AppendSub(nil, "orders")[4:]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecoderStream: one op is one frame of a stream of 128-byte-payload
// wakes fed in 4 KiB chunks that cut frames anywhere, as socket reads do.
func BenchmarkDecoderStream(b *testing.B) {
	var stream []byte
	for range 256 {
		stream = AppendWake(stream, "orders", payload128, true)
	}
	frameLen := len(stream) / 256
	const chunk = 4096
	var d Decoder
	off := 0
	b.ReportAllocs()
	b.SetBytes(int64(frameLen))
	for b.Loop() {
		for {
			_, ok, err := d.Next()
			if err != nil {
				b.Fatal(err)
			}
			if ok {
				break
			}
			end := min(off+chunk, len(stream))
			d.Feed(stream[off:end])
			off = end % len(stream)
		}
	}
}
