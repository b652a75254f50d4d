package hub

// subSet is one worker's subscriptions. Nearly every worker holds one or a
// few, and for those a slice scan is faster than a map and costs a fraction
// of its memory (8 bytes a subscription against a map's ~200-byte minimum):
// idle workers are what a hub holds most of. A process that multiplexes
// many channels over one socket (client.Mux) gets a map index once it holds
// more than smallSubs, so sub and unsub stay O(1) there.
type subSet struct {
	list  []*channel
	index map[string]int // position in list; nil while len(list) <= smallSubs
}

const smallSubs = 8

func (s *subSet) len() int { return len(s.list) }

func (s *subSet) get(q string) *channel {
	if s.index != nil {
		if i, ok := s.index[q]; ok {
			return s.list[i]
		}
		return nil
	}
	for _, ch := range s.list {
		if ch.q == q {
			return ch
		}
	}
	return nil
}

// add reports whether ch was added (false: already there).
func (s *subSet) add(ch *channel) bool {
	if s.get(ch.q) != nil {
		return false
	}
	s.list = append(s.list, ch)
	if s.index != nil {
		s.index[ch.q] = len(s.list) - 1
	} else if len(s.list) > smallSubs {
		s.index = make(map[string]int, len(s.list))
		for i, c := range s.list {
			s.index[c.q] = i
		}
	}
	return true
}

// remove takes q out; order is not kept (the last entry fills the gap).
func (s *subSet) remove(q string) {
	i := -1
	if s.index != nil {
		if j, ok := s.index[q]; ok {
			i = j
		}
	} else {
		for j, ch := range s.list {
			if ch.q == q {
				i = j
				break
			}
		}
	}
	if i < 0 {
		return
	}
	last := len(s.list) - 1
	s.list[i] = s.list[last]
	s.list[last] = nil
	s.list = s.list[:last]
	if s.index != nil {
		delete(s.index, q)
		if i < last {
			s.index[s.list[i].q] = i
		}
		if len(s.list) <= smallSubs/2 {
			s.index = nil
		}
	}
	if len(s.list) == 0 {
		s.list = nil
	}
}

// reset forgets everything and frees the storage.
// reset empties the set, keeping a small list's storage for the worker
// struct's next connection (Hub.recycle).
func (s *subSet) reset() {
	clear(s.list)
	if cap(s.list) > smallSubs {
		s.list = nil
	} else {
		s.list = s.list[:0]
	}
	s.index = nil
}
