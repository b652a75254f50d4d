//go:build darwin || freebsd

package client

import "golang.org/x/sys/unix"

// dirOpenFlags opens the socket's directory for fstat and fstatat: there
// is no O_PATH, so the directory must be readable.
const dirOpenFlags = unix.O_RDONLY
