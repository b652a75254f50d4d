package client

// A failover is done only once the local listener has shown that
// notifications arrive on its connection (the delivery check of
// listener.Conn): through a transaction-pooling PgBouncer it fails loudly
// with the cause, through a session pooler it works.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/listener"
)

func TestPGFailoverThroughPooler(t *testing.T) {
	for _, mode := range []string{"transaction", "session"} {
		t.Run(mode, func(t *testing.T) {
			e := newPGEnv(t)
			b := pgtesting.PgBouncer(t, e.db, mode)
			h := e.startHub(nil)
			rec := &recorder{}
			failedOver := make(chan error, 1)
			f := e.failover(rec, func(o *foSetup) {
				o.Local.DatabaseURL = b.URL()
				o.DisableFailback = true
				o.OnFailover = func(reason error) { failedOver <- reason }
			})
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			defer cancel()
			if err := f.Subscribe(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			if err := h.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if mode == "transaction" {
				select {
				case <-f.Done():
				case <-time.After(waitLong):
					t.Fatal("the failover neither finished nor failed")
				}
				var fe *FailoverError
				want := "listener: notifications do not arrive on this connection: a transaction-pooling PgBouncer? use a direct URL"
				if err := f.Err(); !errors.As(err, &fe) || !errors.Is(err, listener.ErrNotDelivered) || !strings.Contains(err.Error(), want) {
					t.Fatalf("Err() = %v, want a FailoverError saying %q", err, want)
				}
				select {
				case r := <-failedOver:
					t.Fatalf("OnFailover(%v) through a transaction pooler", r)
				default:
				}
				return
			}
			select {
			case <-failedOver:
			case <-time.After(waitLong):
				t.Fatalf("no failover (Err %v)", f.Err())
			}
			if f.Mode() != ModeLocal {
				t.Fatalf("mode %v", f.Mode())
			}
			e.notify("a", "local")
			testutil.WaitFor(t, waitLong, "the wake through the local listener", func() bool { return rec.hasPayload("a", "local") })
		})
	}
}
