package client

import "golang.org/x/sys/unix"

// dirOpenFlags opens the socket's directory for fstat, fstatat and the
// connect through /proc/self/fd, without needing read permission on it.
const dirOpenFlags = unix.O_PATH
