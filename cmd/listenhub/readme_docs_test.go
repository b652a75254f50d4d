package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/internal/testutil"
)

// docFiles returns README.md, every docs/*.md and the READMEs of deploy/
// and the clients, as paths relative to this package.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(files) == 0 {
		t.Fatalf("no docs/*.md (%v)", err)
	}
	more, err := filepath.Glob("../../clients/*/README.md")
	if err != nil || len(more) == 0 {
		t.Fatalf("no clients/*/README.md (%v)", err)
	}
	files = append(files, more...)
	return append([]string{readmePath, "../../deploy/README.md"}, files...)
}

// headingAnchors returns the GitHub anchors of a markdown file's headings.
func headingAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	fence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(line, "#") {
			base := testutil.GitHubAnchor(strings.TrimLeft(line, "# "))
			a := base
			for n := 1; anchors[a]; n++ { // GitHub numbers repeated headings
				a = base + "-" + strconv.Itoa(n)
			}
			anchors[a] = true
		}
	}
	return anchors
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinks checks the relative links of the documentation (docFiles):
// the file exists, and an anchor names a heading of it.
func TestDocsLinks(t *testing.T) {
	for _, path := range docFiles(t) {
		doc := readDoc(t, path)
		for _, m := range mdLink.FindAllStringSubmatch(doc, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(link, "#")
			file := path
			if target != "" {
				file = filepath.Join(filepath.Dir(path), target)
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s links to %s: %v", path, link, err)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			if !headingAnchors(readDoc(t, file))[anchor] {
				t.Errorf("%s links to %s, but %s has no heading with that anchor", path, link, file)
			}
		}
	}
}

// commandLine finds a listenhub command line: the command and what follows
// it on the line.
// ("from listenhub import" is Python's).
var commandLine = regexp.MustCompile(`(?:^|[^m] |[^ ])\blistenhub ([a-z][a-z-]*)([^\n` + "`" + `]*)`)

// codeBlocks returns the bodies of the fenced code blocks in text, each
// line ending in a newline.
func codeBlocks(text string) []string {
	var out []string
	var body strings.Builder
	fence := false
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "```") && fence:
			out = append(out, body.String())
			body.Reset()
			fence = false
		case strings.HasPrefix(line, "```"):
			fence = true
		case fence:
			body.WriteString(line + "\n")
		}
	}
	return out
}

// docCode returns the code of a markdown text: the fenced blocks (with
// backslash-continued lines joined) and the inline code spans.
func docCode(doc string) []string {
	var out []string
	var block []string
	fence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			if fence {
				out = append(out, strings.ReplaceAll(strings.Join(block, "\n"), "\\\n", " "))
				block = nil
			}
			fence = !fence
			continue
		}
		if fence {
			block = append(block, line)
			continue
		}
		for _, m := range backticked.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// TestDocsCommandLines: every listenhub command line in the documentation
// (docFiles) names a command that exists and only flags that command has.
func TestDocsCommandLines(t *testing.T) {
	known := map[string]map[string]helpFlag{}
	for _, c := range commands {
		_, flags := commandHelp(t, c.name)
		known[c.name] = flags
	}
	flagRE := regexp.MustCompile(`(?:^|\s)--([a-z0-9-]+)`)
	checked := 0
	for _, path := range docFiles(t) {
		for _, code := range docCode(readDoc(t, path)) {
			for _, m := range commandLine.FindAllStringSubmatch(code, -1) {
				cmd, rest := m[1], m[2]
				if cmd == "help" || strings.HasPrefix(rest, ":") || strings.HasPrefix(rest, "-") && !strings.HasPrefix(rest, " ") {
					continue // help; a program's output ("listenhub demo: …"); listenhub-relay
				}
				flags, ok := known[cmd]
				if !ok && !strings.Contains(rest, " -") {
					continue // words, as in a log line ("listenhub serving")
				}
				if !ok {
					t.Errorf("%s: `listenhub %s%s`: there is no command %q", path, cmd, rest, cmd)
					continue
				}
				// The line ends where a shell would end the command.
				// (or where a table's columns part).
				if i := strings.IndexAny(rest, "|;&#)"); i >= 0 {
					rest = rest[:i]
				}
				rest, _, _ = strings.Cut(rest, "  ")
				checked++
				for _, f := range flagRE.FindAllStringSubmatch(rest, -1) {
					if _, ok := flags[f[1]]; !ok {
						t.Errorf("%s: `listenhub %s%s`: %s has no --%s", path, cmd, rest, cmd, f[1])
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked only %d command lines: is the extraction broken?", checked)
	}
}

// TestREADMEShape: the README stays a first read: at most 12 KB, how to
// point a worker at the hub within its first 200 lines, and each quick
// start (a complete program with the commands around it, which
// clients/quickstart_test.go runs) at most 45 lines of code.
func TestREADMEShape(t *testing.T) {
	doc := readREADME(t)
	if len(doc) > 12*1024 {
		t.Errorf("README.md is %d bytes, want at most %d: move the detail to docs/", len(doc), 12*1024)
	}
	lines := strings.Split(doc, "\n")
	i := slicesIndex(lines, "## Point the workers at it")
	if i < 0 || i > 200 {
		t.Errorf("README.md: \"## Point the workers at it\" is on line %d, want within the first 200", i+1)
	}
	for _, want := range []string{"### Go", "### pgbus on Puma", "### Rails Action Cable", "### Python under gunicorn", "### Node cluster"} {
		j := slicesIndex(lines, want)
		if j < i || j > 300 {
			t.Errorf("README.md: %q is on line %d, want after the section's heading and within the first 300", want, j+1)
		}
		n := 0
		for _, block := range codeBlocks(readmeSection(t, doc, want)) {
			n += strings.Count(block, "\n")
		}
		if n == 0 || n > 45 {
			t.Errorf("README.md %s: the quick start has %d lines of code, want 1 to 45", want, n)
		}
	}
}

func slicesIndex(lines []string, s string) int {
	for i, l := range lines {
		if l == s {
			return i
		}
	}
	return -1
}
