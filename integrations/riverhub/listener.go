package riverhub

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver"

	"github.com/listenhub/listenhub/client"
)

// markerTimeout bounds a Listen's wait for its marker; past it the Listen
// returns anyway, and a notification committed just before it may be
// delivered (as with a LISTEN racing a NOTIFY).
const markerTimeout = 5 * time.Second

// resyncTimeout bounds the query that turns a durable wake on the insert
// topic into insert notifications.
const resyncTimeout = 10 * time.Second

// insertTopic is River's topic for job inserts, whose notifications name the
// queue: {"queue":"default"}.
const insertTopic = "river_insert"

var (
	errNotConnected = errors.New("listenhub river listener: not connected")
	errConnected    = errors.New("listenhub river listener: connection already established")
)

// listener is River's riverdriver.Listener over a client.Failover. River's
// notifier calls Connect, Listen, Unlisten, Ping and Close from one
// goroutine and WaitForNotification from another, cancelling the wait before
// each Listen and Unlisten.
type listener struct {
	pool *pgxpool.Pool
	opts Options
	log  *slog.Logger

	mu               sync.Mutex // everything below but what conn guards
	schema, prefix   string
	afterConnectExec string
	c                *conn // nil unless connected
}

// conn is one Connect's state: its Failover and the notifications it
// delivered that WaitForNotification has not taken yet. Close discards it,
// queue and all, as closing riverpgxv5's connection would.
type conn struct {
	fo     *client.Failover
	marker string // the private name a Listen's marker is NOTIFYed on

	mu       sync.Mutex
	queue    []*riverdriver.Notification
	ready    chan struct{} // cap 1: the queue is not empty
	listened map[string]bool
	// held: channel names Listen began on whose wakes are dropped until
	// their marker (a token, in markers) has come: those wakes were
	// committed before the Listen began.
	held    map[string]string
	markers map[string]chan struct{}
	closed  bool
}

func newListener(pool *pgxpool.Pool, opts Options, schema string) *listener {
	l := &listener{pool: pool, opts: opts, log: opts.Logger, schema: schema}
	l.setPrefix()
	return l
}

func (l *listener) setPrefix() {
	l.prefix = ""
	if l.schema != "" {
		l.prefix = l.schema + "."
	}
}

// Connect opens the Failover (the hub, or this process's own LISTEN
// connection when the hub is away) and subscribes the marker name.
func (l *listener) Connect(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c != nil {
		return errConnected
	}
	// riverpgxv5's listener takes its connection from the pool, so a
	// closed pool fails its Connect, and River's notifier reports that
	// from Start; this one must too, though it listens elsewhere.
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("listenhub river listener: %w", err)
	}
	pc.Release()
	if err := l.resolveSchema(ctx); err != nil {
		return err
	}
	opts := l.opts.Failover
	if opts.Local.ChannelPrefix != "" || opts.Local.ChannelSuffix != "" {
		return errors.New("listenhub river listener: River's channels are not mapped: run the hub without --channel-prefix and --channel-suffix, and leave Local's ChannelPrefix and ChannelSuffix empty")
	}
	if opts.Local.DatabaseURL == "" && opts.Local.ConnConfig == nil {
		cc := l.pool.Config().ConnConfig.Config.Copy()
		app := opts.Local.ApplicationName
		if app == "" {
			app = "listenhub-local"
		}
		cc.RuntimeParams["application_name"] = app
		opts.Local.ConnConfig = cc
	}
	c := &conn{
		ready:    make(chan struct{}, 1),
		listened: make(map[string]bool),
		held:     make(map[string]string),
		markers:  make(map[string]chan struct{}),
		marker:   "lh.river." + token(),
	}
	fo, err := client.NewFailover(ctx, opts, client.FailoverHandlers{
		OnWake: func(w client.Wake) { l.onWake(c, w) },
	})
	if err != nil {
		return fmt.Errorf("listenhub river listener: %w", err)
	}
	c.fo = fo
	if err := fo.Subscribe(ctx, c.marker); err != nil {
		fo.Close()
		return fmt.Errorf("listenhub river listener: %w", err)
	}
	l.c = c
	return nil
}

// resolveSchema runs the after-connect statement (tests) and, without a
// schema given, takes the pool's current one, as riverpgxv5 does.
func (l *listener) resolveSchema(ctx context.Context) error {
	if l.schema != "" && l.afterConnectExec == "" {
		return nil
	}
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Conn()
	if l.afterConnectExec != "" {
		// The statement changes this session: not back into the pool.
		conn = pc.Hijack()
		defer conn.Close(context.WithoutCancel(ctx))
		if _, err := conn.Exec(ctx, l.afterConnectExec); err != nil {
			return err
		}
	} else {
		defer pc.Release()
	}
	if l.schema == "" {
		// current_schema() is NULL when no schema of search_path exists.
		if err := conn.QueryRow(ctx, "SELECT coalesce(current_schema(), '')").Scan(&l.schema); err != nil {
			return err
		}
		l.setPrefix()
	}
	return nil
}

func (l *listener) connected() (*conn, error) {
	if l.c == nil {
		return nil, errNotConnected
	}
	return l.c, nil
}

// Listen subscribes topic's channel. A new one is fenced: a marker NOTIFY is
// committed first, and the topic's wakes are dropped until the marker has
// come back, so that a NOTIFY committed before this Listen began is not
// delivered (the hub may have been listening on the channel for another
// process all along) and one committed after it returned is.
func (l *listener) Listen(ctx context.Context, topic string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, err := l.connected()
	if err != nil {
		return err
	}
	name := l.prefix + topic
	c.mu.Lock()
	fresh := !c.listened[name]
	c.listened[name] = true
	var tok string
	var came chan struct{}
	if fresh {
		tok, came = token(), make(chan struct{})
		c.held[name] = tok
		c.markers[tok] = came
	}
	c.mu.Unlock()
	if fresh {
		if _, err := l.pool.Exec(ctx, "SELECT pg_notify($1, $2)", c.marker, tok); err != nil {
			c.forget(name, tok)
			return fmt.Errorf("listenhub river listener: marker for %q: %w", name, err)
		}
	}
	if err := c.fo.Subscribe(ctx, name); err != nil {
		if fresh {
			c.forget(name, tok)
		}
		return fmt.Errorf("listenhub river listener: %w", err)
	}
	if !fresh {
		return nil
	}
	t := time.NewTimer(markerTimeout)
	defer t.Stop()
	select {
	case <-came:
		return nil
	case <-ctx.Done():
		c.release(name, tok)
		return ctx.Err()
	case <-c.fo.Done():
		return fmt.Errorf("listenhub river listener: %w", c.fo.Err())
	case <-t.C:
		c.release(name, tok)
		l.log.Warn("listenhub river listener: a Listen's marker did not come back in time; a notification committed just before it may be delivered",
			"channel", name, "timeout", markerTimeout)
		return nil
	}
}

// Unlisten unsubscribes topic's channel; its wakes still arriving are
// dropped, those already queued stay (as in a Postgres connection's buffer).
func (l *listener) Unlisten(ctx context.Context, topic string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, err := l.connected()
	if err != nil {
		return err
	}
	name := l.prefix + topic
	c.mu.Lock()
	delete(c.listened, name)
	c.mu.Unlock()
	c.fo.Unsubscribe(name)
	return nil
}

// Ping fails once the listener is dead (the hub failed and so did the local
// connection): River's notifier then closes and connects again.
func (l *listener) Ping(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, err := l.connected()
	if err != nil {
		return err
	}
	if err := c.fo.Err(); err != nil {
		return fmt.Errorf("listenhub river listener: %w", err)
	}
	return ctx.Err()
}

func (l *listener) Schema() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.schema
}

// SetAfterConnectExec sets a statement run on a connection of the pool at
// each Connect, before the schema is looked up (River's tests use it).
func (l *listener) SetAfterConnectExec(sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.afterConnectExec = sql
}

// WaitForNotification returns the next notification, or ctx's error as soon
// as ctx ends, or the Failover's error once it is dead.
func (l *listener) WaitForNotification(ctx context.Context) (*riverdriver.Notification, error) {
	l.mu.Lock()
	c, err := l.connected()
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	for {
		if n := c.pop(); n != nil {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.ready:
		case <-c.fo.Done():
			if n := c.pop(); n != nil {
				return n, nil
			}
			return nil, fmt.Errorf("listenhub river listener: %w", c.fo.Err())
		}
	}
}

// Close closes the Failover and discards what it queued.
func (l *listener) Close(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.c
	if c == nil {
		return nil
	}
	l.c = nil
	c.mu.Lock()
	c.closed = true
	c.queue = nil
	c.mu.Unlock()
	c.fo.Close()
	return nil
}

// onWake routes a wake of c's Failover: a marker releases its Listen, a
// wake of a channel not listened or still held is dropped, a durable one on
// the insert topic becomes insert notifications. It never blocks.
func (l *listener) onWake(c *conn, w client.Wake) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if w.Name == c.marker {
		if came, ok := c.markers[w.Payload]; ok {
			for name, tok := range c.held {
				if tok == w.Payload {
					delete(c.held, name)
				}
			}
			delete(c.markers, w.Payload)
			close(came)
		}
		return
	}
	if !c.listened[w.Name] || c.held[w.Name] != "" {
		return
	}
	topic := strings.TrimPrefix(w.Name, l.prefix)
	if w.Durable {
		// A gap: NOTIFYs may have been lost. River's payloads are JSON,
		// never empty, so a durable wake is always the client's.
		if topic == insertTopic {
			go l.resyncInserts(c)
		}
		return
	}
	c.pushLocked(&riverdriver.Notification{Topic: topic, Payload: w.Payload})
}

// resyncInserts queues an insert notification for every queue with
// available jobs: what River's producers would have been told in the gap.
func (l *listener) resyncInserts(c *conn) {
	ctx, cancel := context.WithTimeout(context.Background(), resyncTimeout)
	defer cancel()
	l.mu.Lock()
	table := pgx.Identifier{"river_job"}
	if l.schema != "" {
		table = pgx.Identifier{l.schema, "river_job"}
	}
	l.mu.Unlock()
	var queues []string
	rows, err := l.pool.Query(ctx, "SELECT DISTINCT queue FROM "+table.Sanitize()+" WHERE state = 'available'")
	if err == nil {
		queues, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		l.log.Warn("listenhub river listener: after a gap in notifications, the queues with available jobs could not be read; River's producers fetch at their next poll", "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || !c.listened[l.prefix+insertTopic] {
		return
	}
	for _, q := range queues {
		c.pushLocked(&riverdriver.Notification{Topic: insertTopic, Payload: insertPayload(q)})
	}
}

func (c *conn) pushLocked(n *riverdriver.Notification) {
	c.queue = append(c.queue, n)
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

func (c *conn) pop() *riverdriver.Notification {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		return nil
	}
	n := c.queue[0]
	c.queue[0] = nil
	c.queue = c.queue[1:]
	if len(c.queue) == 0 {
		c.queue = nil // let a drained burst's array go
	}
	return n
}

// release ends name's hold for tok (its marker is not waited for any more).
func (c *conn) release(name, tok string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[name] == tok {
		delete(c.held, name)
	}
	delete(c.markers, tok)
}

// forget undoes a Listen that failed.
func (c *conn) forget(name, tok string) {
	c.release(name, tok)
	c.mu.Lock()
	delete(c.listened, name)
	c.mu.Unlock()
}

// insertPayload is River's insert notification for queue.
func insertPayload(queue string) string {
	b, _ := json.Marshal(struct {
		Queue string `json:"queue"`
	}{queue})
	return string(b)
}

func token() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
