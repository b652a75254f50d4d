package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/listenhub/listenhub/internal/channame"
	"github.com/listenhub/listenhub/internal/pgquote"
	"github.com/listenhub/listenhub/internal/relayfix"
)

// session is one connection pair: the replication stream and the
// connection that NOTIFYs. Run starts a new one after every loss.
type session struct {
	r  *Relay
	nc *pgconn.PgConn // NOTIFYs, checks, lag; batcher goroutine only
	rc net.Conn       // the replication connection, hijacked
	mr *msgReader     // over rc; reader goroutine only

	tables [][2]string // schema, table of the publication at start
	// seen: the publication's tables and their row filters at the last
	// look while streaming (watchTables); nil before the first.
	seen map[[2]string]string
	// xidRef is a recent xmax of the server as a full 64-bit xid: the
	// 32-bit xids of pgoutput are widened against it (fullXid).
	xidRef uint64
	ver    int // server_version_num
	// walsender is the backend pid of the replication connection.
	walsender int
	// published is the publication's publish parameter as last read
	// ("+insert,update"; "" when the publication is missing), confirmed
	// and activePID the slot's (standby), walSenderTimeout the server's.
	published, confirmedLSN, activePID, walSenderTimeout string
	// replication is the role's REPLICATION (or superuser) attribute as
	// last seen ("true"/"false"); revokedSaid: its loss was said.
	replication string
	revoked     string // the warning that says so, kept while streaming
}

type sessionResult struct {
	active    bool      // the session streamed (the slot was ours)
	streaming time.Time // when it began to
	err       error
}

func (r *Relay) connConfig(replication bool) *pgconn.Config {
	cc := r.opts.ConnConfig.Copy()
	// Always the relay's own name, never the URL's: census counts the
	// hub's backends by theirs.
	cc.RuntimeParams["application_name"] = r.opts.ApplicationName
	if replication {
		cc.RuntimeParams["replication"] = "database"
	} else {
		// A NOTIFY transaction need not wait for its own WAL flush: the
		// change it announces is durable already (the writer's commit),
		// and a NOTIFY never outlives a server crash anyway (listeners
		// are disconnected and re-read). This keeps an fsync per batch
		// off the relay's path.
		cc.RuntimeParams["synchronous_commit"] = "off"
	}
	return cc
}

// connect opens one connection; a refusal that no retry can cure is a
// ConfigError.
func (r *Relay) connect(ctx context.Context, replication bool) (*pgconn.PgConn, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(cctx, r.connConfig(replication))
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			switch pe.Code {
			case "28P01", "28000", "3D000":
				return nil, configErrorf(err, "%s", oneLine(err))
			case "08P01": // protocol violation: a pooler refusing replication=database
				if replication && strings.Contains(pe.Message, "replication") {
					return nil, configErrorf(err, "the replication connection was refused (%s): %s", pe.Message, relayfix.Pooler)
				}
			}
		}
		if replication {
			return nil, fmt.Errorf("replication connection: %w", err)
		}
		return nil, err
	}
	// idle_session_timeout (PostgreSQL 14 on) set for the relay's role
	// would end the NOTIFY connection whenever no wake was due for that
	// long, and with it the session: a reconnect and a replay each time.
	// The relay's connections are never leaked sessions; they opt out.
	// (Not a startup parameter: PostgreSQL 13 does not know it.)
	if serverMajor(c) >= 14 {
		if _, err := c.Exec(cctx, "SET idle_session_timeout = 0").ReadAll(); err != nil {
			c.Close(context.Background())
			return nil, fmt.Errorf("SET idle_session_timeout: %w", err)
		}
	}
	return c, nil
}

// notReplication names the cause of the syntax error a plain session
// answers a replication command with (CREATE_REPLICATION_SLOT,
// START_REPLICATION): the connection was opened with replication=database,
// so something between the relay and the server dropped that parameter,
// which a transaction-mode pooler does (PgBouncer refuses it instead, and
// connect says so). Retrying cannot help: a *ConfigError with the fix.
func notReplication(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42601" {
		return configErrorf(err, "the replication connection is a plain session (a replication command got %s): a connection pooler in between dropped the replication=database parameter: %s",
			pgLine(pe), relayfix.Pooler)
	}
	return err
}

// serverMajor is the server's major version from its server_version
// (e.g. "15.4 (Debian …)" is 15), 0 if unknown.
func serverMajor(c *pgconn.PgConn) int {
	v := c.ParameterStatus("server_version")
	i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if i >= 0 {
		v = v[:i]
	}
	n, _ := strconv.Atoi(v)
	return n
}

// session runs one session until it fails or ctx is done.
func (r *Relay) session(ctx context.Context, everActive bool) (res sessionResult) {
	t0 := time.Now()
	// The two connections are opened at once: a restart (or a
	// takeover) is streaming again one connection set-up sooner.
	type dialed struct {
		c   *pgconn.PgConn
		err error
	}
	rch := make(chan dialed, 1)
	go func() {
		c, err := r.connect(ctx, true)
		rch <- dialed{c, err}
	}()
	var rconn *pgconn.PgConn
	defer func() {
		if rconn == nil {
			if d := <-rch; d.c != nil {
				d.c.Close(context.Background())
			}
		}
	}()
	nc, err := r.connect(ctx, false)
	if err != nil {
		return sessionResult{err: err}
	}
	defer nc.Close(context.Background())
	s := &session{r: r, nc: nc}
	slot, err := s.preflight(ctx, everActive)
	if err != nil {
		return sessionResult{err: err}
	}
	if slot.walStatus == "lost" {
		reason := fmt.Sprintf("replication slot %s is invalidated (wal_status lost: it fell further behind than max_slot_wal_keep_size allows, and the WAL it needed is gone), so the changes it missed got no wake",
			pgquote.Literal(r.opts.Slot))
		if !r.opts.RecreateInvalidSlot {
			return sessionResult{err: configErrorf(nil, "%s: %s", reason, relayfix.RecreateSlot(r.opts.Slot))}
		}
		if err := s.dropSlot(ctx, reason); err != nil {
			return sessionResult{err: err}
		}
		slot = slotInfo{}
	}
	t1 := time.Now()
	d := <-rch
	if d.err != nil {
		rconn = d.c // nil
		rch <- d
		return sessionResult{err: d.err}
	}
	rconn = d.c
	s.walsender = int(rconn.PID())
	hj, err := rconn.Hijack()
	if err != nil {
		rconn.Close(context.Background())
		return sessionResult{err: err}
	}
	s.rc = hj.Conn
	defer s.rc.Close()
	// Closing the replication socket is what ends a read in progress.
	stop := context.AfterFunc(ctx, func() { s.rc.Close() })
	defer stop()
	s.mr = newMsgReader(s.rc)
	var created bool
	for {
		created, err = s.ensureSlot(ctx, slot)
		if !errors.Is(err, errSlotBusy) {
			break
		}
		// Another relay's temporary slot has the name.
		if !r.standBy(ctx, everActive, err) {
			return sessionResult{err: ctx.Err()}
		}
	}
	if err != nil {
		return sessionResult{err: notReplication(err)}
	}
	if !created {
		s.movedSlot()
	}
	// The previous session's walsender, which may still hold the slot.
	prevWalsender := int(r.walsender.Swap(int32(s.walsender)))
	own := 0 // times the slot was found held by this relay's previous walsender
	for {
		err := s.startReplication(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, errSlotBusy) {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "55000" {
				// The slot was invalidated since the preflight.
				return sessionResult{err: s.undecodable(ctx, fmt.Sprintf("replication slot %s cannot be read (%s)", pgquote.Literal(r.opts.Slot), pgLine(pe)))}
			}
			return sessionResult{err: notReplication(err)}
		}
		if s.endOwnWalsender(ctx, prevWalsender, own == 0) {
			// Not another relay: the walsender of this relay's lost
			// session, which the server has not noticed is gone.
			// It is asked to end, and waited for: never a standby,
			// never a takeover.
			own++
			if own == 50 {
				r.log.Warn("relay: its previous walsender still holds the slot; waiting for it to exit", "pid", prevWalsender)
			}
			r.setLastError(fmt.Sprintf("waiting for this relay's previous walsender (pid %d) to release the slot", prevWalsender))
			if !sleep(ctx, min(time.Duration(own)*20*time.Millisecond, 500*time.Millisecond)) {
				return sessionResult{err: ctx.Err()}
			}
			continue
		}
		if !r.standBy(ctx, everActive, err) {
			return sessionResult{err: ctx.Err()}
		}
		// The standby's lag is the slot's too.
		if err := s.refreshXidRef(ctx); err != nil {
			return sessionResult{err: err}
		}
		s.watchActive()
	}
	r.standbyLogged = false
	r.log.Debug("relay session set up", "connect_and_check", t1.Sub(t0), "total", time.Since(t0))
	prev := State(r.state.Load())
	r.setState(StateActive)
	r.setLastError("")
	streaming := time.Now()
	switch {
	case prev == StateStandby:
		r.takeovers.Add(1)
		r.log.Info("relay took over the slot", "slot", r.opts.Slot)
	case everActive:
		r.reconnects.Add(1)
		// Once a minute at most: a relay that is down streams again for
		// a moment at every retry (each second) before it finds what is
		// still wrong, which its "relay down" line says.
		level := slog.LevelInfo
		if time.Since(r.againLogged) < time.Minute {
			level = slog.LevelDebug
		} else {
			r.againLogged = time.Now()
		}
		r.log.Log(context.Background(), level, "relay streaming again", "slot", r.opts.Slot)
	default:
		r.log.Info("relay streaming", "slot", r.opts.Slot, "temporary", r.opts.TemporarySlot,
			"publication", r.opts.Publication, "tables", len(s.tables), "channel_template", r.opts.ChannelTemplate,
			"ops", r.opts.Ops.String(), "window", r.opts.Window)
	}
	if r.resyncOwed.Load() && s.owedInSlot() {
		// Owed since the start, since a session that created the slot
		// was lost before it could record it, or since the slot moved
		// without this relay: recorded in the slot, on the plain
		// connection now that this relay streams (a standby records
		// nothing), and owed again by the next start until sent.
		if err := s.recordResyncPlain(ctx); err != nil {
			return sessionResult{active: true, streaming: streaming, err: err}
		}
	}
	if (created || r.resyncOwed.Load()) && !s.owedInSlot() {
		// What was committed before the slot existed (or before the
		// position this relay cannot vouch for) is covered by one wake
		// per channel, sent now that every later commit is in the slot.
		if err := s.resync(ctx); err != nil {
			return sessionResult{active: true, streaming: streaming, err: err}
		}
		r.resyncOwed.Store(false)
	}
	// From here the stream closes the socket itself, after its last
	// word on a stop (stream).
	if !stop() {
		return sessionResult{active: true, streaming: streaming, err: ctx.Err()}
	}
	err = s.stream(ctx)
	var pe *pgconn.PgError
	if ctx.Err() == nil && errors.As(err, &pe) && pe.Code == "42704" && strings.Contains(pe.Message, "publication") {
		err = s.publicationGone(ctx, pe)
	}
	return sessionResult{active: true, streaming: streaming, err: err}
}

// publicationGone handles the walsender's "publication does not exist":
// the publication was dropped, or the slot's position predates the
// publication (dropped and created again), whose decoding then fails at
// every attempt.
func (s *session) publicationGone(ctx context.Context, pe *pgconn.PgError) error {
	r := s.r
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := query(cctx, s.nc, `SELECT count(*)::text FROM pg_publication WHERE pubname = $1`, r.opts.Publication)
	if err != nil {
		return fmt.Errorf("%w (and checking the publication: %v)", pe, err)
	}
	if rows[0][0] == "0" {
		return r.publicationDropped(pe)
	}
	return s.undecodable(ctx, fmt.Sprintf("the walsender says %s although the publication exists: the slot's position predates it (it was dropped and created again)", pgLine(pe)))
}

// publicationDropped is the error of a publication dropped while the relay
// ran. With --create-publication and --recreate-invalid-slot the relay has
// the fix: a transient error, after which the next session creates the
// publication and, if the slot cannot decode past the gap, a new slot
// with its resync. Otherwise the fix is named and the relay stops.
func (r *Relay) publicationDropped(cause error) error {
	if r.opts.TemporarySlot {
		// No slot outlives the session: the next one is new, its
		// resync NOTIFYs every channel once.
		if r.opts.CreatePublication != "" {
			r.log.Warn("relay: the publication was dropped while the relay ran; creating it again (--create-publication) on a new temporary slot",
				"publication", r.opts.Publication)
			return fmt.Errorf("publication %s was dropped while the relay ran; creating it again: %w", pgquote.Literal(r.opts.Publication), cmp.Or(cause, errors.New("gone")))
		}
		return configErrorf(cause, "publication %s was dropped while the relay ran: %s; then start the relay again, whose new temporary slot NOTIFYs every channel once",
			pgquote.Literal(r.opts.Publication), relayfix.MissingPublication(r.opts.Publication))
	}
	if r.opts.CreatePublication != "" && r.opts.RecreateInvalidSlot {
		r.log.Warn("relay: the publication was dropped while the relay ran; creating it again (--create-publication), and the slot if it cannot decode past the gap (--recreate-invalid-slot)",
			"publication", r.opts.Publication, "slot", r.opts.Slot)
		msg := fmt.Sprintf("publication %s was dropped while the relay ran; creating it again", pgquote.Literal(r.opts.Publication))
		if cause != nil {
			return fmt.Errorf("%s: %w", msg, cause)
		}
		return errors.New(msg)
	}
	return configErrorf(cause, "publication %s was dropped while the relay ran; the slot cannot decode past that point: %s; then %s",
		pgquote.Literal(r.opts.Publication), relayfix.MissingPublication(r.opts.Publication), relayfix.RecreateSlot(r.opts.Slot))
}

// undecodable is the error, or with RecreateInvalidSlot the recreation, of
// a slot that can no longer decode.
func (s *session) undecodable(ctx context.Context, reason string) error {
	r := s.r
	if r.opts.TemporarySlot {
		// The next session's slot is new anyway, with its resync.
		return fmt.Errorf("%s: a new temporary slot", reason)
	}
	if !r.opts.RecreateInvalidSlot {
		return configErrorf(nil, "%s: %s", reason, relayfix.RecreateSlot(r.opts.Slot))
	}
	s.rc.Close() // the slot is released once our walsender is gone
	if err := s.dropSlot(ctx, reason); err != nil {
		return err
	}
	return errSlotRecreated
}

// withClause finds a WITH (...) in --create-publication: the user chose the
// publication's parameters.
var withClause = regexp.MustCompile(`(?i)\bWITH\s*\(`)

// checkPublished compares the publication's publish parameter (e.g.
// "insert,update") with the ops NOTIFYed. An op NOTIFYed but not published
// would never wake anyone: that is an error naming the fix. Ops published
// and not NOTIFYed cost the walsender for nothing: a hint.
func (r *Relay) checkPublished(published string) error {
	var pub Ops
	if published != "" {
		var err error
		if pub, err = ParseOps(published); err != nil {
			return fmt.Errorf("relay: the publication's publish parameter %q: %w", published, err)
		}
	}
	pubName := pgquote.Ident(r.opts.Publication)
	if missing := r.opts.Ops &^ pub; missing != 0 {
		return configErrorf(nil, "publication %s does not publish %s, which --ops NOTIFYs: %s",
			pgquote.Literal(r.opts.Publication), missing, relayfix.SetPublish(r.opts.Publication, (pub|r.opts.Ops).String()))
	}
	if extra := pub &^ r.opts.Ops; extra != 0 {
		r.log.Info("relay: the publication also publishes changes the relay does not NOTIFY; the walsender sends them for nothing",
			"publication", r.opts.Publication, "unused", extra.String(),
			"fix", "ALTER PUBLICATION "+pubName+" SET (publish = "+pgquote.Literal(r.opts.Ops.String())+")")
	}
	return nil
}

// preflight checks what no retry can fix and reads the publication's
// tables: each misconfiguration is a ConfigError naming the fix.
func (s *session) preflight(ctx context.Context, everActive bool) (slotInfo, error) {
	r := s.r
	res, err := s.multi(ctx, preflightSQL)
	if err != nil {
		return slotInfo{}, err
	}
	if len(res) != 4 || len(res[0]) != 1 || len(res[3]) != 1 {
		return slotInfo{}, errors.New("relay: cannot read the server's settings")
	}
	v := res[0][0]
	ver, _ := strconv.Atoi(v[0])
	s.ver = ver
	user := v[6]
	switch {
	case ver < 130000:
		return slotInfo{}, configErrorf(nil, "PostgreSQL %d.%d is too old for the relay: it needs 13 or later (pg_visible_in_snapshot)", ver/10000, ver%10000/100)
	case v[1] != "logical":
		return slotInfo{}, configErrorf(nil, "wal_level is %s, the relay needs logical: %s", v[1], relayfix.WalLevel)
	case v[2] == "0":
		return slotInfo{}, configErrorf(nil, "max_wal_senders is 0, the relay needs one: run ALTER SYSTEM SET max_wal_senders = 10; then restart PostgreSQL")
	case v[3] == "0":
		return slotInfo{}, configErrorf(nil, "max_replication_slots is 0, the relay needs one: run ALTER SYSTEM SET max_replication_slots = 10; then restart PostgreSQL")
	case v[4] == "true":
		if everActive {
			return slotInfo{}, errors.New("the server is in recovery (a standby, or a failover in progress)")
		}
		return slotInfo{}, configErrorf(nil, "the server is a standby (in recovery): point the relay at the primary, where NOTIFY can run")
	case v[5] != "true":
		return slotInfo{}, configErrorf(nil, "role %s may not open a replication connection: %s", pgquote.Ident(user), relayfix.ReplicationRole(user))
	}
	pub := r.opts.Publication
	tables := res[1]
	if v[7] == "" {
		if r.opts.CreatePublication == "" {
			return slotInfo{}, configErrorf(nil, "publication %s does not exist: %s", pgquote.Literal(pub), relayfix.MissingPublication(pub))
		}
		sql := "CREATE PUBLICATION " + pgquote.Ident(pub) + " FOR " + r.opts.CreatePublication
		if !withClause.MatchString(r.opts.CreatePublication) {
			// Only the ops the relay NOTIFYs: the walsender then sends
			// nothing for the others (a pgmq queue's reads are updates
			// and its acks deletes, two more changes per message).
			sql += " WITH (publish = " + pgquote.Literal(r.opts.Ops.String()) + ")"
		}
		if _, err := s.nc.Exec(ctx, sql).ReadAll(); err != nil {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "42710" { // not a concurrent creation
				return slotInfo{}, configErrorf(err, "cannot create the publication (%s): %s", sql, oneLine(err))
			}
		} else {
			r.log.Info("relay created the publication", "sql", sql)
		}
		if tables, err = query(ctx, s.nc, `SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2`, pub); err != nil {
			return slotInfo{}, err
		}
	} else if err := r.checkPublished(strings.TrimPrefix(v[7], "+")); err != nil {
		return slotInfo{}, err
	}
	s.tables = s.tables[:0]
	for _, row := range tables {
		for o := op(0); o < numOps; o++ {
			if !r.opts.Ops.has(o) {
				continue
			}
			if ch := r.tmpl.channel(row[0], row[1], o); len(ch) > channame.MaxLen {
				return slotInfo{}, configErrorf(nil, "channel %q of table %s.%s is %d bytes, over the %d PostgreSQL keeps: shorten the channel template (%q) or rename the table",
					ch, row[0], row[1], len(ch), channame.MaxLen, r.tmpl.String())
			}
		}
		s.tables = append(s.tables, [2]string{row[0], row[1]})
	}
	var slot slotInfo
	if len(res[2]) == 1 {
		slot = slotInfo{plugin: res[2][0][0], typ: res[2][0][1], sameDB: res[2][0][2], walStatus: res[2][0][3]}
	}
	return slot, s.setXidRef(res[3][0])
}

// refreshXidRef reads the server's xmax again (and the slot's lag).
func (s *session) refreshXidRef(ctx context.Context) error {
	res, err := s.multi(ctx, xidRefSQL)
	if err != nil {
		return err
	}
	if len(res) != 1 || len(res[0]) != 1 {
		return errors.New("relay: cannot read xmax")
	}
	return s.setXidRef(res[0][0])
}

func (s *session) setXidRef(row []string) error {
	x, err := strconv.ParseUint(row[0], 10, 64)
	if err != nil {
		return fmt.Errorf("relay: xmax %q: %w", row[0], err)
	}
	s.xidRef = x
	if len(row) >= 6 {
		s.published, s.confirmedLSN, s.activePID, s.walSenderTimeout = row[2], row[3], row[4], row[5]
	}
	if len(row) >= 7 {
		s.watchReplication(row[6])
	}
	if row[1] != "" {
		if lag, err := strconv.ParseInt(row[1], 10, 64); err == nil {
			s.r.lagBytes.Store(lag)
		}
	}
	return nil
}

// fullXid widens a 32-bit xid of a recent transaction to the 64-bit xid8
// pg_visible_in_snapshot takes, against a recent xmax (ref): the
// transaction is within 2^31 of it.
func fullXid(ref uint64, x uint32) uint64 {
	f := ref&^0xffffffff | uint64(x)
	switch {
	case f > ref+1<<31 && f >= 1<<32:
		f -= 1 << 32
	case f+1<<31 < ref:
		f += 1 << 32
	}
	return f
}

// startReplication sends START_REPLICATION on the hijacked connection and
// waits for the CopyBothResponse. A slot active for another process is
// errSlotBusy.
func (s *session) startReplication(ctx context.Context) error {
	r := s.r
	messages := ""
	if s.ver >= 140000 {
		messages = ", messages 'true'"
	}
	sql := fmt.Sprintf("START_REPLICATION SLOT %s LOGICAL 0/0 (proto_version '1', publication_names %s%s)",
		pgquote.Ident(r.opts.Slot), pgquote.Literal(pgquote.Ident(r.opts.Publication)), messages)
	q, err := (&pgproto3.Query{String: sql}).Encode(nil)
	if err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		s.rc.SetDeadline(dl)
	} else {
		s.rc.SetDeadline(time.Now().Add(30 * time.Second))
	}
	defer s.rc.SetDeadline(time.Time{})
	if _, err := s.rc.Write(q); err != nil {
		return fmt.Errorf("START_REPLICATION: %w", err)
	}
	for {
		typ, body, err := s.readMsg()
		if err != nil {
			return fmt.Errorf("START_REPLICATION: %w", err)
		}
		switch typ {
		case 'W': // CopyBothResponse
			return nil
		case 'E':
			// Read up to ReadyForQuery, so that the connection can
			// ask again.
			pe := pgError(body)
			for typ != 'Z' {
				if typ, _, err = s.readMsg(); err != nil {
					return fmt.Errorf("START_REPLICATION: %w", err)
				}
			}
			if pe.Code == "55006" { // object_in_use: another walsender has the slot
				return fmt.Errorf("%w: %s", errSlotBusy, pe.Message)
			}
			return fmt.Errorf("START_REPLICATION: %w", pe)
		}
	}
}

// maxMessage bounds one message from the server: a walsender message
// carries one row, and a row is at most 1 GB.
const maxMessage = 1<<30 + 1<<20

// readMsg reads one backend message. body is valid until the next call.
func (s *session) readMsg() (byte, []byte, error) { return s.mr.Next() }

// watchActive is a standby's watch of the active relay, after each look at
// the slot: when the slot's confirmed position has not moved for longer
// than the active relay could take while WAL grew past it (a frozen or
// hung relay whose connection the server still holds), or when the slot
// holds more than MaxLagBytes, the standby warns too, and its lag is the
// stall. The server ends such a walsender after wal_sender_timeout; then
// this relay takes over.
func (s *session) watchActive() {
	r := s.r
	w := &r.stall
	now := time.Now()
	lag := r.lagBytes.Load()
	if s.confirmedLSN != w.confirmed || lag <= 0 {
		w.confirmed, w.since = s.confirmedLSN, now
		r.lagSeconds.Store(0)
		if lag <= r.opts.MaxLagBytes {
			r.setWarning("")
			return
		}
	}
	// The active relay reports its position at least every status
	// interval while it is idle, a few milliseconds under load.
	bound := max(r.opts.MaxLag, 3*r.opts.StatusInterval)
	stalled := now.Sub(w.since)
	if stalled > bound {
		r.lagSeconds.Store(int64(stalled))
	}
	if stalled <= bound && lag <= r.opts.MaxLagBytes {
		r.setWarning("")
		return
	}
	fix := s.walSenderTimeoutFix()
	r.setWarning(fmt.Sprintf("the active relay (walsender pid %s) has not confirmed for %v (lag %d bytes): wakes stall until the server ends its walsender after wal_sender_timeout (%s), then this relay takes over; to shorten that, %s",
		s.activePID, stalled.Round(time.Second), lag, s.walSenderTimeout, fix))
	if now.Sub(w.warned) >= time.Minute {
		w.warned = now
		r.log.Warn("relay standby: the active relay is not confirming; wakes stall until the server ends its walsender (wal_sender_timeout), then this relay takes over",
			"slot", r.opts.Slot, "active_pid", s.activePID, "confirmed_lsn", s.confirmedLSN, "unchanged_for", stalled.Round(time.Millisecond),
			"lag_bytes", lag, "max_lag", r.opts.MaxLag, "max_lag_bytes", r.opts.MaxLagBytes, "wal_sender_timeout", s.walSenderTimeout,
			"fix", fix)
	}
}

// walSenderTimeoutFix is the SQL that bounds how long a stuck active relay
// holds the slot: wal_sender_timeout for the relays' role (the active
// relay's next connection takes it), at the relay's own --max-lag.
func (s *session) walSenderTimeoutFix() string {
	role := "CURRENT_USER"
	if cc := s.r.opts.ConnConfig; cc != nil && cc.User != "" {
		role = pgquote.Ident(cc.User)
	}
	d := max(s.r.opts.MaxLag, time.Second).Round(time.Second)
	return fmt.Sprintf("run ALTER ROLE %s SET wal_sender_timeout = '%ds';", role, int(d.Seconds()))
}

// watchReplication says, once, that the role lost its REPLICATION
// attribute while the relay streams: the stream goes on, but the next
// connection (a restart, a lost connection, a takeover) will be refused.
// Only a loss is said: on a managed service the attribute may be false
// from the start, replication granted another way (rds_replication).
func (s *session) watchReplication(now string) {
	was := s.replication
	s.replication = now
	if was != "true" || now != "false" || s.revoked != "" {
		return
	}
	r := s.r
	user := ""
	if cc := r.opts.ConnConfig; cc != nil {
		user = cc.User
	}
	msg := "the role lost its REPLICATION attribute: streaming goes on, but the next connection will be refused; fix: " + relayfix.ReplicationRole(user)
	s.revoked = msg
	r.setWarning(msg)
	r.log.Error("relay: "+msg, "slot", r.opts.Slot)
}
