package hub

import "iter"

// workerSet is the connected workers. A slice in which each worker knows its
// index, rather than a map by id: adding and removing stay O(1), and a
// worker costs the set 8 bytes instead of a map slot and the garbage of the
// map's growth (docs/performance.md, idle memory).
type workerSet struct {
	list []*worker
}

func (s *workerSet) len() int { return len(s.list) }

func (s *workerSet) add(w *worker) {
	w.idx = int32(len(s.list))
	s.list = append(s.list, w)
}

// remove takes w out; the last worker fills its place.
func (s *workerSet) remove(w *worker) {
	i := int(w.idx)
	if i < 0 || i >= len(s.list) || s.list[i] != w {
		return
	}
	last := len(s.list) - 1
	s.list[i] = s.list[last]
	s.list[i].idx = int32(i)
	s.list[last] = nil
	s.list = s.list[:last]
	w.idx = -1
	if cap(s.list) > 1024 && len(s.list) < cap(s.list)/4 {
		s.list = append([]*worker(nil), s.list...) // a flood's worth of slots is not kept
	}
}

// all yields every worker; the loop body may close the worker at hand.
func (s *workerSet) all() iter.Seq[*worker] { return lastFirst(&s.list) }

// lastFirst yields the elements of *list from the last to the first,
// reading *list afresh at each step. The workers set and a channel's
// routing table both fill a removed element's place with their last one, so
// a loop body may remove the element at hand (close or evict a worker):
// the element that takes its place was yielded already, so none is skipped
// and none yielded twice.
func lastFirst[T any](list *[]T) iter.Seq[T] {
	return func(yield func(T) bool) {
		for i := len(*list) - 1; i >= 0; i-- {
			if i >= len(*list) {
				continue // more than the element at hand went
			}
			if !yield((*list)[i]) {
				return
			}
		}
	}
}
