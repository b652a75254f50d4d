package relay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The relay decodes the few pgoutput messages it needs itself instead of
// using a library (docs/design.md, "Relay"): it needs the relation of each
// change, never the tuple, so a change costs a type byte and four bytes of
// relation id, with no allocation, whatever the size of the row.
//
// Protocol version 1 (PostgreSQL 10 and later), without streaming of
// in-progress transactions: a transaction arrives as Begin, changes and
// Commit, once it has committed.

// pgEpoch is the zero of the replication protocol's timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func pgTime(us int64) time.Time { return pgEpoch.Add(time.Duration(us) * time.Microsecond) }

func toPGTime(t time.Time) int64 { return t.Sub(pgEpoch).Microseconds() }

var errShort = errors.New("relay: pgoutput message too short")

// op is a kind of row change, and the bit of it in an ops set.
type op uint8

const (
	opInsert op = iota
	opUpdate
	opDelete
	opTruncate
	numOps
)

// opNames are the {op} of the channel template: TG_OP's spelling, as
// pgmq's trigger uses it.
var opNames = [numOps]string{"INSERT", "UPDATE", "DELETE", "TRUNCATE"}

// xlogData is the header of a CopyData 'w' message of the walsender.
type xlogData struct {
	walStart, walEnd uint64
	data             []byte
}

func parseXLogData(b []byte) (xlogData, error) {
	if len(b) < 24 {
		return xlogData{}, errShort
	}
	return xlogData{
		walStart: binary.BigEndian.Uint64(b),
		walEnd:   binary.BigEndian.Uint64(b[8:]),
		data:     b[24:],
	}, nil
}

// keepalive is a CopyData 'k' message: the walsender's position and
// whether it wants a status update now.
type keepalive struct {
	walEnd uint64
	reply  bool
}

func parseKeepalive(b []byte) (keepalive, error) {
	if len(b) < 17 {
		return keepalive{}, errShort
	}
	return keepalive{walEnd: binary.BigEndian.Uint64(b), reply: b[16] != 0}, nil
}

// appendStandbyStatus appends a complete CopyData message carrying a
// standby status update ('r') that reports lsn as written, flushed and
// applied: the slot's confirmed_flush_lsn moves to it.
func appendStandbyStatus(dst []byte, lsn uint64, now time.Time) []byte {
	dst = append(dst, 'd', 0, 0, 0, 4+1+8*4+1, 'r')
	dst = binary.BigEndian.AppendUint64(dst, lsn)
	dst = binary.BigEndian.AppendUint64(dst, lsn)
	dst = binary.BigEndian.AppendUint64(dst, lsn)
	dst = binary.BigEndian.AppendUint64(dst, uint64(toPGTime(now)))
	return append(dst, 0)
}

// begin is pgoutput's Begin.
type begin struct {
	finalLSN   uint64
	commitTime time.Time
	xid        uint32
}

func parseBegin(b []byte) (begin, error) {
	if len(b) < 20 {
		return begin{}, errShort
	}
	return begin{
		finalLSN:   binary.BigEndian.Uint64(b),
		commitTime: pgTime(int64(binary.BigEndian.Uint64(b[8:]))),
		xid:        binary.BigEndian.Uint32(b[16:]),
	}, nil
}

// commit is pgoutput's Commit.
type commit struct {
	commitLSN, endLSN uint64
	commitTime        time.Time
}

func parseCommit(b []byte) (commit, error) {
	if len(b) < 25 {
		return commit{}, errShort
	}
	return commit{
		commitLSN:  binary.BigEndian.Uint64(b[1:]),
		endLSN:     binary.BigEndian.Uint64(b[9:]),
		commitTime: pgTime(int64(binary.BigEndian.Uint64(b[17:]))),
	}, nil
}

// relationMsg is the part of pgoutput's Relation the relay uses: the
// columns are skipped.
type relationMsg struct {
	id           uint32
	schema, name string
}

func parseRelation(b []byte) (relationMsg, error) {
	if len(b) < 4 {
		return relationMsg{}, errShort
	}
	r := relationMsg{id: binary.BigEndian.Uint32(b)}
	var ok bool
	rest := b[4:]
	if r.schema, rest, ok = cstring(rest); !ok {
		return r, errShort
	}
	if r.name, _, ok = cstring(rest); !ok {
		return r, errShort
	}
	return r, nil
}

func cstring(b []byte) (string, []byte, bool) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:], true
		}
	}
	return "", nil, false
}

// changeRelation returns the relation id of an Insert, Update or Delete:
// the first four bytes; the tuple after them is never read.
func changeRelation(b []byte) (uint32, error) {
	if len(b) < 4 {
		return 0, errShort
	}
	return binary.BigEndian.Uint32(b), nil
}

// truncateRelations calls f with each relation id of a Truncate.
func truncateRelations(b []byte, f func(uint32)) error {
	if len(b) < 5 {
		return errShort
	}
	n := binary.BigEndian.Uint32(b)
	b = b[5:]
	if uint64(len(b)) < 4*uint64(n) {
		return errShort
	}
	for i := uint32(0); i < n; i++ {
		f(binary.BigEndian.Uint32(b[4*i:]))
	}
	return nil
}

// formatLSN spells an LSN the way PostgreSQL does: 16/B374D848.
func formatLSN(lsn uint64) string { return fmt.Sprintf("%X/%X", lsn>>32, uint32(lsn)) }

// parseLSN reads PostgreSQL's spelling of an LSN.
func parseLSN(s string) (uint64, error) {
	var hi, lo uint32
	if _, err := fmt.Sscanf(s, "%X/%X", &hi, &lo); err != nil {
		return 0, fmt.Errorf("relay: bad LSN %q", s)
	}
	return uint64(hi)<<32 | uint64(lo), nil
}

// logicalMessage is pgoutput's Message (pg_logical_emit_message, sent with
// the messages option): its prefix and content; the flags and position
// before them are skipped.
type logicalMessage struct {
	prefix  string
	content []byte
}

func parseMessage(b []byte) (logicalMessage, error) {
	if len(b) < 9 {
		return logicalMessage{}, errShort
	}
	prefix, rest, ok := cstring(b[9:])
	if !ok || len(rest) < 4 {
		return logicalMessage{}, errShort
	}
	n := binary.BigEndian.Uint32(rest)
	if uint64(len(rest)-4) < uint64(n) {
		return logicalMessage{}, errShort
	}
	return logicalMessage{prefix: prefix, content: rest[4 : 4+n]}, nil
}
