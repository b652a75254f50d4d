// Package fdreserve keeps a few descriptors open (on /dev/null) for the
// moment the process runs out of them (RLIMIT_NOFILE lowered under it,
// say): given up, they let the Postgres reconnect and the metrics server
// open what they need while workers hold every other descriptor, and they
// are taken again after. The hub keeps the reserve from its start on; the
// descriptors count in its budget like any other open at start.
package fdreserve

import (
	"errors"
	"sync"
	"syscall"
)

// Size is how many descriptors a reconnect may need at once: the socket,
// the duplicate the listener takes of it, and one for a name lookup.
const Size = 3

var (
	mu    sync.Mutex
	held  []int
	users int // Keep calls not matched by a Drop
)

// Keep makes the reserve hold Size descriptors until the matching Drop,
// taking what it can now (the rest at the next Refill). Each hub of the
// process keeps it while it runs.
func Keep() {
	mu.Lock()
	defer mu.Unlock()
	users++
	refillLocked()
}

// Drop ends a Keep; the last one closes the reserve, so that a process
// whose hubs have stopped holds none of its descriptors.
func Drop() {
	mu.Lock()
	defer mu.Unlock()
	if users > 0 {
		users--
	}
	if users == 0 {
		releaseLocked()
	}
}

// Refill takes again, as far as descriptors allow, what the reserve gave
// up. The hub calls it on its status tick: a reserve given up while the
// process was short fills up once descriptors are free again. It never
// waits, since its caller is an event loop: while a Retry is using the
// reserve (a Postgres dial may take seconds), it does nothing, and Retry
// takes the reserve again itself.
func Refill() {
	if !mu.TryLock() {
		return
	}
	defer mu.Unlock()
	refillLocked()
}

// Held returns how many descriptors the reserve holds now.
func Held() int {
	mu.Lock()
	defer mu.Unlock()
	return len(held)
}

// Exhausted reports whether err says the process (EMFILE) or the system
// (ENFILE) is out of descriptors.
func Exhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// Retry runs f, and when f failed for want of descriptors and the reserve
// holds some, gives the reserve up, runs f once more and takes the reserve
// again (what f opened may leave it short until a later Refill). One
// caller at a time uses the reserve; another that runs short meanwhile
// waits for it.
func Retry(f func() error) error {
	err := f()
	if !Exhausted(err) {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	if len(held) == 0 {
		return err
	}
	releaseLocked()
	err = f()
	refillLocked()
	return err
}

func releaseLocked() {
	for _, fd := range held {
		closeFD(fd)
	}
	held = held[:0]
}

func refillLocked() {
	for users > 0 && len(held) < Size {
		fd, err := openNull()
		if err != nil {
			return
		}
		held = append(held, fd)
	}
}
