//go:build linux && !listenhub_poll

package loop

const wantBackend = "epoll"

// wakeFD is the descriptor wake writes to.
func wakeFD(b *backend) int { return b.wakefd }
