package loop

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
	"golang.org/x/sys/unix"
)

func fdCount(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	return len(ents)
}

// socketpair makes a connected pair of stream sockets, both close-on-exec
// and, when nonblock, both non-blocking. Portably: SOCK_CLOEXEC and
// SOCK_NONBLOCK are not on macOS.
func socketpair(nonblock bool) ([2]int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return fds, err
	}
	for _, fd := range fds {
		unix.CloseOnExec(fd)
		if nonblock {
			if err := unix.SetNonblock(fd, true); err != nil {
				unix.Close(fds[0])
				unix.Close(fds[1])
				return fds, err
			}
		}
	}
	return fds, nil
}

// nbSocketpair is socketpair(true), or the test fails.
func nbSocketpair(t *testing.T) [2]int {
	t.Helper()
	fds, err := socketpair(true)
	if err != nil {
		t.Fatal(err)
	}
	return fds
}

// start runs a new loop on its own goroutine and returns it with a function
// that stops it and waits for Run to return.
func start(t *testing.T) (*Loop, func()) {
	t.Helper()
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- l.Run() }()
	stop := func() {
		t.Helper()
		l.Stop()
		testutil.WaitErr(t, errc, 10*time.Second, "Run after Stop")
	}
	return l, stop
}

// onLoop runs f on the loop and waits for it.
func onLoop(t *testing.T, l *Loop, f func()) {
	t.Helper()
	done := make(chan struct{})
	if err := l.Post(func() { f(); close(done) }); err != nil {
		t.Fatalf("Post: %v", err)
	}
	testutil.WaitClosed(t, done, 10*time.Second, "posted function did not run within 10s")
}

func TestEcho1000Socketpairs(t *testing.T) {
	const n = 1000
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < 4*n {
		lim.Cur = min(lim.Max, 4*n)
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	}
	before := fdCount(t)
	l, stop := start(t)

	type pair struct{ loopSide, testSide int }
	pairs := make([]pair, n)
	for i := range pairs {
		fds, err := socketpair(false)
		if err != nil {
			t.Fatalf("socketpair %d: %v", i, err)
		}
		if err := unix.SetNonblock(fds[0], true); err != nil {
			t.Fatal(err)
		}
		pairs[i] = pair{fds[0], fds[1]}
	}
	toks := make([]Token, n)
	onLoop(t, l, func() {
		for i, p := range pairs {
			fd := p.loopSide
			buf := make([]byte, 256)
			var err error
			toks[i], err = l.Register(fd, Readable, func(ev Events) {
				for {
					m, err := unix.Read(fd, buf)
					if m <= 0 || err != nil {
						return
					}
					// A socketpair's buffer holds far more than one
					// test message, so the echo never short-writes.
					if _, err := unix.Write(fd, buf[:m]); err != nil {
						panic(err)
					}
				}
			})
			if err != nil {
				panic(err)
			}
		}
	})
	for i, p := range pairs {
		msg := []byte(fmt.Sprintf("hello %d", i))
		if _, err := unix.Write(p.testSide, msg); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range pairs {
		want := []byte(fmt.Sprintf("hello %d", i))
		got := make([]byte, 0, len(want))
		buf := make([]byte, 64)
		tv := unix.Timeval{Sec: 10}
		if err := unix.SetsockoptTimeval(p.testSide, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			t.Fatal(err)
		}
		for len(got) < len(want) {
			m, err := unix.Read(p.testSide, buf)
			if err != nil || m <= 0 {
				t.Fatalf("pair %d: read echo: n=%d err=%v", i, m, err)
			}
			got = append(got, buf[:m]...)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("pair %d: echo %q, want %q", i, got, want)
		}
	}
	onLoop(t, l, func() {
		if got := l.registered(); got != n {
			t.Errorf("registered() = %d, want %d", got, n)
		}
		for i := range pairs {
			if err := l.Unregister(toks[i]); err != nil {
				t.Errorf("Unregister: %v", err)
			}
			unix.Close(pairs[i].loopSide)
		}
	})
	for _, p := range pairs {
		unix.Close(p.testSide)
	}
	stop()
	if after := fdCount(t); after != before {
		t.Fatalf("fd count %d before, %d after: leaked %d", before, after, after-before)
	}
}

func TestTimersFireInDeadlineOrderAndCancelledNeverFire(t *testing.T) {
	l, stop := start(t)
	defer stop()
	rng := rand.New(rand.NewSource(1))
	const n = 200
	type rec struct {
		id       int
		deadline time.Time
	}
	var (
		fired     []rec
		cancelled = map[int]bool{}
		allDone   = make(chan struct{})
		remaining int
	)
	onLoop(t, l, func() {
		timers := make([]*Timer, n)
		for i := 0; i < n; i++ {
			d := time.Duration(rng.Intn(80)) * time.Millisecond
			id := i
			timers[i] = l.AfterFunc(d, func() {
				if cancelled[id] {
					t.Errorf("cancelled timer %d fired", id)
				}
				// The deadline the timer took when it was made: one read
				// of the clock here, before AfterFunc's own, could order
				// two timers made a preemption apart the other way.
				fired = append(fired, rec{id, timers[id].when})
				remaining--
				if remaining == 0 {
					close(allDone)
				}
			})
		}
		remaining = n
		for i := 0; i < n; i += 3 {
			if !timers[i].Stop() {
				t.Errorf("Stop of pending timer %d returned false", i)
			}
			if timers[i].Stop() {
				t.Errorf("second Stop of timer %d returned true", i)
			}
			cancelled[i] = true
			remaining--
		}
	})
	testutil.WaitClosed(t, allDone, 10*time.Second, "timers did not all fire within 10s")
	// Let any wrongly surviving cancelled timer show itself: run one more
	// timer scheduled after the latest deadline and check from there.
	late := make(chan struct{})
	onLoop(t, l, func() { l.AfterFunc(100*time.Millisecond, func() { close(late) }) })
	<-late
	onLoop(t, l, func() {
		if len(fired) != n-len(cancelled) {
			t.Errorf("%d timers fired, want %d", len(fired), n-len(cancelled))
		}
		if !sort.SliceIsSorted(fired, func(i, j int) bool { return fired[i].deadline.Before(fired[j].deadline) }) {
			t.Errorf("timers fired out of deadline order")
		}
	})
}

func TestEveryRepeatsUntilStopped(t *testing.T) {
	l, stop := start(t)
	defer stop()
	var (
		count int
		tm    *Timer
		done  = make(chan struct{})
	)
	onLoop(t, l, func() {
		tm = l.Every(2*time.Millisecond, func() {
			count++
			if count == 5 {
				tm.Stop()
				// A second timer proves the first stays stopped.
				l.AfterFunc(30*time.Millisecond, func() { close(done) })
			}
		})
	})
	testutil.WaitClosed(t, done, 10*time.Second, "repeating timer did not fire 5 times within 10s")
	onLoop(t, l, func() {
		if count != 5 {
			t.Errorf("repeating timer fired %d times, want exactly 5", count)
		}
	})
}

func TestPostsRunExactlyOnceInPerGoroutineOrder(t *testing.T) {
	l, stop := start(t)
	defer stop()
	const goroutines, each = 8, 12500
	next := make([]int, goroutines) // loop goroutine only
	var bad []string
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if err := l.Post(func() {
					if next[g] != i && len(bad) < 10 {
						bad = append(bad, fmt.Sprintf("goroutine %d: post %d ran when %d was expected", g, i, next[g]))
					}
					next[g] = i + 1
				}); err != nil {
					t.Errorf("Post: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	onLoop(t, l, func() {
		for _, b := range bad {
			t.Error(b)
		}
		total := 0
		for g, n := range next {
			if n != each {
				t.Errorf("goroutine %d: %d posts ran, want %d", g, n, each)
			}
			total += n
		}
		if total != goroutines*each {
			t.Errorf("%d posts ran, want %d", total, goroutines*each)
		}
	})
}

func TestStopFromOutside(t *testing.T) {
	before := fdCount(t)
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	l.OnClose(func() { closed = true })
	errc := make(chan error, 1)
	go func() { errc <- l.Run() }()
	onLoop(t, l, func() {})

	// Posts queued before Stop run; Run returns; later posts are refused.
	ran := make(chan struct{})
	if err := l.Post(func() { close(ran) }); err != nil {
		t.Fatal(err)
	}
	l.Stop()
	testutil.WaitErr(t, errc, 10*time.Second, "Run after Stop")
	select {
	case <-ran:
	default:
		t.Error("a post queued before Stop did not run")
	}
	if !closed {
		t.Error("OnClose hook did not run")
	}
	if err := l.Post(func() { t.Error("post after stop ran") }); !errors.Is(err, ErrStopped) {
		t.Errorf("Post after stop = %v, want ErrStopped", err)
	}
	select {
	case <-l.Done():
	default:
		t.Error("Done not closed after Run returned")
	}
	if after := fdCount(t); after != before {
		t.Errorf("fd count %d before New, %d after Run: leaked %d", before, after, after-before)
	}
}

func TestStopFromInside(t *testing.T) {
	before := fdCount(t)
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	l.OnClose(func() { order = append(order, "close") })
	l.AfterFunc(time.Millisecond, func() {
		order = append(order, "timer")
		l.Stop()
		// Posted from inside after Stop, before the queue closes: runs.
		if err := l.Post(func() { order = append(order, "post") }); err != nil {
			t.Errorf("Post during stopping: %v", err)
		}
	})
	done := make(chan error, 1)
	go func() { done <- l.Run() }()
	testutil.WaitErr(t, done, 10*time.Second, "Run after Stop from a timer")
	if got := fmt.Sprint(order); got != "[timer post close]" {
		t.Errorf("order = %s, want [timer post close]", got)
	}
	if err := l.Run(); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run = %v, want ErrRunning", err)
	}
	if after := fdCount(t); after != before {
		t.Errorf("fd count %d before, %d after: leaked %d", before, after, after-before)
	}
}

func TestWritableInterestOnlyWhileAsked(t *testing.T) {
	l, stop := start(t)
	defer stop()
	fds := nbSocketpair(t)
	defer unix.Close(fds[1])
	var (
		tok      Token
		writable int
		iters    int
		done     = make(chan struct{})
	)
	onLoop(t, l, func() {
		var err error
		tok, err = l.Register(fds[0], Writable, func(ev Events) {
			if ev&Writable == 0 {
				return
			}
			writable++
			if writable == 3 {
				if err := l.Modify(tok, Readable); err != nil {
					t.Errorf("Modify: %v", err)
				}
			}
		})
		if err != nil {
			t.Error(err)
		}
		l.AfterIteration(func() {
			if writable >= 3 {
				iters++
				if iters == 20 {
					close(done)
				}
			}
		})
	})
	// Wake the loop for 20 more iterations without the fd being writable-interested.
	go func() {
		for i := 0; i < 40; i++ {
			if l.Post(func() {}) != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	testutil.WaitClosed(t, done, 10*time.Second, "loop did not iterate")
	onLoop(t, l, func() {
		if writable != 3 {
			t.Errorf("writable handler ran %d times, want 3 (interest dropped after the third)", writable)
		}
		if err := l.Unregister(tok); err != nil {
			t.Error(err)
		}
		unix.Close(fds[0])
	})
}

func TestStaleTokenAndStaleEvents(t *testing.T) {
	l, stop := start(t)
	defer stop()
	a := nbSocketpair(t)
	b := nbSocketpair(t)
	defer unix.Close(a[1])
	defer unix.Close(b[1])
	// Both ends readable before the loop looks: their events arrive in the
	// same epoll_wait. Each handler unregisters the other, so exactly one
	// may run: the other's event is stale by then.
	unix.Write(a[1], []byte("x"))
	unix.Write(b[1], []byte("x"))
	var ta, tb Token
	ran := 0
	done := make(chan struct{})
	onLoop(t, l, func() {
		ta, _ = l.Register(a[0], Readable, func(Events) {
			ran++
			l.Unregister(ta)
			l.Unregister(tb)
		})
		tb, _ = l.Register(b[0], Readable, func(Events) {
			ran++
			l.Unregister(ta)
			l.Unregister(tb)
		})
		l.AfterIteration(func() {
			if ran > 0 {
				select {
				case <-done:
				default:
					close(done)
				}
			}
		})
	})
	<-done
	onLoop(t, l, func() {
		if ran != 1 {
			t.Errorf("%d handlers ran, want exactly 1 (the other's event was stale)", ran)
		}
		old := ta
		unix.Close(a[0])
		unix.Close(b[0])
		// The fd number is reused by the next descriptor.
		fds := nbSocketpair(t)
		defer unix.Close(fds[1])
		defer unix.Close(fds[0])
		nt, err := l.Register(old.FD(), Readable, func(Events) {})
		if err != nil {
			t.Fatalf("register reused fd: %v", err)
		}
		if err := l.Modify(old, Writable); !errors.Is(err, ErrStaleToken) {
			t.Errorf("Modify with a stale token = %v, want ErrStaleToken", err)
		}
		if err := l.Unregister(old); !errors.Is(err, ErrStaleToken) {
			t.Errorf("Unregister with a stale token = %v, want ErrStaleToken", err)
		}
		if err := l.Unregister(nt); err != nil {
			t.Errorf("Unregister current token: %v", err)
		}
	})
}

func TestAfterIterationRunsAfterPosts(t *testing.T) {
	l, stop := start(t)
	defer stop()
	var log []string
	done := make(chan struct{})
	onLoop(t, l, func() {
		l.AfterIteration(func() {
			if len(log) > 0 && log[len(log)-1] == "post" {
				log = append(log, "after")
				select {
				case <-done:
				default:
					close(done)
				}
			}
		})
	})
	l.Post(func() { log = append(log, "post") })
	<-done
	onLoop(t, l, func() {
		if fmt.Sprint(log[:2]) != "[post after]" {
			t.Errorf("log = %v, want post then after", log)
		}
	})
}

func BenchmarkPost(b *testing.B) {
	l, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	go l.Run()
	defer l.Stop()
	b.ReportAllocs()
	var wg sync.WaitGroup
	f := func() { wg.Done() }
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		wg.Add(1)
		l.Post(f)
	}
	wg.Wait()
}

func TestInLoop(t *testing.T) {
	l, stop := start(t)
	defer stop()
	if l.inLoop() {
		t.Error("inLoop() true on the test goroutine")
	}
	var inside bool
	onLoop(t, l, func() { inside = l.inLoop() })
	if !inside {
		t.Error("inLoop() false on the loop goroutine")
	}
}
