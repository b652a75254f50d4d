package main

// The hop reference: the one-way latency of a small write on a Unix socket
// to another, idle process on this machine. Every hub adds one such hop
// (Postgres → hub → worker instead of Postgres → worker), so it is the floor
// of what a hub adds to a single listener's latency here.

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/benchmarks/internal/hist"
)

// hopSinkMain reads 8-byte send timestamps from fd 3 and prints the
// latency summary at EOF.
func hopSinkMain() error {
	f := os.NewFile(3, "hop")
	var h hist.H
	buf := make([]byte, 8)
	for {
		if _, err := f.Read(buf); err != nil {
			break
		}
		h.Record(time.Now().UnixNano() - int64(binary.BigEndian.Uint64(buf)))
	}
	return json.NewEncoder(os.Stdout).Encode(h.Summarize())
}

// measureHop sends n timestamps, one per interval, to a child process.
func measureHop(n int, interval time.Duration) (hist.Summary, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return hist.Summary{}, err
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "hop"), os.NewFile(uintptr(fds[1]), "hop-child")
	self, _ := os.Executable()
	cmd := exec.Command(self, "hopsink")
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return hist.Summary{}, err
	}
	if err := cmd.Start(); err != nil {
		return hist.Summary{}, err
	}
	theirs.Close()
	var b [8]byte
	for range n {
		time.Sleep(interval)
		binary.BigEndian.PutUint64(b[:], uint64(time.Now().UnixNano()))
		if _, err := mine.Write(b[:]); err != nil {
			break
		}
	}
	mine.Close()
	var s hist.Summary
	if err := json.NewDecoder(out).Decode(&s); err != nil {
		cmd.Wait()
		return s, fmt.Errorf("hop sink: %w", err)
	}
	return s, cmd.Wait()
}
