//go:build unix

// Package sockdir is the rule a hub's clients apply to the directories
// that hold its socket, in one place for both sides: the clients refuse a
// socket whose directories someone else could change (swap the socket for
// theirs), and the hub refuses to serve where its clients would refuse,
// instead of serving a socket nobody will use while every worker quietly
// falls back to a connection of its own.
//
// A directory is trusted when its owner is trusted (the caller's uid,
// root, or a uid the caller names) and it is not writable by group or
// other, unless it is sticky (as /tmp is: there only a file's owner may
// remove or rename it). The socket's own directory and every directory
// above it, up to /, must be.
package sockdir

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Problem says why a directory with the given owner and mode cannot be
// trusted ("" when it can).
func Problem(uid, mode uint32, trusted func(uid uint32) bool) string {
	if !trusted(uid) {
		return fmt.Sprintf("owned by uid %d, not ours (%d), root or an allowed uid", uid, os.Geteuid())
	}
	if mode&0o022 != 0 && mode&unix.S_ISVTX == 0 {
		return fmt.Sprintf("mode %04o is writable by group or other (and not sticky)", mode&0o7777)
	}
	return ""
}

// Untrusted is a directory that cannot be trusted, why, and the command
// that fixes it.
type Untrusted struct {
	Dir, Problem, Fix string
}

func (u *Untrusted) Error() string { return "directory " + u.Dir + ": " + u.Problem }

// Chain checks dir and every directory above it, up to /, after resolving
// symbolic links (the directories a connect through dir goes through). It
// returns the first directory that cannot be trusted (nil when all can),
// or an error when one cannot be examined.
func Chain(dir string, trusted func(uid uint32) bool) (*Untrusted, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, err
	}
	for d := real; ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return nil, &os.PathError{Op: "stat", Path: d, Err: err}
		}
		if p := Problem(st.Uid, uint32(st.Mode), trusted); p != "" {
			fix := "chmod go-w " + d + " (or chmod +t " + d + ")"
			if !trusted(st.Uid) {
				fix = fmt.Sprintf("chown %d %s (or root)", os.Geteuid(), d)
			}
			return &Untrusted{Dir: d, Problem: p, Fix: fix}, nil
		}
		if d == filepath.Dir(d) {
			return nil, nil
		}
	}
}
