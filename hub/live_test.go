package hub

import (
	"context"
	"strings"
	"testing"
	"time"
)

// SetLive changes caps, the status interval and the allowed uids of a
// running hub; an invalid value changes nothing; connected workers stay.
func TestSetLive(t *testing.T) {
	e := newEnv(t, nil)
	e.do(func() { e.pg.auto = true })
	w := e.dial()
	w.subscribe("a")
	ctx := context.Background()
	live := Live{MaxSubscriptions: 1, StatusInterval: 2 * time.Second}
	if err := e.h.SetLive(ctx, live); err != nil {
		t.Fatal(err)
	}
	w.sub("b")
	w.expect(`{"t":"nack","q":"b","error":"too many subscriptions"}`)
	e.do(func() {
		if n := len(e.clk.tickers); n != 2 || !e.clk.tickers[0].stopped || e.clk.tickers[1].d != 2*time.Second {
			t.Errorf("status timer not restarted at 2s: %d tickers", n)
		}
		if got := e.h.cfg.HardQueueLimit; got != defaultHardQueueLimit {
			t.Errorf("zero HardQueueLimit gave %d, want the default", got)
		}
	})

	if err := e.h.SetLive(ctx, Live{HardQueueBytes: 1000}); err == nil || !strings.Contains(err.Error(), "HardQueueBytes") {
		t.Fatalf("SetLive with a 1000-byte hard cap: %v", err)
	}
	w.sub("c")
	w.expect(`{"t":"nack","q":"c","error":"too many subscriptions"}`) // unchanged

	// Only uid 12345 now: new connections are refused, w stays.
	if err := e.h.SetLive(ctx, Live{AllowUIDs: []int{12345}}); err != nil {
		t.Fatal(err)
	}
	refused := dialRaw(t, e.path)
	refused.eof()
	w.subscribe("b")
	if s := e.h.Stats(); s.ConnectionsRefused != 1 || s.Workers != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Config is safe from any goroutine while SetLive replaces the settings on
// the loop (run under -race: a plain read of the loop's copy was a data
// race), and it returns the new values once SetLive returned.
func TestConfigWhileSetLive(t *testing.T) {
	e := newEnv(t, nil)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c := e.h.Config()
			if c.HardQueueLimit < 1 {
				t.Errorf("Config().HardQueueLimit = %d mid-SetLive", c.HardQueueLimit)
				return
			}
		}
	}()
	for i := 1; i <= 50; i++ {
		if err := e.h.SetLive(context.Background(), Live{HardQueueLimit: 100 + i, AllowUIDs: []int{1000 + i}}); err != nil {
			t.Fatal(err)
		}
		c := e.h.Config()
		if c.HardQueueLimit != 100+i || len(c.AllowUIDs) != 1 || c.AllowUIDs[0] != 1000+i {
			t.Fatalf("after SetLive %d: Config() %d %v", i, c.HardQueueLimit, c.AllowUIDs)
		}
	}
	close(stop)
	<-done
}
