package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/monitor"
)

const readmePath = "../../README.md"

func readREADME(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// readmeSection returns the text under the heading line `heading` up to the
// next heading of the same or a higher level.
func readmeSection(t *testing.T, doc, heading string) string {
	t.Helper()
	level := strings.IndexByte(heading, ' ')
	var out []string
	in := false
	fence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(line, "#") {
			l := strings.IndexByte(line, ' ')
			if in && l > 0 && l <= level {
				break
			}
			if line == heading {
				in = true
				continue
			}
		}
		if in {
			out = append(out, line)
		}
	}
	if !in {
		t.Fatalf("README has no %q section", heading)
	}
	return strings.Join(out, "\n")
}

// markdownTable returns the body rows of the first table in text, split
// into trimmed cells, after checking its header.
func markdownTable(t *testing.T, text string, header []string) [][]string {
	t.Helper()
	var rows [][]string
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "|") {
			if rows != nil {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	if len(rows) < 2 || !slices.Equal(rows[0], header) {
		t.Fatalf("want a table with header %q, got %q", header, rows)
	}
	return rows[2:] // header and |---|
}

var backticked = regexp.MustCompile("`([^`]*)`")

// firstCode returns the first `code` span of a cell, "" if none.
func firstCode(cell string) string {
	if m := backticked.FindStringSubmatch(cell); m != nil {
		return m[1]
	}
	return ""
}

// helpFlag is one flag as `listenhub CMD -h` prints it.
type helpFlag struct {
	def   string // the default as printed, "" when it is the zero value
	usage string // the usage text, without the "(default …)" printDefaults adds
}

// commandHelp runs `listenhub CMD -h` and parses it: the synopsis of its
// first line and the flag list (printDefaults' layout).
func commandHelp(t *testing.T, cmd string) (synopsis string, flags map[string]helpFlag) {
	t.Helper()
	var out, errw bytes.Buffer
	if code := run(context.Background(), []string{cmd, "-h"}, &out, &errw); code != 0 {
		t.Fatalf("%s -h exited %d: %s", cmd, code, errw.String())
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	synopsis, ok := strings.CutPrefix(first, "usage: listenhub ")
	if !ok {
		t.Fatalf("%s -h: first line %q, want usage: listenhub …", cmd, first)
	}
	flagLine := regexp.MustCompile(`^  --([a-z0-9-]+)( \S+)?$`)
	defRE := regexp.MustCompile(` \(default ([^)]*)\)$`)
	flags = map[string]helpFlag{}
	var cur string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "  -") && !strings.HasPrefix(line, "  --") {
			t.Errorf("%s -h prints %q: flags are spelled --name", cmd, line)
		}
		if m := flagLine.FindStringSubmatch(line); m != nil {
			cur = m[1]
			flags[cur] = helpFlag{}
			continue
		}
		if u, ok := strings.CutPrefix(line, "    \t"); ok && cur != "" {
			f := flags[cur]
			if m := defRE.FindStringSubmatch(u); m != nil {
				v := m[1]
				if uq, err := strconv.Unquote(v); err == nil {
					v = uq
				}
				f.def = v
				u = strings.TrimSuffix(u, m[0])
			}
			f.usage = u
			flags[cur] = f
		}
	}
	return synopsis, flags
}

// helpAside is the trailing remark of a usage text that the README's
// environment and default columns say instead.
var helpAside = regexp.MustCompile(` \((env |default: |required|off when empty\))[^()]*\)?$`)

// relayFlagNames are the flags serve shares with relay (relayFlags): the
// README documents them once, in relay's table.
func relayFlagNames() map[string]bool {
	fs := newFlagSet("x")
	var rf relayFlags
	rf.register(fs)
	names := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	return names
}

// TestREADMEServeFlags fails when the README's flag table and `serve -h`
// disagree: a flag missing from either side, a wrong environment variable,
// a wrong default, or a meaning that does not say what -h says (markdown
// aside; the environment and default remarks of -h are the table's other
// columns). The relay flags serve shares are in relay's table.
func TestREADMEServeFlags(t *testing.T) {
	checkFlagTable(t, "serve", relayFlagNames())
}

// TestREADMERelayFlags is the same for `relay -h` and its table.
func TestREADMERelayFlags(t *testing.T) {
	checkFlagTable(t, "relay", nil)
}

func checkFlagTable(t *testing.T, cmd string, elsewhere map[string]bool) {
	_, flags := commandHelp(t, cmd)
	if len(flags) < 10 {
		t.Fatalf("parsed only %d flags from %s -h", len(flags), cmd)
	}
	rows := markdownTable(t, readmeSection(t, readREADME(t), "### `"+cmd+"` flags"),
		[]string{"flag", "environment", "default", "meaning"})
	seen := map[string]bool{}
	markdown := strings.NewReplacer("`", "", "**", "")
	for _, r := range rows {
		name := strings.TrimPrefix(firstCode(r[0]), "--")
		if name == "" || seen[name] {
			t.Errorf("README flag row %q: no flag, or a duplicate", r[0])
			continue
		}
		seen[name] = true
		f, ok := flags[name]
		if !ok {
			t.Errorf("README documents --%s, which %s does not have", name, cmd)
			continue
		}
		if env := firstCode(r[1]); env != envName(name) {
			t.Errorf("README: --%s is read from %s, the table says %q", name, envName(name), env)
		}
		// A non-zero default must appear as the cell's first code span;
		// a zero default must not look like a value (the cell says
		// "empty", "off", "required" or what the hub does instead).
		if got := firstCode(r[2]); got != f.def {
			if f.def == "" {
				t.Errorf("README: --%s has no default, the table says `%s`", name, got)
			} else {
				t.Errorf("README: --%s defaults to %q, the table says %q", name, f.def, got)
			}
		}
		if help, doc := helpAside.ReplaceAllString(f.usage, ""), markdown.Replace(r[3]); help != doc {
			t.Errorf("README: --%s means\n  %q in the table,\n  %q in %s -h", name, doc, help, cmd)
		}
	}
	for name := range flags {
		if !seen[name] && !elsewhere[name] {
			t.Errorf("%s has --%s, which the README's flag table lacks", cmd, name)
		}
	}
}

// TestREADMEMetrics fails when the README's metrics table and /metrics
// disagree: every family the exposition writes, in its order, with its
// type.
func TestREADMEMetrics(t *testing.T) {
	rows := markdownTable(t, readmeSection(t, readREADME(t), "### Metrics"),
		[]string{"metric", "type", "meaning"})
	var doc, code []string
	for _, r := range rows {
		doc = append(doc, firstCode(r[0])+" "+r[1])
	}
	// A hub never started: its /metrics has every family, at zero.
	h, err := hub.New(hub.Config{SocketPath: filepath.Join(t.TempDir(), "hub.sock"), DatabaseURL: "postgres://u@127.0.0.1:1/x"})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	monitor.Handler(h, monitor.Options{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			code = append(code, f[2]+" "+f[3])
		}
	}
	if !slices.Equal(doc, code) {
		t.Errorf("README metrics table\n  %q\n/metrics serves\n  %q", doc, code)
	}
}

// TestREADMECommands checks the two commands a fresh clone starts with, and
// holds the README's command list, the usage and every command's -h to the
// same synopses: the list is the usage's, word for word; each command's -h
// starts with its synopsis; and the flags a synopsis names are exactly the
// flags the command has (serve's are in its table, checked above).
func TestREADMECommands(t *testing.T) {
	doc := readREADME(t)
	for heading, want := range map[string]string{
		"## Run it":  "go run ./cmd/listenhub demo",
		"## Test it": "go test -race ./...",
	} {
		sec := readmeSection(t, doc, heading)
		if !strings.Contains(sec, "```\n"+want+"\n```") {
			t.Errorf("README %s: want the command %q in a code block of its own", heading, want)
		}
	}
	if first := strings.Index(doc, "## Run it"); first < 0 || first > strings.Index(doc, "## Test it") ||
		strings.Count(doc[:first], "\n## ") > 0 {
		t.Errorf("README: \"Run it\" and \"Test it\" must be the first two sections")
	}
	cmds := readmeSection(t, doc, "## The commands")
	block, ok := codeBlock(cmds)
	if !ok || block != commandList() {
		t.Errorf("README's command list\n%s\nis not what listenhub help prints\n%s", block, commandList())
	}
	_, help, _ := runCmd([]string{"help"})
	if !strings.Contains(help, commandList()) {
		t.Errorf("listenhub help does not list every command:\n%s", help)
	}
	flagRE := regexp.MustCompile(`--([a-z0-9-]+)`)
	for _, c := range commands {
		syn, flags := commandHelp(t, c.name)
		if syn != c.synopsis {
			t.Errorf("%s -h says usage: listenhub %s; the command list says %s", c.name, syn, c.synopsis)
		}
		if c.name == "serve" || c.name == "relay" { // their flag tables, above
			continue
		}
		named := map[string]bool{}
		for _, m := range flagRE.FindAllStringSubmatch(c.synopsis, -1) {
			named[m[1]] = true
			if _, ok := flags[m[1]]; !ok {
				t.Errorf("the synopsis of %s names --%s, which %s -h lacks", c.name, m[1], c.name)
			}
		}
		for f := range flags {
			if !named[f] {
				t.Errorf("%s has --%s, which its synopsis (the README's command list) lacks", c.name, f)
			}
		}
	}
}

// codeBlock returns the body of the first fenced code block in text.
func codeBlock(text string) (string, bool) {
	_, rest, ok := strings.Cut(text, "```\n")
	if !ok {
		return "", false
	}
	body, _, ok := strings.Cut(rest, "```")
	return body, ok
}

// TestREADMELinks checks the README's in-page anchors and relative links.
func TestREADMELinks(t *testing.T) {
	doc := readREADME(t)
	anchors := map[string]bool{}
	fence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(line, "#") {
			anchors[githubAnchor(strings.TrimLeft(line, "# "))] = true
		}
	}
	for _, m := range regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(doc, -1) {
		link := m[1]
		switch {
		case strings.HasPrefix(link, "#"):
			if !anchors[link[1:]] {
				t.Errorf("README links to %s, but no heading has that anchor", link)
			}
		case strings.Contains(link, "://"):
		default:
			path, _, _ := strings.Cut(link, "#")
			if _, err := os.Stat(filepath.Join(filepath.Dir(readmePath), path)); err != nil {
				t.Errorf("README links to %s: %v", link, err)
			}
		}
	}
}

// githubAnchor is GitHub's heading anchor: lower case, spaces to hyphens,
// punctuation dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 0x7f:
			b.WriteRune(r)
		}
	}
	return b.String()
}
