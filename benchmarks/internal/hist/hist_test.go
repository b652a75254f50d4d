package hist

import (
	"math/rand/v2"
	"sort"
	"testing"
)

func TestIndexLower(t *testing.T) {
	for _, v := range []int64{0, 1, 63, 64, 65, 127, 128, 1000, 1 << 20, 123456789, 1 << 40} {
		i := index(v)
		lo, w := lower(i)
		if v < lo || v >= lo+w {
			t.Fatalf("v=%d index %d bucket [%d,%d)", v, i, lo, lo+w)
		}
	}
}

func TestQuantile(t *testing.T) {
	var h H
	var vals []int64
	for range 100000 {
		v := int64(rand.ExpFloat64() * 1e6)
		vals = append(vals, v)
		h.Record(v)
	}
	sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
	for _, q := range []float64{0.5, 0.95, 0.99} {
		want := vals[int(q*float64(len(vals)))-1]
		got := h.Quantile(q)
		if d := float64(got-want) / float64(want); d > 0.02 || d < -0.02 {
			t.Errorf("q%.2f: got %d want %d", q, got, want)
		}
	}
	var m H
	m.MergeSparse(h.Sparse())
	if m.Quantile(0.99) != h.Quantile(0.99) || m.Count() != h.Count() {
		t.Fatal("sparse round trip")
	}
}
