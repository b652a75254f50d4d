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
			if added := s.add(ch); added == had {
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
