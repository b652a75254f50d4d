package hub

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/fdpass"
	"github.com/listenhub/listenhub/internal/handoff"
	"github.com/listenhub/listenhub/loop"
)

// The two ends are not part of the package's API: command listenhub
// reaches them through internal/handoff.
func init() {
	handoff.RegisterHub(handoff.Hub[*Hub]{Handover: (*Hub).handover, Takeover: (*Hub).takeover})
}

// Hot upgrade (docs/design.md, "Lifecycle"): the running hub (old) hands the
// listening socket, every worker connection with its state, and the
// Postgres connection to a new process (new) over an fdpass connection.
// Workers see no EOF and no wake is lost or duplicated.
//
// The conversation, one JSON message each way at a time:
//
//	new → old  hello    {pid}
//	old → new  plan     {marker}               (TLS: LISTENed already)
//	new → old  prepared                        (TLS: its own connections)
//	           old copies the large backlogs into a memfd, serving on
//	           (upgrade_precopy.go)
//	           old freezes: stops accepting and reading workers (their
//	           input waits in the kernel), waits for Postgres to be quiet
//	           (no command in flight, the union LISTENed)
//	old → new  prepare  {channels, marker}    (TLS only, see below)
//	new → old  —        new LISTENs channels+marker on its own connection
//	                    and NOTIFYs the marker; old delivers up to it
//	old → new  state    {workers, channels, counters, …} + descriptors
//	                    (the memfd among them), then the bytes not in it
//	new → old  ready    new holds everything, has touched nothing
//	old → new  commit   old will never touch any of it again
//	new → old  serving  new reads, writes and accepts
//
// Until commit, old can take everything back (new is killed by its parent
// and has written nothing): any failure or the deadline there means old
// serves on. A plaintext Postgres connection moves as its descriptor, at the
// quiet point, with the bytes read and not parsed yet. A TLS one cannot (the
// record layer's state lives in old's memory): new opens its own, LISTENs
// the union and a marker channel, and one NOTIFY on the marker splits the
// notification stream between the two, so that at most two backends exist
// and old's is closed at commit. See package pglisten, handover.go.
//
// This file holds the conversation's messages and the handed state's
// format; upgrade_handover.go is the old process's side,
// upgrade_takeover.go the new one's.

// pgHandover is what the Postgres side must offer for an upgrade (*pgSet
// does, for all its connections at once: each is handed over, or each
// splits its stream at the marker).
type pgHandover interface {
	postgres
	CanDetach() bool
	WhenIdle(done func())
	CancelHold()
	Detach() ([]handoff.PG, error)
	Resume() error
	Abandon()
	Terminate(done func())
	ListenMarker(marker string, done func(error))
	UnlistenMarker(marker string)
	PauseAtMarker(marker string, done func())
	SendMarker(marker string) error
}

// upgrade is the state of a hot upgrade on either side. Loop goroutine.
type upgrade struct {
	taking bool // this process is the new one
	pg     pgHandover
	marker string
	pre    *precopy // old: the pre-copy, nil when none
	// handed: old took the snapshot; workers, socket and Postgres are the
	// new process's unless the upgrade is rolled back.
	handed bool
	// listening is closed (new, TLS) once the union and the marker are
	// LISTENed on new's own connection.
	listening chan struct{}
	listened  bool
	// live (new, TLS): the commit came; markerSeen: the marker arrived on
	// new's connection. Delivery starts when both hold.
	live, markerSeen bool
}

// readInterest is the interest in a worker's input: none while an upgrade
// holds the workers (their input waits in the kernel for whoever serves
// next).
func (h *Hub) readInterest() loop.Events {
	if h.up != nil {
		return 0
	}
	return loop.Readable
}

// dropEmpty UNLISTENs the channels an upgrade left without subscribers.
func (h *Hub) dropEmpty() {
	for _, ch := range h.channels {
		if len(ch.subs) == 0 && ch.state == stateListening {
			h.unlisten(ch)
		}
	}
}

// onHealth sees the Postgres side's health reports during an upgrade and
// reports whether it swallowed one. The new process has no worker to tell
// until it is live.
func (u *upgrade) onHealth(h *Hub, healthy bool) bool {
	if !u.taking {
		return false
	}
	if healthy && !u.listened {
		u.listened = true
		close(u.listening)
	}
	return true
}

// upMsg is one message of the conversation.
type upMsg struct {
	T       string     `json:"t"` // hello, plan, prepared, prepare, state, ready, commit, serving, abort
	PID     int        `json:"pid,omitempty"`
	Marker  string     `json:"marker,omitempty"` // plan: the TLS hand-over's marker; empty: descriptors
	Reason  string     `json:"reason,omitempty"`
	Prepare *upPrepare `json:"prepare,omitempty"`
	State   *handedHub `json:"state,omitempty"`
	// Mapping (plan) is the old process's channel mapping; absent from
	// an older hub, whose mapping the new process reads off the handed
	// channels instead (adopt).
	Mapping *upMapping `json:"mapping,omitempty"`
}

// upMapping is a hub's channel mapping: Config.ChannelPrefix and
// ChannelSuffix.
type upMapping struct {
	Prefix string `json:"prefix"`
	Suffix string `json:"suffix"`
}

// An upgrade never changes the channel mapping (docs/design.md, "Faults
// beside the hub"): the workers handed over are subscribed to channels
// named under the old one, and a new process that LISTENed new workers'
// names under its own would map one name to two channels. The new process
// refuses before the old one freezes anything, and the old one serves on;
// a new mapping takes a restart.

// mappingAdvice is what to do about a refused mapping change.
const mappingAdvice = "an upgrade keeps the channels of the workers it hands over; " +
	"restart the hub to apply the new mapping (its workers fall back meanwhile and come back under it), " +
	"or set channel-prefix and channel-suffix back and upgrade again"

// checkMapping refuses to take over from a hub whose mapping m is not this
// one's.
func (h *Hub) checkMapping(m upMapping) error {
	if m.Prefix == h.cfg.ChannelPrefix && m.Suffix == h.cfg.ChannelSuffix {
		return nil
	}
	return fmt.Errorf("hub: upgrade refused: the channel mapping changed (prefix %q to %q, suffix %q to %q): %s",
		m.Prefix, h.cfg.ChannelPrefix, m.Suffix, h.cfg.ChannelSuffix, mappingAdvice)
}

// checkHandedMapping is checkMapping for an old process that did not send
// its mapping: each handed channel must be where this one's mapping puts
// its name.
func (h *Hub) checkHandedMapping(chans []handedChannel) error {
	for _, c := range chans {
		if pg, err := h.channelName(c.Q); err != nil || pg != c.PG {
			return fmt.Errorf("hub: upgrade refused: the channel mapping changed (the old process LISTENs %q for %q, this one's prefix %q and suffix %q give %q): %s",
				c.PG, c.Q, h.cfg.ChannelPrefix, h.cfg.ChannelSuffix, pg, mappingAdvice)
		}
	}
	return nil
}

type upPrepare struct {
	Channels []string `json:"channels"` // Postgres channel names
}

// handedHub is the hub's state as it moves. Descriptors travel beside it as
// SCM_RIGHTS; the FD fields index that list.
type handedHub struct {
	Version  int             `json:"version"`
	Socket   handedSocket    `json:"socket"`
	Postgres *handoff.PG     `json:"postgres,omitempty"` // plaintext only
	PGFD     int             `json:"pg_fd"`
	Healthy  bool            `json:"healthy"`
	NextID   uint64          `json:"next_id"`
	Stats    Stats           `json:"stats"`
	Channels []handedChannel `json:"channels"`
	Workers  []handedWorker  `json:"workers"`
	Extra    map[string]int  `json:"extra,omitempty"`

	// MemFD is the pre-copy's file (upgrade_precopy.go), holding the Out of the
	// workers marked Mapped; -1: none.
	MemFD int `json:"mem_fd"`

	// PGMore are the Postgres connections after the first
	// (Config.PostgresConnections), in order, their descriptors at
	// PGMoreFDs; absent from a hub with one connection.
	PGMore    []handoff.PG `json:"pg_more,omitempty"`
	PGMoreFDs []int        `json:"pg_more_fds,omitempty"`
}

// handedVersion 2: the conversation has plan and prepared before the
// freeze, and the workers' bytes travel raw after the state. 3: the large
// backlogs are in a memfd (MemFD, handedWorker.Mapped), not raw.
const handedVersion = 3

// fromVersion accepts the state of this version and of version 2 (0.1.0,
// whose hub sends every worker's bytes raw and has no memfd), so that the
// release before this one upgrades to it in place.
func (st *handedHub) fromVersion() error {
	switch st.Version {
	case handedVersion:
		return nil
	case 2:
		st.MemFD = -1 // absent from its JSON, which reads as 0
		for _, hw := range st.Workers {
			if hw.Mapped {
				return fmt.Errorf("hub: upgrade: a version 2 state with a mapped worker (%d)", hw.ID)
			}
		}
		return nil
	}
	return fmt.Errorf("hub: upgrade: state version %d, this binary speaks 2 and %d", st.Version, handedVersion)
}

type handedSocket struct {
	FD       int    `json:"fd"`
	Path     string `json:"path"`
	Dev, Ino uint64
	// Inherited: systemd's socket (Config.ListenerFile); its file is never
	// removed, by either process.
	Inherited bool `json:"inherited,omitempty"`
}

type handedChannel struct {
	Q  string `json:"q"`
	PG string `json:"pg"`
	// Introspection counters (Hub.Channels); absent from an older hub.
	Received  uint64 `json:"received,omitempty"`
	Delivered uint64 `json:"delivered,omitempty"`
}

// handedWorker is one worker. Offsets are relative to the first unsent byte
// of Out; the first frame of Out may be partly written already.
type handedWorker struct {
	ID   uint64   `json:"id"`
	FD   int      `json:"fd"`
	PID  int32    `json:"pid"`
	UID  int32    `json:"uid"`
	Subs []string `json:"subs,omitempty"` // Postgres channel names
	// In (received, not decoded), Out (produced, not sent) and Ends
	// (frame ends in Out) are not part of the JSON: they follow the
	// state as one raw message per worker with any (sendRaw), whose
	// lengths these are.
	InLen  int      `json:"in_len,omitempty"`
	OutLen int      `json:"out_len,omitempty"`
	Frames int      `json:"frames,omitempty"`
	In     []byte   `json:"-"`
	Out    []byte   `json:"-"`
	Ends   []uint64 `json:"-"`
	// Mapped: Out is not in the raw message but in the state's memfd,
	// OutLen bytes at MapAt (pre-copied before the freeze). In the new
	// process Out is then a mapping, which free lets go of.
	Mapped bool   `json:"mapped,omitempty"`
	MapAt  int64  `json:"map_at,omitempty"`
	free   func() // the new process's, until a ring adopts Out
	// out are Out's two parts in the old process's ring (not copied);
	// none when Mapped.
	out [2][]byte
	// PartialSince: when the partial frame in In started (unix
	// nanoseconds): its frame timeout goes on, it does not restart.
	PartialSince int64             `json:"partial_since,omitempty"`
	Durable      map[string]uint64 `json:"durable,omitempty"`
	Spans        []span            `json:"spans,omitempty"`   // durable wakes in Out
	Answers      []span            `json:"answers,omitempty"` // acks, nacks, status in Out
	StatusAt     int64             `json:"status_at"`         // -1: no unsent status
	Unknown      bool              `json:"unknown,omitempty"`
	// Introspection (Hub.Workers): when it connected to the first hub,
	// and its counters; absent from an older hub.
	Connected int64  `json:"connected_ns,omitempty"` // unix nanoseconds
	Sent      uint64 `json:"sent,omitempty"`
	Coalesced uint64 `json:"coalesced,omitempty"`
	Dropped   uint64 `json:"dropped,omitempty"`
}

// MarshalJSON and UnmarshalJSON keep span's fields unexported elsewhere.
func (s span) MarshalJSON() ([]byte, error) { return json.Marshal([2]uint64{s.start, s.end}) }

func (s *span) UnmarshalJSON(b []byte) error {
	var a [2]uint64
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	s.start, s.end = a[0], a[1]
	return nil
}

// sendRaw sends the workers' bytes after the state: one message per
// worker with any, straight from its buffers: In, Out (unless Mapped),
// then the length of each frame in Out (4 bytes, little-endian).
func sendRaw(conn *fdpass.Conn, ws []handedWorker) error {
	var ends []byte // reused: SendParts has sent it when it returns
	for i := range ws {
		hw := &ws[i]
		if hw.InLen+hw.OutLen+hw.Frames == 0 {
			continue
		}
		ends = ends[:0]
		prev := uint64(0)
		for _, e := range hw.Ends {
			ends = binary.LittleEndian.AppendUint32(ends, uint32(e-prev))
			prev = e
		}
		if err := conn.SendParts(hw.In, hw.out[0], hw.out[1], ends); err != nil {
			return fmt.Errorf("hub: upgrade: send worker %d's bytes: %w", hw.ID, err)
		}
	}
	return nil
}

// recvRaw receives what sendRaw sent into ws's In, Out and Ends.
func recvRaw(conn *fdpass.Conn, ws []handedWorker) error {
	for i := range ws {
		hw := &ws[i]
		if hw.InLen+hw.OutLen+hw.Frames == 0 {
			continue
		}
		if hw.InLen < 0 || hw.OutLen < 0 || hw.Frames < 0 {
			return fmt.Errorf("hub: upgrade: worker %d: negative lengths", hw.ID)
		}
		outLen := hw.OutLen // in the memfd when Mapped
		if hw.Mapped {
			outLen = 0
		}
		n := hw.InLen + outLen + 4*hw.Frames
		b, fds, err := conn.RecvSized(n)
		closeAll(fds)
		if err != nil {
			return fmt.Errorf("hub: upgrade: worker %d's bytes: %w", hw.ID, err)
		}
		if len(b) != n {
			return fmt.Errorf("hub: upgrade: worker %d's bytes: %d, want %d", hw.ID, len(b), n)
		}
		hw.In, hw.Out = b[:hw.InLen:hw.InLen], b[hw.InLen:hw.InLen+outLen]
		ends := b[hw.InLen+outLen:]
		hw.Ends = make([]uint64, hw.Frames)
		end := uint64(0)
		for j := range hw.Ends {
			end += uint64(binary.LittleEndian.Uint32(ends[4*j:]))
			hw.Ends[j] = end
		}
	}
	return nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func sendMsg(conn *fdpass.Conn, m upMsg, fds []int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("hub: upgrade: encode %s: %w", m.T, err)
	}
	if err := conn.Send(b, fds); err != nil {
		return fmt.Errorf("hub: upgrade: send %s: %w", m.T, err)
	}
	return nil
}

func recvMsg(conn *fdpass.Conn) (upMsg, []int, error) {
	b, fds, err := conn.Recv()
	if err != nil {
		return upMsg{}, nil, fmt.Errorf("hub: upgrade: %w", err)
	}
	var m upMsg
	if err := json.Unmarshal(b, &m); err != nil {
		closeAll(fds)
		return upMsg{}, nil, fmt.Errorf("hub: upgrade: decode: %w", err)
	}
	return m, fds, nil
}
