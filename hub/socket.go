package hub

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/loop"
)

// maxSocketPath is the room in sockaddr_un.sun_path, less the NUL.
const maxSocketPath = len(unix.RawSockaddrUnix{}.Path) - 1 // 107 on Linux, 103 on macOS and FreeBSD

// listenBacklog is the listen(2) backlog: a host's workers often start at
// once (a preforking master forks them all), and a full backlog makes
// connect fail with EAGAIN, which a client reads as "no hub".
const listenBacklog = 4096

// listenSocket is the bound, listening Unix socket. Loop goroutine only
// once Start returned.
type listenSocket struct {
	path string
	fd   int // -1 once closed
	tok  loop.Token
	// dev and ino identify the socket file this hub created, so that Stop
	// removes it only if it is still ours.
	dev, ino uint64
	// adopted: the socket was handed to the hub (systemd socket
	// activation), so its file belongs to whoever bound it and is never
	// removed.
	adopted bool
}

// ErrSocketInUse is wrapped by the error Start returns when another process
// is accepting on the socket path.
var ErrSocketInUse = errors.New("in use by a running hub")

// checkSocket fails if path is held by a live hub (someone accepts on it)
// or is something other than a socket. A stale socket passes: bindSocket
// replaces it.
func checkSocket(path string) error {
	if len(path) > maxSocketPath {
		return fmt.Errorf("hub: socket path %q is %d bytes; a Unix socket path is at most %d", path, len(path), maxSocketPath)
	}
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("hub: socket %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("hub: socket %s: exists and is not a socket; not replacing it", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("hub: socket %s is %w", path, ErrSocketInUse)
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, fs.ErrNotExist):
		return nil // stale: nobody accepts on it
	case errors.Is(err, syscall.EAGAIN):
		// The backlog of a live, busy hub is full.
		return fmt.Errorf("hub: socket %s is %w (its backlog is full)", path, ErrSocketInUse)
	}
	return fmt.Errorf("hub: socket %s: cannot tell whether a hub runs there: %w", path, err)
}

// bindSocket creates, binds and listens on path with mode 0600. The umask is
// set around bind(2), so there is no moment when the socket exists with a
// wider mode. A stale socket file at path is removed first.
//
// The socket is bound and listening under a temporary name in the same
// directory first, and only then linked to path: the file at path appears
// exactly when connect(2) on it can succeed. Bound straight at path, the
// file would exist between bind(2) and listen(2) with nobody listening, and
// a worker (or a supervisor waiting for the file) connecting in that moment
// would get ECONNREFUSED from a hub that is starting fine. link(2), unlike
// rename(2), fails when path exists, so a hub started at the same moment
// is still never replaced.
func bindSocket(path string) (listenSocket, error) {
	return bindSocketAs(path, socketPerm{mode: defaultSocketMode, gid: -1})
}

// defaultSocketMode is the mode of the socket file when Config.SocketMode
// is zero: the hub's own uid only (root can connect anyway).
const defaultSocketMode os.FileMode = 0o600

// socketPerm is who may connect to the socket file: its permission bits,
// and its group (-1: the hub's).
type socketPerm struct {
	mode os.FileMode
	gid  int
}

// lookupGroup resolves a Config.SocketGroup: a group name, or a numeric gid.
func lookupGroup(name string) (int, error) {
	if gid, err := strconv.ParseUint(name, 10, 32); err == nil {
		return int(gid), nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return -1, fmt.Errorf("hub: config: SocketGroup: %w", err)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return -1, fmt.Errorf("hub: config: SocketGroup %q: gid %q", name, g.Gid)
	}
	return gid, nil
}

// bindSocketAs is bindSocket with the file's mode and group: it is bound
// with mode 0600 (the umask is set around bind), given its group, then its
// mode, and only then listens and appears at path. At no moment can anyone
// the final mode and group do not admit connect.
func bindSocketAs(path string, perm socketPerm) (listenSocket, error) {
	s := listenSocket{path: path, fd: -1}
	if err := checkSocket(path); err != nil {
		return s, err
	}
	fd, err := streamSocket()
	if err != nil {
		return s, fmt.Errorf("hub: %w", os.NewSyscallError("socket", err))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		unix.Close(fd)
		return s, fmt.Errorf("hub: remove stale socket: %w", err)
	}
	tmp := tempSocketPath(path)
	if tmp != "" {
		os.Remove(tmp) // left by a hub that died in the middle of this
	}
	bindAt := tmp
	if bindAt == "" {
		bindAt = path // no room for a temporary name: bind in place
	}
	old := unix.Umask(0o177)
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: bindAt})
	unix.Umask(old)
	if err != nil {
		unix.Close(fd)
		if err == unix.EADDRINUSE && bindAt == path {
			// Another hub bound it between our check and our bind.
			return s, fmt.Errorf("hub: socket %s is %w", path, ErrSocketInUse)
		}
		return s, fmt.Errorf("hub: bind %s: %w", path, os.NewSyscallError("bind", err))
	}
	if err := setSocketPerm(bindAt, perm); err != nil {
		unix.Close(fd)
		os.Remove(bindAt)
		return s, err
	}
	if err := unix.Listen(fd, listenBacklog); err != nil {
		unix.Close(fd)
		os.Remove(bindAt)
		return s, fmt.Errorf("hub: listen %s: %w", path, os.NewSyscallError("listen", err))
	}
	if tmp != "" {
		err := os.Link(tmp, path)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			// A file system without hard links: rename is atomic too,
			// only it would replace a hub bound in the last moment.
			err = os.Rename(tmp, path)
		}
		os.Remove(tmp)
		if err != nil {
			unix.Close(fd)
			if errors.Is(err, fs.ErrExist) {
				// Another hub bound it between our check and now.
				return s, fmt.Errorf("hub: socket %s is %w", path, ErrSocketInUse)
			}
			return s, fmt.Errorf("hub: socket %s: %w", path, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		s.dev, s.ino = uint64(st.Dev), uint64(st.Ino)
	}
	s.fd = fd
	return s, nil
}

// setSocketPerm gives the socket file bound at name (mode 0600 so far, and
// not listening yet) its group and then its mode. The group goes first: a
// mode that opens the file to its group must find the right group there.
// lchown does not follow a symlink; chmod has no such variant, but the
// name is one this process just bound in the socket's directory, which
// must not be writable by others anyway (they could replace the socket).
func setSocketPerm(name string, perm socketPerm) error {
	if perm.gid >= 0 {
		if err := os.Lchown(name, -1, perm.gid); err != nil {
			return fmt.Errorf("hub: socket group %d: %w", perm.gid, err)
		}
	}
	if perm.mode != defaultSocketMode {
		if err := os.Chmod(name, perm.mode); err != nil {
			return fmt.Errorf("hub: socket mode %#o: %w", perm.mode, err)
		}
	}
	return nil
}

// tempSeq makes temporary socket names unique within the process, so that
// hubs started at once with sockets in one directory do not collide.
var tempSeq atomic.Uint64

// tempSocketPath is the name bindSocket binds under before the socket is
// linked to path: in the same directory (so that link works) and unique
// among live processes (pid) and within this one (tempSeq), so that a file
// left under it can only be a dead hub's. It returns "" when that name
// would not fit in sun_path.
func tempSocketPath(path string) string {
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".listenhub-%d-%d.tmp", os.Getpid(), tempSeq.Add(1)))
	if len(tmp) > maxSocketPath {
		return ""
	}
	return tmp
}

// adoptSocket takes over f, a socket bound and listening already (passed
// by systemd socket activation): it must be a listening AF_UNIX stream
// socket, checked here so that a socket unit with a TCP port or a datagram
// socket is refused with the reason instead of failing on the first
// accept. want, when not empty, must be the path it is bound to. The
// descriptor is dup'ed (non-blocking, close-on-exec): f stays the caller's
// to close.
func adoptSocket(f *os.File, want string) (listenSocket, error) {
	s := listenSocket{path: want, fd: -1, adopted: true}
	raw := int(f.Fd())
	check := func(opt int) (int, error) {
		v, err := unix.GetsockoptInt(raw, unix.SOL_SOCKET, opt)
		if err != nil {
			return 0, fmt.Errorf("hub: inherited socket (fd %d): %w", raw, os.NewSyscallError("getsockopt", err))
		}
		return v, nil
	}
	dom, err := socketDomain(raw)
	if err != nil {
		return s, fmt.Errorf("hub: inherited socket (fd %d): %w", raw, err)
	}
	typ, err := check(unix.SO_TYPE)
	if err != nil {
		return s, err
	}
	acc, err := check(unix.SO_ACCEPTCONN)
	if err != nil {
		return s, err
	}
	if dom != unix.AF_UNIX || typ != unix.SOCK_STREAM || acc == 0 {
		return s, fmt.Errorf("hub: inherited socket (fd %d) is not a listening Unix stream socket (family %d, type %d, listening %v); use ListenStream=/path", raw, dom, typ, acc != 0)
	}
	sa, err := unix.Getsockname(raw)
	if err != nil {
		return s, fmt.Errorf("hub: inherited socket (fd %d): %w", raw, os.NewSyscallError("getsockname", err))
	}
	var bound string
	if u, ok := sa.(*unix.SockaddrUnix); ok {
		bound = u.Name
	}
	if want != "" && bound != want {
		return s, fmt.Errorf("hub: inherited socket (fd %d) is bound to %q, not the configured socket %s", raw, bound, want)
	}
	if want == "" {
		s.path = bound
	}
	fd, err := unix.FcntlInt(uintptr(raw), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return s, fmt.Errorf("hub: inherited socket (fd %d): %w", raw, os.NewSyscallError("fcntl", err))
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return s, fmt.Errorf("hub: inherited socket (fd %d): %w", raw, os.NewSyscallError("fcntl", err))
	}
	s.fd = fd
	return s, nil
}

// close closes the socket and removes its file, if the file is still the
// one bind created.
func (s *listenSocket) close() {
	if s.fd < 0 {
		return
	}
	unix.Close(s.fd)
	s.fd = -1
	if s.adopted {
		return
	}
	var st unix.Stat_t
	if err := unix.Stat(s.path, &st); err == nil && uint64(st.Dev) == s.dev && uint64(st.Ino) == s.ino {
		os.Remove(s.path)
	}
}

// closeSocket stops accepting: workers that connect from now on get
// ECONNREFUSED or ENOENT, and fall back.
func (h *Hub) closeSocket() {
	if h.sock.fd < 0 {
		return
	}
	if !h.closed {
		_ = h.loop.Unregister(h.sock.tok)
	}
	h.sock.close()
}
