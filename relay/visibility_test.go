package relay

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

// TestRelayWaitsForVisibility drives the batcher's flush with the xid of
// a transaction that is still open, standing for one whose commit was
// decoded but which has not yet left the ProcArray: no NOTIFY may go out
// until it is visible to a new snapshot, and then it must.
func TestRelayWaitsForVisibility(t *testing.T) {
	f := newFixture(t)
	ch := f.schema + ".vis.INSERT"
	l := listen(t, ch)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	open := pgtesting.Connect(t, db.URL())
	tx, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var xid8 string
	if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&xid8); err != nil {
		t.Fatal(err)
	}
	full, _ := strconv.ParseUint(xid8, 10, 64)

	r, err := New(f.options())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := r.connect(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close(context.Background())
	s := &session{r: r, nc: nc}
	if err := s.refreshXidRef(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Prepare(ctx, notifyStmt, notifySQL, nil); err != nil {
		t.Fatal(err)
	}
	var b batch
	b.add(event{kind: evCommit, xid: uint32(full), end: 1, commit: time.Now(), chans: []string{ch}, changes: 1})
	done := make(chan error, 1)
	go func() { done <- s.flush(ctx, &b) }()
	testutil.WaitFor(t, 10*time.Second, "the flush waiting", func() bool { return r.Stats().VisibilityWaits >= 20 })
	if n := l.count(ch); n != 0 {
		t.Fatalf("NOTIFYed while the transaction was not visible (%d wakes)", n)
	}
	select {
	case err := <-done:
		t.Fatalf("flush returned (%v) while the transaction was open", err)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the wake once visible", func() bool { return l.count(ch) == 1 })
	t.Logf("%d visibility checks while the transaction was open", r.Stats().VisibilityWaits)
}

// TestRelayLagWarning: the lag is exported, and a warning is logged above
// the limit.
func TestRelayLagWarning(t *testing.T) {
	f := newFixture(t, "q_a")
	out := &testutil.SyncBuffer{}
	opts := f.options()
	opts.Logger = slogTo(out)
	opts.MaxLagBytes = 1
	r := f.start(opts)
	waitActive(t, r)
	for i := 0; i < 5; i++ {
		f.exec("INSERT INTO " + f.schema + ".q_a (v) VALUES ('x')")
	}
	// Traffic on a table outside the publication keeps the server's WAL
	// position ahead of the slot's confirmed one: back to back, in
	// statements large enough that the walsender is decoding one most of
	// the time. (One row every 5 ms left the slot caught up at most of
	// the relay's lag readings, 2 s apart, and all of them now and then.)
	f.exec("CREATE TABLE " + f.schema + "_lag (id int)")
	t.Cleanup(func() { db.Exec(context.Background(), "DROP TABLE "+f.schema+"_lag") })
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				db.Exec(context.Background(), "INSERT INTO "+f.schema+"_lag SELECT generate_series(1, 2000)")
			}
		}
	}()
	testutil.WaitFor(t, 15*time.Second, "the lag warning", func() bool { return contains(out.String(), "relay lagging") })
	if r.Stats().LagBytes <= 0 && !contains(out.String(), "lag_bytes=") {
		t.Errorf("no lag in bytes exported")
	}
}

func fullXidCases(t *testing.T) {
	for _, c := range []struct {
		ref  uint64
		x    uint32
		want uint64
	}{
		{1000, 990, 990},
		{1000, 1010, 1010},                  // not yet visible: ahead of xmax
		{1<<32 + 5, 0xfffffff0, 0xfffffff0}, // the previous epoch
		{1<<32 - 5, 3, 1<<32 + 3},           // the next epoch
		{5<<32 + 1<<31, 1<<31 - 10, 5<<32 + 1<<31 - 10},
	} {
		if got := fullXid(c.ref, c.x); got != c.want {
			t.Errorf("fullXid(%d, %d) = %d, want %d", c.ref, c.x, got, c.want)
		}
	}
}

func TestFullXid(t *testing.T) { fullXidCases(t) }

var _ = pgconn.Config{}
