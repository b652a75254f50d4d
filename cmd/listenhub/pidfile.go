package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The pid file may live in a directory other users can write to (/tmp, a
// shared /run): nothing in it is followed or trusted. Its directory is
// opened once and everything happens relative to it: the pid is written to
// a new file of a random name (O_CREAT|O_EXCL|O_NOFOLLOW, so no file or
// link planted there is opened) and renamed over the name (a rename
// replaces a link, it does not follow it).

// pidDir opens the pid file's directory and checks it: a directory others
// can write to is refused unless it is sticky (others cannot remove or
// replace what is ours there) and what is at the name, if anything, is a
// regular file of ours.
func pidDir(path string) (dfd int, base string, err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if base == "" || base == "." || base == ".." {
		return -1, "", fmt.Errorf("pid file %q: not a file name", path)
	}
	dfd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", fmt.Errorf("pid file: %w", &os.PathError{Op: "open", Path: dir, Err: err})
	}
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		unix.Close(dfd)
		return -1, "", fmt.Errorf("pid file: %w", &os.PathError{Op: "stat", Path: dir, Err: err})
	}
	me := uint32(os.Geteuid())
	shared := st.Mode&0o022 != 0 || (st.Uid != me && st.Uid != 0)
	if !shared {
		return dfd, base, nil
	}
	if st.Mode&unix.S_ISVTX == 0 {
		unix.Close(dfd)
		return -1, "", fmt.Errorf("pid file %q: refused: its directory is writable by others and not sticky", path)
	}
	var fst unix.Stat_t
	switch err := unix.Fstatat(dfd, base, &fst, unix.AT_SYMLINK_NOFOLLOW); {
	case errors.Is(err, unix.ENOENT):
	case err != nil:
		unix.Close(dfd)
		return -1, "", fmt.Errorf("pid file: %w", &os.PathError{Op: "stat", Path: path, Err: err})
	case fst.Mode&unix.S_IFMT != unix.S_IFREG || fst.Uid != me:
		unix.Close(dfd)
		return -1, "", fmt.Errorf("pid file %q: refused: in a directory writable by others, and not a regular file of ours", path)
	}
	return dfd, base, nil
}

// checkPIDFile is the check of pidDir alone, at start: a refused pid file
// is a startup error.
func checkPIDFile(path string) error {
	dfd, _, err := pidDir(path)
	if err == nil {
		unix.Close(dfd)
	}
	return err
}

// writePIDFile writes this process's pid to path atomically, so that a
// reader never sees a partial pid, without following a link planted at the
// name or at the temporary one.
func writePIDFile(path string) error {
	dfd, base, err := pidDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	var r [8]byte
	_, _ = rand.Read(r[:])
	tmp := "." + base + "." + strconv.Itoa(os.Getpid()) + "." + hex.EncodeToString(r[:]) + ".tmp"
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("pid file: %w", &os.PathError{Op: "create", Path: tmp, Err: err})
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, werr := f.WriteString(strconv.Itoa(os.Getpid()) + "\n")
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dfd, tmp, dfd, base)
	}
	if werr != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("pid file %q: %w", path, werr)
	}
	return nil
}

// removePIDFile removes path if it still names this process: after an
// upgrade it names the new one, which must keep it. A link there is not
// followed.
func removePIDFile(path string) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), path)
	b := make([]byte, 32)
	n, _ := f.Read(b)
	f.Close()
	if strings.TrimSpace(string(b[:n])) == strconv.Itoa(os.Getpid()) {
		os.Remove(path)
	}
}
