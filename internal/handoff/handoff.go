// Package handoff is the bridge the hot upgrade crosses between packages
// that must not show it in their public API: package pglisten registers how
// a LISTEN connection is detached, adopted and split at a marker, package
// hub registers its two ends of the hand-over, and package hub and command
// listenhub call them through here. Nothing in it is a promise to anyone
// outside this module.
//
// The registrations are made from the registering package's init, which
// runs before any package importing it is initialized, so a Get never
// finds nothing.
package handoff

import (
	"context"
	"errors"

	"github.com/listenhub/listenhub/internal/fdpass"
	"github.com/listenhub/listenhub/loop"
)

// PG is a plaintext LISTEN connection as it moves to another process. The
// field names are part of the hand-over's JSON (an older binary reads
// them).
type PG struct {
	// FD is the connection's socket. It is not part of the JSON: it
	// travels as SCM_RIGHTS.
	FD         int `json:"-"`
	BackendPID uint32
	// Channels is the set LISTENed on the connection.
	Channels []string
	// Unread are bytes read from the socket and not parsed yet.
	Unread []byte
	// Check is the delivery check's private channel, LISTENed on the
	// connection ("" when it is not: the adopter LISTENs one of its own).
	Check string `json:",omitempty"`
}

// Conn is what a listener connection offers an upgrade (package pglisten,
// handover.go, says what each does).
type Conn interface {
	CanDetach() bool
	WhenIdle(done func())
	CancelHold()
	Detach() (PG, error)
	Resume() error
	Abandon()
	Terminate(done func())
	PauseAtMarker(marker string, done func())
	SendMarker(marker string) error
}

// Listener is package pglisten's part, C its connection and Cfg its
// configuration type.
type Listener[C, Cfg any] struct {
	// Of returns the upgrade side of c.
	Of func(c C) Conn
	// Adopt makes a connection of one another process detached.
	Adopt func(l *loop.Loop, cfg Cfg, pg PG) (C, error)
	// OpenForTakeover opens a connection of this process's own for the
	// marker hand-over.
	OpenForTakeover func(ctx context.Context, l *loop.Loop, cfg Cfg, channels []string, marker string, onMarker func()) (C, error)
}

// Hub is package hub's part, H its hub type.
type Hub[H any] struct {
	// Handover hands h to the process at the other end of conn.
	Handover func(h H, ctx context.Context, conn *fdpass.Conn, extra map[string]int) error
	// Takeover starts h from the state handed over on conn.
	Takeover func(h H, ctx context.Context, conn *fdpass.Conn, onLive func()) (map[string]int, error)
}

// ErrRefused is wrapped by Handover's error when the new process refused
// the state (and says why itself before it exits).
var ErrRefused = errors.New("the new process refused")

var listener, hub any

// RegisterListener is called by package pglisten's init.
func RegisterListener[C, Cfg any](f Listener[C, Cfg]) { listener = f }

// GetListener returns what package pglisten registered; it panics if the
// types differ (a programming error).
func GetListener[C, Cfg any]() Listener[C, Cfg] { return listener.(Listener[C, Cfg]) }

// RegisterHub is called by package hub's init.
func RegisterHub[H any](f Hub[H]) { hub = f }

// GetHub returns what package hub registered.
func GetHub[H any]() Hub[H] { return hub.(Hub[H]) }
