package loop

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/internal/testutil"
)

// TestBackendIsTheOneTheBuildAskedFor: epoll on Linux by default, poll(2)
// under -tags listenhub_poll and everywhere else, so that CI's poll run
// really runs the suites through poll.
func TestBackendIsTheOneTheBuildAskedFor(t *testing.T) {
	if Backend != wantBackend {
		t.Fatalf("Backend = %q, want %q for this build", Backend, wantBackend)
	}
}

// TestRegisterRefusesAClosedFD: both backends refuse at Register a
// descriptor that is not open, instead of reporting it on every later wait.
func TestRegisterRefusesAClosedFD(t *testing.T) {
	l, stop := start(t)
	defer stop()
	fds := nbSocketpair(t)
	unix.Close(fds[0])
	defer unix.Close(fds[1])
	onLoop(t, l, func() {
		_, err := l.Register(fds[0], Readable, func(Events) {})
		if !errors.Is(err, unix.EBADF) {
			t.Errorf("Register(closed fd) = %v, want EBADF", err)
		}
		if n := l.registered(); n != 0 {
			t.Errorf("registered() = %d after a refused Register, want 0", n)
		}
	})
}

// TestUnregisterInTheMiddleKeepsTheOthers removes registrations from the
// middle of the interest set while their neighbours are ready (poll moves
// the last slot into the hole) and checks that every remaining fd is still
// reported, under its own handler, and no removed one is.
func TestUnregisterInTheMiddleKeepsTheOthers(t *testing.T) {
	l, stop := start(t)
	defer stop()
	const n = 64
	var pairs [n][2]int
	for i := range pairs {
		p := nbSocketpair(t)
		pairs[i] = p
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		if _, err := unix.Write(p[1], []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	seen := make(chan int, 4*n)
	var toks [n]Token
	onLoop(t, l, func() {
		for i := range pairs {
			i := i
			tok, err := l.Register(pairs[i][0], Readable, func(Events) {
				var b [1]byte
				if m, _ := unix.Read(pairs[i][0], b[:]); m == 1 {
					if int(b[0]) != i {
						t.Errorf("handler %d read byte %d", i, b[0])
					}
					seen <- i
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			toks[i] = tok
		}
	})
	got := map[int]bool{}
	for len(got) < n {
		got[testutil.Recv(t, seen, 10*time.Second, "a registered fd's handler")] = true
	}
	// Remove every even registration, then make every fd readable again.
	onLoop(t, l, func() {
		for i := 0; i < n; i += 2 {
			if err := l.Unregister(toks[i]); err != nil {
				t.Errorf("Unregister %d: %v", i, err)
			}
		}
		for i := range pairs {
			if _, err := unix.Write(pairs[i][1], []byte{byte(i)}); err != nil {
				t.Error(err)
			}
		}
	})
	got = map[int]bool{}
	for len(got) < n/2 {
		i := testutil.Recv(t, seen, 10*time.Second, "a remaining fd's handler")
		if i%2 == 0 {
			t.Fatalf("unregistered fd %d was reported", i)
		}
		got[i] = true
	}
	// The even fds are readable still: one more full iteration, and any
	// of them the loop still reported would be in seen by now.
	onLoop(t, l, func() {})
	onLoop(t, l, func() {
		for len(seen) > 0 {
			if i := <-seen; i%2 == 0 {
				t.Errorf("unregistered fd %d was reported", i)
			}
		}
		if r := l.registered(); r != n/2 {
			t.Errorf("registered() = %d, want %d", r, n/2)
		}
	})
}

// TestStopAfterRunReturnedWritesNothing: once Run has returned, its wake-up
// fd is closed and its number free for any file the process opens next.
// Stop (a hub stopped twice, or after its loop failed) and Post must not
// write to it then.
func TestStopAfterRunReturnedWritesNothing(t *testing.T) {
	l, stop := start(t)
	w := wakeFD(l.be)
	stop()
	// Another file takes the number, as the next open in the process may.
	// The pair may take it itself, being opened first.
	fds := nbSocketpair(t)
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	peer := fds[1]
	switch w {
	case fds[0]:
	case fds[1]:
		peer = fds[0]
	default:
		if err := unix.Dup2(fds[0], w); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(w)
	}
	l.Stop()
	if err := l.Post(func() {}); !errors.Is(err, ErrStopped) {
		t.Errorf("Post after Run returned = %v, want ErrStopped", err)
	}
	var buf [16]byte
	if n, err := unix.Read(peer, buf[:]); err != unix.EAGAIN {
		t.Fatalf("the file that took the wake-up fd's number got %d bytes (%v): %q", n, err, buf[:max(n, 0)])
	}
}
