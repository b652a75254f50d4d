package pgtest

import "syscall"

// setPdeathsig asks the kernel to send sig to the child when the thread
// that forked it exits.
func setPdeathsig(a *syscall.SysProcAttr, sig syscall.Signal) { a.Pdeathsig = sig }
