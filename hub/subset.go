package hub

// subSet is one worker's subscriptions. Nearly every worker holds one or a
// few, and for those a slice scan is faster than a map and costs a fraction
// of its memory (16 bytes a subscription against a map's ~200-byte
// minimum): idle workers are what a hub holds most of. A process that
// multiplexes many channels over one socket (client.Mux) gets a map index
// once it holds more than smallSubs, so sub and unsub stay O(1) there.
type subSet struct {
	list  []subscription
	index map[string]int // position in list; nil while len(list) <= smallSubs
}

// subscription is one of a worker's channels, with the worker's place in
// that channel's routing table (channel.subs), so that leaving it is O(1).
type subscription struct {
	ch *channel
	at int32
}

const smallSubs = 8

func (s *subSet) len() int { return len(s.list) }

// find returns q's position in list, or -1.
func (s *subSet) find(q string) int {
	if s.index != nil {
		if i, ok := s.index[q]; ok {
			return i
		}
		return -1
	}
	for i := range s.list {
		if s.list[i].ch.q == q {
			return i
		}
	}
	return -1
}

func (s *subSet) get(q string) *channel {
	if i := s.find(q); i >= 0 {
		return s.list[i].ch
	}
	return nil
}

// add appends ch, with its place at, and reports whether it was added
// (false: already there).
func (s *subSet) add(ch *channel, at int) bool {
	if s.find(ch.q) >= 0 {
		return false
	}
	s.list = append(s.list, subscription{ch: ch, at: int32(at)})
	if s.index != nil {
		s.index[ch.q] = len(s.list) - 1
	} else if len(s.list) > smallSubs {
		s.index = make(map[string]int, len(s.list))
		for i, sub := range s.list {
			s.index[sub.ch.q] = i
		}
	}
	return true
}

// remove takes q out; order is not kept (the last entry fills the gap).
func (s *subSet) remove(q string) {
	i := s.find(q)
	if i < 0 {
		return
	}
	last := len(s.list) - 1
	s.list[i] = s.list[last]
	s.list[last] = subscription{}
	s.list = s.list[:last]
	if s.index != nil {
		delete(s.index, q)
		if i < last {
			s.index[s.list[i].ch.q] = i
		}
		if len(s.list) <= smallSubs/2 {
			s.index = nil
		}
	}
	if len(s.list) == 0 && cap(s.list) > smallSubs {
		s.list = nil
	}
}

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

// addSubscriber puts w in ch's routing table; false if it was there.
func addSubscriber(ch *channel, w *worker) bool {
	if !w.subs.add(ch, len(ch.subs)) {
		return false
	}
	ch.subs = append(ch.subs, w)
	return true
}

// removeSubscriber takes w out of ch's routing table and ch out of w's
// subscriptions; the last subscriber fills w's place.
func removeSubscriber(ch *channel, w *worker) {
	i := w.subs.find(ch.q)
	if i < 0 {
		return
	}
	at := int(w.subs.list[i].at)
	w.subs.remove(ch.q)
	last := len(ch.subs) - 1
	if moved := ch.subs[last]; at != last {
		ch.subs[at] = moved
		moved.subs.list[moved.subs.find(ch.q)].at = int32(at)
	}
	ch.subs[last] = nil
	ch.subs = ch.subs[:last]
	if c := cap(ch.subs); c > 64 && len(ch.subs) < c/4 {
		ch.subs = append([]*worker(nil), ch.subs...) // a crowd's worth of slots is not kept
	}
}
