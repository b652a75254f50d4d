//go:build unix

package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/peercred"
	"github.com/listenhub/listenhub/internal/sockdir"
)

// hubSupported: Dial can reach a hub here.
const hubSupported = true

// dirProblem says why a socket directory with stat st cannot be trusted
// ("" if it can).
func dirProblem(st *unix.Stat_t, uids []int) string {
	if !trusted(uids, st.Uid) {
		return fmt.Sprintf("directory owned by uid %d, not ours (%d), root or an allowed uid", st.Uid, os.Geteuid())
	}
	if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
		return fmt.Sprintf("directory mode %04o is writable by group or other (and not sticky)", st.Mode&0o7777)
	}
	return ""
}

// sockProblem says why the file at the socket path (lstat: a symlink is not
// followed) is not our hub's socket ("" if it may be).
func sockProblem(st *unix.Stat_t, uids []int) string {
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		kind := "not a socket"
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			kind = "a symlink"
		}
		return fmt.Sprintf("%s (mode %06o): not our hub's socket", kind, st.Mode)
	}
	if !trusted(uids, st.Uid) {
		return fmt.Sprintf("socket owned by uid %d, not ours (%d), root or an allowed uid: not our hub", st.Uid, os.Geteuid())
	}
	return ""
}

// maxSunPath is the room in sockaddr_un.sun_path, less the NUL.
const maxSunPath = len(unix.RawSockaddrUnix{}.Path) - 1

// dialSocket connects to the hub socket at path after checking its
// identity: the directory is opened (O_PATH on Linux; elsewhere read-only,
// so there it must be readable) and checked (dirProblem), the
// name is lstat'ed in it (sockProblem), and the connect goes through that
// open directory (/proc/self/fd/N/name), so that a symlink swapped into the
// path meanwhile changes nothing. Without /proc (macOS, FreeBSD), or for a name too long for
// it, it connects by path and requires the same socket file (device and
// inode) afterwards. The peer's uid is checked next, by Dial (checkPeer).
func dialSocket(ctx context.Context, path string, allow []int) (net.Conn, error) {
	dir, name := filepath.Split(path)
	if name == "" || name == "." || name == ".." {
		return nil, &ConnError{Op: "dial", Path: path, Err: errors.New("not a socket path")}
	}
	if dir == "" {
		dir = "."
	}
	dfd, err := unix.Open(dir, dirOpenFlags|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		var perr error = &os.PathError{Op: "open", Path: dir, Err: err}
		switch err {
		case unix.ENOENT:
			perr = fmt.Errorf("%w: the socket's directory is missing: start the hub, or create it (install -d -m 0755 %s, owned by the hub's user)", perr, dir)
		case unix.EACCES:
			perr = fmt.Errorf("%w: %s", perr, unsearchableFix(dir))
		}
		return nil, &ConnError{Op: "dial", Path: path, Err: perr}
	}
	defer unix.Close(dfd)
	uids := trustedUIDs(allow)
	refuse := func(problem string) error {
		return &ConnError{Op: "dial", Path: path, Err: &SocketError{Path: path, Problem: problem}}
	}
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return nil, &ConnError{Op: "dial", Path: path, Err: &os.PathError{Op: "fstat", Path: dir, Err: err}}
	}
	if p := dirProblem(&st, uids); p != "" {
		return nil, refuse(p)
	}
	// The directories above it too: whoever can rename one can put a
	// directory of theirs in its place.
	if u, err := sockdir.Chain(dir, func(uid uint32) bool { return trusted(uids, uid) }); err == nil && u != nil {
		return nil, refuse(u.Error())
	}
	var before unix.Stat_t
	if err := unix.Fstatat(dfd, name, &before, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, &ConnError{Op: "dial", Path: path, Err: &os.PathError{Op: "lstat", Path: path, Err: err}}
	}
	if p := sockProblem(&before, uids); p != "" {
		return nil, refuse(p)
	}
	via := fmt.Sprintf("/proc/self/fd/%d/%s", dfd, name)
	pinned := len(via) <= maxSunPath && procFD()
	if !pinned {
		via = path
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", via)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) {
			// Name the path the caller gave, not the /proc one.
			oe.Addr = &net.UnixAddr{Name: path, Net: "unix"}
		}
		if errors.Is(err, unix.EACCES) {
			err = fmt.Errorf("%w: %s", err, unsearchableFix(dir))
		}
		return nil, &ConnError{Op: "dial", Path: path, Err: err}
	}
	if !pinned {
		var after unix.Stat_t
		if err := unix.Fstatat(dfd, name, &after, unix.AT_SYMLINK_NOFOLLOW); err != nil || after.Dev != before.Dev || after.Ino != before.Ino {
			conn.Close()
			return nil, refuse("the socket file changed during the connect: not our hub")
		}
	}
	return conn, nil
}

// unsearchableFix says what to do about EACCES on the way to a socket in
// dir: this uid may not search a directory of the path, or not write the
// socket.
func unsearchableFix(dir string) string {
	return fmt.Sprintf("uid %d may not reach the socket: every directory of %s needs search (x) permission for it and the socket write permission (the hub's --socket-mode 0660 with --socket-group, this user in that group, and chmod o+x or g+x on the directories)", os.Geteuid(), dir)
}

// procFD reports whether /proc/self/fd is there to connect through.
var procFD = sync.OnceValue(func() bool {
	var st unix.Stat_t
	return unix.Stat("/proc/self/fd", &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
})

// checkPeer reads the credentials of the socket's peer (SO_PEERCRED on
// Linux, LOCAL_PEERCRED on macOS and FreeBSD: the process that called
// listen on it, as of that call) and refuses a uid that is not allowed. An
// empty allow list means our effective uid and root: both report the
// peer's effective uid.
func checkPeer(conn net.Conn, allow []int) error {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return fmt.Errorf("peer credentials: %T has no descriptor", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	var uid, pid int
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		var c peercred.Cred
		c, cerr = peercred.Get(int(fd))
		uid, pid = int(c.UID), int(c.PID)
	}); err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return fmt.Errorf("peer credentials: %w", os.NewSyscallError(peercred.Call, cerr))
	}
	if len(allow) == 0 {
		allow = []int{os.Geteuid(), 0}
	}
	for _, a := range allow {
		if a >= 0 && a == uid {
			return nil
		}
	}
	return &PeerError{UID: uid, PID: pid, Allowed: slices.Clone(allow)}
}
