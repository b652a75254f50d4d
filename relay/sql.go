package relay

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/listenhub/listenhub/internal/pgquote"
)

// The relay's SQL: queries over the simple protocol on a replication or a
// plain connection, the preflight's statements, and the server's errors.

// query runs one statement with text parameters and returns its rows as
// strings (NULL as "").
func query(ctx context.Context, c *pgconn.PgConn, sql string, args ...string) ([][]string, error) {
	params := make([][]byte, len(args))
	for i, a := range args {
		params[i] = []byte(a)
	}
	res := c.ExecParams(ctx, sql, params, nil, nil, nil).Read()
	if res.Err != nil {
		return nil, res.Err
	}
	rows := make([][]string, len(res.Rows))
	for i, row := range res.Rows {
		rows[i] = make([]string, len(row))
		for j, v := range row {
			rows[i][j] = string(v)
		}
	}
	return rows, nil
}

// preflightSQL reads, in one round trip, everything the relay checks
// before it streams: settings and role; the publication; its tables; the
// slot; the server's xmax and the slot's lag. (A new backend's first
// catalog reads are slow, and a restart waits for them.)
const preflightSQL = `SELECT current_setting('server_version_num'), current_setting('wal_level'),
	current_setting('max_wal_senders'), current_setting('max_replication_slots'), pg_is_in_recovery()::text,
	(r.rolreplication OR r.rolsuper)::text, current_user,
	` + publishedSQL + `
	FROM pg_roles r WHERE r.rolname = current_user;
SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2;
SELECT plugin, slot_type, (database = current_database())::text, coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $2;
` + xidRefSQL

// publishedSQL is the publication's publish parameter, "+insert,update"
// ("+" when it publishes nothing), or "" when it does not exist.
const publishedSQL = `coalesce((SELECT '+' || concat_ws(',', CASE WHEN pubinsert THEN 'insert' END, CASE WHEN pubupdate THEN 'update' END,
		CASE WHEN pubdelete THEN 'delete' END, CASE WHEN pubtruncate THEN 'truncate' END)
		FROM pg_publication WHERE pubname = $1), '')`

// xidRefSQL reads the server's xmax as a full xid, the slot's lag, the
// publication's publish parameter (watched while streaming), the slot's
// confirmed position and walsender (watched by a standby) and
// wal_sender_timeout.
const xidRefSQL = `SELECT pg_snapshot_xmax(pg_current_snapshot())::text,
	CASE WHEN NOT pg_is_in_recovery() THEN (SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint::text FROM pg_replication_slots WHERE slot_name = $2) END,
	` + publishedSQL + `,
	coalesce((SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $2), ''),
	coalesce((SELECT active_pid::text FROM pg_replication_slots WHERE slot_name = $2), ''),
	current_setting('wal_sender_timeout'),
	(SELECT (rolreplication OR rolsuper)::text FROM pg_roles WHERE rolname = session_user)`

// multi runs statements as one simple query (one round trip, one implicit
// transaction), with $1 and $2 replaced by the publication and slot names
// as literals, and returns each statement's rows.
func (s *session) multi(ctx context.Context, sql string) ([][][]string, error) {
	return s.multiOn(ctx, s.nc, sql)
}

// multiOn is multi on another connection than the session's.
func (s *session) multiOn(ctx context.Context, c *pgconn.PgConn, sql string) ([][][]string, error) {
	sql = strings.NewReplacer("$1", pgquote.Literal(s.r.opts.Publication), "$2", pgquote.Literal(s.r.opts.Slot)).Replace(sql)
	results, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	out := make([][][]string, len(results))
	for i, res := range results {
		for _, row := range res.Rows {
			r := make([]string, len(row))
			for j, v := range row {
				r[j] = string(v)
			}
			out[i] = append(out[i], r)
		}
	}
	return out, nil
}

// simpleQuery runs one simple Query on the replication connection and
// returns its error (a *pgconn.PgError when the server refused it).
func (s *session) simpleQuery(ctx context.Context, sql string) error {
	q, err := (&pgproto3.Query{String: sql}).Encode(nil)
	if err != nil {
		return err
	}
	if _, err := s.rc.Write(q); err != nil {
		return err
	}
	var qerr error
	for {
		typ, body, err := s.readMsg()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if typ == 'E' && qerr == nil {
			qerr = pgError(body)
		}
		if typ == 'Z' {
			return qerr
		}
	}
}

func pgError(body []byte) *pgconn.PgError {
	var m pgproto3.ErrorResponse
	if err := m.Decode(body); err != nil {
		return &pgconn.PgError{Severity: "ERROR", Message: "undecodable ErrorResponse"}
	}
	return pgconn.ErrorResponseToPgError(&m)
}

// quoteIdent quotes an SQL identifier.

// quoteLiteral quotes an SQL string literal (standard_conforming_strings).

// oneLine flattens a multi-line error into one line.
func oneLine(err error) string {
	s := strings.ReplaceAll(err.Error(), ":\n", ": ")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}
