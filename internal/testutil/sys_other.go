//go:build !linux

package testutil

import "syscall"

// fdDir lists the process's open descriptors (all of them on macOS; on
// FreeBSD only with fdescfs mounted on /dev/fd).
const fdDir = "/dev/fd"

// DieWithParent does nothing: there is no parent-death signal off Linux,
// so a child outlives a test process killed without its cleanup.
func DieWithParent(a *syscall.SysProcAttr, sig syscall.Signal) {}
