package hub_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/hub"
)

// fakeUpstream confirms every Listen at once unless refuse names it.
type fakeUpstream struct {
	mu      sync.Mutex
	sink    hub.UpstreamSink
	listens []string
	refuse  map[string]bool
}

func (u *fakeUpstream) Open(sink hub.UpstreamSink) error {
	u.mu.Lock()
	u.sink = sink
	u.mu.Unlock()
	sink.Health(true)
	return nil
}

func (u *fakeUpstream) Listen(ch string, done func(error)) {
	u.mu.Lock()
	u.listens = append(u.listens, ch)
	refused := u.refuse[ch]
	u.mu.Unlock()
	go func() {
		if refused {
			done(errors.New("bridge: refused"))
			return
		}
		done(nil)
	}()
}

func (u *fakeUpstream) Unlisten(ch string, done func(error)) { go done(nil) }
func (u *fakeUpstream) Close(done func())                    { go done() }

// rawWorker speaks the protocol to the hub.
type rawWorker struct {
	t   *testing.T
	c   net.Conn
	dec frame.Decoder
	buf []byte
}

func (w *rawWorker) send(b []byte) {
	if _, err := w.c.Write(b); err != nil {
		w.t.Fatal(err)
	}
}

// next is the next frame that is not a status, or a status when want is
// "status".
func (w *rawWorker) next(want string) frame.Message {
	w.t.Helper()
	for {
		m, ok, err := w.dec.Next()
		if err != nil {
			w.t.Fatal(err)
		}
		if ok {
			if m.Type == frame.TypeStatus && want != frame.TypeStatus {
				continue
			}
			return m
		}
		w.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := w.c.Read(w.buf)
		if err != nil {
			w.t.Fatalf("waiting for %s: %v", want, err)
		}
		w.dec.Feed(w.buf[:n])
	}
}

// A hub fed by an Upstream opens no Postgres connection: it acks on the
// upstream's confirmation, nacks on its refusal, delivers its
// notifications, and turns its health going false and back into statuses
// and one durable wake per channel, as after a Postgres reconnect.
func TestUpstreamFeedsTheHub(t *testing.T) {
	up := &fakeUpstream{refuse: map[string]bool{"no": true}}
	sock := filepath.Join(t.TempDir(), "hub.sock")
	h, err := hub.New(hub.Config{SocketPath: sock, Upstream: up})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.Stop(ctx)
	})
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := &rawWorker{t: t, c: c, buf: make([]byte, 4096)}
	if m := w.next(frame.TypeStatus); m.Type != frame.TypeStatus || !m.Healthy {
		t.Fatalf("first frame %+v, want status healthy", m)
	}
	w.send(frame.AppendSub(nil, "orders"))
	if m := w.next(""); m.Type != frame.TypeAck || m.Name != "orders" {
		t.Fatalf("%+v, want ack orders", m)
	}
	w.send(frame.AppendSub(nil, "no"))
	if m := w.next(""); m.Type != frame.TypeNack || m.Name != "no" {
		t.Fatalf("%+v, want nack no", m)
	}
	up.sink.Notify("orders", "42")
	up.sink.Notify("elsewhere", "x") // nobody subscribed: dropped
	up.sink.Notify("orders", "")
	if m := w.next(""); m.Type != frame.TypeWake || m.Payload != "42" || !m.HasPayload {
		t.Fatalf("%+v, want the wake with 42", m)
	}
	if m := w.next(""); m.Type != frame.TypeWake || m.HasPayload {
		t.Fatalf("%+v, want a durable wake", m)
	}
	up.sink.Health(false)
	if m := w.next(frame.TypeStatus); m.Type != frame.TypeStatus || m.Healthy {
		t.Fatalf("%+v, want status false", m)
	}
	up.sink.Health(true)
	if m := w.next(frame.TypeStatus); m.Type != frame.TypeStatus || !m.Healthy {
		t.Fatalf("%+v, want status true", m)
	}
	if m := w.next(""); m.Type != frame.TypeWake || m.Name != "orders" || m.HasPayload {
		t.Fatalf("%+v, want the resync's durable wake", m)
	}
	if s := h.Stats(); !s.PostgresHealthy || s.PostgresReconnects != 1 {
		t.Fatalf("stats %+v, want healthy after one reconnect", s)
	}
}
