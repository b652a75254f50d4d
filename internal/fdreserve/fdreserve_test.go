//go:build unix

package fdreserve

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// With every descriptor below RLIMIT_NOFILE taken, a dial fails with
// EMFILE; through Retry it succeeds on the reserve, and the reserve is
// taken again once the dialled connection is closed.
func TestRetryOnTheReserve(t *testing.T) {
	ln := testutil.ListenTCP(t)
	defer ln.Close()
	Keep()
	defer func() {
		Drop()
		if Held() != 0 {
			t.Errorf("reserve holds %d after the last Drop", Held())
		}
	}()
	if Held() != Size {
		t.Fatalf("reserve holds %d, want %d", Held(), Size)
	}
	// Take every descriptor left under a limit lowered to 256.
	testutil.LowerNofile(t, 256)
	var filler []int
	defer func() {
		for _, fd := range filler {
			syscall.Close(fd)
		}
	}()
	for {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			if !Exhausted(err) {
				t.Fatal(err)
			}
			break
		}
		filler = append(filler, fd)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); !Exhausted(err) {
		t.Fatalf("dial with no descriptor left: %v, want EMFILE", err)
	}
	var c net.Conn
	if err := Retry(func() (err error) {
		c, err = net.Dial("tcp", ln.Addr().String())
		return err
	}); err != nil {
		t.Fatalf("dial through the reserve: %v", err)
	}
	if Held() >= Size {
		t.Fatalf("reserve holds %d while the connection it made room for is open", Held())
	}
	c.Close()
	Refill()
	if Held() != Size {
		t.Fatalf("reserve holds %d after the connection closed, want %d", Held(), Size)
	}
}

// Refill runs on the hub's event loop: it must not wait for a Retry whose
// call (a Postgres dial, up to its connect timeout) runs on the reserve.
func TestRefillDoesNotWaitForARetry(t *testing.T) {
	Keep()
	defer Drop()
	onReserve := make(chan struct{})
	release := make(chan struct{})
	retried := make(chan error, 1)
	go func() {
		calls := 0
		retried <- Retry(func() error {
			if calls++; calls == 1 {
				return syscall.EMFILE
			}
			close(onReserve)
			<-release
			return nil
		})
	}()
	select {
	case <-onReserve:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("Retry never ran its call again on the reserve")
	}
	refilled := make(chan struct{})
	go func() {
		Refill()
		close(refilled)
	}()
	select {
	case <-refilled:
	case <-time.After(5 * time.Second):
		t.Error("Refill waited for a Retry in progress")
	}
	close(release)
	if err := <-retried; err != nil {
		t.Fatalf("Retry: %v", err)
	}
	<-refilled
	if Held() != Size {
		t.Fatalf("reserve holds %d after the Retry, want %d", Held(), Size)
	}
}
