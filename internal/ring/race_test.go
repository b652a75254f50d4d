//go:build race

package ring

// raceEnabled: under the race detector sync.Pool drops a share of Puts on
// purpose, so allocation counts are not meaningful.
const raceEnabled = true
