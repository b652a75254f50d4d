package pglisten

import (
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/loop"
)

// TestParseConfigSchemeTypo: a URL with a misspelt scheme says so, instead
// of pgconn's "failed to parse as keyword/value".
func TestParseConfigSchemeTypo(t *testing.T) {
	for _, s := range []string{"postgress://x", "postgre://u:secret@h/db", "mysql://h/db"} {
		_, err := ParseConfig(s, "")
		if !errors.Is(err, ErrURLScheme) || !IsConfigError(err) || strings.Contains(err.Error(), "keyword/value") ||
			!strings.Contains(err.Error(), "want postgres:// or postgresql://") || strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseConfig(%q): %v", s, err)
		}
	}
	for _, s := range []string{"postgres://h/db", "postgresql://h/db", "host=h dbname=x", "host=h password=a://b", ""} {
		if _, err := ParseConfig(s, ""); err != nil {
			t.Errorf("ParseConfig(%q): %v", s, err)
		}
	}
}

// refusingServer answers like a server without TLS whose pg_hba refuses
// the password: 'N' to an SSLRequest, a FATAL 28P01 to a startup message.
func refusingServer(t *testing.T) string {
	ln := testutil.ListenTCP(t)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					var hdr [4]byte
					if _, err := io.ReadFull(c, hdr[:]); err != nil {
						return
					}
					body := make([]byte, binary.BigEndian.Uint32(hdr[:])-4)
					if _, err := io.ReadFull(c, body); err != nil {
						return
					}
					if len(body) == 4 && binary.BigEndian.Uint32(body) == 80877103 { // SSLRequest
						c.Write([]byte{'N'})
						continue
					}
					var e []byte
					for _, f := range []string{"SFATAL", "VFATAL", "C28P01", `Mpassword authentication failed for user "u"`} {
						e = append(append(e, f...), 0)
					}
					e = append(e, 0)
					msg := binary.BigEndian.AppendUint32([]byte{'E'}, uint32(4+len(e)))
					c.Write(append(msg, e...))
					return
				}
			}()
		}
	}()
	return "postgres://u:sekrit@" + ln.Addr().String() + "/db" // sslmode prefer: TLS first
}

// TestConnectErrorCauseFirst: an authentication failure behind a refused
// TLS attempt (sslmode=prefer against a server without TLS) says the
// server's reason first, not "tls error: server refused TLS connection",
// and is still a configuration error.
func TestConnectErrorCauseFirst(t *testing.T) {
	cc := mustParseConfig(t, refusingServer(t), "")
	l, err := loop.New(loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { l.Stop(); l.Run() }()
	_, openErr := Open(ctxT(t), l, Config{ConnConfig: cc})
	_, plainErr := NewPlain(ctxT(t), PlainConfig{ConnConfig: cc})
	want := "listener: connect to `user=u database=db`: FATAL: password authentication failed for user \"u\" (SQLSTATE 28P01)"
	for _, err := range []error{openErr, plainErr} {
		if err == nil || err.Error() != want || !IsConfigError(err) {
			t.Errorf("error %v (config error %v), want %q", err, IsConfigError(err), want)
		}
	}
}
