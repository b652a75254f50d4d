//go:build !linux

package main

import (
	"errors"

	"golang.org/x/sys/unix"
)

// prlimitNofile fails: changing another process's limit is Linux's
// prlimit(2); the tests that need it skip.
func prlimitNofile(pid int, lim, old *unix.Rlimit) error {
	return errors.New("prlimit(2) is Linux only")
}

// passCred and senderPID serve the fake systemd of the lifecycle tests;
// systemd is Linux only.
func passCred(fd int) error { return nil }

func senderPID(oob []byte) int { return 0 }
