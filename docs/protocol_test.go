package docs_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/listener"
)

// hexBlock is one ```hex fenced block of protocol.md: a label line starting
// with "# " and a hexdump -C style dump of the bytes.
type hexBlock struct {
	line  int    // line number of the label, for messages
	label string // the label without "# "
	data  []byte // the dumped bytes
}

func (b hexBlock) String() string { return fmt.Sprintf("protocol.md:%d (%s)", b.line, b.label) }

// parseHexBlocks reads every ```hex block of doc and checks that its dump
// is well formed: offsets count the bytes, and the ASCII gutter shows the
// bytes (printable ASCII as itself, anything else as '.').
func parseHexBlocks(t *testing.T, doc string) []hexBlock {
	t.Helper()
	var blocks []hexBlock
	var cur *hexBlock
	sc := bufio.NewScanner(strings.NewReader(doc))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && line == "```hex":
			cur = &hexBlock{line: n + 1}
		case cur == nil:
		case line == "```":
			if cur.label == "" || len(cur.data) == 0 {
				t.Fatalf("protocol.md:%d: hex block without label or bytes", cur.line)
			}
			blocks = append(blocks, *cur)
			cur = nil
		case cur.label == "":
			label, ok := strings.CutPrefix(line, "# ")
			if !ok {
				t.Fatalf("protocol.md:%d: hex block must start with a \"# \" label line, got %q", n, line)
			}
			cur.label = label
		default:
			cur.data = append(cur.data, parseDumpLine(t, n, line, len(cur.data))...)
		}
	}
	if cur != nil {
		t.Fatalf("protocol.md:%d: unterminated hex block", cur.line)
	}
	return blocks
}

// parseDumpLine parses one line of `hexdump -C` output:
//
//	00000010  71 22 3a 22 63 68 61 74  22 7d                    |q":"chat"}|
//
// The columns are fixed: 8 offset digits, two spaces, 49 columns of hex,
// a space, and the gutter between bars.
func parseDumpLine(t *testing.T, n int, line string, offset int) []byte {
	t.Helper()
	if len(line) < 62 || line[8:10] != "  " || line[59] != ' ' || line[60] != '|' || !strings.HasSuffix(line, "|") {
		t.Fatalf("protocol.md:%d: not a hexdump -C line: %q", n, line)
	}
	off, err := strconv.ParseUint(line[:8], 16, 32)
	if err != nil || int(off) != offset {
		t.Fatalf("protocol.md:%d: offset %q, want %08x", n, line[:8], offset)
	}
	b, err := hex.DecodeString(strings.Join(strings.Fields(line[10:59]), ""))
	if err != nil || len(b) == 0 || len(b) > 16 {
		t.Fatalf("protocol.md:%d: bad hex bytes %q: %v", n, line[10:59], err)
	}
	// Re-render the hex columns to catch misplaced bytes (the gap after
	// the eighth byte) and trailing garbage.
	var want strings.Builder
	for i, c := range b {
		if i == 8 {
			want.WriteByte(' ')
		}
		if i > 0 {
			want.WriteByte(' ')
		}
		fmt.Fprintf(&want, "%02x", c)
	}
	if got := strings.TrimRight(line[10:59], " "); got != want.String() {
		t.Fatalf("protocol.md:%d: hex columns %q, want %q", n, got, want.String())
	}
	var gutter strings.Builder
	for _, c := range b {
		if c >= 0x20 && c < 0x7f {
			gutter.WriteByte(c)
		} else {
			gutter.WriteByte('.')
		}
	}
	if got := line[61 : len(line)-1]; got != gutter.String() {
		t.Fatalf("protocol.md:%d: ASCII gutter %q does not match the bytes, want %q", n, got, gutter.String())
	}
	return b
}

func readDoc(t *testing.T) string {
	t.Helper()
	b := testutil.ReadFile(t, "protocol.md")
	return string(b)
}

// encodeByType encodes m with the encoder dedicated to its type, the one
// the hub and the client call.
func encodeByType(t *testing.T, m frame.Message) []byte {
	t.Helper()
	switch m.Type {
	case frame.TypeSub:
		return frame.AppendSub(nil, m.Name)
	case frame.TypeUnsub:
		return frame.AppendUnsub(nil, m.Name)
	case frame.TypeAck:
		return frame.AppendAck(nil, m.Name)
	case frame.TypeNack:
		return frame.AppendNack(nil, m.Name, m.Error)
	case frame.TypeWake:
		return frame.AppendWake(nil, m.Name, []byte(m.Payload), m.HasPayload)
	case frame.TypeStatus:
		return frame.AppendStatus(nil, m.Healthy)
	}
	t.Fatalf("no encoder for type %q", m.Type)
	return nil
}

// checkFrame checks that data is exactly one frame holding body, and that
// both the type's encoder and the generic Append produce these very bytes
// from the decoded message.
func checkFrame(t *testing.T, b hexBlock, data []byte, body string) frame.Message {
	t.Helper()
	if len(data) < 4 {
		t.Fatalf("%v: %d bytes, shorter than a header", b, len(data))
	}
	if n := binary.BigEndian.Uint32(data); int(n) != len(data)-4 {
		t.Fatalf("%v: header says %d bytes, %d follow", b, n, len(data)-4)
	}
	if got := string(data[4:]); got != body {
		t.Fatalf("%v: body bytes %s differ from the label %s", b, got, body)
	}
	if !json.Valid(data[4:]) {
		t.Fatalf("%v: body is not valid JSON", b)
	}
	m, err := frame.Decode(data[4:])
	if err != nil {
		t.Fatalf("%v: frame.Decode: %v", b, err)
	}
	if got := encodeByType(t, m); !bytes.Equal(got, data) {
		t.Errorf("%v: the %s encoder writes\n% x\nthe doc shows\n% x", b, m.Type, got, data)
	}
	if got := frame.Append(nil, m); !bytes.Equal(got, data) {
		t.Errorf("%v: frame.Append writes\n% x\nthe doc shows\n% x", b, got, data)
	}
	return m
}

// splitJSON splits a label holding several JSON objects separated by spaces.
func splitJSON(t *testing.T, b hexBlock, s string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	var out []string
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			t.Fatalf("%v: label: %v", b, err)
		}
		out = append(out, string(raw))
	}
	return out
}

// TestProtocolHexExamples checks every byte dump in protocol.md against the
// frame codec: the frames are what the encoders write, the stream decodes
// into those frames in order, and the oversized header is refused.
func TestProtocolHexExamples(t *testing.T) {
	blocks := parseHexBlocks(t, readDoc(t))
	seen := map[string]bool{}
	for _, b := range blocks {
		switch {
		case strings.HasPrefix(b.label, "{"):
			m := checkFrame(t, b, b.data, b.label)
			seen[m.Type] = true
			if m.Type == frame.TypeWake && !m.HasPayload {
				seen["wake/durable"] = true
			}
			if m.Type == frame.TypeWake && m.HasPayload {
				seen["wake/ephemeral"] = true
			}
			// Byte by byte through the incremental decoder, as a
			// client reading a socket would see it.
			var d frame.Decoder
			for i := range b.data {
				d.Feed(b.data[i : i+1])
				got, ok, err := d.Next()
				if err != nil {
					t.Fatalf("%v: Decoder after %d bytes: %v", b, i+1, err)
				}
				if ok != (i == len(b.data)-1) {
					t.Fatalf("%v: Decoder after %d of %d bytes: ok=%v", b, i+1, len(b.data), ok)
				}
				if ok && got != m {
					t.Fatalf("%v: Decoder: %+v, Decode: %+v", b, got, m)
				}
			}
		case strings.HasPrefix(b.label, "stream: "):
			bodies := splitJSON(t, b, strings.TrimPrefix(b.label, "stream: "))
			var d frame.Decoder
			d.Feed(b.data)
			rest := b.data
			for _, body := range bodies {
				m, ok, err := d.Next()
				if err != nil || !ok {
					t.Fatalf("%v: Decoder.Next: ok=%v err=%v", b, ok, err)
				}
				n := 4 + len(body)
				if n > len(rest) {
					t.Fatalf("%v: stream too short for %s", b, body)
				}
				if want := checkFrame(t, b, rest[:n], body); m != want {
					t.Fatalf("%v: stream decodes to %+v, want %+v", b, m, want)
				}
				rest = rest[n:]
			}
			if len(rest) != 0 || d.Buffered() != 0 {
				t.Fatalf("%v: %d bytes after the labelled frames", b, len(rest))
			}
			seen["stream"] = true
		case strings.HasPrefix(b.label, "too large: "):
			n := binary.BigEndian.Uint32(b.data)
			if len(b.data) != 4 || n <= frame.MaxLen || !strings.Contains(b.label, strconv.Itoa(int(n))) {
				t.Fatalf("%v: want a lone header above MaxLen whose length the label names", b)
			}
			var d frame.Decoder
			d.Feed(b.data)
			if _, ok, err := d.Next(); ok || !errors.Is(err, frame.ErrTooLarge) {
				t.Fatalf("%v: Decoder.Next: ok=%v err=%v, want ErrTooLarge", b, ok, err)
			}
			seen["too large"] = true
		default:
			t.Fatalf("%v: unknown label kind", b)
		}
	}
	for _, k := range []string{"sub", "unsub", "ack", "nack", "wake/durable", "wake/ephemeral", "status", "stream", "too large"} {
		if !seen[k] {
			t.Errorf("protocol.md has no hex example of %s", k)
		}
	}

	// The doc says the largest legal header is 00 40 00 00: the decoder
	// must wait for that body rather than refuse it.
	var d frame.Decoder
	d.Feed([]byte{0x00, 0x40, 0x00, 0x00})
	if _, ok, err := d.Next(); ok || err != nil {
		t.Errorf("header 00 40 00 00: ok=%v err=%v, want a wait for more bytes", ok, err)
	}
}

// TestProtocolProse checks the numbers and inline bytes the prose states.
func TestProtocolProse(t *testing.T) {
	doc := readDoc(t)
	if frame.MaxLen != 4194304 {
		t.Fatalf("frame.MaxLen is %d; protocol.md says 4,194,304", frame.MaxLen)
	}
	for _, s := range []string{"4,194,304", "`0x00400000`", "`00 40 00 00`", "65,536"} {
		if !strings.Contains(doc, s) {
			t.Errorf("protocol.md no longer mentions %s", s)
		}
	}
	// "the 22-byte body `{...}` goes on the wire as the header `00 00 00 16`"
	re := regexp.MustCompile("the (\\d+)-byte body `([^`]+)` goes on the wire as the\\s+header `([0-9a-f ]+)`")
	m := re.FindStringSubmatch(doc)
	if m == nil {
		t.Fatal("protocol.md lost its inline framing example")
	}
	f := frame.Append(nil, mustDecode(t, m[2]))
	if strconv.Itoa(len(f)-4) != m[1] || fmt.Sprintf("% x", f[:4]) != m[3] || string(f[4:]) != m[2] {
		t.Errorf("inline example: %s is %d bytes with header % x, the doc says %s bytes, header %s", m[2], len(f)-4, f[:4], m[1], m[3])
	}
}

func mustDecode(t *testing.T, body string) frame.Message {
	t.Helper()
	m, err := frame.Decode([]byte(body))
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return m
}

// TestDocLinks checks that every in-page link of the documents points at a
// heading, using GitHub's anchor rules (lower case, punctuation dropped,
// spaces to hyphens).
func TestDocLinks(t *testing.T) {
	for _, name := range []string{"protocol.md"} {
		b := testutil.ReadFile(t, name)
		checkAnchors(t, name, string(b))
	}
}

func checkAnchors(t *testing.T, name, doc string) {
	t.Helper()
	anchors := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		anchors[testutil.GitHubAnchor(strings.TrimLeft(line, "# "))] = true
	}
	for _, m := range regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(doc, -1) {
		if !anchors[m[1]] {
			t.Errorf("%s: link to #%s, but no heading has that anchor", name, m[1])
		}
	}
}

// TestProtocolFacts checks the values the prose quotes from the code: the
// limits table, the nack reasons, the pgbus LISTEN statement.
func TestProtocolFacts(t *testing.T) {
	doc := readDoc(t)
	for _, c := range []struct {
		what string
		got  any
		want any
		text string // must appear in protocol.md
	}{
		{"hub.DefaultConfig().HardQueueLimit", hub.DefaultConfig().HardQueueLimit, 1024, "`--hard-queue-limit` 1024 frames"},
		{"hub.DefaultConfig().StallTimeout", hub.DefaultConfig().StallTimeout, 2 * time.Second, "`--stall-timeout` 2 s"},
		{"hub.DefaultConfig().HardQueueBytes", hub.DefaultConfig().HardQueueBytes, 8 << 20, "`--hard-queue-bytes` 8 MiB"},
		{"hub.DefaultConfig().DurableQueueLimit", hub.DefaultConfig().DurableQueueLimit, 256, "`--durable-queue-limit` 256"},
		{"hub.DefaultConfig().StatusInterval", hub.DefaultConfig().StatusInterval, time.Second, "5 s by default"},
		{"listener.MaxChannelLen", listener.MaxChannelLen, 63, "63 bytes (Postgres NAMEDATALEN-1)"},
		{"pgbus LISTEN", "LISTEN " + listener.QuoteIdentifier("pgmq.q_"+"default"+".INSERT"), `LISTEN "pgmq.q_default.INSERT"`, "`LISTEN \"pgmq.q_default.INSERT\"`"},
	} {
		if c.got != c.want {
			t.Errorf("%s is %v; protocol.md says %v", c.what, c.got, c.want)
		}
		if !strings.Contains(doc, c.text) {
			t.Errorf("protocol.md no longer says %s (for %s)", c.text, c.what)
		}
	}
}
