package hub

import (
	"io"
	"log/slog"
	"strings"
	"testing"
)

// An upgrade never changes the channel mapping: the new process refuses
// an old one whose prefix or suffix differs, whether the old one says its
// mapping (the plan) or only hands its channels over (an older hub), and
// says what to do.
func TestUpgradeMappingChecks(t *testing.T) {
	h, err := New(Config{SocketPath: "/nonexistent/map.sock", ChannelPrefix: "b.", ChannelSuffix: ".INSERT",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.checkMapping(upMapping{Prefix: "b.", Suffix: ".INSERT"}); err != nil {
		t.Fatalf("the same mapping: %v", err)
	}
	if err := h.checkHandedMapping([]handedChannel{{Q: "x", PG: "b.x.INSERT"}}); err != nil {
		t.Fatalf("channels under the same mapping: %v", err)
	}
	for _, err := range []error{
		h.checkMapping(upMapping{Prefix: "a.", Suffix: ".INSERT"}),
		h.checkMapping(upMapping{Prefix: "b.", Suffix: ""}),
		h.checkHandedMapping([]handedChannel{{Q: "x", PG: "b.x.INSERT"}, {Q: "y", PG: "a.y.INSERT"}}),
	} {
		if err == nil {
			t.Fatal("a changed mapping taken over")
		}
		for _, want := range []string{"upgrade refused: the channel mapping changed", "restart the hub", "set channel-prefix and channel-suffix back"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v: lacks %q", err, want)
			}
		}
	}
}
