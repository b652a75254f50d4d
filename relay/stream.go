package relay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/listenhub/listenhub/internal/channame"
	"github.com/listenhub/listenhub/internal/pgquote"
)

// The stream runs on two goroutines. The reader decodes the replication
// connection and turns each committed transaction into an event: its xid,
// end position, commit time and the channels it touched. The batcher (the
// session's goroutine) gathers events into a batch, waits until every
// transaction of it is visible, NOTIFYs the batch's channels in one
// transaction, and only then reports the batch's end as confirmed. While a
// batch is being NOTIFYed, the reader goes on decoding: the next batch
// forms behind it, so a busy stream coalesces without any timer.

type evKind uint8

const (
	evCommit    evKind = iota
	evKeepalive        // the walsender's position while no transaction was open
	evProbe            // the reader heard nothing for a while: is the walsender still ours?
)

type event struct {
	kind    evKind
	xid     uint32
	end     uint64    // commit: end of the commit record; keepalive: walEnd
	commit  time.Time // commit timestamp
	chans   []string  // distinct channels the transaction touched
	changes int       // row changes (and truncated tables) decoded
	// more: the reader had further bytes at hand after this event, so
	// another is already on its way.
	more  bool
	reply bool // keepalive: the server asks for a status update now
	// resync: the transaction carries the message that records a resync
	// owed (resyncPrefix): every channel is NOTIFYed with it.
	resync bool
	probe  chan error // evProbe: the batcher's answer, nil to read on
}

// eventQueue bounds the decoded transactions waiting for the batcher;
// past it the reader waits, and the walsender with it.
const eventQueue = 4096

// relation is what the reader knows of a relation from its last Relation
// message: its channel per op ("" when the op is not NOTIFYed or the name
// is too long).
type relation struct {
	schema, name string
	chans        [numOps]string
	tooLong      [numOps]bool
}

// probeSilence: a read deadline without a message asks the server whether
// the walsender still holds the slot (a test turns it off to make a
// session fail while its walsender lives on).
var probeSilence = true

// read is the reader goroutine: it decodes until the connection fails.
func (s *session) read(ctx context.Context, events chan<- event) error {
	r := s.r
	rels := map[uint32]*relation{}
	var cur event
	var seen map[string]struct{} // cur's channels, once there are many
	inTx := false
	idle := 3 * r.opts.StatusInterval // the server answers our status within this
	send := func(ev event) error {
		select {
		case events <- ev:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	add := func(rel *relation, o op) {
		cur.changes++
		if !r.opts.Ops.has(o) {
			return
		}
		if rel.tooLong[o] {
			r.tooLong.Add(1)
			if ok, n := r.tooLongLog.allow(time.Now()); ok {
				r.log.Warn("relay: channel name too long, not NOTIFYed", "table", rel.schema+"."+rel.name,
					"op", opNames[o], "channel", r.tmpl.channel(rel.schema, rel.name, o), "max", channame.MaxLen, "suppressed", n)
			}
			return
		}
		ch := rel.chans[o]
		if seen != nil {
			if _, ok := seen[ch]; ok {
				return
			}
			seen[ch] = struct{}{}
		} else {
			for _, c := range cur.chans {
				if c == ch {
					return
				}
			}
			if len(cur.chans) == 8 {
				seen = make(map[string]struct{}, 16)
				for _, c := range cur.chans {
					seen[c] = struct{}{}
				}
				seen[ch] = struct{}{}
			}
		}
		cur.chans = append(cur.chans, ch)
	}
	lookup := func(id uint32) (*relation, error) {
		rel := rels[id]
		if rel == nil {
			return nil, fmt.Errorf("relay: change of relation %d before its Relation message", id)
		}
		return rel, nil
	}
	for {
		// The deadline is reset for every message, whatever is
		// buffered: a message cut short waits for its rest under a
		// fresh one (msgReader keeps its place). On a stop the deadline
		// is endStream's.
		if ctx.Err() == nil {
			s.rc.SetReadDeadline(time.Now().Add(idle))
		}
		taken := s.mr.Taken()
		typ, body, err := s.readMsg()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil && s.mr.Taken() != taken {
				continue // bytes came: a message is arriving, not silence
			}
			if probeSilence && errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil {
				// Silence is not death: a walsender decoding a large
				// transaction of unpublished tables sends nothing,
				// not even a keepalive, for as long as that takes.
				// The batcher asks the server whether the slot is
				// still our walsender's.
				ev := event{kind: evProbe, probe: make(chan error, 1)}
				if err := send(ev); err != nil {
					return err
				}
				select {
				case perr := <-ev.probe:
					if perr != nil {
						return fmt.Errorf("no message from the walsender for %v: %w", idle, perr)
					}
					continue
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return err
		}
		switch typ {
		case 'd':
		case 'E':
			return pgError(body)
		case 'c':
			return errStreamEnded
		default:
			continue // NoticeResponse, ParameterStatus
		}
		if len(body) == 0 {
			return errShort
		}
		switch body[0] {
		case 'k':
			ka, err := parseKeepalive(body[1:])
			if err != nil {
				return err
			}
			// A keepalive goes to the batcher even when it asks for
			// nothing: it may be what follows a commit in the buffer
			// (PostgreSQL sends one after a transaction it skipped),
			// and its more says whether anything else does.
			ev := event{kind: evKeepalive, reply: ka.reply, more: s.mr.Buffered() > 0}
			if !inTx {
				ev.end = ka.walEnd
			}
			if err := send(ev); err != nil {
				return err
			}
			continue
		case 'w':
		default:
			continue
		}
		xld, err := parseXLogData(body[1:])
		if err != nil {
			return err
		}
		m := xld.data
		if len(m) == 0 {
			return errShort
		}
		switch m[0] {
		case 'B':
			b, err := parseBegin(m[1:])
			if err != nil {
				return err
			}
			cur = event{kind: evCommit, xid: b.xid, commit: b.commitTime}
			seen = nil
			inTx = true
		case 'C':
			c, err := parseCommit(m[1:])
			if err != nil {
				return err
			}
			cur.end = c.endLSN
			cur.commit = c.commitTime
			cur.more = s.mr.Buffered() > 0
			r.decodeHist.Observe(time.Since(c.commitTime), 1)
			inTx = false
			if err := send(cur); err != nil {
				return err
			}
			cur = event{}
		case 'M':
			lm, err := parseMessage(m[1:])
			if err != nil {
				return err
			}
			if inTx && lm.prefix == resyncPrefix && string(lm.content) == r.opts.Slot {
				cur.resync = true
			}
		case 'R':
			rm, err := parseRelation(m[1:])
			if err != nil {
				return err
			}
			rel := &relation{schema: rm.schema, name: rm.name}
			for o := op(0); o < numOps; o++ {
				if r.opts.Ops.has(o) {
					ch := r.tmpl.channel(rm.schema, rm.name, o)
					if len(ch) > channame.MaxLen {
						rel.tooLong[o] = true
					} else {
						rel.chans[o] = ch
					}
				}
			}
			rels[rm.id] = rel
		case 'I', 'U', 'D':
			id, err := changeRelation(m[1:])
			if err != nil {
				return err
			}
			rel, err := lookup(id)
			if err != nil {
				return err
			}
			o := opInsert
			if m[0] == 'U' {
				o = opUpdate
			} else if m[0] == 'D' {
				o = opDelete
			}
			add(rel, o)
		case 'T':
			var lerr error
			err := truncateRelations(m[1:], func(id uint32) {
				rel, err := lookup(id)
				if err != nil {
					lerr = err
					return
				}
				add(rel, opTruncate)
			})
			if err == nil {
				err = lerr
			}
			if err != nil {
				return err
			}
		}
	}
}

// batch is what the batcher has gathered and not yet NOTIFYed.
type batch struct {
	txs     int
	xids    []uint32 // of the transactions that touched a channel
	chans   []string
	seen    map[string]struct{}
	wakes   int // sum of the transactions' channel counts
	changes int
	commits []time.Time
	end     uint64
	start   time.Time // when the first transaction arrived
	more    bool      // the last transaction's more
	resync  bool      // a transaction of it recorded a resync owed
	ownTxs  int       // transactions of the relay's own (the resync's record)
}

func (b *batch) add(ev event) {
	if b.txs == 0 {
		b.start = time.Now()
	}
	b.txs++
	b.changes += ev.changes
	b.end = max(b.end, ev.end)
	b.more = ev.more
	if len(ev.chans) == 0 {
		return
	}
	b.xids = append(b.xids, ev.xid)
	if !ev.resync || ev.changes > 0 {
		// The relay's own record of a resync is no writer's commit.
		b.commits = append(b.commits, ev.commit)
	}
	b.wakes += len(ev.chans)
	if b.seen == nil {
		b.seen = map[string]struct{}{}
	}
	for _, c := range ev.chans {
		if _, ok := b.seen[c]; !ok {
			b.seen[c] = struct{}{}
			b.chans = append(b.chans, c)
		}
	}
}

func (b *batch) reset() {
	b.txs, b.wakes, b.changes = 0, 0, 0
	b.xids, b.chans, b.commits = b.xids[:0], b.chans[:0], b.commits[:0]
	clear(b.seen)
	b.more, b.resync, b.ownTxs = false, false, 0
}

// beforeNotify, when set, runs as a batch's NOTIFY is about to go out (a
// test stops the relay there, as a SIGTERM in the round trip would).
var beforeNotify func()

// stopFlushTimeout bounds the last NOTIFY and status update on a stop.
const stopFlushTimeout = 2 * time.Second

// maxBatch bounds the transactions of one batch (and so the size of the
// NOTIFY statement's parameters) when a backlog is replayed.
const maxBatch = 10000

// notifySQL NOTIFYs its channels only if every transaction of the batch
// is visible to the statement's snapshot, all in one round trip and one
// transaction: the NOT EXISTS is evaluated once, before any pg_notify. It
// returns one row per channel when it NOTIFYed, none when a transaction
// was not yet visible (and then nothing was NOTIFYed).
const notifySQL = `SELECT pg_notify(c, '') FROM unnest($1::text[]) c
WHERE NOT EXISTS (SELECT FROM unnest($2::xid8[]) x WHERE NOT pg_visible_in_snapshot(x, pg_current_snapshot()))`

const notifyStmt = "listenhub_relay_notify"

// stream runs the reader and the batcher until the session fails.
func (s *session) stream(ctx context.Context) error {
	r := s.r
	if _, err := s.nc.Prepare(ctx, notifyStmt, notifySQL, nil); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan event, eventQueue)
	readErr := make(chan error, 1)
	go func() { readErr <- s.read(ctx, events) }()
	defer func() {
		cancel()
		s.rc.Close()
		<-readErr
	}()

	// A NOTIFY begun before a stop runs to its end, bounded: cut short,
	// it may have committed all the same, unconfirmed, and the next start
	// would NOTIFY its transactions again.
	nctx, ncancel := context.WithCancel(context.WithoutCancel(ctx))
	defer ncancel()
	defer context.AfterFunc(ctx, func() { time.AfterFunc(stopFlushTimeout, ncancel) })()

	var b batch
	// confirmed is what this session has NOTIFYed (or needed not to):
	// it starts at 0, never at a previous session's position, which a
	// server that crashed may have lost (the slot then replays from
	// further back, and the server ignores a position behind its own).
	var confirmed, sent uint64
	var lastStatus time.Time
	// lastProgress is when the position this session reports last
	// advanced: a transaction decoded for minutes (millions of rows)
	// moves nothing, and its lag counts from here.
	lastProgress := time.Now()
	sendStatus := func(reply bool) error {
		if confirmed != sent {
			lastProgress = time.Now()
		}
		msg := appendStandbyStatus(nil, confirmed, time.Now())
		if reply {
			msg[len(msg)-1] = 1
		}
		s.rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, err := s.rc.Write(msg)
		lastStatus, sent = time.Now(), confirmed
		if confirmed > 0 {
			r.confirmed.Store(confirmed)
		}
		return err
	}
	tick := min(r.opts.StatusInterval, 2*time.Second)
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	var lastRefresh time.Time = time.Now()
	var lastLagWarn time.Time
	// behindSince is since when the slot has held more than
	// behindBytes of WAL at every look (zero while it does not): a
	// transaction being decoded moves the walsender's keepalives, so its
	// position alone does not show it.
	var behindSince time.Time
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	flush := func() error {
		if err := s.flush(nctx, &b); err != nil {
			return err
		}
		confirmed = max(confirmed, b.end)
		b.reset()
		// The position is reported at most every few milliseconds under
		// load: a restart replays at most that much more.
		if time.Since(lastStatus) >= 5*time.Millisecond {
			return sendStatus(false)
		}
		return nil
	}
	handle := func(ev event) error {
		switch ev.kind {
		case evProbe:
			ev.probe <- s.probe(ctx)
		case evCommit:
			if ev.resync {
				// The channels of the publication's tables join the
				// transaction's: its NOTIFY is the resync.
				b.resync = true
				if ev.changes == 0 {
					b.ownTxs++
				}
				ev.chans = append(ev.chans, s.resyncChans()...)
			}
			b.add(ev)
		case evKeepalive:
			b.more = ev.more
			if b.txs == 0 && ev.end > confirmed {
				// Nothing decoded is waiting: every transaction
				// before this position has been NOTIFYed or needed
				// none.
				confirmed = ev.end
				r.lagSeconds.Store(0)
			}
			if ev.reply {
				return sendStatus(false)
			}
		}
		return nil
	}
	for {
		var timeout <-chan time.Time
		if b.txs > 0 {
			switch {
			case r.opts.Window <= 0, b.txs >= maxBatch,
				!b.more && len(events) == 0:
				if err := flush(); err != nil {
					return err
				}
				continue
			case time.Since(b.start) >= r.opts.Window:
				// The window is over, but what the reader has decoded
				// meanwhile joins the batch: it waits for nothing more,
				// and behind a slow NOTIFY round trip it is most of the
				// stream. One NOTIFY transaction for all of it instead
				// of one per window spares the server (and every
				// listener) a transaction per millisecond of backlog.
				for n := len(events); n > 0 && b.txs < maxBatch; n-- {
					if err := handle(<-events); err != nil {
						return err
					}
				}
				if err := flush(); err != nil {
					return err
				}
				continue
			}
			timer.Reset(r.opts.Window - time.Since(b.start))
			timeout = timer.C
		}
		select {
		case <-ctx.Done():
			// A stop: what is decoded is NOTIFYed and confirmed
			// before the connections close, so that the next start
			// replays nothing twice. Bounded: past it, the next
			// start replays the rest.
			if b.txs > 0 || confirmed != sent {
				fctx, fcancel := context.WithTimeout(context.Background(), stopFlushTimeout)
				defer fcancel()
				if b.txs == 0 || s.flush(fctx, &b) == nil {
					confirmed = max(confirmed, b.end)
					sendStatus(false)
				}
			}
			s.endStream(readErr)
			return ctx.Err()
		case err := <-readErr:
			readErr <- err // for the deferred wait
			return err
		case <-timeout:
			continue
		case <-ticker.C:
			if b.txs == 0 && time.Since(lastStatus) >= r.opts.StatusInterval {
				if err := sendStatus(true); err != nil {
					return err
				}
			} else if b.txs == 0 && confirmed != sent {
				if err := sendStatus(false); err != nil {
					return err
				}
			}
			if time.Since(lastRefresh) >= 2*time.Second {
				lastRefresh = time.Now()
				if err := s.refreshXidRef(ctx); err != nil {
					return err
				}
				if err := s.watchPublication(ctx); err != nil {
					return err
				}
				if err := s.watchTables(ctx); err != nil {
					return err
				}
				lag, lagT := r.lagBytes.Load(), time.Duration(r.lagSeconds.Load())
				// WAL waits and the position has not moved for longer
				// than MaxLag: a decode in progress (or a stall) that
				// no NOTIFY measured. An idle relay's position follows
				// the walsender's keepalives within a tick or two, so
				// MaxLag has a floor of two looks (maxLagFloor).
				bound := max(r.opts.MaxLag, maxLagFloor(tick))
				if stuck := time.Since(lastProgress); lag > 0 && stuck > bound && stuck > lagT {
					lagT = stuck
					r.lagSeconds.Store(int64(stuck))
				}
				switch {
				case lag < behindBytes:
					behindSince = time.Time{}
				case behindSince.IsZero():
					behindSince = time.Now()
				default:
					if behind := time.Since(behindSince); behind > bound && behind > lagT {
						lagT = behind
						r.lagSeconds.Store(int64(behind))
					}
				}
				if lag > r.opts.MaxLagBytes || lagT > r.opts.MaxLag {
					r.setWarning(fmt.Sprintf("lagging: %v since the last NOTIFY or progress, %d bytes of WAL behind (--max-lag %v, --max-lag-bytes %d); a long transaction being decoded, or a slow NOTIFY connection",
						lagT.Round(time.Second), lag, r.opts.MaxLag, r.opts.MaxLagBytes))
					if time.Since(lastLagWarn) >= time.Minute {
						lastLagWarn = time.Now()
						r.log.Warn("relay lagging", "lag_bytes", lag, "lag_seconds", lagT.Seconds(),
							"max_lag", r.opts.MaxLag, "max_lag_bytes", r.opts.MaxLagBytes)
					}
				} else {
					r.setWarning(s.revoked) // "" but for a REPLICATION lost meanwhile
				}
			}
			continue
		case ev := <-events:
			if timeout != nil && !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			if err := handle(ev); err != nil {
				return err
			}
		}
	}
}

// endStream ends the replication stream in order on a stop: CopyDone, then
// the stream read up to the server's CopyDone, which it sends once it has
// read ours, and so the status update before it. Closing at once instead
// lost that update now and then: closed with the walsender's messages
// unread, a TCP socket sends a reset, and the server's kernel drops what
// the walsender had not read yet, the update included; the next start
// then replayed the last batch. Bounded by stopFlushTimeout.
func (s *session) endStream(readErr chan error) {
	deadline := time.Now().Add(stopFlushTimeout)
	s.rc.SetDeadline(deadline)
	if _, err := s.rc.Write([]byte{'c', 0, 0, 0, 4}); err != nil {
		return
	}
	// The reader stops at the server's CopyDone, or for the stop (its
	// context is done) wherever it was; then the rest is read here. At
	// the deadline its read is cut short, whatever deadline it set.
	var err error
	select {
	case err = <-readErr:
	case <-time.After(time.Until(deadline)):
		s.rc.SetReadDeadline(time.Now())
		err = <-readErr
	}
	readErr <- err // for stream's deferred wait
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return // the server's CopyDone, or the connection failed
	}
	for time.Now().Before(deadline) {
		typ, _, err := s.readMsg()
		if err != nil || typ == 'c' {
			return
		}
	}
}

// errStreamEnded is the reader's error when the server ends the stream
// (CopyDone).
var errStreamEnded = errors.New("the server ended the replication stream")

// flush NOTIFYs the batch's channels once every transaction that touched
// them is visible to a new snapshot.
func (s *session) flush(ctx context.Context, b *batch) error {
	r := s.r
	if len(b.chans) > 0 {
		chans := textArray(b.chans)
		xids := make([]byte, 0, 2+12*len(b.xids))
		xids = append(xids, '{')
		for i, x := range b.xids {
			if i > 0 {
				xids = append(xids, ',')
			}
			xids = strconv.AppendUint(xids, fullXid(s.xidRef, x), 10)
		}
		xids = append(xids, '}')
		params := [][]byte{chans, xids}
		var waited time.Time
		for {
			if beforeNotify != nil {
				beforeNotify()
			}
			tag, err := s.nc.ExecPrepared(ctx, notifyStmt, params, nil, nil).Close()
			if err != nil {
				return fmt.Errorf("NOTIFY: %w", err)
			}
			n := tag.RowsAffected()
			if n == int64(len(b.chans)) {
				break
			}
			if n != 0 {
				return fmt.Errorf("NOTIFY: %d rows for %d channels", n, len(b.chans))
			}
			r.visWaits.Add(1)
			if waited.IsZero() {
				waited = time.Now()
			} else if time.Since(waited) > 10*time.Second {
				return fmt.Errorf("transactions %v decoded as committed are still not visible after 10s", b.xids)
			}
			t := time.NewTimer(visibilityRetry)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		now := time.Now()
		if b.resync {
			r.resyncs.Add(1)
			r.log.Info("relay NOTIFYed every channel of the publication once (a new slot, or a gap in what the publication published)",
				"channels", len(b.chans))
		}
		for _, c := range b.commits {
			r.hist.Observe(now.Sub(c), 1)
		}
		if len(b.commits) > 0 {
			r.lagSeconds.Store(int64(max(0, now.Sub(b.commits[len(b.commits)-1]))))
		}
		r.notifies.Add(uint64(len(b.chans)))
		r.batches.Add(1)
		r.coalesced.Add(uint64(b.wakes - len(b.chans)))
	}
	r.transactions.Add(uint64(b.txs - b.ownTxs))
	r.changes.Add(uint64(b.changes))
	return nil
}

// resync NOTIFYs every channel of the publication's tables once.
func (s *session) resync(ctx context.Context) error {
	r := s.r
	chans := s.resyncChans()
	if len(chans) == 0 {
		return nil
	}
	if _, err := s.nc.ExecParams(ctx, `SELECT pg_notify(c, '') FROM unnest($1::text[]) c`,
		[][]byte{textArray(chans)}, nil, nil, nil).Close(); err != nil {
		return fmt.Errorf("resync NOTIFY: %w", err)
	}
	r.resyncs.Add(1)
	r.notifies.Add(uint64(len(chans)))
	r.batches.Add(1)
	r.log.Info("relay NOTIFYed every channel of the publication once (new slot)", "channels", len(chans))
	return nil
}

// textArray is the text form of a text[]: every element quoted, with
// backslash and double quote escaped.
func textArray(ss []string) []byte {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if s[j] == '"' || s[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return []byte(b.String())
}

// resyncChans are the channels of every table of the publication (as the
// session's preflight read it) and every op NOTIFYed.
func (s *session) resyncChans() []string {
	r := s.r
	var chans []string
	for _, t := range s.tables {
		for o := op(0); o < numOps; o++ {
			if r.opts.Ops.has(o) {
				chans = append(chans, r.tmpl.channel(t[0], t[1], o))
			}
		}
	}
	return chans
}

// probe answers the reader's question after a silence: nil when the slot
// is still held by this session's walsender (busy, e.g. decoding a large
// transaction it will send nothing of), an error otherwise.
func (s *session) probe(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := query(qctx, s.nc, `SELECT coalesce((SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1), 0)::text`, s.r.opts.Slot)
	if err != nil {
		return fmt.Errorf("and the server does not answer: %w", err)
	}
	if rows[0][0] != strconv.Itoa(s.walsender) {
		return fmt.Errorf("and the slot is no longer held by it (active_pid %s, ours %d)", rows[0][0], s.walsender)
	}
	s.r.log.Debug("relay: the walsender is silent but still holds the slot (decoding); waiting", "pid", s.walsender)
	return nil
}

// watchTables compares, with each look at the server while streaming, the
// tables the publication covers, and their row filters (PostgreSQL 15 on),
// with what the relay saw last. A table that left the publication, or a
// row filter added, stops changes from waking with nothing in the stream
// to say so: the relay logs it once per change, with the tables, and
// Stats (listenhub_relay_tables, listenhub_relay_tables_filtered) show
// what is covered now.
func (s *session) watchTables(ctx context.Context) error {
	r := s.r
	sql := `SELECT schemaname, tablename, '' FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2`
	if s.ver >= 150000 {
		sql = `SELECT schemaname, tablename, coalesce(rowfilter, '') FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2`
	}
	rows, err := query(ctx, s.nc, sql, r.opts.Publication)
	if err != nil {
		return fmt.Errorf("read the publication's tables: %w", err)
	}
	now := make(map[[2]string]string, len(rows))
	filtered := 0
	for _, row := range rows {
		now[[2]string{row[0], row[1]}] = row[2]
		if row[2] != "" {
			filtered++
		}
	}
	r.tables.Store(int64(len(now)))
	r.tablesFiltered.Store(int64(filtered))
	if s.seen == nil { // the first look: the tables of the preflight, no filters known
		s.seen = make(map[[2]string]string, len(s.tables))
		for _, t := range s.tables {
			s.seen[t] = ""
		}
	}
	var left, arrived, newFilters []string
	quoted := map[string]string{} // a left table's name as to_regclass reads it
	for t := range s.seen {
		if _, ok := now[t]; !ok {
			name := t[0] + "." + t[1]
			left = append(left, name)
			quoted[pgquote.Ident(t[0])+"."+pgquote.Ident(t[1])] = name
		}
	}
	for t, f := range now {
		if _, ok := s.seen[t]; !ok {
			arrived = append(arrived, t[0]+"."+t[1])
		}
		if f != "" && s.seen[t] != f {
			newFilters = append(newFilters, t[0]+"."+t[1]+" WHERE "+f)
		}
	}
	sort.Strings(left)
	sort.Strings(arrived)
	sort.Strings(newFilters)
	if len(left) > 0 {
		// A table that no longer exists did not leave the publication:
		// it was dropped (nothing left to wake for) or renamed (its
		// changes now wake the new name's channel).
		names := make([]string, 0, len(quoted))
		for q := range quoted {
			names = append(names, q)
		}
		gone, err := query(ctx, s.nc, `SELECT n FROM unnest($1::text[]) n WHERE to_regclass(n) IS NULL`, string(textArray(names)))
		if err != nil {
			return fmt.Errorf("look up the tables gone from the publication: %w", err)
		}
		goneSet := make(map[string]bool, len(gone))
		var goneNames []string
		for _, g := range gone {
			goneSet[quoted[g[0]]] = true
			goneNames = append(goneNames, quoted[g[0]])
		}
		sort.Strings(goneNames)
		var still []string
		for _, t := range left {
			if !goneSet[t] {
				still = append(still, t)
			}
		}
		if len(goneNames) > 0 {
			attrs := []any{"publication", r.opts.Publication, "tables", strings.Join(goneNames, ", ")}
			if len(arrived) > 0 {
				attrs = append(attrs, "new_tables", strings.Join(arrived, ", "), "note", "a renamed table's changes wake the channel of its new name")
			}
			r.log.Info("relay: published tables were dropped or renamed", attrs...)
		}
		if len(still) > 0 {
			r.log.Warn("relay: tables left the publication: their changes get no wake", "publication", r.opts.Publication,
				"tables", strings.Join(still, ", "), "fix", fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE ..., or leave them off on purpose", pgquote.Ident(r.opts.Publication)))
		}
	}
	if len(newFilters) > 0 {
		r.log.Warn("relay: row filters on published tables: changes outside them get no wake", "publication", r.opts.Publication,
			"filters", strings.Join(newFilters, "; "))
	}
	s.seen = now
	return nil
}

// watchPublication checks, with each look at the server while streaming,
// that the publication still publishes what the relay NOTIFYs. A change
// that stops it (ALTER PUBLICATION ... SET (publish = ...), a DROP) ends
// the session with the fix: the changes committed meanwhile are not in
// the stream. A resync is recorded in the slot first, so the session that
// streams after the fix NOTIFYs every channel once for them.
func (s *session) watchPublication(ctx context.Context) error {
	r := s.r
	if s.published == "" {
		return r.publicationDropped(nil)
	}
	pub, err := ParseOps(strings.TrimPrefix(s.published, "+"))
	if strings.TrimPrefix(s.published, "+") == "" {
		pub, err = 0, nil
	}
	if err != nil || r.opts.Ops&^pub == 0 {
		return nil
	}
	if s.owedInSlot() {
		if _, err := query(ctx, s.nc, `SELECT pg_logical_emit_message(true, $1, $2)::text`, resyncPrefix, r.opts.Slot); err != nil {
			return fmt.Errorf("record a resync: %w", err)
		}
	}
	perr := r.checkPublished(strings.TrimPrefix(s.published, "+"))
	var ce *ConfigError
	if errors.As(perr, &ce) {
		then := "once fixed, the relay NOTIFYs every channel once"
		if !s.owedInSlot() && !r.opts.TemporarySlot { // PostgreSQL 13: no messages
			then = "once fixed, restart the workers or NOTIFY their channels"
		}
		return configErrorf(nil, "%s (changed while the relay ran: changes committed since got no wake; %s)", ce.Msg, then)
	}
	return perr
}

// behindBytes is the WAL the slot may hold at every look for MaxLag
// without the relay counting it as lag: more than a busy server writes
// between two looks of an idle relay, less than one long transaction.
const behindBytes = 16 << 20

// maxLagFloor is the least lag the relay can tell from an idle one's: two
// looks at the server (every tick, at most 2 s apart) and the keepalive in
// between. A --max-lag below it is said at the floor instead.
func maxLagFloor(tick time.Duration) time.Duration { return 2*tick + time.Second }
