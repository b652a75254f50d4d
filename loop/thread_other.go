//go:build !linux

package loop

import (
	"bytes"
	"runtime"
	"strconv"
)

// threadID identifies the calling goroutine, parsed from the header of its
// stack trace ("goroutine 18 [running]:"): there is no portable gettid, and
// Run's goroutine is the loop's identity as well as its thread is. Only
// assertions call it.
func threadID() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseInt(string(b), 10, 64)
	return id
}
