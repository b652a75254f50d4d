package main

import (
	"strings"
	"testing"
)

// TestGuardPaced: the guard passes a hub within the ratio of gohub's CPU
// per delivery, fails one over it or one that lost a wake, and refuses a
// run that has nothing to compare.
func TestGuardPaced(t *testing.T) {
	l := layout{Procs: 256, ConnsPerProc: 1}
	row := func(sys string, cpu float64, lost uint64) LatencyRow {
		return LatencyRow{System: sys, N: 256, Layout: l, Recv: 1_000_000, CPU: cpu, Lost: lost}
	}
	small := LatencyRow{System: "hub", N: 8, Layout: layout{Procs: 8, ConnsPerProc: 1}, Recv: 1000, CPU: 9}
	for _, c := range []struct {
		name string
		rows []LatencyRow
		want string // "" for a pass
	}{
		{"within", []LatencyRow{row("hub", 4, 0), row("gohub", 5, 0), small}, ""},
		{"over", []LatencyRow{row("hub", 6, 0), row("gohub", 5, 0)}, "1.20× gohub's"},
		{"lost", []LatencyRow{row("hub", 4, 3), row("gohub", 5, 0)}, "3 lost"},
		{"nothing", []LatencyRow{small, row("gohub", 5, 0)}, "no paced row"},
	} {
		err := guardPaced(&Results{Paced: c.rows}, 1.0)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want a pass", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}
