// Package peercred reads the credentials of a Unix socket's peer: the
// hub checks every worker's uid against --allow-uid, and a worker checks
// that the process behind the socket is its hub. One implementation for
// both sides, per system.
package peercred

// Cred is a socket peer's effective uid and its pid (0 where the system
// does not say: FreeBSD).
type Cred struct {
	PID int32
	UID uint32
}
