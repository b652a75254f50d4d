package relay

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

// stallingReader serves data but stops once, after exactly cut bytes,
// with the error a read deadline gives: the walsender's bytes stopping
// anywhere in a message for longer than the reader's deadline.
type stallingReader struct {
	data    []byte
	off     int
	cut     int
	stalled bool
}

func (r *stallingReader) Read(p []byte) (int, error) {
	if r.off >= len(r.data) {
		return 0, io.EOF
	}
	if !r.stalled && r.off == r.cut {
		r.stalled = true
		return 0, os.ErrDeadlineExceeded
	}
	end := len(r.data)
	if !r.stalled {
		end = min(end, r.cut)
	}
	n := copy(p, r.data[r.off:end])
	r.off += n
	return n, nil
}

// decodeAll runs the stream loop's reader over src to its end, answering
// its probes, and returns one line per event and the probes asked.
func decodeAll(t *testing.T, src io.Reader) (got []string, probes int) {
	t.Helper()
	s := &session{r: newTestRelay(t, OpInsert), rc: fakeConn{r: src}}
	s.mr = newMsgReader(s.rc)
	events := make(chan event)
	done := make(chan error, 1)
	go func() { done <- s.read(t.Context(), events) }()
	for {
		select {
		case ev := <-events:
			switch ev.kind {
			case evProbe:
				probes++
				ev.probe <- nil // the walsender is ours: read on
			case evCommit:
				got = append(got, fmt.Sprintf("%d@%d:%s:%d", ev.xid, ev.end, strings.Join(ev.chans, "+"), ev.changes))
			}
		case err := <-done:
			if err != io.EOF {
				t.Fatalf("read: %v, want EOF at the end of the stream", err)
			}
			return got, probes
		}
	}
}

// The reader keeps its place in the replication stream however the bytes
// stop: cut once at every byte offset of the small messages, and at every
// offset near the edges of a message larger than the read buffer (its
// header, the buffer's size, its end), it decodes the same transactions
// as the uncut stream, in order, and reads on to the end. (Reading the
// header and then the body lost the header whenever the body was late.)
func TestReaderKeepsItsPlaceAcrossStalls(t *testing.T) {
	var st stream
	st.relation(1, "pgmq", "q_a")
	st.relation(2, "pgmq", "q_b")
	st.tx(100, 1000, 1, 3, []byte("row"))
	st.tx(101, 2000, 2, 1, []byte("row"))
	small := st.Len()
	st.tx(102, 3000, 1, 1, bytes.Repeat([]byte("x"), msgBufferSize+1000)) // one message larger than the buffer
	big := st.Len()
	st.tx(103, 4000, 2, 2, []byte("row"))
	st.relation(1, "pgmq", "q_renamed")
	st.tx(104, 5000, 1, 1, []byte("row"))
	data := st.Bytes()

	want, _ := decodeAll(t, bytes.NewReader(data))
	if len(want) != 5 {
		t.Fatalf("uncut stream: %d transactions, want 5: %q", len(want), want)
	}
	// The large message's header starts 24+1+5+... after small: find it
	// as the first 'd' message whose length passes the buffer.
	bigHdr := -1
	for off := small; off+5 <= big; {
		n := int(uint32(data[off+1])<<24 | uint32(data[off+2])<<16 | uint32(data[off+3])<<8 | uint32(data[off+4]))
		if n > msgBufferSize {
			bigHdr = off
			break
		}
		off += 1 + n
	}
	if bigHdr < 0 {
		t.Fatal("no message larger than the buffer in the stream")
	}
	var cuts []int
	for off := 0; off <= small; off++ {
		cuts = append(cuts, off)
	}
	for _, base := range []int{bigHdr, bigHdr + msgBufferSize, big - 8} {
		for d := -8; d <= 8; d++ {
			cuts = append(cuts, base+d)
		}
	}
	for off := big; off <= len(data); off++ {
		cuts = append(cuts, off)
	}
	for _, cut := range cuts {
		got, probes := decodeAll(t, &stallingReader{data: data, cut: cut})
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("cut at byte %d of %d: decoded %q, want %q", cut, len(data), got, want)
		}
		if probes > 1 {
			t.Fatalf("cut at byte %d: %d probes for one stall", cut, probes)
		}
	}
	t.Logf("%d cuts, each decoded the same %d transactions", len(cuts), len(want))
}
