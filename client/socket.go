package client

import (
	"errors"
	"os"
	"slices"
)

// errEmptyPath is the construction error of a Dial or NewFailover without a
// socket path: it would otherwise fail as a missing socket every time and,
// in a Failover, listen locally for good without a word.
var errEmptyPath = errors.New("listenhub client: no socket path (SocketPath is empty)")

// SocketError is Dial's refusal of the file at the socket path, or of its
// directory, before connecting: the same identity rules as the Python and
// Node clients and docs/protocol.md ("What a client must do"). The socket
// must be a socket (lstat: a symlink is refused, not followed), owned by
// this process's uid, root or a uid in Options.AllowUIDs; its directory
// must be owned by one of those and not writable by group or other unless
// sticky (OpenSSH's StrictModes rule: in a sticky directory like /tmp only
// an entry's owner can rename or remove it, and the socket's owner is
// checked too). errors.Is(err, ErrNotOurHub) is true; Dial wraps it in a
// *ConnError.
type SocketError struct {
	Path    string
	Problem string // e.g. "a symlink (mode 120777): not our hub's socket"
}

func (e *SocketError) Error() string { return e.Problem }

// Is makes errors.Is(err, ErrNotOurHub) true.
func (e *SocketError) Is(target error) bool { return target == ErrNotOurHub }

// trustedUIDs are the owners a socket file and its directory may have: this
// process's effective uid, root, and the allowed uids (which, unlike for the
// peer check, do not replace the first two: a directory we own is safe).
func trustedUIDs(allow []int) []int {
	return append([]int{os.Geteuid(), 0}, allow...)
}

func trusted(uids []int, uid uint32) bool {
	return slices.ContainsFunc(uids, func(u int) bool { return u >= 0 && uint32(u) == uid })
}
