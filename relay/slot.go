package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/pgquote"
)

// The replication slot: made or checked at the start of a session, dropped
// when it cannot be used, and the resync it owes recorded in it.

// owedInSlot reports whether a new slot's resync is recorded in the slot
// itself: a logical message written right after its creation, which every
// session decodes (and NOTIFYs every channel for) until one has NOTIFYed
// it and confirmed past it. A temporary slot dies with its session, and
// PostgreSQL 13 sends no messages: their resync is sent at once.
func (s *session) owedInSlot() bool { return !s.r.opts.TemporarySlot && s.ver >= 140000 }

// resyncPrefix is the prefix of the logical message that records a resync
// owed (its content is the slot's name).
const resyncPrefix = "listenhub.resync"

// errSlotRecreated ends a session whose slot was dropped to be created
// again: the next session starts at once.
var errSlotRecreated = errors.New("the replication slot was dropped to be created again")

// dropSlot drops the slot (--recreate-invalid-slot), waiting up to 10 s
// for a walsender of ours that still holds it to go away.
func (s *session) dropSlot(ctx context.Context, reason string) error {
	r := s.r
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows, err := query(ctx, s.nc, `SELECT (SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE slot_name = $1 AND NOT active) IS NOT NULL OR NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)`, r.opts.Slot)
		if err != nil {
			return fmt.Errorf("drop the replication slot: %w", err)
		}
		if rows[0][0] == "t" || rows[0][0] == "true" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("drop the replication slot: still in use after 10s")
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	r.log.Warn("relay dropped the replication slot to create it again (--recreate-invalid-slot); the new slot NOTIFYs every channel once",
		"slot", r.opts.Slot, "reason", reason)
	return nil
}

// endOwnWalsender ends the walsender that holds the slot when it is the one
// of this relay's previous session (the server had not noticed that
// session's end), and reports whether it was.
func (s *session) endOwnWalsender(ctx context.Context, old int, first bool) bool {
	if old == 0 || old == s.walsender {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := query(cctx, s.nc, `SELECT coalesce((SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1), 0)::text`, s.r.opts.Slot)
	if err != nil {
		return false
	}
	if rows[0][0] == "0" && !first {
		// Released since START_REPLICATION found it busy: the old
		// walsender, asked to end, has exited. Try again at once
		// rather than stand by for it.
		return true
	}
	if rows[0][0] != strconv.Itoa(old) {
		return false
	}
	if first {
		if _, err := query(cctx, s.nc, `SELECT pg_terminate_backend($1::int)::text`, rows[0][0]); err != nil {
			return false
		}
		s.r.log.Info("relay ended its own previous walsender, which still held the slot", "pid", old)
	}
	return true
}

// slotInfo is what pg_replication_slots says of the slot ("" fields: no
// such slot).
type slotInfo struct {
	plugin, typ, sameDB, walStatus string
}

// movedSlot finds a slot whose confirmed position is past the one this
// relay confirmed last (pg_replication_slot_advance, or another consumer
// reading it between two sessions): what lay between got no wake. It is
// logged, and a resync is owed.
func (s *session) movedSlot() {
	r := s.r
	own := r.ownConfirmed
	at, err := parseLSN(s.confirmedLSN)
	if own == 0 || err != nil || at <= own {
		return
	}
	r.resyncOwed.Store(true)
	r.log.Warn("relay: the slot moved past what this relay confirmed (another relay took over meanwhile, its standby say, or pg_replication_slot_advance, or another consumer read it); NOTIFYing every channel once",
		"slot", r.opts.Slot, "confirmed_by_this_relay", formatLSN(own), "slot_confirmed", s.confirmedLSN)
}

// ensureSlot creates the slot when it is missing (or always, when
// temporary), on the replication connection. created says the slot is new
// (a resync is due). A slot name taken by another relay's temporary slot is
// errSlotBusy.
//
// A permanent slot's resync is owed until it has been sent: the logical
// message that records it (owedInSlot) is written right after the
// creation, on the same connection, and every session decodes it until one
// has NOTIFYed it. (The walsender takes no second query while it creates
// the slot, so the two cannot share a write: a process killed in the one
// round trip between them loses the resync. A connection lost there is
// covered: the relay remembers the message is owed.)
func (s *session) ensureSlot(ctx context.Context, slot slotInfo) (created bool, err error) {
	r := s.r
	if !r.opts.TemporarySlot && slot.typ != "" {
		if slot.typ != "logical" || slot.plugin != "pgoutput" || slot.sameDB != "true" {
			return false, configErrorf(nil, "replication slot %s exists but is not a pgoutput slot of this database (type %s, plugin %s): drop it (SELECT pg_drop_replication_slot(%s)) or choose another --slot",
				pgquote.Literal(r.opts.Slot), slot.typ, slot.plugin, pgquote.Literal(r.opts.Slot))
		}
		return false, nil
	}
	sql := "CREATE_REPLICATION_SLOT " + pgquote.Ident(r.opts.Slot)
	if r.opts.TemporarySlot {
		sql += " TEMPORARY"
	}
	sql += " LOGICAL pgoutput NOEXPORT_SNAPSHOT"
	// Creating a slot waits for every transaction running when it began
	// to end: say which, every slotWaitLog.
	waitDone := make(chan struct{})
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		s.logSlotWait(ctx, waitDone)
	}()
	err = s.simpleQuery(ctx, sql)
	close(waitDone)
	<-waited
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42710" { // duplicate_object: another relay made it
			if r.opts.TemporarySlot {
				return false, fmt.Errorf("%w: %s", errSlotBusy, pe.Message)
			}
			return false, nil
		}
		return false, fmt.Errorf("create the replication slot: %w", err)
	}
	r.log.Info("relay created the replication slot", "slot", r.opts.Slot, "temporary", r.opts.TemporarySlot)
	if s.owedInSlot() {
		r.resyncOwed.Store(true)
		if err := s.recordResync(ctx); err != nil {
			return false, err
		}
	}
	return true, nil
}

// recordResync writes the logical message that records a resync owed, on
// the replication connection (before START_REPLICATION).
// resyncSQL records a resync in the slot: a transactional logical message
// the stream delivers in commit order.
func (s *session) resyncSQL() string {
	return "SELECT pg_logical_emit_message(true, " + pgquote.Literal(resyncPrefix) + ", " + pgquote.Literal(s.r.opts.Slot) + ")"
}

// recordResyncPlain records a resync on the plain connection, once the
// replication connection streams.
func (s *session) recordResyncPlain(ctx context.Context) error {
	if err := s.nc.Exec(ctx, s.resyncSQL()).Close(); err != nil {
		return fmt.Errorf("record the resync: %w", err)
	}
	s.r.resyncOwed.Store(false)
	return nil
}

func (s *session) recordResync(ctx context.Context) error {
	if err := s.simpleQuery(ctx, s.resyncSQL()); err != nil {
		return fmt.Errorf("record the new slot's resync: %w", err)
	}
	s.r.resyncOwed.Store(false)
	return nil
}

// slotWaitLog is how often a slot creation that waits is logged.
var slotWaitLog = 10 * time.Second

// logSlotWait logs, every slotWaitLog until done, the transactions a slot
// creation waits for: the oldest running transaction with an xid, and the
// oldest prepared one.
func (s *session) logSlotWait(ctx context.Context, done <-chan struct{}) {
	r := s.r
	t := time.NewTicker(slotWaitLog)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		look := fmt.Sprintf(`SELECT pid::text, extract(epoch FROM now() - xact_start)::int::text, coalesce(state, ''), left(query, 80)
	FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid NOT IN (pg_backend_pid(), %d) ORDER BY xact_start LIMIT 1;
SELECT gid, extract(epoch FROM now() - prepared)::int::text FROM pg_prepared_xacts ORDER BY prepared LIMIT 1`, s.walsender)
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := s.multi(qctx, look)
		if err != nil && s.nc.IsClosed() {
			// The NOTIFY connection ended during the wait
			// (idle_session_timeout, a terminated backend): the wait
			// is still said, looked at on a connection of its own.
			if c, cerr := r.connect(qctx, false); cerr == nil {
				res, err = s.multiOn(qctx, c, look)
				c.Close(qctx)
			}
		}
		cancel()
		if err != nil || len(res) != 2 {
			res = [][][]string{nil, nil}
		}
		args := []any{"slot", r.opts.Slot, "waiting", time.Since(start).Round(time.Second)}
		var what string
		if len(res[0]) == 1 {
			row := res[0][0]
			args = append(args, "pid", row[0], "xact_age_seconds", row[1], "state", row[2], "query", row[3])
			what = fmt.Sprintf("transaction of pid %s (running %ss, %s)", row[0], row[1], row[2])
		}
		if len(res[1]) == 1 {
			row := res[1][0]
			args = append(args, "prepared_gid", row[0], "prepared_age_seconds", row[1])
			if what != "" {
				what += " and "
			}
			what += fmt.Sprintf("prepared transaction %s (%ss old; COMMIT PREPARED or ROLLBACK PREPARED ends it)", pgquote.Literal(row[0]), row[1])
		}
		if what == "" {
			what = "transactions running when it began"
		}
		r.setLastError("creating the replication slot waits for the " + what + " to end")
		r.log.Warn("relay: creating the replication slot waits for the transactions running when it began to end", args...)
	}
}
