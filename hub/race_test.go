//go:build race

package hub

// raceEnabled: under the race detector sync.Pool drops a share of Puts on
// purpose, so allocation counts are not the program's.
const raceEnabled = true
