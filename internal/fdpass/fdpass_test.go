package fdpass

import (
	"bytes"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSendRecvManyFDs: a message with a body larger than a packet and more
// descriptors than one SCM_RIGHTS message may carry arrives whole, every
// descriptor a working duplicate of the one sent, in order.
func TestSendRecvManyFDs(t *testing.T) {
	a, b := pair(t)
	const nfds = 600 // three packets' worth
	var sent []int
	var files []*os.File
	for i := 0; i < nfds/2; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, r, w)
		sent = append(sent, int(r.Fd()), int(w.Fd()))
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	body := bytes.Repeat([]byte("0123456789"), 20_000) // 200 kB
	errc := make(chan error, 1)
	go func() { errc <- a.Send(body, sent) }()
	got, fds, err := b.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if !bytes.Equal(got, body) {
		t.Fatalf("body: %d bytes, want %d", len(got), len(body))
	}
	if len(fds) != nfds {
		t.Fatalf("%d descriptors, want %d", len(fds), nfds)
	}
	// Pair i's write end reaches pair i's read end through the copies.
	for i := 0; i < nfds; i += 2 {
		if _, err := unix.Write(fds[i+1], []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		var one [1]byte
		if _, err := files[i].Read(one[:]); err != nil || one[0] != byte(i) {
			t.Fatalf("pair %d: read %v %v", i/2, one, err)
		}
	}
	// Received descriptors are close-on-exec.
	if fl, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
		t.Errorf("received descriptor flags %#x, %v: want FD_CLOEXEC", fl, err)
	}
}

// TestRecvEOF: the peer's close is an error, not an empty message.
func TestRecvEOF(t *testing.T) {
	a, b := pair(t)
	if err := a.Send([]byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if got, _, err := b.Recv(); err != nil || string(got) != "x" {
		t.Fatalf("first: %q %v", got, err)
	}
	if _, _, err := b.Recv(); err == nil {
		t.Fatal("Recv after the peer closed: no error")
	}
}

func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	fa, fb, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	defer fb.Close()
	a, err := New(fa)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(fb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestSendPartsRecvSized: parts of every size (empty ones, ones across a
// packet boundary) arrive as their concatenation, whether received sized
// (straight into the body), undersized or unsized; an empty message too.
func TestSendPartsRecvSized(t *testing.T) {
	a, b := pair(t)
	var parts [][]byte
	var want []byte
	for i, n := range []int{0, 5, maxData - 3, 0, 2*maxData + 7, 1, maxData} {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		parts = append(parts, p)
		want = append(want, p...)
	}
	for _, size := range []int{len(want), len(want) / 2, -1} {
		errc := make(chan error, 1)
		go func() { errc <- a.SendParts(parts...) }()
		var got []byte
		var err error
		if size < 0 {
			got, _, err = b.Recv()
		} else {
			got, _, err = b.RecvSized(size)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("size %d: got %d bytes, want %d", size, len(got), len(want))
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- a.SendParts() }()
	if got, _, err := b.RecvSized(0); err != nil || len(got) != 0 {
		t.Fatalf("empty: %d bytes, %v", len(got), err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
