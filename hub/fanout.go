package hub

import (
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// A large fanout's writes over several threads.
//
// Waking a reader costs a write(2) several microseconds on a VM, so one
// NOTIFY to 256 workers is ~1 ms of writes one after the other on the loop
// thread, and the last worker gets its frame ~1 ms after the first. When
// one iteration has at least parallelMin workers to write, the loop splits
// them into disjoint slices: it hands all but one to helper goroutines
// (each locked to its own OS thread), writes the last itself, and waits for
// all of them. A helper does nothing but the write(2)/writev(2) of its
// workers' pending bytes and records how many bytes the kernel took; every
// other consequence (discarding the written bytes, counters, EPOLLOUT,
// closing a worker whose write failed) is done afterwards on the loop, in
// order, exactly as for a serial write. The helpers touch the workers only
// between the hand-off (a channel send) and the loop's WaitGroup.Wait, while
// the loop touches nothing: the hub stays lock-free, and the channel and the
// WaitGroup are the happens-before edges.

// parallelMin is the fewest workers to write in one iteration for the
// writes to be split: below it a helper's wake-up (~5-20 µs) costs more
// than it saves.
const parallelMin = 32

// defaultWriteThreads is Config.WriteThreads' default: the cores the
// runtime may use, at most 4 (the loop's thread and 3 helpers).
func defaultWriteThreads() int { return min(runtime.GOMAXPROCS(0), 4) }

// writeResult is what a helper's write left for the loop to apply.
type writeResult struct {
	n   int
	err error
}

// fanoutJob is one helper's share of an iteration.
type fanoutJob struct {
	ws  []*worker
	res []writeResult
}

// fanout is the helpers. Created on the first large flush; stopped when the
// loop stops.
type fanout struct {
	jobs []chan fanoutJob // one per helper
	wg   sync.WaitGroup
	res  []writeResult // per worker of the current flush, reused
	iov  [][][]byte    // per helper and the loop, reused writev vectors
}

func newFanout(helpers int) *fanout {
	f := &fanout{jobs: make([]chan fanoutJob, helpers), iov: make([][][]byte, helpers+1)}
	for i := range f.jobs {
		ch := make(chan fanoutJob)
		f.jobs[i] = ch
		f.iov[i] = make([][]byte, 2)
		go f.helper(ch, f.iov[i])
	}
	f.iov[helpers] = make([][]byte, 2)
	return f
}

func (f *fanout) helper(jobs <-chan fanoutJob, iov [][]byte) {
	runtime.LockOSThread()
	for j := range jobs {
		for i, w := range j.ws {
			j.res[i].n, j.res[i].err = rawWrite(w, iov)
		}
		f.wg.Done()
	}
}

// stop ends the helpers. Loop goroutine, no flush in progress.
func (f *fanout) stop() {
	for _, ch := range f.jobs {
		close(ch)
	}
}

// writeAll writes every worker of ws (each non-closed, not armed, with
// bytes pending), the loop's share itself, and returns each write's result
// in ws's order. It returns once every helper is done.
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
	for i := range f.jobs {
		lo := mine + i*size
		if lo >= len(ws) {
			break
		}
		hi := min(lo+size, len(ws))
		f.wg.Add(1)
		f.jobs[i] <- fanoutJob{ws: ws[lo:hi], res: f.res[lo:hi]}
	}
	iov := f.iov[len(f.jobs)]
	for i, w := range ws[:mine] {
		f.res[i].n, f.res[i].err = rawWrite(w, iov)
	}
	f.wg.Wait()
	return f.res
}

// rawWrite is the system call of a write: one write (or writev, when the
// ring wraps) of everything pending. It changes nothing but w.writes.
func rawWrite(w *worker, iov [][]byte) (int, error) {
	a, b := w.out.Peek()
	for {
		w.writes++
		var n int
		var err error
		if len(b) == 0 {
			n, err = unix.Write(w.fd, a)
		} else {
			iov[0], iov[1] = a, b
			n, err = unix.Writev(w.fd, iov)
			iov[0], iov[1] = nil, nil
		}
		if err != unix.EINTR {
			return n, err
		}
	}
}
