package loop

import "golang.org/x/sys/unix"

// threadID identifies the calling OS thread; Run locks its goroutine to one.
func threadID() int64 { return int64(unix.Gettid()) }
