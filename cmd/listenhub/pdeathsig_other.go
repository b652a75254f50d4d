//go:build !linux

package main

import "syscall"

// dieWithParent does nothing: there is no parent-death signal off Linux
// (a demo worker still exits when its stdin, the demo's pipe, closes).
func dieWithParent(a *syscall.SysProcAttr) {}
