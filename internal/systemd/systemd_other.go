//go:build !linux

package systemd

import "time"

// Notifier is never opened off Linux: NewNotifier returns nil, whose
// methods accept every call and send nothing.
type Notifier struct{}

// NewNotifier returns nil, nil: no service manager listens off Linux.
func NewNotifier() (*Notifier, error) { return nil, nil }

// Notify sends nothing.
func (n *Notifier) Notify(state string) error { return nil }

// Close does nothing.
func (n *Notifier) Close() error { return nil }

// Notify sends nothing.
func Notify(state string) error { return nil }

// WatchdogInterval returns 0: no watchdog off Linux.
func WatchdogInterval() (time.Duration, error) { return 0, nil }

// Listeners returns nil: no socket activation off Linux.
func Listeners() ([]Listener, error) { return nil, nil }
