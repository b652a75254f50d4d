package latency_test

import (
	"fmt"
	"time"

	"github.com/listenhub/listenhub/latency"
)

// A histogram's quantile is the upper bound of the bucket it falls in.
func ExampleHistogram_Quantile() {
	h := latency.Histogram{
		Bounds: []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond},
		Counts: []uint64{90, 99, 100},
		Count:  100,
		Sum:    300 * time.Millisecond,
	}
	fmt.Println(h.Quantile(0.5), h.Quantile(0.99), h.Quantile(1))
	// Output: 1ms 10ms 100ms
}
