package client

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/listenhub/listenhub/internal/channame"
)

// ErrClosed is the error of a Listener or Subscription that was closed by
// its owner. Subscribe after Close returns it.
var ErrClosed = errors.New("listenhub client: closed")

// ErrInvalidName matches (errors.Is) a refusal of the subscription name
// itself: longer than 63 bytes once mapped to a Postgres channel, or holding
// a NUL. Such a refusal is final for that name and harmless for the
// transport: a hub client stays alive after it, and a Failover does not fail
// over because of it.
var ErrInvalidName = errors.New("listenhub client: invalid subscription name")

// ErrLimit matches (errors.Is) a refusal for one of the hub's caps: this
// worker holds the most subscriptions the hub allows one connection, or the
// hub LISTENs the most channels it allows. Like a name refusal it is final
// for that subscribe and harmless for the transport: the hub keeps the
// connection, the client stays alive and a Failover does not fail over (its
// own connection would only move the load onto a backend of its own).
var ErrLimit = errors.New("listenhub client: hub limit reached")

// ErrAckTimeout matches (errors.Is) an *AckTimeoutError.
var ErrAckTimeout = errors.New("listenhub client: ack timeout")

// ErrSlowSubscriber matches (errors.Is) the error of a Mux Subscription that
// was closed because its buffer of ephemeral wakes overflowed.
var ErrSlowSubscriber = errors.New("listenhub client: slow subscriber")

// NackKind says what a nack refused, and so what the client does after it.
type NackKind int

const (
	// NackOther is a refusal of the transport's kind (the LISTEN
	// failed): it kills the client, and a Failover fails over.
	NackOther NackKind = iota
	// NackInvalidName refuses the name itself (see ErrInvalidName).
	NackInvalidName
	// NackLimit is one of the hub's caps (see ErrLimit).
	NackLimit
)

func (k NackKind) String() string {
	switch k {
	case NackInvalidName:
		return "invalid-name"
	case NackLimit:
		return "limit"
	}
	return "other"
}

// NackError is the hub's refusal of a subscription: its nack frame.
type NackError struct {
	Name   string   // the subscription name that was refused
	Reason string   // the hub's "error" field, verbatim
	Kind   NackKind // what was refused
}

func (e *NackError) Error() string {
	return fmt.Sprintf("listenhub client: hub refused %q: %s", e.Name, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidName) true for a name refusal and
// errors.Is(err, ErrLimit) for a cap.
func (e *NackError) Is(target error) bool {
	return target == ErrInvalidName && e.Kind == NackInvalidName || target == ErrLimit && e.Kind == NackLimit
}

// AckTimeoutError says that the hub did not answer a sub within the ack
// timeout. The client is dead after it: a hub that does not answer is wedged
// or is an old hub that silently drops what it refuses.
type AckTimeoutError struct {
	Name    string
	Timeout time.Duration
}

func (e *AckTimeoutError) Error() string {
	return fmt.Sprintf("listenhub client: no ack for %q within %v", e.Name, e.Timeout)
}

// Is makes errors.Is(err, ErrAckTimeout) true.
func (e *AckTimeoutError) Is(target error) bool { return target == ErrAckTimeout }

// ErrNotOurHub matches (errors.Is) a *PeerError: the process behind the
// socket runs as a uid the client does not trust.
var ErrNotOurHub = errors.New("listenhub client: not our hub")

// PeerError is Dial's refusal of the process behind the socket: its uid
// (SO_PEERCRED) is not in the allowed list (Options.AllowUIDs; by default
// this process's own uid and root). The connection was closed without a
// frame sent. Dial wraps it in a *ConnError; a Failover treats it like any
// other dial failure and listens locally.
type PeerError struct {
	UID, PID int   // the peer's credentials
	Allowed  []int // the uids that would have been accepted
}

func (e *PeerError) Error() string {
	allowed := make([]string, len(e.Allowed))
	for i, u := range e.Allowed {
		allowed[i] = strconv.Itoa(u)
	}
	return fmt.Sprintf("peer uid %d (pid %d) is not one of the allowed uids [%s]: not our hub",
		e.UID, e.PID, strings.Join(allowed, " "))
}

// Is makes errors.Is(err, ErrNotOurHub) true.
func (e *PeerError) Is(target error) bool { return target == ErrNotOurHub }

// ErrRefused matches (errors.Is) a *RefusedError.
var ErrRefused = errors.New("listenhub client: refused by the hub")

// RefusedError is the hub's refusal of this connection: a peer uid its
// --allow-uid does not name, its --max-workers reached, no descriptors left.
// The hub says why in the connection's first frame (a nack with an empty
// "q", docs/protocol.md) and closes it; the client dies with this error.
// A Failover fails over to its local listener, as for any hub failure.
type RefusedError struct {
	Path   string // the hub socket
	Reason string // the hub's words, e.g. "uid 1000 is not allowed (--allow-uid)"
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("listenhub client: the hub at %s refused this connection: %s", e.Path, e.Reason)
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// ConnError is a transport failure of the hub connection: the dial, a read
// (EOF when the hub closed the socket, which is also what eviction looks
// like; or a malformed frame), or a write (including a write that stalled
// past the write timeout).
type ConnError struct {
	Op   string // "dial", "read" or "write"
	Path string // the hub socket
	Err  error
}

func (e *ConnError) Error() string {
	return fmt.Sprintf("listenhub client: %s %s: %v", e.Op, e.Path, e.Err)
}

func (e *ConnError) Unwrap() error { return e.Err }

// SlowSubscriberError is the error of a Mux Subscription whose ephemeral
// wakes overflowed its buffer: at least one payload was lost for it, so it
// is closed rather than left to continue with a silent gap.
type SlowSubscriberError struct {
	Name   string
	Buffer int
}

func (e *SlowSubscriberError) Error() string {
	return fmt.Sprintf("listenhub client: subscriber of %q too slow: more than %d ephemeral wakes pending", e.Name, e.Buffer)
}

// Is makes errors.Is(err, ErrSlowSubscriber) true.
func (e *SlowSubscriberError) Is(target error) bool { return target == ErrSlowSubscriber }

// checkName rejects the names that are invalid whatever the hub's channel
// prefix and suffix are, without a round trip. The hub checks the mapped
// channel again.
func checkName(q string) error {
	if len(q) > channame.MaxLen {
		return fmt.Errorf("listenhub client: %q: %w: %d bytes, the limit is %d", q, ErrInvalidName, len(q), channame.MaxLen)
	}
	if strings.IndexByte(q, 0) >= 0 {
		return fmt.Errorf("listenhub client: %q: %w: contains NUL", q, ErrInvalidName)
	}
	if !utf8.ValidString(q) {
		// The frame would carry U+FFFD in its place, and the hub's ack
		// (or nack) would name a different string than q: refused here,
		// with a reason, rather than left to time out.
		return fmt.Errorf("listenhub client: %q: %w: not valid UTF-8", q, ErrInvalidName)
	}
	return nil
}

// limitReason tells a cap's refusal from any other nack by the hub's
// reason text: "too many subscriptions" (per worker) and "too many
// channels" (the hub's union).
func limitReason(reason string) bool {
	return strings.HasPrefix(strings.ToLower(reason), "too many ")
}

// invalidNameReason tells a name refusal from any other nack by the hub's
// reason text. The wire protocol (v1) has no nack code, so the reason words
// are the contract: listenhub's hub says "invalid channel: …" for a name
// (empty, too long once prefixed and suffixed, NUL) and "LISTEN failed: …"
// when Postgres did not LISTEN; a failed LISTEN whose cause is still the
// name (the listener's own "invalid channel" check) counts as a name
// refusal too.
func invalidNameReason(reason string) bool {
	r := strings.ToLower(reason)
	return strings.HasPrefix(r, "invalid") ||
		strings.Contains(r, "invalid channel") ||
		strings.Contains(r, "too long") ||
		strings.Contains(r, "contains nul")
}

// nackKind classifies a nack's reason: the name first, then the caps.
func nackKind(reason string) NackKind {
	switch {
	case invalidNameReason(reason):
		return NackInvalidName
	case limitReason(reason):
		return NackLimit
	}
	return NackOther
}

// Timeout reports whether err is the hub not answering in time: an ack
// timeout, a write that stalled past Options.WriteTimeout, a frame or a
// silence past FrameTimeout or SilenceTimeout. Like pgconn.Timeout, for a
// caller that must decide whether to wait longer.
func Timeout(err error) bool {
	if errors.Is(err, ErrAckTimeout) {
		return true
	}
	var ce *ConnError
	return errors.As(err, &ce) && errors.Is(ce.Err, os.ErrDeadlineExceeded)
}

// SafeToRetry reports whether the same call may succeed if made again on a
// new Conn or Failover: true for a failure of the transport (the hub went
// away, was evicted, refused the connection for a cap, timed out), false
// for a refusal a retry meets again (the name, the hub's caps on
// subscriptions, a socket or peer that is not our hub, a hub on another
// database) and for ErrClosed. A Mux subscriber closed for being slow may
// subscribe again. Like pgconn.SafeToRetry.
func SafeToRetry(err error) bool {
	switch {
	case err == nil,
		errors.Is(err, ErrClosed),
		errors.Is(err, ErrInvalidName),
		errors.Is(err, ErrLimit),
		errors.Is(err, ErrNotOurHub),
		errors.Is(err, ErrOtherDatabase):
		return false
	}
	var se *SocketError
	if errors.As(err, &se) {
		return false
	}
	var ce *ConnError
	var ne *NackError
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, ErrAckTimeout) ||
		errors.Is(err, ErrRefused) || errors.Is(err, ErrSlowSubscriber)
}
