//go:build unix

package pglisten

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/handoff"
	"github.com/listenhub/listenhub/internal/pgquote"
	"github.com/listenhub/listenhub/loop"
)

// The upgrade's side of a Conn is not part of this package's API: package
// hub reaches it through internal/handoff.
func init() {
	handoff.RegisterListener(handoff.Listener[*Conn, Config]{
		Of:              func(c *Conn) handoff.Conn { return upgradeSide{c} },
		Adopt:           adopt,
		OpenForTakeover: openForTakeover,
	})
}

// upgradeSide is a Conn as internal/handoff sees it.
type upgradeSide struct{ c *Conn }

func (u upgradeSide) CanDetach() bool                  { return u.c.canDetach() }
func (u upgradeSide) WhenIdle(done func())             { u.c.whenIdle(done) }
func (u upgradeSide) CancelHold()                      { u.c.cancelHold() }
func (u upgradeSide) Detach() (handoff.PG, error)      { return u.c.detach() }
func (u upgradeSide) Resume() error                    { return u.c.resume() }
func (u upgradeSide) Abandon()                         { u.c.abandon() }
func (u upgradeSide) Terminate(done func())            { u.c.terminate(done) }
func (u upgradeSide) PauseAtMarker(m string, f func()) { u.c.pauseAtMarker(m, f) }
func (u upgradeSide) SendMarker(marker string) error   { return u.c.sendMarker(marker) }

// A hot upgrade (docs/design.md, "Lifecycle") moves the LISTEN connection to
// a new process without losing or duplicating a notification.
//
// Plaintext: the old process waits for a quiet point (whenIdle: nothing
// pending, nothing in flight, the set LISTENed), stops reading there and
// hands the socket over as is (detach): the descriptor, the backend pid, the
// set and the bytes it read but could not parse yet (the start of a partial
// message). The new process adopts it and, once told to, Resumes reading
// where the old one stopped; the kernel held whatever arrived meanwhile.
//
// TLS (or any connection without a descriptor to hand over): the record
// layer's state cannot move, so the new process opens its own connection,
// LISTENs the union plus a marker channel (openForTakeover) and sends one
// NOTIFY on the marker (sendMarker). Postgres delivers notifications to
// every listener in the order of its queue, so the marker splits the stream
// exactly: the old process (which LISTENs the marker too, pauseAtMarker)
// delivers everything before it and stops reading at it; the new one drops
// everything before it and delivers everything after.

// handover is a Conn's upgrade state. The zero value is "no upgrade".
type handover struct {
	// holding: an upgrade waits for a quiet point; no health probe is
	// sent meanwhile (its answer would be in flight at the hand-over).
	holding bool
	idle    func() // whenIdle's callback, run once at the quiet point
	// paused: nothing is read or parsed; what arrives waits in the kernel
	// (descriptor) or in rbuf (bridge).
	paused bool
	// detached: the descriptor is out of the loop (detach), still open.
	detached bool
	// marker: a notification on this channel pauses the Conn and runs
	// onMarker; while skip is set, every notification before it is
	// dropped (the old process delivers those).
	marker   string
	skip     bool
	onMarker func()
}

// errNoDescriptor is returned by detach for a connection the loop does not
// drive from a descriptor (TLS): use the marker hand-over instead.
var errNoDescriptor = errors.New("listener: connection has no descriptor to hand over")

// canDetach reports whether the connection can be handed over as a
// descriptor (plaintext) rather than by the marker hand-over.
func (c *Conn) canDetach() bool {
	_, ok := c.tr.(*fdTransport)
	return ok && c.state == stateUp
}

// whenIdle runs done on the loop once the connection is up, healthy, and has
// no command pending or in flight: the quiet point of a hand-over. From now
// on no health probe is sent while nothing is in flight (cancelHold ends
// that). The caller must stop issuing commands meanwhile. done runs from the
// end of an iteration, never inside whenIdle.
func (c *Conn) whenIdle(done func()) {
	c.ho.holding = true
	c.ho.idle = done
	c.kick()
}

// cancelHold forgets a whenIdle that has not fired, and lets health probes
// go out again.
func (c *Conn) cancelHold() {
	c.ho.holding = false
	c.ho.idle = nil
}

// kick makes sure another loop iteration comes, whose end checks for idle.
func (c *Conn) kick() {
	if !c.kicked {
		c.kicked = true
		if c.l.Post(func() { c.kicked = false }) != nil {
			c.kicked = false
		}
	}
}

// checkIdle is called at the end of every iteration (from flush).
func (c *Conn) checkIdle() {
	if c.ho.idle == nil || c.state != stateUp || !c.healthy || len(c.pending) > 0 || len(c.inflight) > 0 || c.chk.awaiting != "" {
		return
	}
	if t, ok := c.tr.(*fdTransport); ok && len(t.out) > 0 {
		return
	}
	f := c.ho.idle
	c.ho.idle = nil
	f()
}

// pause stops reading and parsing. Bytes already read and not parsed stay
// in the buffer; the health check stops (a paused connection hears nothing).
func (c *Conn) pause() {
	if c.ho.paused {
		return
	}
	c.ho.paused = true
	if c.hc != nil {
		c.hc.Stop()
		c.hc = nil
	}
	// A delivery check cannot be answered while nothing is read; the
	// next one is sent after Resume.
	c.resetCheck()
	if t, ok := c.tr.(*fdTransport); ok && t.tok.Valid() {
		_ = c.l.Modify(t.tok, t.interest())
	}
}

// resume undoes Pause (and detach, whose descriptor goes back into the
// loop): what waited is parsed, then reading goes on. The hold ends too,
// and a marker not reached yet is forgotten (an upgrade rolled back).
func (c *Conn) resume() error {
	c.cancelHold()
	c.ho.marker, c.ho.skip, c.ho.onMarker = "", false, nil
	if !c.ho.paused {
		return nil
	}
	c.ho.paused = false
	if c.state != stateUp {
		return nil
	}
	if t, ok := c.tr.(*fdTransport); ok {
		if c.ho.detached {
			c.ho.detached = false
			if err := t.start(c, c.gen); err != nil {
				c.fail(fmt.Errorf("resume: %w", err))
				return err
			}
		}
		if err := c.l.Modify(t.tok, t.interest()); err != nil {
			c.fail(fmt.Errorf("resume: %w", err))
			return err
		}
	}
	c.lastRx = c.l.Now()
	c.probeSince = time.Time{}
	if c.hc == nil {
		c.hc = c.l.AfterFunc(c.cfg.HealthCheckInterval, c.healthTick)
	}
	if c.rend > c.rpos {
		c.received()
	}
	return nil
}

// detach pauses the connection and takes its descriptor out of the loop,
// still open, and returns what another process needs to Adopt it. Call it
// at the quiet point (from the whenIdle callback). resume puts it back;
// abandon closes this process's copy for good.
func (c *Conn) detach() (handoff.PG, error) {
	t, ok := c.tr.(*fdTransport)
	if !ok || c.state != stateUp {
		return handoff.PG{}, errNoDescriptor
	}
	if len(c.pending) > 0 || len(c.inflight) > 0 || len(t.out) > 0 {
		return handoff.PG{}, errors.New("listener: detach: a command is in flight")
	}
	c.pause()
	if t.tok.Valid() {
		if err := c.l.Unregister(t.tok); err != nil {
			return handoff.PG{}, fmt.Errorf("listener: detach: %w", err)
		}
		t.tok = loop.Token{}
	}
	c.ho.detached = true
	h := handoff.PG{FD: t.fd, BackendPID: t.pid, Unread: append([]byte(nil), c.rbuf[c.rpos:c.rend]...)}
	if c.chk.listening {
		h.Check = c.chk.channel
	}
	for ch := range c.set {
		h.Channels = append(h.Channels, ch)
	}
	return h, nil
}

// abandon drops the connection without a word to the server: another
// process owns it now (detach) or has its own (the marker hand-over with a
// descriptor). This process's copy of the descriptor is closed; the
// session goes on. Every later call is a no-op; Close still runs its done.
func (c *Conn) abandon() {
	if c.state == stateClosed {
		return
	}
	c.cancelHold()
	if t, ok := c.tr.(*fdTransport); ok {
		if t.tok.Valid() {
			_ = c.l.Unregister(t.tok)
			t.tok = loop.Token{}
		}
		unix.Close(t.fd)
		t.fd = -1
		c.tr = nil
	}
	c.state = stateClosing
	c.failWaiting(ErrClosed)
	c.finishClose()
}

// adopt makes a Conn of a connection another process Detached: it starts
// paused (resume starts reading) and healthy, with h.Channels as its set.
// Call it on the loop goroutine or before the loop runs; it takes
// ownership of h.FD.
func adopt(l *loop.Loop, cfg Config, h handoff.PG) (*Conn, error) {
	if h.FD < 0 {
		return nil, errors.New("listener: adopt: no descriptor")
	}
	if err := unix.SetNonblock(h.FD, true); err != nil {
		unix.Close(h.FD)
		return nil, fmt.Errorf("listener: adopt: %w", os.NewSyscallError("fcntl(O_NONBLOCK)", err))
	}
	c := newConn(l, cfg)
	for _, ch := range h.Channels {
		c.set[ch] = struct{}{}
	}
	if h.Check != "" {
		c.chk.channel, c.chk.listening = h.Check, true
	}
	if len(h.Unread) > len(c.rbuf) {
		c.rbuf = make([]byte, len(h.Unread))
	}
	c.rend = copy(c.rbuf, h.Unread)
	tr := &fdTransport{fd: h.FD, pid: h.BackendPID}
	l.AfterIteration(c.flush)
	l.OnClose(c.loopStopped)
	c.gen++
	if err := tr.start(c, c.gen); err != nil {
		tr.discard()
		return nil, fmt.Errorf("listener: adopt: %w", err)
	}
	c.tr = tr
	c.pid = tr.pid
	c.state = stateUp
	c.everUp = true // a refused reconnect is retried, not fatal
	c.healthy = true
	c.chk.verified = true // by the process that handed it over
	c.lastRx = l.Now()
	c.chk.lastNote = c.lastRx
	c.pause()
	c.log.Info("listener: adopted", "pid", c.pid, "channels", len(c.set))
	return c, nil
}

// openForTakeover opens a connection of this process's own for the marker
// hand-over: channels and marker are LISTENed on connect (OnHealth(true)
// says when), every notification before the one on marker is dropped, and
// at it the Conn pauses and onMarker runs. resume starts the delivery.
func openForTakeover(ctx context.Context, l *loop.Loop, cfg Config, channels []string, marker string, onMarker func()) (*Conn, error) {
	if cfg.ConnConfig == nil {
		return nil, errNoConnConfig
	}
	if err := ValidChannel(marker); err != nil {
		return nil, err
	}
	c := newConn(l, cfg)
	for _, ch := range channels {
		c.set[ch] = struct{}{}
	}
	c.set[marker] = struct{}{}
	c.ho.marker, c.ho.skip, c.ho.onMarker = marker, true, onMarker
	if err := c.dialAndBegin(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// pauseAtMarker makes the Conn pause at the first notification on marker
// (which it must LISTEN) and run done then. Notifications before it are
// delivered as usual.
func (c *Conn) pauseAtMarker(marker string, done func()) {
	c.ho.marker, c.ho.skip, c.ho.onMarker = marker, false, done
}

// sendMarker sends NOTIFY marker. Its answer is not waited for: the marker's
// arrival is what the hand-over waits for.
func (c *Conn) sendMarker(marker string) error {
	if err := ValidChannel(marker); err != nil {
		return err
	}
	if c.state != stateUp {
		return fmt.Errorf("listener: send marker: connection %s", c.state)
	}
	c.send(&query{kind: queryProbe}, appendQuery(nil, pgquote.AppendIdent([]byte("NOTIFY "), marker)))
	return nil
}

// markerFilter is called for every notification while a marker is set; it
// reports whether the notification is swallowed.
func (c *Conn) markerFilter(ch []byte) bool {
	if string(ch) == c.ho.marker {
		c.ho.marker, c.ho.skip = "", false
		c.pause()
		if f := c.ho.onMarker; f != nil {
			c.ho.onMarker = nil
			f()
		}
		return true
	}
	return c.ho.skip
}

// hold keeps a chunk the bridge read while paused, behind what waits.
func (c *Conn) hold(chunk []byte) {
	if c.rend+len(chunk) > len(c.rbuf) {
		nb := make([]byte, c.rend-c.rpos+len(chunk))
		c.rend = copy(nb, c.rbuf[c.rpos:c.rend])
		c.rpos = 0
		c.rbuf = nb
	}
	c.rend += copy(c.rbuf[c.rend:], chunk)
}

// interest is what the loop should watch the socket for: nothing while
// paused but for unsent bytes.
func (t *fdTransport) interest() loop.Events {
	ev := loop.Readable
	if t.c != nil && t.c.ho.paused {
		ev = 0
	}
	if len(t.out) > 0 {
		ev |= loop.Writable
	}
	return ev
}

// terminate ends the session and runs done (on the loop) once the server
// has hung up, which it does after its backend left pg_stat_activity, or
// after the health-check timeout. An upgrade closes the old process's own
// TLS connection this way, so that the count of backends is back to one
// before the old process is gone. Commands still waiting get ErrClosed.
func (c *Conn) terminate(done func()) {
	if c.state != stateUp || c.tr == nil {
		c.Close(done)
		return
	}
	if done != nil {
		c.closeDone = append(c.closeDone, done)
	}
	c.state = stateClosing
	c.healthy = false // no OnHealth: the owner asked for this
	if c.hc != nil {
		c.hc.Stop()
		c.hc = nil
	}
	c.failWaiting(ErrClosed)
	// Read again (what comes is not delivered: the state is closing), so
	// that the hang-up is seen.
	c.ho = handover{}
	if t, ok := c.tr.(*fdTransport); ok && t.tok.Valid() {
		_ = c.l.Modify(t.tok, t.interest())
	}
	if err := c.tr.write(terminate); err != nil {
		c.finishClose()
		return
	}
	c.closeTimer = c.l.AfterFunc(c.cfg.HealthCheckTimeout, c.finishClose)
}
