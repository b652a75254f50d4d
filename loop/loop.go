// Package loop is a single-threaded, level-triggered event loop.
//
// One goroutine, locked to its OS thread, waits for readiness and runs every
// callback:
// fd readiness handlers, timers, functions posted from other goroutines and
// end-of-iteration hooks. Because everything runs on that one goroutine, the
// state a loop's callbacks touch needs no locks. The price is the rule every
// callback must keep: never block. No blocking syscall, channel operation,
// lock or network round-trip; slow work goes to another goroutine, which hands
// its result back with Post.
//
// One iteration of Run, top to bottom:
//
//  1. the wait (epoll_wait or poll), with a timeout taken from the nearest
//     timer (0 when posts are already queued, forever when there is nothing
//     to wait for);
//  2. the readiness handler of every fd the wait reported;
//  3. every timer whose deadline has passed, in deadline order;
//  4. every function posted before this step started, in posting order;
//  5. the AfterIteration hooks (the hub flushes each worker it touched here,
//     so all the frames one iteration produced leave in one write).
//
// The loop knows nothing of frames, workers or Postgres.
//
// # Backends
//
// Two backends sit behind the same API and the same semantics
// (level-triggered readiness, hang-ups reported as Readable|Writable, stale
// events dropped by generation); Backend names the one compiled in.
//
//   - epoll, the default on Linux: the kernel keeps the interest set, and a
//     wait costs in proportion to the fds that are ready. Wakes from other
//     goroutines go through an eventfd.
//   - poll(2), on every other Unix (macOS and FreeBSD, where developers run
//     the hub and embed the client) and on Linux under the build tag
//     listenhub_poll, which is how CI runs the loop, hub, client and command
//     suites through it. The interest set is an array handed to the kernel
//     on every wait, so each wait costs one pass over every registered fd,
//     ready or not, in the kernel and again in the loop: fine for a
//     developer's hundreds of workers, linear in the fd count beyond
//     (docs/performance.md has the measured curve). Wakes go through a
//     self-pipe, the same code on every platform, so what runs on a Mac is
//     what CI tests here. macOS refuses poll on more than OPEN_MAX (10,240)
//     descriptors.
//
// There is no kqueue backend: nothing this project builds on can run it, and
// untested code is a defect.
package loop

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Events is a set of readiness conditions.
type Events uint32

const (
	// Readable: data (or EOF) can be read without blocking.
	Readable Events = 1 << iota
	// Writable: some bytes can be written without blocking.
	Writable
)

func (e Events) String() string {
	switch e {
	case 0:
		return "none"
	case Readable:
		return "readable"
	case Writable:
		return "writable"
	case Readable | Writable:
		return "readable|writable"
	}
	return fmt.Sprintf("Events(%#x)", uint32(e))
}

// Handler is called on the loop goroutine when its fd is ready. A hang-up or
// an error on the fd is reported as Readable|Writable whatever the interest,
// as the Go runtime's netpoller does: whichever side the owner is waiting on
// then sees the failure on its next read or write. A Handler must not block.
type Handler func(ev Events)

// Token names one registration. File descriptor numbers are reused as soon as
// they are closed, so a Token carries a generation as well: events, Modify and
// Unregister for a registration that no longer exists are recognised as stale
// instead of reaching whoever holds the fd number now.
type Token struct {
	fd  int32
	gen uint32
}

// FD returns the file descriptor the token was registered for.
func (t Token) FD() int { return int(t.fd) }

// Valid reports whether t came from Register (the zero Token never does).
func (t Token) Valid() bool { return t.gen != 0 }

var (
	// ErrStopped is returned by Post after the loop has stopped.
	ErrStopped = errors.New("loop: stopped")
	// ErrStaleToken is returned for a token whose registration is gone.
	ErrStaleToken = errors.New("loop: stale token")
	// ErrRunning is returned by a second call to Run.
	ErrRunning = errors.New("loop: Run already called")
)

// Options configures a Loop.
type Options struct {
	// Logger receives the loop's own rare complaints (a failed epoll_ctl
	// during shutdown, say). Nil means slog.Default().
	Logger *slog.Logger
	// MaxEvents bounds the readiness events taken from one epoll_wait.
	// Zero means 256. The poll backend reports every ready fd of a wait
	// and ignores it.
	MaxEvents int
}

// registration is one fd's entry in Loop.regs, held by value: registering
// a connection allocates nothing in the loop. gen 0 marks a free slot.
type registration struct {
	gen uint32
	ev  Events
	h   Handler
}

// ready is one fd a wait reported, with the generation it was registered
// under, so that the loop can drop it if an earlier handler of the same
// pass unregistered (or re-registered) the fd.
type ready struct {
	fd  int32
	gen uint32
	ev  Events
}

// Loop is a single-threaded event loop. Methods documented "loop goroutine
// only" may also be called before Run starts, for setup, but never
// concurrently with Run from another goroutine.
type Loop struct {
	be     *backend // the OS's readiness interface and the wake-up fd
	log    *slog.Logger
	events []ready // what the last wait reported; reused

	// Loop-goroutine state.
	regs      []registration // indexed by fd; gen 0 when not registered
	gen       uint32         // last generation handed out; 0 is never used
	timers    timerHeap
	timerSeq  uint64
	afterIter []func()
	onClose   []func()
	now       time.Time

	// Shared with other goroutines.
	mu       sync.Mutex
	posts    []func() // guarded by mu
	closed   bool     // guarded by mu: Post refuses once set
	spare    []func() // loop goroutine only: the drained posts slice, reused
	notified atomic.Bool
	stopping atomic.Bool
	started  atomic.Bool
	tid      atomic.Int64 // thread (or goroutine) of Run, for inLoop; 0 until Run starts
	done     chan struct{}
}

// New creates a loop: the backend's readiness set and its wake-up fd.
func New(opts Options) (*Loop, error) {
	n := opts.MaxEvents
	if n <= 0 {
		n = 256
	}
	be, err := newBackend(n)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Loop{
		be:     be,
		log:    log,
		events: make([]ready, 0, n),
		now:    time.Now(),
		done:   make(chan struct{}),
	}, nil
}

// Run runs the loop on the calling goroutine, locked to its OS thread, until
// Stop. When it returns, the posts queued before the stop have run, the
// OnClose hooks have run, and the backend's descriptors are closed.
func (l *Loop) Run() error {
	if !l.started.CompareAndSwap(false, true) {
		return ErrRunning
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l.tid.Store(threadID())
	defer close(l.done)

	var err error
	for !l.stopping.Load() {
		if err = l.poll(); err != nil {
			break
		}
	}
	l.shutdown()
	return err
}

// Done is closed when Run has returned.
func (l *Loop) Done() <-chan struct{} { return l.done }

// poll is one iteration.
func (l *Loop) poll() error {
	var err error
	l.events, err = l.be.wait(l.events[:0], l.timeout())
	if err != nil {
		return err
	}
	// An interrupted wait (EINTR) reports nothing and no error: timers that
	// came due meanwhile still run, and the timeout is recomputed.
	l.now = time.Now()
	for _, e := range l.events {
		fd := int(e.fd)
		if fd >= len(l.regs) {
			continue
		}
		r := l.regs[fd]
		if r.gen == 0 || r.gen != e.gen {
			continue // unregistered, or re-registered, by an earlier handler
		}
		r.h(e.ev)
	}
	l.runTimers()
	l.runPosts()
	for _, f := range l.afterIter {
		f()
	}
	return nil
}

// timeout is the wait's timeout in milliseconds: 0 when posts are waiting,
// -1 (forever) when there is no timer, otherwise the time to the nearest
// timer rounded up, so that the loop never wakes a hair early and spins.
func (l *Loop) timeout() int {
	if l.stopping.Load() {
		return 0
	}
	if len(l.timers) == 0 {
		return -1
	}
	d := time.Until(l.timers[0].when)
	if d <= 0 {
		return 0
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	if ms > 1<<30 {
		ms = 1 << 30
	}
	return int(ms)
}

// wake ends the current or next wait. The CAS makes it one write to the
// wake-up fd per batch of posts: until the loop drains the queue, later
// posters find the flag set and skip the syscall. Called with mu held and
// closed false: shutdown closes the wake-up fd only after it set closed,
// and a write after that could land in whatever file reused the number.
func (l *Loop) wake() {
	if !l.notified.CompareAndSwap(false, true) {
		return
	}
	l.be.wake()
}

// Post queues f to run on the loop goroutine and wakes the loop. It is safe
// from any goroutine, including the loop's own (f then runs later in the
// same iteration's post step or the next). Posts from one goroutine run in
// the order they were posted. Once the loop has stopped, Post returns
// ErrStopped and f never runs.
func (l *Loop) Post(f func()) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrStopped
	}
	l.posts = append(l.posts, f)
	l.wake()
	return nil
}

func (l *Loop) runPosts() {
	// Clear the flag before taking the queue: a post that lands after the
	// swap then writes the eventfd again and is run next iteration.
	l.notified.Store(false)
	l.mu.Lock()
	batch := l.posts
	l.posts = l.spare[:0]
	l.mu.Unlock()
	for i, f := range batch {
		f()
		batch[i] = nil // let the closure be collected
	}
	l.spare = batch[:0]
}

// Stop makes Run return. From another goroutine it only asks: Run may still
// be finishing its current iteration when Stop returns (wait on Done). From
// a callback on the loop, the current iteration completes first.
//
// The rule for posts: every function whose Post returned nil runs before
// Run returns, including those posted by the shutdown itself up to the
// moment the queue is closed; after that, Post returns ErrStopped.
func (l *Loop) Stop() {
	l.stopping.Store(true)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return // stopped already: the wake-up fd is closed
	}
	l.notified.Store(false) // force the write: Run may be parked
	l.wake()
}

func (l *Loop) shutdown() {
	// Run what was posted before the stop, and what those posts post in
	// turn, then close the queue so later posts are refused.
	for {
		l.mu.Lock()
		if len(l.posts) == 0 {
			l.closed = true
			l.mu.Unlock()
			break
		}
		l.mu.Unlock()
		l.runPosts()
	}
	for _, f := range l.onClose {
		f()
	}
	l.timers = nil
	l.regs = nil
	l.be.close()
}

// OnClose registers f to run on the loop goroutine when the loop stops,
// after the remaining posts and before the loop's own descriptors close.
// Hooks run in registration order. Loop goroutine only.
func (l *Loop) OnClose(f func()) { l.onClose = append(l.onClose, f) }

// AfterIteration registers f to run at the end of every iteration, after
// all events, timers and posts of that pass. Loop goroutine only.
func (l *Loop) AfterIteration(f func()) { l.afterIter = append(l.afterIter, f) }

// Now returns the time taken when the current iteration's wait
// returned: cheap, and the same for every callback of one pass.
func (l *Loop) Now() time.Time { return l.now }

// inLoop reports whether the caller runs on the loop goroutine. Meant for
// assertions in tests; it costs a system call (a stack walk off Linux).
func (l *Loop) inLoop() bool {
	tid := l.tid.Load()
	return tid != 0 && threadID() == tid
}

// Register adds fd to the loop with interest ev and handler h. The fd should
// be non-blocking. Level-triggered: h is called every iteration for as long
// as the condition holds, so a handler that leaves data unread is called
// again. Loop goroutine only.
func (l *Loop) Register(fd int, ev Events, h Handler) (Token, error) {
	if fd < 0 {
		return Token{}, fmt.Errorf("loop: register fd %d: invalid descriptor", fd)
	}
	if h == nil {
		return Token{}, fmt.Errorf("loop: register fd %d: nil handler", fd)
	}
	if fd < len(l.regs) && l.regs[fd].gen != 0 {
		return Token{}, fmt.Errorf("loop: register fd %d: already registered", fd)
	}
	l.gen++
	if l.gen == 0 {
		l.gen = 1
	}
	gen := l.gen
	if err := l.be.add(fd, ev, gen); err != nil {
		return Token{}, fmt.Errorf("loop: register fd %d: %w", fd, err)
	}
	if fd >= len(l.regs) {
		l.growRegs(fd)
	}
	l.regs[fd] = registration{gen: gen, ev: ev, h: h}
	return Token{fd: int32(fd), gen: gen}, nil
}

// growRegs makes regs long enough to index fd, doubling its storage:
// append's growth (a quarter at a time for large slices) would copy the
// table five times over on the way to 10,000 connections.
func (l *Loop) growRegs(fd int) {
	if fd < cap(l.regs) {
		l.regs = l.regs[:fd+1]
		return
	}
	grown := make([]registration, fd+1, max(2*cap(l.regs), fd+1, 64))
	copy(grown, l.regs)
	l.regs = grown
}

func (l *Loop) lookup(t Token) *registration {
	fd := int(t.fd)
	if t.gen == 0 || fd < 0 || fd >= len(l.regs) {
		return nil
	}
	r := &l.regs[fd]
	if r.gen != t.gen {
		return nil
	}
	return r
}

// Modify changes the interest of a registration. Switching Writable on and
// off as an outbound buffer fills and drains is the expected use; a Modify
// to the current interest costs nothing. Loop goroutine only.
func (l *Loop) Modify(t Token, ev Events) error {
	r := l.lookup(t)
	if r == nil {
		return ErrStaleToken
	}
	if r.ev == ev {
		return nil
	}
	if err := l.be.mod(int(t.fd), ev, t.gen); err != nil {
		return fmt.Errorf("loop: modify fd %d: %w", t.fd, err)
	}
	r.ev = ev
	return nil
}

// Unregister removes a registration. It does not close the fd: the caller
// does, after this. Events already collected for it in the current
// iteration are dropped. Loop goroutine only.
func (l *Loop) Unregister(t Token) error {
	r := l.lookup(t)
	if r == nil {
		return ErrStaleToken
	}
	l.regs[t.fd] = registration{}
	if err := l.be.del(int(t.fd)); err != nil {
		return fmt.Errorf("loop: unregister fd %d: %w", t.fd, err)
	}
	return nil
}

// registered reports how many fds are registered (the wake-up fd not
// counted). Loop goroutine only; for tests.
func (l *Loop) registered() int {
	n := 0
	for _, r := range l.regs {
		if r.gen != 0 {
			n++
		}
	}
	return n
}
