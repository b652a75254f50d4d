// Package hist is a mergeable log-linear latency histogram.
//
// Values are nanoseconds. Below 64 ns each value has its own bucket; above,
// every power of two is split into 64 buckets, so a reported quantile is
// within 1.6% of the true sample. Workers keep one per socket (allocated on
// the first sample, so an idle socket costs nothing), send it to the harness
// in sparse form, and the harness merges them: percentiles over all receipts
// of all workers, not an average of per-worker percentiles.
package hist

import (
	"math"
	"math/bits"
	"time"
)

const (
	subBits = 6
	sub     = 1 << subBits
	maxExp  = 42 // 2^(42+6) ns ≈ 78 hours: nothing we measure is above
	size    = sub + maxExp*sub
)

// H is a histogram. The zero value is empty and ready.
type H struct {
	counts []uint64 // nil until the first sample
	n      uint64
	sum    float64
	min    int64
	max    int64
}

func index(v int64) int {
	if v < sub {
		if v < 0 {
			return 0
		}
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - subBits - 1
	if shift >= maxExp {
		return size - 1
	}
	return sub + shift*sub + int(uint64(v)>>shift) - sub
}

// lower returns the smallest value in bucket i and the bucket's width.
func lower(i int) (int64, int64) {
	if i < sub {
		return int64(i), 1
	}
	shift := (i - sub) / sub
	m := int64((i-sub)%sub + sub)
	return m << shift, 1 << shift
}

// Record adds one sample of v nanoseconds.
func (h *H) Record(v int64) {
	if h.counts == nil {
		h.counts = make([]uint64, size)
		h.min = math.MaxInt64
	}
	h.counts[index(v)]++
	h.n++
	h.sum += float64(v)
	if v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
}

// Count is the number of samples.
func (h *H) Count() uint64 { return h.n }

// Reset empties h, keeping its storage.
func (h *H) Reset() {
	if h.counts != nil {
		clear(h.counts)
	}
	h.n, h.sum, h.max = 0, 0, 0
	h.min = math.MaxInt64
}

// Merge adds o's samples to h.
func (h *H) Merge(o *H) {
	if o.n == 0 {
		return
	}
	if h.counts == nil {
		h.counts = make([]uint64, size)
		h.min = math.MaxInt64
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// Quantile returns the q-quantile (0..1) in nanoseconds: the middle of the
// bucket holding it, clamped to the observed min and max.
func (h *H) Quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, w := lower(i)
			v := lo + w/2
			return max(h.min, min(h.max, v))
		}
	}
	return h.max
}

// Summary is the printable digest of a histogram.
type Summary struct {
	Count uint64  `json:"count"`
	P50   float64 `json:"p50_us"`
	P95   float64 `json:"p95_us"`
	P99   float64 `json:"p99_us"`
	Max   float64 `json:"max_us"`
	Mean  float64 `json:"mean_us"`
}

func us(ns int64) float64 { return math.Round(float64(ns)/100) / 10 }

// Summarize returns h's percentiles in microseconds (0.1 µs resolution).
func (h *H) Summarize() Summary {
	if h.n == 0 {
		return Summary{}
	}
	return Summary{
		Count: h.n,
		P50:   us(h.Quantile(0.50)),
		P95:   us(h.Quantile(0.95)),
		P99:   us(h.Quantile(0.99)),
		Max:   us(h.max),
		Mean:  us(int64(h.sum / float64(h.n))),
	}
}

// Sparse is the wire form: non-zero buckets and the exact extremes.
type Sparse struct {
	Buckets [][2]uint64 `json:"b,omitempty"` // [index, count]
	Sum     float64     `json:"s,omitempty"`
	Min     int64       `json:"lo,omitempty"`
	Max     int64       `json:"hi,omitempty"`
}

// Sparse returns h in wire form.
func (h *H) Sparse() Sparse {
	s := Sparse{Sum: h.sum, Min: h.min, Max: h.max}
	if h.n == 0 {
		s.Min = 0
	}
	for i, c := range h.counts {
		if c != 0 {
			s.Buckets = append(s.Buckets, [2]uint64{uint64(i), c})
		}
	}
	return s
}

// MergeSparse adds a wire-form histogram to h.
func (h *H) MergeSparse(s Sparse) {
	if len(s.Buckets) == 0 {
		return
	}
	if h.counts == nil {
		h.counts = make([]uint64, size)
		h.min = math.MaxInt64
	}
	for _, b := range s.Buckets {
		if b[0] < size {
			h.counts[b[0]] += b[1]
			h.n += b[1]
		}
	}
	h.sum += s.Sum
	h.min = min(h.min, s.Min)
	h.max = max(h.max, s.Max)
}

// Dur formats nanoseconds for tables.
func Dur(ns int64) string { return time.Duration(ns).String() }
