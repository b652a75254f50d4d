package pgtest

import "testing"

// TestStoppedInEpoll: /proc/PID/syscall of a stopped process says idle only
// for an epoll wait on x86-64; arm64 forgets a stopped task's system call,
// so there (and on architectures not listed) it cannot tell.
func TestStoppedInEpoll(t *testing.T) {
	for _, c := range []struct {
		arch, file  string
		idle, known bool
	}{
		{"amd64", "232 0x4 0x55c9d30c6250 0x1 0xffffffff 0xffffffffffffffff 0x0 0x7ffc6c63a4b8 0x7f1ceaf28ef3\n", true, true},
		{"amd64", "281 0x4 0x1 0x1 0x0 0x0 0x0 0x7ffc 0x7f1c\n", true, true},
		{"amd64", "0 0x9 0x55c9 0x2000 0x0 0x0 0x0 0x7ffc 0x7f1c\n", false, true}, // read
		{"amd64", "-1 0x7ffc6c63a4b8 0x55c9d30c6250\n", false, true},              // stopped outside a system call
		{"arm64", "-1 0xffffd0c0 0xaaaab0c0\n", false, false},
		{"riscv64", "22 0x4 0x1\n", false, false},
	} {
		idle, known := stoppedInEpoll(c.arch, c.file)
		if idle != c.idle || known != c.known {
			t.Errorf("stoppedInEpoll(%s, %.12q) = %v, %v; want %v, %v", c.arch, c.file, idle, known, c.idle, c.known)
		}
	}
}
