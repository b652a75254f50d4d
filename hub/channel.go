package hub

import (
	"errors"
	"log/slog"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/internal/channame"
	"github.com/listenhub/listenhub/internal/enum"
)

// chanState is where a channel of the union stands with Postgres.
type chanState uint8

const (
	// stateListenInFlight: LISTEN issued, not confirmed yet. Every
	// subscriber is a waiter, to be acked when it completes.
	stateListenInFlight chanState = iota + 1
	// stateListening: Postgres confirmed the LISTEN. A new subscriber is
	// acked at once (or, while the connection is down, when it is back).
	stateListening
	// stateUnlistenInFlight: the last subscriber left and UNLISTEN is
	// issued. Subscribers arriving now wait for a fresh LISTEN, issued
	// when the UNLISTEN completes.
	stateUnlistenInFlight
)

// chanStateNames are the String forms, indexed by value.
var chanStateNames = [...]string{
	stateListenInFlight: "listen-in-flight", stateListening: "listening",
	stateUnlistenInFlight: "unlisten-in-flight",
}

func (s chanState) String() string { return enum.Name(chanStateNames[:], int(s), "chanState") }

// channel is one member of the union: one Postgres channel, the workers
// subscribed to it and where its LISTEN stands. At most one LISTEN or
// UNLISTEN is in flight per channel, so done callbacks always refer to the
// current operation. A channel exists while it has subscribers or a command
// in flight; it is deleted when an UNLISTEN completes with no subscriber.
type channel struct {
	q     string // subscription name, as workers see it
	pg    string // Postgres channel: prefix + q + suffix
	state chanState
	// subs is the routing table: every worker here gets this channel's
	// wakes, acked or not (rule 1: routing before LISTEN). Its length is
	// the refcount. A slice rather than a set: a wake walks it, and each
	// worker's subscription remembers its place for O(1) removal (see
	// removeSubscriber). Walk it with lastFirst when the walk may close a
	// worker.
	subs []*worker
	// waiters are subs still owed an answer, in arrival order; a worker
	// that sent sub twice is here twice and gets two answers.
	waiters []waiter
	// unlistenFailed: the UNLISTEN failed (the connection was down past
	// the command timeout) and nobody subscribed since. The state stays
	// stateUnlistenInFlight with no command in flight; the UNLISTEN is
	// retried when the connection is back, or a new sub LISTENs afresh.
	unlistenFailed bool

	// For Hub.Channels: NOTIFYs received for it, and wake frames queued
	// for its subscribers (coalesced and dropped durable wakes aside).
	wakesReceived, wakesDelivered uint64
}

// waiter is a sub owed an answer, with when it was read (the start of that
// loop iteration), for the ack latency.
type waiter struct {
	w  *worker
	at time.Time
}

// channelName maps a subscription name to its Postgres channel, or says why
// it cannot be LISTENed.
func (h *Hub) channelName(q string) (string, error) {
	if q == "" {
		return "", channame.Check(q) // whatever the prefix and suffix
	}
	pg := q
	if h.cfg.ChannelPrefix != "" || h.cfg.ChannelSuffix != "" {
		pg = h.cfg.ChannelPrefix + q + h.cfg.ChannelSuffix
	}
	if err := channame.Check(pg); err != nil {
		return "", err
	}
	return pg, nil
}

// The nack texts of the caps (docs/design.md, "Limits").
const (
	nackTooManySubs     = "too many subscriptions"
	nackTooManyChannels = "too many channels"
)

// refuseSub answers a sub with nack, logging it (rate-limited, the name
// cut).
func (h *Hub) refuseSub(w *worker, q, reason string) {
	if h.logOK(logRefusedSub, slog.LevelInfo) {
		h.logLine(logRefusedSub, slog.LevelInfo, "sub refused", "worker", w.id, "pid", w.pid,
			"q", logName(q), "reason", reason)
	}
	h.sendNack(w, q, reason)
}

// refuseSubQ64 is refuseSub for a name that was not valid UTF-8: the nack
// carries the name's bytes as sent, in base64 ("q64", docs/protocol.md).
func (h *Hub) refuseSubQ64(w *worker, q, sent, reason string) {
	if h.logOK(logRefusedSub, slog.LevelInfo) {
		h.logLine(logRefusedSub, slog.LevelInfo, "sub refused", "worker", w.id, "pid", w.pid,
			"q", logName(q), "reason", reason)
	}
	if w.closed {
		return
	}
	h.stats.nacks.Add(1)
	h.scratch = frame.AppendNackRaw(h.scratch[:0], q, sent, reason)
	h.enqueueControl(w, h.scratch)
}

// subscribe handles {"t":"sub"}: routing table first, LISTEN second, ack
// last.
func (h *Hub) subscribe(w *worker, q string) {
	pg, err := h.channelName(q)
	if err != nil {
		h.refuseSub(w, q, err.Error())
		return
	}
	// A sub of a name already held is an answer owed, not a new
	// subscription; either way waiting answers count, so that a worker
	// cannot grow a waiter list by repeating a sub whose LISTEN is in
	// flight.
	if int(w.waiting) >= h.cfg.MaxSubscriptions || w.subs.get(q) == nil && w.subs.len() >= h.cfg.MaxSubscriptions {
		h.refuseSub(w, q, nackTooManySubs)
		return
	}
	ch := h.channels[pg]
	if ch == nil {
		if len(h.channels) >= h.cfg.MaxChannels {
			h.refuseSub(w, q, nackTooManyChannels)
			return
		}
		ch = &channel{q: q, pg: pg}
		h.channels[pg] = ch
		h.addSub(w, ch)
		h.addWaiter(ch, w)
		h.listen(ch)
		return
	}
	h.addSub(w, ch)
	if ch.unlistenFailed {
		ch.unlistenFailed = false
		h.addWaiter(ch, w)
		h.listen(ch) // a fresh LISTEN makes the state certain again
		return
	}
	if ch.state == stateListening && h.healthy {
		h.sendAck(w, q, h.loop.Now())
		return
	}
	// LISTEN or UNLISTEN in flight, or the connection is down: the
	// answer comes when Postgres has LISTENed (again).
	h.addWaiter(ch, w)
}

func (h *Hub) addWaiter(ch *channel, w *worker) {
	ch.waiters = append(ch.waiters, waiter{w, h.loop.Now()})
	w.waiting++
}

// takeWaiters empties ch's waiter list and returns it, for answering:
// taken out first, because an answer may evict its worker, and eviction
// edits the waiter list.
func takeWaiters(ch *channel) []waiter {
	ws := ch.waiters
	ch.waiters = nil
	for _, x := range ws {
		x.w.waiting--
	}
	return ws
}

func (h *Hub) addSub(w *worker, ch *channel) { addSubscriber(ch, w) }

// unsubscribe handles {"t":"unsub"}; no answer. Unknown names are ignored.
func (h *Hub) unsubscribe(w *worker, q string) {
	ch := w.subs.get(q)
	if ch == nil {
		return
	}
	h.dropSub(w, ch)
}

// dropSub takes w out of ch (unsub or disconnect) and UNLISTENs ch if that
// was the last subscriber.
func (h *Hub) dropSub(w *worker, ch *channel) {
	removeSubscriber(ch, w)
	if w.tr != nil {
		delete(w.tr.durable, ch.q)
	}
	ws := ch.waiters[:0]
	for _, x := range ch.waiters {
		if x.w != w {
			ws = append(ws, x)
		} else {
			w.waiting--
		}
	}
	clear(ch.waiters[len(ws):])
	ch.waiters = ws
	// In flight, the completion decides: a finished LISTEN with nobody
	// left turns into an UNLISTEN, a finished UNLISTEN deletes.
	if len(ch.subs) == 0 && ch.state == stateListening && h.up == nil {
		// (During an upgrade the union stays as it is; whoever serves
		// next UNLISTENs the channels left without subscribers.)
		h.unlisten(ch)
	}
}

func (h *Hub) listen(ch *channel) {
	ch.state = stateListenInFlight
	if h.stopping {
		return
	}
	h.pg.Listen(ch.pg, func(err error) { h.listenDone(ch, err) })
}

func (h *Hub) unlisten(ch *channel) {
	if ch.state == stateListening {
		h.stats.channels.Add(-1)
	}
	ch.state = stateUnlistenInFlight
	if h.stopping {
		return // Close UNLISTENs everything
	}
	h.pg.Unlisten(ch.pg, func(err error) { h.unlistenDone(ch, err) })
}

func (h *Hub) listenDone(ch *channel, err error) {
	if h.stopping {
		return
	}
	if err != nil {
		// Rate-limited like a refused sub: a worker that piles up
		// thousands of subs while Postgres is down makes thousands fail.
		if h.logOK(logRefusedSub, slog.LevelWarn) {
			h.logLine(logRefusedSub, slog.LevelWarn, "LISTEN failed", "q", logName(ch.q), "channel", logName(ch.pg),
				"subscribers", len(ch.subs), "reason", err)
		}
		reason := "LISTEN failed: " + err.Error()
		for _, x := range takeWaiters(ch) {
			if !x.w.closed {
				h.sendNack(x.w, ch.q, reason)
			}
		}
		// Refused subscribers leave the routing table. Whether Postgres
		// LISTENs after a failure (a connection lost mid-command) is
		// unknown, so UNLISTEN to make it certain; a sub meanwhile gets
		// a fresh LISTEN.
		for _, w := range ch.subs {
			w.subs.remove(ch.q)
			if w.tr != nil {
				delete(w.tr.durable, ch.q)
			}
		}
		clear(ch.subs)
		ch.subs = nil
		h.unlisten(ch)
		return
	}
	if len(ch.subs) == 0 {
		h.unlisten(ch) // everybody left while the LISTEN was in flight
		return
	}
	ch.state = stateListening
	h.stats.channels.Add(1)
	if h.healthy {
		h.ackWaiters(ch)
	}
}

func (h *Hub) unlistenDone(ch *channel, err error) {
	if h.stopping {
		return
	}
	if err != nil {
		if h.logOK(logRefusedSub, slog.LevelWarn) {
			h.logLine(logRefusedSub, slog.LevelWarn, "UNLISTEN failed", "q", logName(ch.q), "channel", logName(ch.pg), "reason", err)
		}
		if len(ch.subs) == 0 && !errors.Is(err, channame.ErrInvalid) {
			// The listener may still LISTEN to it (and re-LISTEN on
			// reconnect): retry once the connection is back.
			ch.unlistenFailed = true
			return
		}
	}
	if len(ch.subs) > 0 {
		h.listen(ch) // subscribers arrived while the UNLISTEN was in flight
		return
	}
	delete(h.channels, ch.pg)
}

// ackWaiters answers every waiter of a listening channel.
func (h *Hub) ackWaiters(ch *channel) {
	for _, x := range takeWaiters(ch) {
		if !x.w.closed {
			h.sendAck(x.w, ch.q, x.at)
		}
	}
}

// sendAck queues the ack of a sub read at subAt, and records how long the
// sub waited for it.
func (h *Hub) sendAck(w *worker, q string, subAt time.Time) {
	h.scratch = frame.AppendAck(h.scratch[:0], q)
	if h.enqueueControl(w, h.scratch) {
		h.ackLatency.Observe(time.Since(subAt), 1)
	}
}

// sendNack refuses a sub; every nack is counted here, where it is decided.
func (h *Hub) sendNack(w *worker, q, reason string) {
	if w.closed {
		return
	}
	h.stats.nacks.Add(1)
	h.scratch = frame.AppendNack(h.scratch[:0], q, reason)
	h.enqueueControl(w, h.scratch)
}
