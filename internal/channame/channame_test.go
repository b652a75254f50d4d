package channame

import (
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	fits := strings.Repeat("x", MaxLen)
	for _, ch := range []string{"a", fits, "é", "with space", `quote"d`} {
		if err := Check(ch); err != nil {
			t.Errorf("Check(%q) = %v", ch, err)
		}
	}
	for ch, want := range map[string]string{
		"":         "invalid channel: empty name",
		fits + "y": "invalid channel: 64 bytes, Postgres allows at most 63",
		"a\x00b":   "invalid channel: contains NUL",
		"a\xffb":   "invalid channel: not valid UTF-8",
	} {
		err := Check(ch)
		if !errors.Is(err, ErrInvalid) || err.Error() != want {
			t.Errorf("Check(%q) = %v, want %q wrapping ErrInvalid", ch, err, want)
		}
	}
}
