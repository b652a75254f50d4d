package hub

import (
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A large fanout's writes over several threads.
//
// Waking a reader costs a write(2) several microseconds on a VM, so one
// NOTIFY to 256 workers is ~1 ms of writes one after the other on the loop
// thread, and the last worker gets its frame ~1 ms after the first. When
// one iteration has at least parallelMin workers to write, the loop splits
// them into disjoint slices: it offers all but one to helper goroutines
// (each locked to its own OS thread), writes the first itself, then takes
// back every slice no helper has started and waits for those that have. A helper does nothing but the write(2)/writev(2) of its
// workers' pending bytes and records how many bytes the kernel took; every
// other consequence (discarding the written bytes, counters, EPOLLOUT,
// closing a worker whose write failed) is done afterwards on the loop, in
// order, exactly as for a serial write. A helper touches the workers only
// between taking its job (a compare-and-swap on the job's state, after the
// loop stored it ready) and signalling done (a channel send the loop
// receives before it goes on), while the loop touches none of that job's
// workers: the hub stays lock-free, and the atomic state and the done
// channel are the happens-before edges.

// parallelMin is the fewest workers to write in one iteration for the
// writes to be split: below it a helper's wake-up (~5-20 µs) costs more
// than it saves.
const parallelMin = 32

// defaultWriteThreads is Config.WriteThreads' default: the cores the
// runtime may use, at most 4 (the loop's thread and 3 helpers).
func defaultWriteThreads() int { return min(runtime.GOMAXPROCS(0), 4) }

// loopLoad says whether the loop has been idle more than busy lately, which
// is when the helpers may write. A helper pays when there is a core nobody
// wants: at a paced rate a NOTIFY to 256 processes then reaches the last
// one sooner (p99 21 against 25 ms here). When the loop runs flat out, so
// does everything else (the notifier, Postgres, the woken readers), and a
// helper only takes a core from the readers: on two cores a flood to one
// process cost 303 ns of hub CPU per delivery with a helper against 226 ns
// without, and the reader fell behind and was evicted (docs/performance.md,
// parallel writes).
type loopLoad struct {
	end        time.Time // when the previous iteration ended
	busy, wait int64     // decaying sums of the last iterations, ns
}

// iteration records one iteration that began (epoll_wait returned) at
// start and ended at end.
func (l *loopLoad) iteration(start, end time.Time) {
	if !l.end.IsZero() {
		l.wait += int64(start.Sub(l.end)) - l.wait>>3
	}
	l.busy += int64(end.Sub(start)) - l.busy>>3
	l.end = end
}

func (l *loopLoad) idle() bool { return l.wait > l.busy }

// writeResult is what a helper's write left for the loop to apply.
type writeResult struct {
	n   int
	err error
}

// Job states. The loop makes a job ready; either its helper takes it (and
// signals done when finished) or the loop, having written its own share,
// steals it back and writes it itself: a helper thread the scheduler has not
// run yet never holds the loop up (on an oversubscribed machine it may not
// run for milliseconds).
const (
	jobIdle  int32 = iota // nothing to do; the loop may set the job up
	jobReady              // set up; the helper or the loop may take it
	jobTaken              // the helper is writing it; done follows
)

// fanoutJob is one helper's share of an iteration. ws and res are written by
// the loop while the job is idle and read by whoever takes it: the state's
// atomic operations order them.
type fanoutJob struct {
	state atomic.Int32
	ws    []*worker
	res   []writeResult
	wake  chan struct{} // buffered 1: a nudge, never blocks the loop
	done  chan struct{} // buffered 1: the helper finished a job it took
	iov   [][]byte
}

// fanout is the helpers. Created on the first large flush; stopped when the
// loop stops.
type fanout struct {
	jobs []*fanoutJob // one per helper
	res  []writeResult
	iov  [][]byte // the loop's writev vectors
	quit chan struct{}
}

func newFanout(helpers int) *fanout {
	f := &fanout{iov: make([][]byte, 2), quit: make(chan struct{})}
	for range helpers {
		j := &fanoutJob{wake: make(chan struct{}, 1), done: make(chan struct{}, 1), iov: make([][]byte, 2)}
		f.jobs = append(f.jobs, j)
		go j.run(f.quit)
	}
	return f
}

func (j *fanoutJob) run(quit <-chan struct{}) {
	runtime.LockOSThread()
	for {
		select {
		case <-quit:
			return
		case <-j.wake:
		}
		if j.state.CompareAndSwap(jobReady, jobTaken) {
			j.write()
			j.done <- struct{}{}
		}
	}
}

func (j *fanoutJob) write() {
	for i, w := range j.ws {
		j.res[i].n, j.res[i].err = rawWrite(w, j.iov)
	}
}

// stop ends the helpers. Loop goroutine, no flush in progress.
func (f *fanout) stop() { close(f.quit) }

// writeAll writes every worker of ws (each non-closed, not armed, with
// bytes pending), the loop's share itself, and returns each write's result
// in ws's order. It returns once every write is done.
func (f *fanout) writeAll(ws []*worker) []writeResult {
	if cap(f.res) < len(ws) {
		f.res = make([]writeResult, len(ws))
	}
	f.res = f.res[:len(ws)]
	clear(f.res)
	parts := len(f.jobs) + 1
	size := (len(ws) + parts - 1) / parts
	// The loop takes the first slice: it is written with no hand-off
	// delay, while the helpers wake up.
	mine := min(size, len(ws))
	used := f.jobs[:0:0]
	for i, j := range f.jobs {
		lo := mine + i*size
		if lo >= len(ws) {
			break
		}
		hi := min(lo+size, len(ws))
		j.ws, j.res = ws[lo:hi], f.res[lo:hi]
		j.state.Store(jobReady)
		select {
		case j.wake <- struct{}{}:
		default: // a nudge is pending already
		}
		used = f.jobs[:i+1]
	}
	for i, w := range ws[:mine] {
		f.res[i].n, f.res[i].err = rawWrite(w, f.iov)
	}
	for _, j := range used {
		if j.state.CompareAndSwap(jobReady, jobIdle) {
			// Not started: written here, with the loop's vectors.
			for i, w := range j.ws {
				j.res[i].n, j.res[i].err = rawWrite(w, f.iov)
			}
		} else {
			<-j.done
			j.state.Store(jobIdle)
		}
		j.ws, j.res = nil, nil
	}
	return f.res
}

// onWrite, set only by tests of the write path (export_test.go), is called
// before every write(2) or writev(2) to a worker, from whichever thread
// makes it.
var onWrite func(*worker)

// rawWrite is the system call of a write: one write (or writev, when the
// ring wraps) of everything pending. It changes nothing.
func rawWrite(w *worker, iov [][]byte) (int, error) {
	a, b := w.out.Peek()
	for {
		if onWrite != nil {
			onWrite(w)
		}
		var n int
		var err error
		if len(b) == 0 {
			n, err = unix.Write(int(w.fd), a)
		} else {
			iov[0], iov[1] = a, b
			n, err = writev(int(w.fd), iov)
			iov[0], iov[1] = nil, nil
		}
		if err != unix.EINTR {
			return n, err
		}
	}
}

// flushParallel writes the dirty workers over the write threads (see
// fanout.go) and applies each result; flush then finds them written.
func (h *Hub) flushParallel() {
	ws := h.writers.pwork[:0]
	for _, w := range h.dirty {
		if !w.closed && !w.armed && w.out.Len() > 0 {
			ws = append(ws, w)
		}
	}
	if len(ws) >= parallelMin {
		if h.writers.fan == nil {
			h.writers.fan = newFanout(h.cfg.WriteThreads - 1)
		}
		res := h.writers.fan.writeAll(ws)
		for i, w := range ws {
			// In order, on the loop: a failed write closes its
			// worker, a short one arms EPOLLOUT. flush's pass then
			// finds each written (nothing pending: no system call)
			// or armed (skipped).
			h.wrote(w, res[i].n, res[i].err)
		}
	}
	clear(ws)
	h.writers.pwork = ws[:0]
}
