package hub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The pre-copy of an upgrade (docs/design.md, "Lifecycle"). Workers that
// stopped reading can hold hundreds of megabytes between them, and sending
// them raw inside the freeze made the freeze as long as the copy (40
// wedged workers at the caps: 1.2 s) and the two processes' memory twice
// the backlog. So before the freeze, while the workers are still served,
// the old process's loop copies every large backlog, a slice per
// iteration, into one memfd (each worker at its own page-aligned region);
// in the freeze only what changed since is dealt with: the bytes appended
// after the copy are written to the region too, and the state says where
// each worker's unsent bytes start in the file. The new process maps the
// regions and its rings send from the mappings (ring.AdoptForeign).
//
// pwrite into a memfd puts the bytes in shmem pages that are in neither
// process's RSS until touched through a mapping: the new process touches
// a page only to send it. The machine holds a pre-copied backlog twice
// (the old heap and the file) from the copy until the old process exits.
// A rollback leaves the old process as it was: nothing but the file was
// written, and it is closed.

const (
	// precopyMin is the least backlog worth pre-copying: below it the
	// bytes travel raw in the freeze (a few milliseconds for thousands
	// of workers), which costs no mapping and no file.
	precopyMin = 256 << 10
	// precopySliceBytes and precopySliceTime bound one loop iteration's
	// share of the copy; a wake waiting behind it is late by about a
	// millisecond at worst. The next slice starts as long after as this
	// one took: the copy takes at most half of the loop's time.
	precopySliceBytes = 4 << 20
	precopySliceTime  = time.Millisecond
	// precopyPiece is one pwrite: the clock is looked at between two.
	precopyPiece = 256 << 10
	// precopyRounds: once everything was copied, a region whose worker
	// got precopyMin more since is extended this many times, so that
	// the freeze is left only small remainders.
	precopyRounds = 2
	// precopyNoCap is the room reserved after a region for a worker
	// without a byte cap (the file is sparse: unused room costs nothing).
	precopyNoCap = 64 << 20
)

// precopy is one upgrade's pre-copy. The loop goroutine's while it runs
// and in the freeze; fd is closed on the loop (dropPrecopy), so that no
// copy can write to a descriptor number reused meanwhile.
type precopy struct {
	fd     int // the memfd; -1 once closed
	parts  map[*worker]*prePart
	order  []*prePart
	next   int   // index in order of the part being copied
	end    int64 // file space reserved so far
	rounds int
	copied int64 // bytes written to the file
	start  time.Time
	slices int           // loop iterations it took
	busy   time.Duration // loop time it took
	stop   atomic.Bool   // the upgrade gave up: the next slice ends it
	// handed are the page ranges of the parts handed over (hand), the
	// only ones the new process maps.
	handed [][2]int64
	done   chan error // the copy is complete (nil) or abandoned
}

// prePart is one worker's region of the file: ring bytes [p0, p1) (absolute
// offsets) at file offset at+(offset-p0), room bytes reserved from at.
type prePart struct {
	w      *worker
	id     uint64 // w's id when the copy started: w may be reused after a close
	at     int64
	room   int64
	p0, p1 uint64
	next   uint64 // the next ring byte to copy; p1 once complete
	ok     bool   // false: dropped (the worker went, or sent past p1)
}

// precopy copies the large backlogs before the freeze and returns what
// the snapshot needs; nil (logged) when there is nothing to copy or no
// memfd to copy to: the bytes travel raw then. Handover's goroutine.
func (h *Hub) precopy(ctx context.Context) (*precopy, error) {
	pc := &precopy{fd: -1, done: make(chan error, 1)}
	if err := h.loop.Post(func() { h.startPrecopy(pc) }); err != nil {
		return nil, err
	}
	select {
	case err := <-pc.done:
		if err != nil || pc.fd < 0 {
			h.dropPrecopy(pc)
			return nil, err
		}
		h.log.Info("upgrade: pre-copied the large backlogs", "workers", len(pc.order), "bytes", pc.copied,
			"took", time.Since(pc.start).Round(time.Microsecond), "slices", pc.slices, "loop_time", pc.busy.Round(time.Microsecond))
		return pc, nil
	case <-ctx.Done():
		pc.stop.Store(true)
		h.dropPrecopy(pc)
		return nil, ctx.Err()
	case <-h.done:
		h.dropPrecopy(pc)
		return nil, ErrNotRunning
	}
}

// startPrecopy picks the workers and creates the file. Loop goroutine.
func (h *Hub) startPrecopy(pc *precopy) {
	pc.start = time.Now()
	page := int64(unix.Getpagesize())
	for w := range h.workers.all() {
		if w.closed || w.out.Len() < precopyMin {
			continue
		}
		room := int64(w.out.Max)
		if room <= 0 {
			room = precopyNoCap
		}
		room = pageUp(int64(w.out.Len()), page) + pageUp(room, page)
		p := &prePart{w: w, id: w.id, at: pc.end, room: room,
			p0: w.out.Written(), p1: w.out.Appended(), next: w.out.Written(), ok: true}
		pc.end += room
		pc.order = append(pc.order, p)
	}
	if len(pc.order) == 0 {
		pc.done <- nil
		return
	}
	fd, err := memfdCreate("listenhub-upgrade")
	if err != nil {
		h.log.Warn("upgrade: no memfd for the pre-copy; the backlogs go in the freeze", "reason", err)
		pc.done <- nil
		return
	}
	pc.fd = fd
	pc.parts = make(map[*worker]*prePart, len(pc.order))
	for _, p := range pc.order {
		pc.parts[p.w] = p
	}
	h.precopyStep(pc)
}

// precopyStep copies one slice and posts the next. Loop goroutine.
func (h *Hub) precopyStep(pc *precopy) {
	if pc.stop.Load() || h.stopping || pc.fd < 0 {
		pc.done <- errors.New("abandoned")
		return
	}
	began := time.Now()
	complete, err := pc.slice(began.Add(precopySliceTime))
	pc.slices++
	pc.busy += time.Since(began)
	if err == nil && !complete {
		// As long again for everything else: the loop, and the
		// processes sharing the machine with it (Postgres among
		// them), are not starved while a large backlog is copied.
		h.loop.AfterFunc(time.Since(began), func() { h.precopyStep(pc) })
		return
	}
	pc.done <- err
}

// slice copies until the deadline or precopySliceBytes and reports whether
// the copy is complete.
func (pc *precopy) slice(until time.Time) (complete bool, err error) {
	for budget := precopySliceBytes; budget > 0 && time.Now().Before(until); {
		if pc.next == len(pc.order) && !pc.extend() {
			return true, nil
		}
		p := pc.order[pc.next]
		n, err := pc.copyPart(p, min(budget, precopyPiece))
		if err != nil {
			return false, fmt.Errorf("pre-copy worker %d: %w", p.id, err)
		}
		budget -= n
		if !p.ok || p.next == p.p1 {
			pc.next++
		}
	}
	return false, nil
}

// extend starts another round when some worker got precopyMin more bytes
// since its region was copied, and reports whether it did.
func (pc *precopy) extend() bool {
	if pc.rounds == precopyRounds {
		return false
	}
	pc.rounds++
	more := false
	for _, p := range pc.order {
		if !p.ok || !p.current() {
			continue
		}
		a := p.w.out.Appended()
		if a-p.p1 >= precopyMin && int64(a-p.p0) <= p.room {
			p.p1 = a
			more = true
		}
	}
	pc.next = 0
	return more
}

// current reports whether p's worker is still the one whose bytes it holds.
func (p *prePart) current() bool { return !p.w.closed && p.w.id == p.id }

// copyPart writes up to max bytes of p's range to the file, skipping what
// was sent meanwhile (a hole in the file that nobody reads), and returns
// how many it wrote.
func (pc *precopy) copyPart(p *prePart, max int) (int, error) {
	w := p.w
	written := w.out.Written()
	if !p.current() || written > p.p1 {
		p.ok = false
		return 0, nil
	}
	from := p.next
	if written > from {
		from = written
	}
	to := min(p.p1, from+uint64(max))
	if to <= from {
		p.next = p.p1
		return 0, nil
	}
	if err := pwriteRing(pc.fd, w, from, to, p.at+int64(from-p.p0)); err != nil {
		return 0, err
	}
	p.next = to
	pc.copied += int64(to - from)
	return int(to - from), nil
}

// pwriteRing writes w's ring bytes [from, to) (absolute offsets, pending
// now) to fd at off.
func pwriteRing(fd int, w *worker, from, to uint64, off int64) error {
	a, b := w.out.Peek()
	lo, hi := int(from-w.out.Written()), int(to-w.out.Written())
	for _, s := range [2][]byte{a, b} {
		if lo < len(s) && hi > 0 {
			piece := s[max(lo, 0):min(hi, len(s))]
			for len(piece) > 0 {
				n, err := unix.Pwrite(fd, piece, off)
				if err == unix.EINTR {
					continue
				}
				if err != nil {
					return err
				}
				piece, off = piece[n:], off+int64(n)
			}
		}
		lo, hi = lo-len(s), hi-len(s)
	}
	return nil
}

// hand completes w's region in the freeze and points hw at it, when w was
// pre-copied and nothing since contradicts it: the bytes appended since
// the copy go to the file too, and none of Out travels raw. Otherwise hw
// is left as it is: its bytes travel raw. Loop goroutine.
func (pc *precopy) hand(w *worker, hw *handedWorker) bool {
	p := pc.parts[w]
	if p == nil || !p.ok || !p.current() || p.next != p.p1 || pc.fd < 0 {
		return false
	}
	written, appended := w.out.Written(), w.out.Appended()
	if written < p.p0 || written > p.p1 || appended < p.p1 || int64(appended-p.p0) > p.room || written == appended {
		return false
	}
	if err := pwriteRing(pc.fd, w, p.p1, appended, p.at+int64(p.p1-p.p0)); err != nil {
		return false // raw after all
	}
	hw.Mapped, hw.MapAt = true, p.at+int64(written-p.p0)
	hw.out = [2][]byte{}
	page := int64(unix.Getpagesize())
	pc.handed = append(pc.handed, [2]int64{hw.MapAt / page * page, pageUp(hw.MapAt+int64(hw.OutLen), page)})
	return true
}

// punchUnhanded frees the file's pages that no handed worker's part
// covers: the regions of workers that went raw after all (they read past
// their copy, or closed) and the bytes a handed worker read between the
// copy and the freeze. The new process maps only the handed parts and
// frees each when its ring lets go of it; without this the rest would
// stay allocated as long as any part is mapped, a wedged worker's for
// ever. Harmless on a rollback (the file goes with its last descriptor).
func (pc *precopy) punchUnhanded() {
	slices.SortFunc(pc.handed, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var from int64
	for _, r := range append(pc.handed, [2]int64{pc.end, pc.end}) {
		if r[0] > from {
			punchHole(pc.fd, from, r[0]-from)
		}
		from = max(from, r[1])
	}
}

// dropPrecopy closes pc's file on the loop, after any slice in flight (or
// here, once the loop has stopped). Any goroutine.
func (h *Hub) dropPrecopy(pc *precopy) {
	if pc == nil {
		return
	}
	closeFile := func() {
		if pc.fd >= 0 {
			pc.punchUnhanded()
			unix.Close(pc.fd)
			pc.fd = -1
		}
	}
	if h.loop.Post(closeFile) != nil {
		closeFile()
	}
}

func pageUp(n, page int64) int64 { return (n + page - 1) / page * page }

// backlogFile is the pre-copy's memfd in the new process. Each adopted ring
// maps its part; when a ring lets go of it (drained, moved to storage of
// its own, or closed), the part's pages are punched out of the file, so
// that a drained worker's backlog is freed while others still hold theirs,
// and the last part closes the file. Loop goroutine (or before it runs).
type backlogFile struct {
	fd    int
	size  int64
	parts int
	// closed, if set, is called once the file is closed (on the loop:
	// the last part is let go of there).
	closed func()
}

func openBacklogFile(fd int) (*backlogFile, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("hub: upgrade: the backlog file: %w", err)
	}
	return &backlogFile{fd: fd, size: st.Size}, nil
}

// mapPart maps n bytes at off, read-only, and returns them with the
// function that lets go of them (for ring.AdoptForeign).
func (f *backlogFile) mapPart(off int64, n int) ([]byte, func(), error) {
	if off < 0 || n <= 0 || off+int64(n) > f.size {
		return nil, nil, fmt.Errorf("hub: upgrade: %d bytes at %d of a %d-byte backlog file", n, off, f.size)
	}
	page := int64(unix.Getpagesize())
	base := off / page * page
	m, err := unix.Mmap(f.fd, base, int(off-base)+n, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("hub: upgrade: map the backlog file: %w", err)
	}
	f.parts++
	free := func() {
		unix.Munmap(m)
		// Whole pages: no other part shares one (mapWorkers).
		punchHole(f.fd, base, pageUp(int64(len(m)), page))
		if f.parts--; f.parts == 0 {
			f.close()
		}
	}
	return m[off-base:], free, nil
}

func (f *backlogFile) close() {
	if f.fd >= 0 {
		unix.Close(f.fd)
		f.fd = -1
		if f.closed != nil {
			f.closed()
		}
	}
}

// mapWorkers maps the pre-copied workers' bytes into their Out. A part
// whose pages another part's also covers is refused: freeing one would
// punch out the other's bytes. On an error nothing stays mapped and the
// file is closed.
func mapWorkers(f *backlogFile, ws []handedWorker) error {
	var mapped []*handedWorker
	for i := range ws {
		if ws[i].Mapped {
			mapped = append(mapped, &ws[i])
		}
	}
	slices.SortFunc(mapped, func(a, b *handedWorker) int { return cmp.Compare(a.MapAt, b.MapAt) })
	page := int64(unix.Getpagesize())
	var err error
	for i, hw := range mapped {
		if i > 0 && hw.MapAt/page*page < pageUp(mapped[i-1].MapAt+int64(mapped[i-1].OutLen), page) {
			err = fmt.Errorf("hub: upgrade: workers %d and %d share pages of the backlog file", mapped[i-1].ID, hw.ID)
			break
		}
		if hw.Out, hw.free, err = f.mapPart(hw.MapAt, hw.OutLen); err != nil {
			break
		}
	}
	if err != nil {
		unmapWorkers(ws)
	}
	if f.parts == 0 {
		f.close()
	}
	return err
}

// unmapWorkers lets go of the mappings mapWorkers made that no ring
// adopted.
func unmapWorkers(ws []handedWorker) {
	for i := range ws {
		if free := ws[i].free; free != nil {
			ws[i].free, ws[i].Out = nil, nil
			free()
		}
	}
}
