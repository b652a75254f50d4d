package hub

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/fdpass"
)

// TestHandoverRollback: a new process that takes the state and then dies
// (or says nothing until the deadline) leaves the old hub serving as
// before: the worker keeps its connection, the NOTIFY that arrived and the
// sub sent while the hub was frozen are served after the rollback, once
// each, and Postgres is read on (plaintext: the descriptor goes back into
// the loop; TLS: reading resumes after the marker).
func TestHandoverRollback(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
		die  bool // the new process dies; else it stays silent
	}{
		{"plaintext-dies", false, true},
		{"plaintext-deadline", false, false},
		{"tls-dies", true, true},
		{"tls-deadline", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.tls && needDB(t).TLSURL() == "" {
				t.Skip("no TLS")
			}
			env := newPGEnv(t, func(c *Config) {
				if tc.tls {
					c.DatabaseURL = needDB(t).TLSURL()
				}
			})
			w := env.dial()
			w.sub("rb")
			w.expect(ack("rb"))

			fa, fb, err := fdpass.Pair()
			if err != nil {
				t.Fatal(err)
			}
			old, err := fdpass.New(fa)
			fa.Close()
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			fake, err := fdpass.New(fb)
			fb.Close()
			if err != nil {
				t.Fatal(err)
			}
			defer fake.Close()

			fakeErr := make(chan error, 1)
			go func() {
				fakeErr <- func() error {
					if err := sendMsg(fake, upMsg{T: "hello", PID: 1}, nil); err != nil {
						return err
					}
					m, fds, err := recvMsg(fake)
					if err != nil {
						return err
					}
					if m.T == "prepare" {
						// The marker, as the new process would send it.
						ctx, cancel := context.WithTimeout(context.Background(), timeout)
						defer cancel()
						if err := env.db.Exec(ctx, `NOTIFY "`+m.Prepare.Marker+`"`); err != nil {
							return err
						}
						if m, fds, err = recvMsg(fake); err != nil {
							return err
						}
					}
					closeAll(fds)
					if m.T != "state" || len(m.State.Workers) != 1 || len(m.State.Channels) != 1 {
						t.Errorf("state: %+v", m)
					}
					if (m.State.Postgres != nil) == tc.tls {
						t.Errorf("postgres handed as a descriptor: %v, with TLS %v", m.State.Postgres != nil, tc.tls)
					}
					// While the hub is frozen: a NOTIFY and a sub.
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					defer cancel()
					if err := env.db.Exec(ctx, `NOTIFY rb, '1'`); err != nil {
						return err
					}
					if _, err := w.c.Write(frame.AppendSub(nil, "rb2")); err != nil {
						return err
					}
					if tc.die {
						return fake.Close()
					}
					return nil
				}()
			}()

			wait := 10 * time.Second
			if !tc.die {
				wait = time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			start := time.Now()
			if err := env.h.Handover(ctx, old, nil); err == nil {
				t.Fatal("Handover succeeded without a ready")
			}
			if err := <-fakeErr; err != nil {
				t.Fatal(err)
			}
			if tc.die && time.Since(start) > 5*time.Second {
				t.Errorf("rollback after the new process died took %v", time.Since(start))
			}
			got := map[string]bool{w.next(): true, w.next(): true}
			if !got[wake("rb", ptr("1"))] || !got[ack("rb2")] {
				t.Fatalf("after the rollback: %v, want the wake and the ack", got)
			}
			env.exec(`NOTIFY rb, '2'`)
			w.expect(wake("rb", ptr("2")))
			if n := env.backends(); n != 1 {
				t.Errorf("%d backends after the rollback, want 1", n)
			}
			if !strings.Contains(env.logs.String(), "upgrade failed; serving on") {
				t.Error("the rollback is not logged")
			}
			// And it still stops normally.
		})
	}
}
