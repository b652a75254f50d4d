package testutil

import "syscall"

// fdDir lists the process's open descriptors.
const fdDir = "/proc/self/fd"

// DieWithParent makes a child started with a sends sig when the thread
// that started it exits (Pdeathsig; off Linux a child outlives a test
// process killed without its cleanup).
func DieWithParent(a *syscall.SysProcAttr, sig syscall.Signal) { a.Pdeathsig = sig }
