//go:build !linux

package pgtest

import "syscall"

// setPdeathsig does nothing: there is no parent-death signal off Linux, so
// a server outlives a test process killed without Close (the next run's
// sweep removes what it left).
func setPdeathsig(a *syscall.SysProcAttr, sig syscall.Signal) {}
