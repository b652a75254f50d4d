//go:build linux && !listenhub_poll

package loop

const wantBackend = "epoll"
