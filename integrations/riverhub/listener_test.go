package riverhub_test

// River's driver conformance cases for listeners (exerciseListener in
// riverdriver/riverdrivertest/listener.go of github.com/riverqueue/river,
// MIT licensed), ported case by case: that package is a module of River's
// repository that is not published, so it cannot be loaded from here. The
// cases that River runs only against SQLite are left out, as River leaves
// them out for Postgres. Each case runs against the wrapper with a real hub
// and a real Postgres; the NOTIFYs are sent by riverpgxv5's own executor,
// as River sends them.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/riverqueue/river/riverdriver"

	"github.com/listenhub/listenhub/integrations/riverhub"
)

type listenerBundle struct {
	driver *riverhub.Driver
	exec   riverdriver.Executor
}

// setupListener is a Driver on a pool whose search_path is a schema of the
// test's own, and a listener for that schema (River's driverWithPool).
func setupListener(t *testing.T) (riverdriver.Listener, *listenerBundle) {
	t.Helper()
	h := startHub(t)
	schema := newSchema(t, false)
	d := riverhub.New(newPool(t, schema, ""), driverOptions(t, h, randName("lhriver-local-")))
	return d.GetListener(&riverdriver.GetListenenerParams{Schema: schema}), &listenerBundle{driver: d, exec: d.GetExecutor()}
}

func connectListener(ctx context.Context, t *testing.T, l riverdriver.Listener) {
	t.Helper()
	mustf(t, l.Connect(ctx), "Connect")
	t.Cleanup(func() { mustf(t, l.Close(ctx), "Close") })
}

// requireNoNotification: nothing within 50 ms (as River's case has it).
func requireNoNotification(ctx context.Context, t *testing.T, l riverdriver.Listener) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	n, err := l.WaitForNotification(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expected no notification, got %+v (err %v)", n, err)
	}
}

func waitForNotification(ctx context.Context, t *testing.T, l riverdriver.Listener) *riverdriver.Notification {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	n, err := l.WaitForNotification(ctx)
	mustf(t, err, "WaitForNotification")
	return n
}

func requireNotification(t *testing.T, got *riverdriver.Notification, topic, payload string) {
	t.Helper()
	if got.Topic != topic || got.Payload != payload {
		t.Fatalf("got %+v, want topic %q payload %q", *got, topic, payload)
	}
}

func notify(ctx context.Context, t *testing.T, b *listenerBundle, l riverdriver.Listener, topic string, payloads ...string) {
	t.Helper()
	mustf(t, b.exec.NotifyMany(ctx, &riverdriver.NotifyManyParams{Payload: payloads, Schema: l.Schema(), Topic: topic}), "NotifyMany")
}

func TestListenerCloseNoOpIfNotConnected(t *testing.T) {
	l, _ := setupListener(t)
	mustf(t, l.Close(context.Background()), "Close")
}

func TestListenerDoesNotReplayBeforeSubscription(t *testing.T) {
	ctx := context.Background()
	l, b := setupListener(t)
	connectListener(ctx, t, l)
	notify(ctx, t, b, l, "topic", "old")
	mustf(t, l.Listen(ctx, "topic"), "Listen")
	notify(ctx, t, b, l, "topic", "new")
	requireNotification(t, waitForNotification(ctx, t, l), "topic", "new")
	requireNoNotification(ctx, t, l)
}

// The hub may hear a channel for another process all along: a NOTIFY
// committed before this Listen reaches the hub all the same, and must not
// reach this listener.
func TestListenerDoesNotReplayWhatTheHubHeardForAnother(t *testing.T) {
	ctx := context.Background()
	l, b := setupListener(t)
	other := b.driver.GetListener(&riverdriver.GetListenenerParams{Schema: l.Schema()})
	connectListener(ctx, t, other)
	mustf(t, other.Listen(ctx, "topic"), "Listen (the other)")
	connectListener(ctx, t, l)
	for i := range 20 {
		notify(ctx, t, b, l, "topic", fmt.Sprintf("old%d", i))
		mustf(t, l.Listen(ctx, "topic"), "Listen")
		notify(ctx, t, b, l, "topic", fmt.Sprintf("new%d", i))
		requireNotification(t, waitForNotification(ctx, t, l), "topic", fmt.Sprintf("new%d", i))
		mustf(t, l.Unlisten(ctx, "topic"), "Unlisten")
	}
	requireNoNotification(ctx, t, l)
}

func TestListenerNewTopicPreservesOtherTopics(t *testing.T) {
	ctx := context.Background()
	l, b := setupListener(t)
	connectListener(ctx, t, l)
	mustf(t, l.Listen(ctx, "topic1"), "Listen")
	notify(ctx, t, b, l, "topic1", "pending")
	notify(ctx, t, b, l, "topic2", "old")
	mustf(t, l.Listen(ctx, "topic2"), "Listen")
	notify(ctx, t, b, l, "topic2", "new")
	requireNotification(t, waitForNotification(ctx, t, l), "topic1", "pending")
	requireNotification(t, waitForNotification(ctx, t, l), "topic2", "new")
	requireNoNotification(ctx, t, l)
}

func TestListenerRepeatedListenPreservesPendingNotifications(t *testing.T) {
	ctx := context.Background()
	l, b := setupListener(t)
	connectListener(ctx, t, l)
	mustf(t, l.Listen(ctx, "topic"), "Listen")
	notify(ctx, t, b, l, "topic", "pending")
	mustf(t, l.Listen(ctx, "topic"), "Listen")
	requireNotification(t, waitForNotification(ctx, t, l), "topic", "pending")
	requireNoNotification(ctx, t, l)
}

func TestListenerResubscribeSkipsGap(t *testing.T) {
	ctx := context.Background()
	l, b := setupListener(t)
	connectListener(ctx, t, l)
	mustf(t, l.Listen(ctx, "topic"), "Listen")
	mustf(t, l.Unlisten(ctx, "topic"), "Unlisten")
	notify(ctx, t, b, l, "topic", "gap")
	mustf(t, l.Listen(ctx, "topic"), "Listen")
	notify(ctx, t, b, l, "topic", "new")
	requireNotification(t, waitForNotification(ctx, t, l), "topic", "new")
	requireNoNotification(ctx, t, l)
}

func TestListenerRoundTrip(t *testing.T) {
	ctx := context.Background()
	l, b := setupListener(t)
	connectListener(ctx, t, l)
	mustf(t, l.Listen(ctx, "topic1"), "Listen")
	mustf(t, l.Listen(ctx, "topic2"), "Listen")
	mustf(t, l.Ping(ctx), "Ping") // still alive

	notify(ctx, t, b, l, "topic1", "payload1_1")
	notify(ctx, t, b, l, "topic2", "payload2_1")
	requireNotification(t, waitForNotification(ctx, t, l), "topic1", "payload1_1")
	requireNotification(t, waitForNotification(ctx, t, l), "topic2", "payload2_1")

	mustf(t, l.Unlisten(ctx, "topic2"), "Unlisten")
	notify(ctx, t, b, l, "topic1", "payload1_2")
	notify(ctx, t, b, l, "topic2", "payload2_2")
	requireNotification(t, waitForNotification(ctx, t, l), "topic1", "payload1_2")
	requireNoNotification(ctx, t, l)

	mustf(t, l.Unlisten(ctx, "topic1"), "Unlisten")
	mustf(t, l.Close(ctx), "Close")
}

func TestListenerSchemaFromParameter(t *testing.T) {
	_, b := setupListener(t)
	l := b.driver.GetListener(&riverdriver.GetListenenerParams{Schema: "my_custom_schema"})
	if got := l.Schema(); got != "my_custom_schema" {
		t.Fatalf("Schema() = %q", got)
	}
}

func TestListenerSchemaFromSearchPath(t *testing.T) {
	ctx := context.Background()
	_, b := setupListener(t)
	l := b.driver.GetListener(&riverdriver.GetListenenerParams{Schema: ""})
	l.SetAfterConnectExec("SET search_path TO 'public'")
	connectListener(ctx, t, l)
	if got := l.Schema(); got != "public" {
		t.Fatalf("Schema() = %q, want public", got)
	}
}

func TestListenerEmptySchemaFromSearchPath(t *testing.T) {
	ctx := context.Background()
	h := startHub(t)
	// River's harness gives this case a pool whose search_path names no
	// schema that exists.
	d := riverhub.New(newPool(t, "lhriver_no_such_schema", ""), driverOptions(t, h, randName("lhriver-local-")))
	l := d.GetListener(&riverdriver.GetListenenerParams{Schema: ""})
	connectListener(ctx, t, l)
	if got := l.Schema(); got != "" {
		t.Fatalf("Schema() = %q, want empty", got)
	}
}

func TestListenerTransactionGated(t *testing.T) {
	ctx := context.Background()
	l, b := setupListener(t)
	connectListener(ctx, t, l)
	mustf(t, l.Listen(ctx, "topic1"), "Listen")
	tx, err := b.exec.Begin(ctx)
	mustf(t, err, "Begin")
	mustf(t, tx.NotifyMany(ctx, &riverdriver.NotifyManyParams{Topic: "topic1", Payload: []string{"payload1"}, Schema: l.Schema()}), "NotifyMany")
	// No notification: the transaction has not committed yet.
	requireNoNotification(ctx, t, l)
	mustf(t, tx.Commit(ctx), "Commit")
	requireNotification(t, waitForNotification(ctx, t, l), "topic1", "payload1")
}

func TestListenerMultipleReuse(t *testing.T) {
	ctx := context.Background()
	l, _ := setupListener(t)
	connectListener(ctx, t, l)
	mustf(t, l.Listen(ctx, "topic1"), "Listen")
	mustf(t, l.Unlisten(ctx, "topic1"), "Unlisten")
	mustf(t, l.Close(ctx), "Close")
	mustf(t, l.Connect(ctx), "Connect")
	mustf(t, l.Listen(ctx, "topic1"), "Listen")
	mustf(t, l.Unlisten(ctx, "topic1"), "Unlisten")
}

func TestListenerWaitForNotificationMultipleBatches(t *testing.T) {
	ctx := context.Background()
	l, b := setupListener(t)
	connectListener(ctx, t, l)
	mustf(t, l.Listen(ctx, "topic"), "Listen")
	payloads := make([]string, 600)
	for i := range payloads {
		payloads[i] = fmt.Sprintf("payload_%d", i)
	}
	notify(ctx, t, b, l, "ignored", payloads...)
	notify(ctx, t, b, l, "topic", payloads...)
	for _, p := range payloads {
		requireNotification(t, waitForNotification(ctx, t, l), "topic", p)
	}
	requireNoNotification(ctx, t, l)
}

// Not one of River's cases: one transaction of 20,000 notifications (what
// InsertMany over 5,000 queues sends) reaches a listener that keeps
// waiting for them, every one in order, as riverpgxv5's own LISTEN
// connection delivers them. The hub's frame limit (1,024) is far below.
func TestListenerBurstInOneTransactionArrivesInFull(t *testing.T) {
	ctx := context.Background()
	l, b := setupListener(t)
	connectListener(ctx, t, l)
	mustf(t, l.Listen(ctx, "topic"), "Listen")
	payloads := make([]string, 20000)
	for i := range payloads {
		payloads[i] = fmt.Sprintf(`{"queue":"queue_%d"}`, i)
	}
	notify(ctx, t, b, l, "topic", payloads...)
	for i, p := range payloads {
		got := waitForNotification(ctx, t, l)
		if got.Topic != "topic" || got.Payload != p {
			t.Fatalf("notification %d of %d: %+v, want %q", i, len(payloads), *got, p)
		}
	}
	requireNoNotification(ctx, t, l)
}

// Not one of the listener cases, but what River's notifier expects of
// them (its StartErrorsOnImmediateProblem): Connect on a closed pool fails,
// as riverpgxv5's listener does, although this one listens through the hub.
func TestListenerConnectFailsOnAClosedPool(t *testing.T) {
	h := startHub(t)
	schema := newSchema(t, false)
	pool := newPool(t, schema, "")
	d := riverhub.New(pool, driverOptions(t, h, randName("lhriver-local-")))
	l := d.GetListener(&riverdriver.GetListenenerParams{Schema: schema})
	pool.Close()
	if err := l.Connect(context.Background()); err == nil {
		l.Close(context.Background())
		t.Fatal("Connect on a closed pool succeeded")
	}
}

func TestListenerReconnectDiscardsBufferedNotifications(t *testing.T) {
	ctx := context.Background()
	l, b := setupListener(t)
	connectListener(ctx, t, l)
	mustf(t, l.Listen(ctx, "topic"), "Listen")
	notify(ctx, t, b, l, "topic", "first", "buffered")
	requireNotification(t, waitForNotification(ctx, t, l), "topic", "first")
	mustf(t, l.Close(ctx), "Close")
	mustf(t, l.Connect(ctx), "Connect")
	mustf(t, l.Listen(ctx, "topic"), "Listen")
	notify(ctx, t, b, l, "topic", "new")
	requireNotification(t, waitForNotification(ctx, t, l), "topic", "new")
	requireNoNotification(ctx, t, l)
}

// River's notifier cancels WaitForNotification to run Listen and Unlisten:
// the wait must return at once, with the context's error.
func TestListenerWaitReturnsWhenCancelled(t *testing.T) {
	ctx := context.Background()
	l, _ := setupListener(t)
	connectListener(ctx, t, l)
	mustf(t, l.Listen(ctx, "topic"), "Listen")
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := l.WaitForNotification(wctx)
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitForNotification returned %v, want context.Canceled", err)
		}
	case <-time.After(time.Second):
		t.Fatal("WaitForNotification did not return within 1s of its context's cancel")
	}
}
