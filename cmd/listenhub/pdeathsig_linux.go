package main

import "syscall"

// dieWithParent has the kernel kill the child when the thread that
// started it exits.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
