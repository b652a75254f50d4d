//go:build darwin || freebsd

package hub

// acceptCall names the call, for errors and logs.
const acceptCall = "accept"

// accept: no accept4 on macOS; see acceptFcntl.
func accept(fd int) (int, error) { return acceptFcntl(fd) }
