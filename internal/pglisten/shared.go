package pglisten

// What the loop-driven Conn (Unix only) and Plain (everywhere) share.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/pgquote"
)

// checkEvery is how many health-check intervals without any notification
// pass before the health check sends the end-to-end NOTIFY instead of the
// empty query (1 s at the default interval).
const checkEvery = 4

// ErrNotDelivered wraps every reason the delivery check failed: the
// connection answers but notifications do not (provably) arrive on it.
var ErrNotDelivered = errors.New("listener: notifications do not arrive on this connection")

// poolerAdvice is the most likely reason a check from a second
// session failed: the one-line advice the hub logs.
const poolerAdvice = "a transaction-pooling PgBouncer? use a direct URL"

// newCheckChannel names a Conn's private channel: unique per process and
// Conn, so that hubs on one database never see each other's checks.
func newCheckChannel() string {
	return fmt.Sprintf("listenhub.check.%d.%08x", os.Getpid(), rand.Uint32())
}

// appendNotify appends `NOTIFY "ch", 'payload'` (the payload a string
// literal, its quotes doubled: standard_conforming_strings is on).
func appendNotify(dst []byte, ch, payload string) []byte {
	dst = pgquote.AppendIdent(append(dst, "NOTIFY "...), ch)
	dst = append(dst, ", '"...)
	dst = append(dst, strings.ReplaceAll(payload, "'", "''")...)
	return append(dst, '\'')
}

// notifyFrom sends NOTIFY ch, payload from a connection of its own, made
// with cfg (application_name suffixed "-check", so that a census of the
// hub's backends does not count it), and closes it.
func notifyFrom(cfg *pgconn.Config, ch, payload string) error {
	cc := cfg.Copy()
	// Through a transaction pooler this session may get the very server
	// that LISTENs, and hear the NOTIFY itself: that must not count.
	cc.OnNotification, cc.OnNotice = nil, nil
	if app := cc.RuntimeParams["application_name"]; app != "" {
		cc.RuntimeParams["application_name"] = app + "-check"
	}
	timeout := cc.ConnectTimeout
	if timeout <= 0 {
		timeout = defaultConnectTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pc, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer pc.Close(ctx)
	_, err = pc.Exec(ctx, string(appendNotify(nil, ch, payload))).ReadAll()
	return err
}

// connectErr says why a connection attempt failed, the server's own words
// first. pgconn's ConnectError (which names host, user and database, never
// the password) lists every attempt in order, so with the default
// sslmode=prefer a server without TLS made an authentication failure read
// "tls error: server refused TLS connection" before the real cause. When
// the server refused us (a PgError: bad password, no such role or
// database), that is the message; the whole error stays in the chain.
func connectErr(err error) error {
	var pe *pgconn.PgError
	var ce *pgconn.ConnectError
	if errors.As(err, &pe) && errors.As(err, &ce) && ce.Config != nil {
		return &causeFirst{msg: fmt.Sprintf("listener: connect to `user=%s database=%s`: %s", ce.Config.User, ce.Config.Database, pe.Error()), err: err}
	}
	return fmt.Errorf("listener: connect: %w", err)
}

// causeFirst is an error whose message is chosen (connectErr) while errors.Is
// and errors.As still see the one it stands for.
type causeFirst struct {
	msg string
	err error
}

func (e *causeFirst) Error() string { return e.msg }
func (e *causeFirst) Unwrap() error { return e.err }

// maxBatchBytes bounds one batch query. The server accepts up to 1 GB, but a
// bounded batch keeps the write and the server's parse small; more commands
// simply go in the next batch.
const maxBatchBytes = 256 << 10
