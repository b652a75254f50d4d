package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/frame"
)

// tailWriteTimeout bounds sending the sub frames: a hub that does not read
// a few hundred bytes in that time is wedged, and tail says so.
const tailWriteTimeout = 5 * time.Second

const tailDescription = `
Connects to the hub, subscribes to each Q and prints every frame the hub
sends (ack, nack, wake, status, and any unknown type) as one compact JSON
line on stdout, exactly as received. Exits 0 on SIGINT/SIGTERM, and 1 when
the hub refuses a subscription (nack: the line is printed, the reason goes
to stderr) or closes the connection.
`

// runTail is `listenhub tail`: a debugging tool that speaks the wire
// protocol directly rather than through client.Conn, so that it shows
// what the hub really sends (unknown frame types and fields included) and
// never gives up on a slow ack. Exit codes: 0 when ctx ends (a signal), 1
// when the hub refuses a subscription (a nack: what was asked cannot be
// tailed, and a script must not mistake the silence for "no events"),
// closes the connection, cannot be reached or sends a malformed frame, 2
// for a usage error.
func runTail(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	socket, qs, code := parseTail(args, stdout, stderr)
	if qs == nil {
		return code
	}
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		if ctx.Err() != nil {
			return 0
		}
		fmt.Fprintf(stderr, "listenhub tail: cannot connect to the hub: %v\n", err)
		return 1
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := tailSubscribe(conn, qs); err != nil {
		if ctx.Err() != nil {
			return 0
		}
		fmt.Fprintf(stderr, "listenhub tail: sending subscriptions to %s: %v\n", socket, err)
		return 1
	}
	return tailFrames(ctx, conn, socket, stdout, stderr)
}

// parseTail parses tail's flags and names; nil names and the exit status
// when they are wrong (or -h was asked).
func parseTail(args []string, stdout, stderr io.Writer) (socket string, qs []string, code int) {
	fs := newFlagSet("tail")
	sock := fs.String("socket", os.Getenv(envName("socket")), "hub socket `path`")
	// Flags may come after the names too (`tail jobs --socket /run/x`);
	// everything after "--" is a name, even one that starts with "-".
	var literal []string
	for i, a := range args {
		if a == "--" {
			args, literal = args[:i], args[i+1:]
			break
		}
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printUsage(stdout, fs, "tail", true)
				fmt.Fprint(stdout, tailDescription)
			}
			return "", nil, flagError(stderr, "tail", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		qs = append(qs, args[0])
		args = args[1:]
	}
	qs = append(qs, literal...)
	if *sock == "" {
		return "", nil, flagError(stderr, "tail", errors.New("--socket is required (or "+envName("socket")+")"))
	}
	if len(qs) == 0 {
		return "", nil, flagError(stderr, "tail", errors.New("give at least one subscription name"))
	}
	return *sock, qs, 0
}

// tailSubscribe sends a sub for each name, all in one write.
func tailSubscribe(conn net.Conn, qs []string) error {
	var subs []byte
	for _, q := range qs {
		subs = frame.AppendSub(subs, q)
	}
	conn.SetWriteDeadline(time.Now().Add(tailWriteTimeout))
	_, err := conn.Write(subs)
	return err
}

// tailFrames prints every frame from conn as a compact JSON line until ctx
// ends (0), the hub refuses a name, closes or sends a malformed frame (1).
func tailFrames(ctx context.Context, conn net.Conn, socket string, stdout, stderr io.Writer) int {
	r := bufio.NewReaderSize(conn, 64<<10)
	w := bufio.NewWriter(stdout)
	var hdr [4]byte
	var body, line []byte
	var compact bytes.Buffer
	for {
		if err := readFrame(r, hdr[:], &body); err != nil {
			w.Flush()
			switch {
			case ctx.Err() != nil:
				return 0
			case errors.Is(err, io.EOF):
				fmt.Fprintf(stderr, "listenhub tail: the hub closed the connection (EOF on %s)\n", socket)
			default:
				fmt.Fprintf(stderr, "listenhub tail: reading from %s: %v\n", socket, err)
			}
			return 1
		}
		m, err := frame.Decode(body)
		if err != nil {
			w.Flush()
			fmt.Fprintf(stderr, "listenhub tail: malformed frame from the hub: %v: %q\n", err, truncate(body, 200))
			return 1
		}
		compact.Reset()
		if err := json.Compact(&compact, body); err != nil {
			// Decode accepted it, so this does not happen; print as is.
			compact.Reset()
			compact.Write(body)
		}
		line = append(append(line[:0], compact.Bytes()...), '\n')
		if _, err := w.Write(line); err != nil {
			return 1 // stdout is gone (a closed pipe): nothing to say it on
		}
		if m.Type == frame.TypeNack {
			w.Flush()
			fmt.Fprintf(stderr, "listenhub tail: the hub refused %q: %s\n", m.Name, m.Error)
			return 1
		}
		if r.Buffered() == 0 {
			// Nothing more in hand: show what we have now.
			if err := w.Flush(); err != nil {
				return 1
			}
		}
	}
}

// readFrame reads one frame's body into *body; the length is checked
// against frame.MaxLen before anything is allocated for it.
func readFrame(r *bufio.Reader, hdr []byte, body *[]byte) error {
	if _, err := io.ReadFull(r, hdr); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("truncated frame header: %w", err)
		}
		return err
	}
	n := binary.BigEndian.Uint32(hdr)
	if n > frame.MaxLen {
		return fmt.Errorf("frame length %d above the %d limit", n, frame.MaxLen)
	}
	if cap(*body) < int(n) {
		*body = make([]byte, n)
	}
	*body = (*body)[:n]
	if _, err := io.ReadFull(r, *body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("truncated frame body (%d bytes announced): %w", n, err)
	}
	return nil
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return strings.ToValidUTF8(string(b[:n]), "") + "…"
}
