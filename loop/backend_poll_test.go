//go:build unix && (!linux || listenhub_poll)

package loop

const wantBackend = "poll"
