package hub

import (
	"os"

	"golang.org/x/sys/unix"
)

// writev is writev(2) of iov.
func writev(fd int, iov [][]byte) (int, error) { return unix.Writev(fd, iov) }

// openFDs counts the process's open descriptors (/dev/fd lists them all
// on macOS), or guesses 16 where that cannot be read.
func openFDs() int {
	ents, err := os.ReadDir("/dev/fd")
	if err != nil {
		return 16
	}
	return len(ents) - 1 // the directory read itself
}
