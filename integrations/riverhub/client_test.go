package riverhub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/listenhub/listenhub/integrations/riverhub"
)

// pickupArgs is a job whose worker reports its ID.
type pickupArgs struct {
	N int `json:"n"`
}

func (pickupArgs) Kind() string { return "lhriver_pickup" }

type pickupWorker struct {
	river.WorkerDefaults[pickupArgs]
	got chan int64
}

func (w *pickupWorker) Work(_ context.Context, job *river.Job[pickupArgs]) error {
	w.got <- job.ID
	return nil
}

// blockArgs is a job that runs until it is cancelled.
type blockArgs struct{}

func (blockArgs) Kind() string { return "lhriver_block" }

type blockWorker struct {
	river.WorkerDefaults[blockArgs]
	started, cancelled chan int64
}

func (w *blockWorker) Work(ctx context.Context, job *river.Job[blockArgs]) error {
	w.started <- job.ID
	<-ctx.Done()
	w.cancelled <- job.ID
	return ctx.Err()
}

type fixture struct {
	t       *testing.T
	h       *hub
	schema  string
	pickup  *pickupWorker
	block   *blockWorker
	workers *river.Workers
	app     string
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{
		t:       t,
		h:       startHub(t),
		schema:  newSchema(t, true),
		pickup:  &pickupWorker{got: make(chan int64, 100)},
		block:   &blockWorker{started: make(chan int64, 10), cancelled: make(chan int64, 10)},
		workers: river.NewWorkers(),
		app:     randName("lhriver-local-"),
	}
	river.AddWorker(f.workers, f.pickup)
	river.AddWorker(f.workers, f.block)
	return f
}

// worker is a River client working jobs through the hub.
func (f *fixture) worker() *river.Client[pgx.Tx] {
	f.t.Helper()
	d := riverhub.New(newPool(f.t, f.schema, ""), driverOptions(f.t, f.h, f.app))
	rc, err := river.NewClient(d, &river.Config{
		Schema:            f.schema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:           f.workers,
		FetchPollInterval: fetchPollInterval,
		Logger:            testLogger(f.t, 8), // errors only
	})
	mustf(f.t, err, "NewClient")
	mustf(f.t, rc.Start(context.Background()), "Start")
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rc.StopAndCancel(ctx)
	})
	return rc
}

// inserter is an insert-only River client of plain riverpgxv5 on a pool of
// its own: jobs come from another session, as from another process.
func (f *fixture) inserter() *river.Client[pgx.Tx] {
	f.t.Helper()
	rc, err := river.NewClient(riverpgxv5.New(newPool(f.t, f.schema, "")), &river.Config{Schema: f.schema, Logger: quietLogger()})
	mustf(f.t, err, "NewClient (insert only)")
	return rc
}

// TestRiverJobPickedUpThroughTheHub: a job inserted by another session is
// worked well before the fetch poll (20 s): only the insert notification,
// through the hub, explains it. The worker holds no Postgres LISTEN
// connection of its own.
func TestRiverJobPickedUpThroughTheHub(t *testing.T) {
	f := newFixture(t)
	f.worker()
	ins := f.inserter()
	db := connect(t)
	for i := range 5 {
		inserted := time.Now()
		res, err := ins.Insert(context.Background(), pickupArgs{N: i}, nil)
		mustf(t, err, "Insert")
		select {
		case id := <-f.pickup.got:
			if id != res.Job.ID {
				t.Fatalf("worked job %d, inserted %d", id, res.Job.ID)
			}
			t.Logf("job %d picked up %v after its insert", id, time.Since(inserted).Round(time.Millisecond))
		case <-time.After(fetchPollInterval / 4):
			t.Fatalf("job %d not worked within %v of its insert (the fetch poll is %v)", res.Job.ID, fetchPollInterval/4, fetchPollInterval)
		}
		time.Sleep(150 * time.Millisecond) // past River's per-queue insert notify limit (FetchCooldown)
	}
	if n := backends(t, db, f.app); n != 0 {
		t.Errorf("%d local LISTEN backends with the hub up, want 0", n)
	}
}

// TestRiverJobCancelThroughControlTopic: JobCancel from another client
// reaches the running job through the control topic, well before River's
// fallback poll for cancellations (a minute).
func TestRiverJobCancelThroughControlTopic(t *testing.T) {
	f := newFixture(t)
	f.worker()
	ins := f.inserter()
	ctx := context.Background()
	res, err := ins.Insert(ctx, blockArgs{}, nil)
	mustf(t, err, "Insert")
	select {
	case <-f.block.started:
	case <-time.After(timeout):
		t.Fatal("the blocking job never started")
	}
	asked := time.Now()
	_, err = ins.JobCancel(ctx, res.Job.ID)
	mustf(t, err, "JobCancel")
	select {
	case <-f.block.cancelled:
		t.Logf("the running job saw its cancel %v after JobCancel", time.Since(asked).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("the running job did not see its cancel within 10s (River's poll for cancellations is a minute)")
	}
	waitFor(t, timeout, "the job cancelled", func() bool {
		j, err := ins.JobGet(ctx, res.Job.ID)
		return err == nil && j.State == rivertype.JobStateCancelled
	})
}

// TestRiverLeaderElectionThroughTheHub: when the leader stops, it resigns
// with a notification on the leadership topic, and the other client takes
// over at once rather than at its next election attempt (every 5 s or
// more).
func TestRiverLeaderElectionThroughTheHub(t *testing.T) {
	f := newFixture(t)
	a, b := f.worker(), f.worker()
	db := connect(t)
	leader := func() string {
		var id string
		db.QueryRow(context.Background(), "SELECT leader_id FROM "+f.schema+".river_leader").Scan(&id)
		return id
	}
	waitFor(t, timeout, "a leader", func() bool { return leader() != "" })
	first := leader()
	stopping, other := a, b
	if first == b.ID() {
		stopping, other = b, a
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stopped := time.Now()
	mustf(t, stopping.Stop(ctx), "Stop")
	waitFor(t, 4*time.Second, "the other client elected within 4s (its own attempts come every 5s or more)", func() bool {
		return leader() == other.ID()
	})
	t.Logf("the other client led %v after the leader stopped", time.Since(stopped).Round(time.Millisecond))
}

// TestListenerGapBecomesInsertNotifications: NOTIFYs lost while the hub
// dies are covered by a durable wake, which the listener turns into one
// insert notification per queue with available jobs: River's producers
// fetch at once instead of at their next poll.
func TestListenerGapBecomesInsertNotifications(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	d := riverhub.New(newPool(t, f.schema, ""), driverOptions(t, f.h, f.app))
	l := d.GetListener(&riverdriver.GetListenenerParams{Schema: f.schema})
	connectListener(ctx, t, l)
	mustf(t, l.Listen(ctx, "river_insert"), "Listen")
	// Jobs committed without a notification (as in the gap) in two
	// queues, and one not available.
	db := connect(t)
	for _, q := range []string{"q1", "q2"} {
		_, err := db.Exec(ctx, "INSERT INTO "+f.schema+".river_job (args, kind, max_attempts, queue, state) VALUES ('{}', 'lhriver_pickup', 1, $1, 'available')", q)
		mustf(t, err, "insert a job")
	}
	_, err := db.Exec(ctx, "INSERT INTO "+f.schema+".river_job (args, kind, max_attempts, queue, state, scheduled_at) VALUES ('{}', 'lhriver_pickup', 1, 'q3', 'scheduled', now() + interval '1 hour')")
	mustf(t, err, "insert a scheduled job")
	requireNoNotification(ctx, t, l)

	f.h.kill() // the failover delivers a durable wake per name
	got := map[string]bool{}
	for range 2 {
		n := waitForNotification(ctx, t, l)
		if n.Topic != "river_insert" {
			t.Fatalf("got %+v, want an insert notification", *n)
		}
		got[n.Payload] = true
	}
	if !got[`{"queue":"q1"}`] || !got[`{"queue":"q2"}`] {
		t.Fatalf("got %v, want one insert notification for q1 and one for q2", got)
	}
	requireNoNotification(ctx, t, l)
}

// TestListenerDeadIsAnErrorRiverReconnectsOn: with the hub gone and no
// local fallback possible, the listener is dead: WaitForNotification and
// Ping return an error that is not a context's, on which River's notifier
// closes and connects again; with the hub back, that works.
func TestListenerDeadIsAnErrorRiverReconnectsOn(t *testing.T) {
	h := startHub(t)
	schema := newSchema(t, false)
	ctx := context.Background()
	opts := driverOptions(t, h, randName("lhriver-local-"))
	opts.Failover.Local.DatabaseURL = "postgres://nobody@127.0.0.1:1/none?connect_timeout=1" // no fallback
	d := riverhub.New(newPool(t, schema, ""), opts)
	l := d.GetListener(&riverdriver.GetListenenerParams{Schema: schema})
	mustf(t, l.Connect(ctx), "Connect")
	mustf(t, l.Listen(ctx, "topic"), "Listen")
	h.kill()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := l.WaitForNotification(wctx)
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("WaitForNotification after the hub and the fallback failed: %v, want the listener's error", err)
	}
	if perr := l.Ping(ctx); perr == nil {
		t.Fatal("Ping on a dead listener returned nil")
	}
	t.Logf("the error River's notifier sees: %v", err)

	// What River's notifier does next.
	mustf(t, l.Close(ctx), "Close")
	h.restart()
	mustf(t, l.Connect(ctx), "Connect again")
	mustf(t, l.Listen(ctx, "topic"), "Listen again")
	mustf(t, d.GetExecutor().NotifyMany(ctx, &riverdriver.NotifyManyParams{Payload: []string{"back"}, Schema: schema, Topic: "topic"}), "NotifyMany")
	requireNotification(t, waitForNotification(ctx, t, l), "topic", "back")
	mustf(t, l.Close(ctx), "Close")
}
