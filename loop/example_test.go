//go:build linux

package loop_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/listenhub/listenhub/loop"
)

// A loop serving a Unix socket: the listener and each connection are
// registered for readability, and every callback runs on the loop's one
// goroutine, so the state they share needs no lock. This server answers
// each read with its length and stops after one connection.
func Example() {
	dir, _ := os.MkdirTemp("", "loop")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "s")
	ln, _ := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: path}); err != nil {
		log.Fatal(err)
	}
	unix.Listen(ln, 16)

	l, err := loop.New(loop.Options{})
	if err != nil {
		log.Fatal(err)
	}
	served := 0 // loop state: touched only by callbacks
	_, err = l.Register(ln, loop.Readable, func(loop.Events) {
		fd, _, err := unix.Accept4(ln, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN: another wake took it
		}
		var tok loop.Token
		tok, _ = l.Register(fd, loop.Readable, func(loop.Events) {
			buf := make([]byte, 512)
			n, err := unix.Read(fd, buf)
			if err == unix.EAGAIN {
				return
			}
			if n <= 0 { // EOF or an error: the connection is done
				l.Unregister(tok)
				unix.Close(fd)
				served++
				l.Stop()
				return
			}
			unix.Write(fd, fmt.Appendf(nil, "%d bytes\n", n)) // small: never blocks here
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() { // a client, in another goroutine
		c, _ := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		unix.Connect(c, &unix.SockaddrUnix{Name: path})
		unix.Write(c, []byte("hello"))
		buf := make([]byte, 64)
		n, _ := unix.Read(c, buf)
		fmt.Print(string(buf[:n]))
		unix.Close(c)
	}()
	if err := l.Run(); err != nil {
		log.Fatal(err)
	}
	unix.Close(ln)
	fmt.Println("connections served:", served)
	// Output:
	// 5 bytes
	// connections served: 1
}
