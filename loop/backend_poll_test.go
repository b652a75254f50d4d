//go:build unix && (!linux || listenhub_poll)

package loop

const wantBackend = "poll"

// wakeFD is the descriptor wake writes to.
func wakeFD(b *backend) int { return b.wakeW }
