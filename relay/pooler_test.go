package relay

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/relayfix"
)

// dropReplicationProxy forwards TCP connections to addr with the
// replication parameter taken out of each startup message: what a
// transaction-mode pooler that does not know the parameter does (PgBouncer
// refuses it instead). Every session behind it is a plain one.
func dropReplicationProxy(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go proxyWithoutReplication(c, addr)
		}
	}()
	return ln.Addr().String()
}

func proxyWithoutReplication(c net.Conn, addr string) {
	defer c.Close()
	var body []byte
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		body = make([]byte, binary.BigEndian.Uint32(hdr[:])-4)
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		code := binary.BigEndian.Uint32(body[:4])
		if code != 80877103 && code != 80877104 { // not an SSLRequest or GSSENCRequest
			break
		}
		c.Write([]byte{'N'})
	}
	out := append([]byte(nil), body[:4]...)
	kv := bytes.Split(bytes.TrimRight(body[4:], "\x00"), []byte{0})
	for i := 0; i+1 < len(kv); i += 2 {
		if string(kv[i]) == "replication" {
			continue
		}
		out = append(append(append(append(out, kv[i]...), 0), kv[i+1]...), 0)
	}
	out = append(out, 0)
	s, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return
	}
	defer s.Close()
	s.Write(binary.BigEndian.AppendUint32(nil, uint32(len(out)+4)))
	s.Write(out)
	// Either side ending ends both: no backend outlives the relay's
	// connection (other tests count backends by application_name).
	go func() {
		io.Copy(s, c)
		s.Close()
		c.Close()
	}()
	io.Copy(c, s)
}

// A pooler that drops the replication parameter makes the replication
// connection a plain session, which answers CREATE_REPLICATION_SLOT or
// START_REPLICATION with a syntax error. The relay ends at once with the
// cause and the fix, never retrying a syntax error for ever.
func TestRelayPoolerDroppingReplicationNamed(t *testing.T) {
	pgtesting.RequireLocal(t, db)
	f := newFixture(t, "q_a")
	cc, err := pgconn.ParseConfig(db.URL())
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(dropReplicationProxy(t, net.JoinHostPort(cc.Host, itoa(int(cc.Port)))))
	if err != nil {
		t.Fatal(err)
	}
	cc.Host = host
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	cc.Port = uint16(p)
	opts := f.options()
	opts.ConnConfig = cc
	rn := f.run(opts)
	rn.ended(t, 20*time.Second, "dropped the replication=database parameter", relayfix.Pooler)
}
