package testutil

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// ListenTCP listens on a free loopback port, or fails the test. The caller
// closes the listener.
func ListenTCP(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// IdleHTTP opens a TCP connection to addr, sends GET path with keep-alive,
// reads the answer and keeps the connection open (never sending more): an
// idle keep-alive client, as a server's connection cap sees it. It returns
// the connection (nil if none could be made within d) and the answer's
// status code (0 if none came within d).
func IdleHTTP(addr, path string, d time.Duration) (net.Conn, int) {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return nil, 0
	}
	c.SetDeadline(time.Now().Add(d))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return c, 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	c.SetDeadline(time.Time{})
	return c, resp.StatusCode
}
