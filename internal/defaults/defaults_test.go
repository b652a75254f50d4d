package defaults

import (
	"testing"
	"time"
)

func TestSet(t *testing.T) {
	for _, c := range []struct{ v, want time.Duration }{{0, 5}, {-1, 5}, {3, 3}} {
		v := c.v
		Set(&v, 5)
		if v != c.want {
			t.Errorf("Set(%v, 5) = %v, want %v", c.v, v, c.want)
		}
	}
}
