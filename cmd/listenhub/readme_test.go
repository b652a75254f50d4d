package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
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

// serveFlagDefaults runs `serve -h` and parses its flag list (the standard
// flag.PrintDefaults layout): flag name → default as printed, "" when the
// flag's default is its zero value (PrintDefaults leaves it out then).
func serveFlagDefaults(t *testing.T) map[string]string {
	t.Helper()
	var out, errw bytes.Buffer
	if code := runServe(context.Background(), []string{"-h"}, &out, &errw); code != 0 {
		t.Fatalf("serve -h exited %d: %s", code, errw.String())
	}
	flagLine := regexp.MustCompile(`^  --([a-z0-9-]+)( \S+)?$`)
	defRE := regexp.MustCompile(`\(default ([^)]*)\)$`)
	defaults := map[string]string{}
	var cur string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := sc.Text()
		if m := flagLine.FindStringSubmatch(line); m != nil {
			cur = m[1]
			defaults[cur] = ""
			continue
		}
		if cur != "" && strings.HasPrefix(line, "    \t") {
			if m := defRE.FindStringSubmatch(line); m != nil {
				v := m[1]
				if u, err := strconv.Unquote(v); err == nil {
					v = u
				}
				defaults[cur] = v
			}
		}
	}
	if len(defaults) < 10 {
		t.Fatalf("parsed only %d flags from serve -h:\n%s", len(defaults), out.String())
	}
	return defaults
}

// TestREADMEServeFlags fails when the README's flag table and `serve`
// disagree: a flag missing from either side, a wrong environment variable,
// or a wrong default.
func TestREADMEServeFlags(t *testing.T) {
	flags := serveFlagDefaults(t)
	rows := markdownTable(t, readmeSection(t, readREADME(t), "### `serve` flags"),
		[]string{"flag", "environment", "default", "meaning"})
	seen := map[string]bool{}
	for _, r := range rows {
		name := strings.TrimPrefix(firstCode(r[0]), "--")
		if name == "" || seen[name] {
			t.Errorf("README flag row %q: no flag, or a duplicate", r[0])
			continue
		}
		seen[name] = true
		def, ok := flags[name]
		if !ok {
			t.Errorf("README documents --%s, which serve does not have", name)
			continue
		}
		if env := firstCode(r[1]); env != envName(name) {
			t.Errorf("README: --%s is read from %s, the table says %q", name, envName(name), env)
		}
		// A non-zero default must appear as the cell's first code span;
		// a zero default must not look like a value (the cell says
		// "empty", "off", "required" or what the hub does instead).
		if got := firstCode(r[2]); got != def {
			if def == "" {
				t.Errorf("README: --%s has no default, the table says `%s`", name, got)
			} else {
				t.Errorf("README: --%s defaults to %q, the table says %q", name, def, got)
			}
		}
	}
	for name := range flags {
		if !seen[name] {
			t.Errorf("serve has --%s, which the README's flag table lacks", name)
		}
	}
}

// TestREADMEMetrics fails when the README's metrics table and /metrics
// disagree.
func TestREADMEMetrics(t *testing.T) {
	rows := markdownTable(t, readmeSection(t, readREADME(t), "### Metrics"),
		[]string{"metric", "type", "meaning"})
	var doc, code []string
	for _, r := range rows {
		doc = append(doc, firstCode(r[0])+" "+r[1])
	}
	for _, m := range metrics {
		code = append(code, m.name+" "+m.typ)
	}
	if !slices.Equal(doc, code) {
		t.Errorf("README metrics table\n  %q\n/metrics serves\n  %q", doc, code)
	}
}

// TestREADMECommands checks the two commands a fresh clone starts with.
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
	// Every command the usage lists is in the README's command list.
	cmds := readmeSection(t, doc, "## The commands")
	for _, c := range []string{"serve", "tail", "census", "demo", "version"} {
		if !strings.Contains(cmds, "listenhub "+c) {
			t.Errorf("README command list lacks listenhub %s", c)
		}
	}
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
