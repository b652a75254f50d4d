package pglisten

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/listenhub/listenhub/internal/pgquote"
)

// The loop-driven connection parses the backend framing itself (1-byte type,
// 4-byte big-endian length that counts itself, body) instead of running
// pgproto3.Frontend over a loop reader. The framing is trivial, and parsing
// it in place means a NotificationResponse is handed to the callback as two
// sub-slices of the read buffer: no message struct, no string conversion, no
// allocation per notification, and no reader that must return a sentinel
// error to stop io.ReadAtLeast from spinning. pgproto3 is still used for the
// rare messages whose bodies are worth a struct (ErrorResponse,
// NoticeResponse) and for nothing on the hot path.

// Backend message types the listener handles.
const (
	msgNotification    = 'A'
	msgCommandComplete = 'C'
	msgDataRow         = 'D'
	msgErrorResponse   = 'E'
	msgEmptyQuery      = 'I'
	msgBackendKeyData  = 'K'
	msgNotice          = 'N'
	msgParameterStatus = 'S'
	msgRowDescription  = 'T'
	msgReadyForQuery   = 'Z'
)

// maxMessageLen bounds one backend message. A notification is at most ~8 KB
// plus its channel name; error and notice texts are small. Anything larger
// on a LISTEN connection is a corrupt stream, and refusing it before
// buffering keeps a bad length from making the hub allocate gigabytes.
const maxMessageLen = 1 << 20

// errProtocol marks a malformed backend stream: the connection is dropped.
var errProtocol = errors.New("listener: protocol error")

// nextMessage splits the first backend message off buf. It returns n == 0
// when buf does not hold a whole message yet (need more bytes: at least
// want in total), and an error for an impossible length.
func nextMessage(buf []byte) (typ byte, body []byte, n, want int, err error) {
	if len(buf) < 5 {
		return 0, nil, 0, 5, nil
	}
	l := binary.BigEndian.Uint32(buf[1:5])
	if l < 4 || l > maxMessageLen {
		return 0, nil, 0, 0, fmt.Errorf("%w: message %q with length %d", errProtocol, buf[0], l)
	}
	total := 1 + int(l)
	if len(buf) < total {
		return 0, nil, 0, total, nil
	}
	return buf[0], buf[5:total], total, total, nil
}

// parseNotification splits a NotificationResponse body (int32 pid, channel
// cstring, payload cstring) into sub-slices of body, without copying.
func parseNotification(body []byte) (channel, payload []byte, ok bool) {
	if len(body) < 4 {
		return nil, nil, false
	}
	rest := body[4:]
	i := bytes.IndexByte(rest, 0)
	if i < 0 {
		return nil, nil, false
	}
	channel, rest = rest[:i], rest[i+1:]
	j := bytes.IndexByte(rest, 0)
	if j < 0 {
		return nil, nil, false
	}
	return channel, rest[:j], true
}

// parseError decodes an ErrorResponse (or NoticeResponse) body.
func parseError(body []byte) (*pgconn.PgError, error) {
	var m pgproto3.ErrorResponse
	if err := m.Decode(body); err != nil {
		return nil, fmt.Errorf("%w: %w", errProtocol, err)
	}
	return pgconn.ErrorResponseToPgError(&m), nil
}

// fatalSeverity reports whether an ErrorResponse ends the session (the
// server closes the connection after it, e.g. pg_terminate_backend's
// "terminating connection due to administrator command").
func fatalSeverity(e *pgconn.PgError) bool {
	s := e.SeverityUnlocalized
	if s == "" {
		s = e.Severity
	}
	return s == "FATAL" || s == "PANIC"
}

// command is one Listen or Unlisten.
type command struct {
	listen  bool
	channel string
	done    func(error) // nil for the internal re-LISTENs of a resync
	resync  bool        // part of the re-LISTEN of the whole set after a reconnect
	waiting bool        // in the pending queue (not sent, not finished)
	// expiring: its CommandTimeout runs (it waits for a connection),
	// ending at deadline. See Conn.expq.
	expiring bool
	deadline time.Time
}

// appendCommand appends one statement of a batch: `LISTEN "ch"`.
func appendCommand(dst []byte, listen bool, ch string) []byte {
	if listen {
		dst = append(dst, "LISTEN "...)
	} else {
		dst = append(dst, "UNLISTEN "...)
	}
	return pgquote.AppendIdent(dst, ch)
}

// appendQuery appends a simple-protocol Query message carrying sql.
func appendQuery(dst []byte, sql []byte) []byte {
	dst = append(dst, 'Q')
	dst = binary.BigEndian.AppendUint32(dst, uint32(4+len(sql)+1))
	dst = append(dst, sql...)
	return append(dst, 0)
}

// beginQuery starts a Query message in dst; finishQuery patches its length
// after the statements were appended in place (no second buffer).
func beginQuery(dst []byte) ([]byte, int) {
	start := len(dst)
	dst = append(dst, 'Q', 0, 0, 0, 0)
	return dst, start
}

func finishQuery(dst []byte, start int) []byte {
	dst = append(dst, 0)
	binary.BigEndian.PutUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// terminate is the Terminate message.
var terminate = []byte{'X', 0, 0, 0, 4}

// Batch outcome. A multi-statement simple Query runs as one implicit
// transaction: when statement k fails, Postgres rolls back the statements
// before it (their CommandComplete notwithstanding) and skips the ones after
// it. So only the failing statement is failed; every other one is sent again.
//
// Which statement failed is counted from the CommandCompletes that came
// before the ErrorResponse, with two exceptions. An error before the first
// CommandComplete may belong to the whole query string (a syntax or
// encoding error is raised before any statement runs), so when the batch
// had more than one command nobody is blamed: the first command is sent
// again on its own, which settles it, and the rest follow in a new batch.
// An error after every statement completed came from the implicit commit:
// all of them failed.
type verdict int

const (
	allDone    verdict = iota // every command succeeded
	oneFailed                 // commands[failed] failed, the others go again
	allFailed                 // every command failed with the error
	isolateOne                // nobody failed yet: retry, the first one alone
)

func settle(n, completes int, failed bool) (v verdict, idx int) {
	switch {
	case !failed:
		return allDone, -1
	case completes >= n:
		return allFailed, -1
	case completes == 0 && n > 1:
		return isolateOne, -1
	default:
		return oneFailed, completes
	}
}
