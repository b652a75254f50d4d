package hub

import (
	"fmt"
	"math/rand"
	"testing"
)

// subSet against a map model, across the small/indexed boundary both ways.
func TestSubSetMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	chans := make([]*channel, 40)
	for i := range chans {
		chans[i] = &channel{q: fmt.Sprintf("q%d", i)}
	}
	var s subSet
	model := map[string]*channel{}
	for step := 0; step < 20000; step++ {
		ch := chans[rng.Intn(len(chans))]
		// Bias towards growth then shrinkage so both regimes are crossed.
		grow := (step/2000)%2 == 0
		if rng.Intn(3) > 0 == grow {
			_, had := model[ch.q]
			if added := s.add(ch, step); added == had {
				t.Fatalf("step %d: add(%s) = %v with model holding it = %v", step, ch.q, added, had)
			}
			model[ch.q] = ch
		} else {
			s.remove(ch.q)
			delete(model, ch.q)
		}
		if s.len() != len(model) {
			t.Fatalf("step %d: len %d, model %d", step, s.len(), len(model))
		}
		if (s.index != nil) && s.len() <= smallSubs/2 {
			t.Fatalf("step %d: index kept at %d entries", step, s.len())
		}
		for _, c := range chans {
			if got, want := s.get(c.q), model[c.q]; got != want {
				t.Fatalf("step %d: get(%s) = %v, want %v", step, c.q, got, want)
			}
		}
	}
	s.reset()
	if s.len() != 0 || s.get("q1") != nil {
		t.Fatal("reset left entries")
	}
}

// The routing tables and the workers' subscriptions agree after any mix of
// subscribes and leaves: every channel lists exactly its subscribers, once
// each, and each subscription knows its worker's place in the channel's
// table (what removeSubscriber relies on to be O(1)).
func TestRoutingTableMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	chans := make([]*channel, 12)
	for i := range chans {
		chans[i] = &channel{q: fmt.Sprintf("q%d", i)}
	}
	workers := make([]*worker, 30)
	for i := range workers {
		workers[i] = &worker{id: uint64(i + 1)}
	}
	model := map[*channel]map[*worker]bool{}
	for _, ch := range chans {
		model[ch] = map[*worker]bool{}
	}
	for step := 0; step < 20000; step++ {
		ch, w := chans[rng.Intn(len(chans))], workers[rng.Intn(len(workers))]
		// Some workers hold many channels (past smallSubs, with an index).
		if rng.Intn(2) == 0 {
			if added := addSubscriber(ch, w); added == model[ch][w] {
				t.Fatalf("step %d: addSubscriber(%s, %d) = %v with the worker subscribed %v", step, ch.q, w.id, added, model[ch][w])
			}
			model[ch][w] = true
		} else {
			removeSubscriber(ch, w)
			delete(model[ch], w)
		}
		for _, c := range chans {
			if len(c.subs) != len(model[c]) {
				t.Fatalf("step %d: %s has %d subscribers, model %d", step, c.q, len(c.subs), len(model[c]))
			}
			for i, x := range c.subs {
				if !model[c][x] {
					t.Fatalf("step %d: %s lists worker %d, not subscribed", step, c.q, x.id)
				}
				j := x.subs.find(c.q)
				if j < 0 || x.subs.list[j].at != int32(i) {
					t.Fatalf("step %d: worker %d's subscription to %s says place %v, it is at %d", step, x.id, c.q, j, i)
				}
			}
		}
	}
}
