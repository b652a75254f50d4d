package main

import (
	"bytes"
	"strconv"
	"testing"
	"time"

	"github.com/listenhub/listenhub/benchmarks/internal/wire"
)

func TestParsePayload(t *testing.T) {
	run, send, ok := parsePayload([]byte("12:345:1700000000000000000:xxxx"))
	if !ok || run != 12 || send != 1700000000000000000 {
		t.Fatalf("got %d %d %v", run, send, ok)
	}
	if _, _, ok := parsePayload([]byte("12:x")); ok {
		t.Fatal("accepted garbage")
	}
}

func TestFastWake(t *testing.T) {
	f := wire.AppendWake(nil, "q", []byte("1:2:3"), true)
	p, hasP, ok := wire.FastWake(f[4:])
	if !ok || !hasP || string(p) != "1:2:3" {
		t.Fatalf("%q %v %v", p, hasP, ok)
	}
	f = wire.AppendWake(nil, "q", nil, false)
	if _, hasP, ok := wire.FastWake(f[4:]); !ok || hasP {
		t.Fatal("durable")
	}
	m, err := wire.Decode(wire.AppendNack(nil, "q", "bad \"x\"")[4:])
	if err != nil || m.T != "nack" || m.Error != `bad "x"` {
		t.Fatal(m, err)
	}
}

// BenchmarkWorkerFrame is the worker's per-frame cost once the bytes are
// in its buffer: what a worker spends that is not the hub's.
func BenchmarkWorkerFrame(b *testing.B) {
	var stream []byte
	now := time.Now().UnixNano()
	for i := range 1000 {
		stream = wire.AppendWake(stream, "bench", []byte("7:"+strconv.Itoa(i)+":"+strconv.FormatInt(now, 10)), true)
	}
	currentRun.Store(7)
	s := &connStats{}
	b.ReportAllocs()
	b.SetBytes(int64(len(stream) / 1000))
	r := wire.NewReader(bytes.NewReader(nil), 64<<10)
	for i := 0; i < b.N; {
		r.Reset(bytes.NewReader(stream))
		for j := 0; j < 1000 && i < b.N; j, i = j+1, i+1 {
			body, _ := r.Next()
			p, hasP, _ := wire.FastWake(body)
			s.wake(p, hasP, time.Now().UnixNano())
		}
	}
}
