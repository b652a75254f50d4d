//go:build unix

package monitor

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/fdreserve"
	"github.com/listenhub/listenhub/internal/testutil"
)

type lockedBuf = testutil.SyncBuffer

// Out of descriptors with a connection waiting, the metrics server takes it
// on the process's descriptor reserve and answers it; with the reserve
// spent it pauses accepting (one log line, little CPU) instead of spinning
// on EMFILE, and serves again once descriptors are free.
func TestAcceptOutOfDescriptors(t *testing.T) {
	ln := testutil.ListenTCP(t)
	var logBuf lockedBuf
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })}
	cl := newConnLimiter(ln, maxConns)
	cl.log = slog.New(slog.NewTextHandler(&logBuf, nil))
	srv.ConnState = cl.track
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()

	fdreserve.Keep()
	t.Cleanup(fdreserve.Drop)
	testutil.LowerNofile(t, 256)
	var filler []int
	fill := func() {
		for {
			fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			if err != nil {
				return
			}
			filler = append(filler, fd)
		}
	}
	free := func(n int) {
		for ; n > 0 && len(filler) > 0; n-- {
			syscall.Close(filler[len(filler)-1])
			filler = filler[:len(filler)-1]
		}
	}
	t.Cleanup(func() { free(len(filler)) })
	// dial connects with one descriptor of the test's own, all others
	// taken: the server has none for it.
	dial := func() net.Conn {
		t.Helper()
		fill()
		free(1)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	get := func(c net.Conn, d time.Duration) (string, error) {
		c.SetDeadline(time.Now().Add(d))
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			return "", err
		}
		return bufio.NewReader(c).ReadString('\n')
	}

	// Each connection stays open (keep-alive), holding what it took: the
	// first ones are served on the reserve, until it is spent.
	onReserve := 0
	var c2 net.Conn
	for {
		c := dial()
		t.Cleanup(func() { c.Close() })
		var ru0, ru1 syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
		start := time.Now()
		line, err := get(c, time.Second)
		if err == nil {
			if !strings.Contains(line, "200") {
				t.Fatalf("on the reserve: %q", line)
			}
			if onReserve++; onReserve > fdreserve.Size {
				t.Fatalf("%d connections served with every descriptor taken and a reserve of %d", onReserve, fdreserve.Size)
			}
			continue
		}
		// Paused, not spinning, and said once.
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
		cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) / time.Duration(time.Since(start).Milliseconds()+1)
		lines := strings.Count(logBuf.String(), "out of file descriptors; accepting paused")
		t.Logf("%d connections served on the reserve; then out of descriptors for 1 s: %d log lines, CPU %v per ms", onReserve, lines, cpu)
		if onReserve == 0 {
			t.Fatal("no connection served on the reserve")
		}
		if lines != 1 {
			t.Fatalf("%d log lines about accepting out of descriptors, want 1:\n%s", lines, logBuf.String())
		}
		if cpu > 300*time.Microsecond {
			t.Fatalf("%v of CPU per ms while out of descriptors: accept spins", cpu)
		}
		c2 = c
		break
	}

	// Descriptors back: the waiting connection is served (its request
	// was written already) within the longest pause.
	free(len(filler))
	c2.SetDeadline(time.Now().Add(timeout))
	start := time.Now()
	line, err := bufio.NewReader(c2).ReadString('\n')
	if err != nil || !strings.Contains(line, "200") {
		t.Fatalf("once descriptors are back: %q, %v", line, err)
	}
	if d := time.Since(start); d > shortPauseMax+time.Second {
		t.Fatalf("served %v after descriptors came back", d)
	}
}
