package relay

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/pgtest/pgtls"
	"github.com/listenhub/listenhub/internal/testutil"
)

var db *pgtest.Cluster

func TestMain(m *testing.M) {
	pgtesting.Main(m, pgtest.Options{Logical: true, TLS: pgtls.Certificate}, &db)
}

var testSeq atomic.Int64

// fixture is one test's schema, publication and slot, so that tests
// sharing the cluster never see each other's changes.
type fixture struct {
	t      *testing.T
	schema string
	pub    string
	slot   string
}

func newFixture(t *testing.T, tables ...string) *fixture {
	t.Helper()
	n := testSeq.Add(1)
	f := &fixture{t: t, schema: fmt.Sprintf("rt%d", n), pub: fmt.Sprintf("pub_rt%d", n), slot: fmt.Sprintf("slot_rt%d", n)}
	f.exec("CREATE SCHEMA " + f.schema)
	for _, tb := range tables {
		f.exec(fmt.Sprintf("CREATE TABLE %s.%s (id bigserial PRIMARY KEY, v text)", f.schema, tb))
	}
	f.exec(fmt.Sprintf("CREATE PUBLICATION %s FOR TABLES IN SCHEMA %s", f.pub, f.schema))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// The slot may still be held by a walsender that is going away.
		for i := 0; i < 50; i++ {
			if err := db.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", f.slot); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		db.Exec(ctx, "DROP PUBLICATION IF EXISTS "+f.pub)
		db.Exec(ctx, "DROP SCHEMA "+f.schema+" CASCADE")
	})
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.Exec(ctx, sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

func (f *fixture) options() Options {
	cc, err := pgconn.ParseConfig(db.URL())
	if err != nil {
		f.t.Fatal(err)
	}
	return Options{ConnConfig: cc, Publication: f.pub, Slot: f.slot, Window: defaultWindow,
		Logger: slog.New(slog.NewTextHandler(testWriter{f.t}, &slog.HandlerOptions{Level: slog.LevelDebug}))}
}

// start runs a relay until the test ends.
func (f *fixture) start(opts Options) *Relay {
	f.t.Helper()
	r, err := New(opts)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	f.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Errorf("Run: %v", err)
		}
	})
	return r
}

func waitActive(t *testing.T, r *Relay) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "relay active", func() bool { return r.Stats().State == StateActive })
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// listener LISTENs on its own connection and records every notification.
type listener struct {
	mu   sync.Mutex
	got  map[string]int
	at   map[string][]time.Time
	conn *pgx.Conn
}

func listen(t *testing.T, channels ...string) *listener {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, db.URL())
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	l := &listener{got: map[string]int{}, at: map[string][]time.Time{}, conn: conn}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			l.mu.Lock()
			l.got[n.Channel]++
			l.at[n.Channel] = append(l.at[n.Channel], time.Now())
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close(context.Background())
	})
	return l
}

func (l *listener) count(ch string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.got[ch]
}

// lastAt is when the last wake on ch arrived (the zero time if none).
func (l *listener) lastAt(ch string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.at[ch]; len(a) > 0 {
		return a[len(a)-1]
	}
	return time.Time{}
}

func (l *listener) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.got {
		n += c
	}
	return n
}

func TestRelayInsert(t *testing.T) {
	f := newFixture(t, "q_jobs", "q_other")
	l := listen(t, f.schema+".q_jobs.INSERT", f.schema+".q_other.INSERT")
	r := f.start(f.options())
	waitActive(t, r)
	// The slot is new: one resync wake per channel.
	testutil.WaitFor(t, 10*time.Second, "resync", func() bool { return l.count(f.schema+".q_jobs.INSERT") == 1 })
	start := time.Now()
	f.exec("INSERT INTO " + f.schema + ".q_jobs (v) VALUES ('a')")
	testutil.WaitFor(t, 10*time.Second, "wake", func() bool { return l.count(f.schema+".q_jobs.INSERT") == 2 })
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		f.exec("INSERT INTO " + f.schema + ".q_jobs (v) VALUES ('a')")
		t1 := time.Now()
		testutil.WaitFor(t, 10*time.Second, "wake", func() bool { return l.count(f.schema+".q_jobs.INSERT") == 3+i })
		l.mu.Lock()
		at := l.at[f.schema+".q_jobs.INSERT"][2+i]
		l.mu.Unlock()
		t.Logf("insert %v, commit to wake %v", t1.Sub(t0), at.Sub(t1))
	}
	t.Logf("first: %v", time.Since(start))
	if n := l.count(f.schema + ".q_other.INSERT"); n != 1 {
		t.Errorf("q_other got %d wakes, want the resync's 1", n)
	}
	testutil.WaitFor(t, 5*time.Second, "the counters", func() bool { return r.Stats().Transactions >= 6 })
	st := r.Stats()
	if st.Transactions != 6 || st.Changes != 6 {
		t.Errorf("stats %+v", st)
	}
}
