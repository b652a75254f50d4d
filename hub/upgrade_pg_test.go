package hub

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/testutil"
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
			w.subscribe("rb")

			old, fake := connPair(t)

			fakeErr := make(chan error, 1)
			go func() {
				fakeErr <- func() error {
					plan, err := helloPrepared(fake)
					if err != nil {
						return err
					}
					if plan.T != "plan" || (plan.Marker != "") != tc.tls {
						t.Errorf("plan: %+v", plan)
					}
					m, fds, err := recvMsg(fake)
					if err != nil {
						return err
					}
					if m.T == "prepare" {
						// The marker, as the new process would send it.
						ctx, cancel := context.WithTimeout(context.Background(), timeout)
						defer cancel()
						if err := env.db.Exec(ctx, `NOTIFY "`+plan.Marker+`"`); err != nil {
							return err
						}
						if m, fds, err = recvMsg(fake); err != nil {
							return err
						}
					}
					closeAll(fds)
					if m.T == "state" {
						if err := recvRaw(fake, m.State.Workers); err != nil {
							return err
						}
					}
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
			if err := env.h.handover(ctx, old, nil); err == nil {
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

// TestHandoverInProcess: a whole upgrade between two hubs of one process
// (the descriptors still travel over SCM_RIGHTS). The worker's sub is
// mid-flight when the upgrade starts (its LISTEN is held up by a stopped
// backend), another sub and a NOTIFY arrive while the hub is frozen: the
// worker gets both acks and every wake once, from whichever hub, without
// an EOF, and the new hub serves on with the counters carried over.
func TestHandoverInProcess(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		name := map[bool]string{false: "plaintext", true: "tls"}[tlsOn]
		t.Run(name, func(t *testing.T) {
			c := needDB(t)
			url := c.URL()
			if tlsOn {
				if url = c.TLSURL(); url == "" {
					t.Skip("no TLS")
				}
			}
			env := newPGEnv(t, func(cfg *Config) { cfg.DatabaseURL = url })
			w := env.dial()
			w.subscribe("a")

			pids, err := c.BackendPIDs(context.Background(), env.app)
			if err != nil || len(pids) != 1 {
				t.Fatalf("backends %v, %v", pids, err)
			}
			fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = c.FreezeIdle(fctx, pids[0])
			fcancel()
			if err != nil {
				t.Fatal(err)
			}
			thawed := false
			thaw := func() {
				if !thawed {
					thawed = true
					if err := c.Thaw(pids[0]); err != nil {
						t.Error(err)
					}
				}
			}
			defer thaw()
			w.sub("b") // its LISTEN waits for the stopped backend
			testutil.WaitFor(t, timeout, "the LISTEN of b in flight", func() bool {
				l, err := env.h.Channels(context.Background(), ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				for _, ch := range l.Channels {
					if ch.Name == "b" && ch.State == "listen-in-flight" && ch.Waiting == 1 {
						return true
					}
				}
				return false
			})

			// Half a frame (an unsub: no answer) that the old hub
			// has read is handed over, and counted by the new one
			// toward maxPartialBytes.
			half := env.dial()
			unsub := frame.AppendUnsub(nil, "zz")
			partial := len(unsub) - 3
			half.send(unsub[:partial])
			partialBytes := func(h *Hub) int {
				got := make(chan int, 1)
				if err := h.loop.Post(func() { got <- h.partial.bytes }); err != nil {
					t.Fatal(err)
				}
				return <-got
			}
			testutil.WaitFor(t, timeout, "the old hub holds the partial frame", func() bool {
				return partialBytes(env.h) == partial
			})
			partialSince := func(h *Hub) []int64 {
				got := make(chan []int64, 1)
				if err := h.loop.Post(func() {
					var out []int64
					for _, w := range h.partial.workers {
						out = append(out, w.partialSince)
					}
					got <- out
				}); err != nil {
					t.Fatal(err)
				}
				return <-got
			}
			since := partialSince(env.h)

			nh, handed, took := upgradeInProcess(t, env.h)

			// The old hub freezes; the sub in flight holds the quiet
			// point back. Meanwhile a sub and a NOTIFY arrive. (Under
			// TLS the marker is LISTENed before the freeze, behind the
			// sub in flight: the backend goes on first.)
			if tlsOn {
				testutil.WaitFor(t, timeout, "the upgrade planned", func() bool {
					return strings.Contains(env.logs.String(), "upgrade: the new process said hello")
				})
				thaw()
			}
			testutil.WaitFor(t, timeout, "the old hub frozen", func() bool {
				return strings.Contains(env.logs.String(), "new process is up; freezing")
			})
			w.sub("c")
			env.exec(`NOTIFY a, 'during'`)
			thaw()

			if err := <-handed; err != nil {
				t.Fatalf("Handover: %v", err)
			}
			if err := <-took; err != nil {
				t.Fatalf("Takeover: %v", err)
			}
			select {
			case <-env.h.Done():
			case <-time.After(timeout):
				t.Fatal("the old hub did not stop")
			}
			got := map[string]int{}
			for i := 0; i < 3; i++ {
				got[w.next()]++
			}
			for _, want := range []string{ack("b"), ack("c"), wake("a", ptr("during"))} {
				if got[want] != 1 {
					t.Fatalf("after the upgrade: %v; want %s once", got, want)
				}
			}
			// Its --frame-timeout goes on from when it started in
			// the old hub; an upgrade does not restart it.
			if got := partialSince(nh); len(since) != 1 || !slices.Equal(got, since) {
				t.Errorf("partial frame started at %v in the new hub, %v in the old", got, since)
			}
			if n := partialBytes(nh); n != partial {
				t.Errorf("new hub counts %d bytes of partial frames, want the handed-over %d", n, partial)
			}
			half.send(unsub[partial:])
			testutil.WaitFor(t, timeout, "the partial frame completed", func() bool { return partialBytes(nh) == 0 })
			half.c.Close()
			testutil.WaitFor(t, timeout, "the half-frame worker gone", func() bool { return nh.Stats().Workers == 1 })
			env.exec(`NOTIFY a, 'after'; NOTIFY b, 'after'; NOTIFY c, 'after'`)
			w.expect(wake("a", ptr("after")), wake("b", ptr("after")), wake("c", ptr("after")))
			w.none()
			st := nh.Stats()
			if st.Upgrades != 1 || st.Workers != 1 || st.Channels != 3 || st.Accepts < 1 {
				t.Errorf("new hub stats %+v", st)
			}
			testutil.WaitFor(t, timeout, "one backend", func() bool { return env.backends() == 1 })
		})
	}
}
