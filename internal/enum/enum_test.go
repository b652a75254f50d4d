package enum

import "testing"

func TestName(t *testing.T) {
	names := []string{1: "one", 3: "three"}
	for _, c := range []struct {
		v    int
		want string
	}{{1, "one"}, {3, "three"}, {0, "kind(0)"}, {2, "kind(2)"}, {4, "kind(4)"}, {-1, "kind(-1)"}} {
		if got := Name(names, c.v, "kind"); got != c.want {
			t.Errorf("Name(%d) = %q, want %q", c.v, got, c.want)
		}
	}
}
