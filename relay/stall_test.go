package relay

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

// stallProxy forwards TCP connections to a Postgres server. On the
// replication connection (the one whose startup message asks for
// replication), stall(k, d) lets k more bytes of the server's stream
// through and then holds the rest for d: the walsender's bytes stopping
// k bytes into whatever message is on its way.
type stallProxy struct {
	addr string

	mu      sync.Mutex
	armed   bool
	left    int
	hold    time.Duration
	stalled chan struct{} // closed when an armed stall begins
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &stallProxy{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, target)
		}
	}()
	return p
}

// stall arms the next stall and returns a channel closed when it begins.
func (p *stallProxy) stall(k int, d time.Duration) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.left, p.hold, p.stalled = true, k, d, make(chan struct{})
	return p.stalled
}

func (p *stallProxy) serve(c net.Conn, target string) {
	defer c.Close()
	s, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
	}
	defer s.Close()
	// The startup message (after any SSLRequest, refused here: the
	// test server is plaintext), forwarded as is.
	var startup []byte
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[:])-4)
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		if code := binary.BigEndian.Uint32(body[:4]); code == 80877103 || code == 80877104 {
			c.Write([]byte{'N'})
			continue
		}
		startup = append(hdr[:], body...)
		break
	}
	replication := bytes.Contains(startup, []byte("replication\x00"))
	if _, err := s.Write(startup); err != nil {
		return
	}
	go func() {
		io.Copy(s, c)
		s.Close()
		c.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := s.Read(buf)
		out := buf[:n]
		for len(out) > 0 {
			k, hold, stalled := len(out), time.Duration(0), chan struct{}(nil)
			if replication {
				p.mu.Lock()
				if p.armed {
					if p.left < k {
						k, hold, stalled = p.left, p.hold, p.stalled
						p.armed = false
					} else {
						p.left -= k
					}
				}
				p.mu.Unlock()
			}
			if _, werr := c.Write(out[:k]); werr != nil {
				return
			}
			out = out[k:]
			if stalled != nil {
				close(stalled)
				time.Sleep(hold) // the stall itself, what the test is about
			}
		}
		if err != nil {
			return
		}
	}
}

// The replication stream stopping anywhere in a message, for longer than
// the reader's deadline, loses no wake and does not wedge the relay: for
// each of a set of offsets into the next message, the stream is held
// there for twice the deadline while a row is committed, then released;
// the row's wake arrives, and the relay stays on the same connection
// (the stall is silence, probed and answered, not a failure). The unit
// test TestReaderKeepsItsPlaceAcrossStalls cuts at every byte offset.
func TestRelayStreamStalledMidMessage(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	f := newFixture(t, "q_s")
	ch := f.schema + ".q_s.INSERT"
	l := listen(t, ch)
	cc, err := pgconn.ParseConfig(db.URL())
	if err != nil {
		t.Fatal(err)
	}
	p := newStallProxy(t, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	host, port, _ := net.SplitHostPort(p.addr)
	cc.Host = host
	pn, _ := strconv.Atoi(port)
	cc.Port = uint16(pn)
	opts := f.options()
	opts.ConnConfig = cc
	const status = 200 * time.Millisecond // the reader's deadline is 3 of these
	opts.StatusInterval = status
	r := f.start(opts)
	waitActive(t, r)
	testutil.WaitFor(t, 20*time.Second, "the start's resync wake", func() bool { return l.count(ch) >= 1 })
	reconnects := r.Stats().Reconnects
	for i, k := range []int{0, 1, 2, 3, 4, 5, 6, 9, 17, 30, 60} {
		before := l.count(ch)
		stalled := p.stall(k, 6*status)
		f.exec("INSERT INTO " + f.schema + ".q_s (v) VALUES ('x')")
		select {
		case <-stalled:
		case <-time.After(20 * time.Second):
			t.Fatalf("offset %d: the stream never reached the stall", k)
		}
		testutil.WaitFor(t, 20*time.Second, "the row's wake after the stall", func() bool { return l.count(ch) > before })
		t.Logf("offset %d (%d of the set): woken after the stall", k, i+1)
	}
	if st := r.Stats(); st.Reconnects != reconnects || st.State != StateActive {
		t.Fatalf("after the stalls: state %v, %d reconnects (were %d): the stalls were taken for failures", st.State, st.Reconnects, reconnects)
	}
}
