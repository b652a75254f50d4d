package monitor

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/hub"
)

// awkward holds strings encoding/json escapes in every way it knows.
var awkward = []string{
	"", "q1", `quo"te`, `back\slash`, "<script>&amp;</script>", "tab\tnl\ncr\rbs\bff\f",
	"ctl\x00\x01\x1f\x7f", "bad utf8 \xff\xfe end", "trunc \xe2\x82", "ls\u2028ps\u2029",
	"héllo wörld ✓ 𝄞", strings.Repeat("x", 63),
}

func sampleWorkers() hub.WorkerList {
	l := hub.WorkerList{Total: 12345, Offset: 7, Limit: 600, Sort: "backlog"}
	zones := []*time.Location{time.UTC, time.FixedZone("x", -(3*3600 + 30*60)), time.FixedZone("y", 5*3600+45*60)}
	for i := range 600 {
		w := hub.WorkerInfo{
			ID: uint64(i) * 1e15, PID: i * 7, UID: i % 3 * 1000,
			ConnectedAt:   time.Date(2026, 12, 4, 9, 10, i%60, i*1_234_567, zones[i%3]),
			Subscriptions: i, BacklogFrames: i * 11, BacklogBytes: i << 20, DurablePending: i % 5,
			FramesSent: ^uint64(0) - uint64(i), DurableCoalesced: uint64(i), DurableDropped: uint64(i / 2),
		}
		switch i % 3 {
		case 0: // nil: null
		case 1:
			w.Names = []string{}
		default:
			w.Names = awkward[:i%len(awkward)]
		}
		l.Workers = append(l.Workers, w)
	}
	return l
}

func sampleChannels() hub.ChannelList {
	l := hub.ChannelList{Total: 3, Sort: "na<me>"}
	for i, s := range awkward {
		l.Channels = append(l.Channels, hub.ChannelInfo{
			Name: s, Channel: "pre." + s, Subscribers: i, State: "listening", Waiting: -i,
			WakesReceived: uint64(i) << 40, WakesDelivered: ^uint64(0),
		})
	}
	return l
}

func TestListJSONMatchesEncodingJSON(t *testing.T) {
	check := func(name string, got []byte, err error, v any) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("%s differs from encoding/json:\n got %.400s\nwant %.400s", name, got, want)
		}
	}
	ctx := context.Background()
	w := sampleWorkers()
	b, err := appendWorkerList(ctx, nil, w)
	check("workers", b, err, w)
	b, err = appendWorkerList(ctx, []byte("reused buffer"), hub.WorkerList{})
	check("no workers", b[len("reused buffer"):], err, hub.WorkerList{})
	b, err = appendWorkerList(ctx, nil, hub.WorkerList{Workers: []hub.WorkerInfo{}})
	check("empty workers", b, err, hub.WorkerList{Workers: []hub.WorkerInfo{}})
	c := sampleChannels()
	b, err = appendChannelList(ctx, nil, c)
	check("channels", b, err, c)
	b, err = appendChannelList(ctx, nil, hub.ChannelList{})
	check("no channels", b, err, hub.ChannelList{})
}

// A client that goes away stops the encoding at the next chunk.
func TestListJSONStopsForAGoneClient(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := sampleWorkers()
	b, err := appendWorkerList(ctx, nil, w)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if full, _ := appendWorkerList(context.Background(), nil, w); len(b) >= len(full) {
		t.Fatalf("encoded %d bytes of %d for a client gone", len(b), len(full))
	}
}

func BenchmarkWorkerPage(b *testing.B) {
	l := sampleWorkers()
	for len(l.Workers) < 10000 {
		l.Workers = append(l.Workers, l.Workers[:min(600, 10000-len(l.Workers))]...)
	}
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(l); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("by-hand", func(b *testing.B) {
		var buf []byte
		for b.Loop() {
			buf, _ = appendWorkerList(context.Background(), buf[:0], l)
		}
	})
}
