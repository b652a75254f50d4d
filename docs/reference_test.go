package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The reference pages stay reference: each within the size a newcomer
// reads (DESIGN.md, "Reference, not notebook"), the history in git and the
// CHANGELOG.
var maxSize = map[string]int{
	"design.md":      30 << 10,
	"performance.md": 20 << 10,
	"robustness.md":  20 << 10,
	"relay.md":       12 << 10,
}

func TestReferenceSizes(t *testing.T) {
	for name, max := range maxSize {
		fi, err := os.Stat(name)
		if err != nil {
			t.Error(err)
			continue
		}
		if fi.Size() > int64(max) {
			t.Errorf("%s is %d bytes, over its %d (move history to CHANGELOG.md, detail to the page it belongs on)", name, fi.Size(), max)
		}
	}
}

var (
	issueRef = regexp.MustCompile(`(?i)\bissues? #?[0-9]+`)
	// A commit hash: 7 to 40 lowercase hex digits with a letter and a digit
	// among them (so "deadbeef" and plain numbers pass).
	hexWord  = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
	letter   = regexp.MustCompile(`[a-f]`)
	digit    = regexp.MustCompile(`[0-9]`)
	datedHdr = regexp.MustCompile(`^#+ .*\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b`)
)

// TestNoNotebook: no page of docs/ names an issue, a commit or a dated run
// in a heading. A figure carries its machine and date once, in a sentence.
func TestNoNotebook(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("no pages: %v", err)
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := issueRef.FindString(line); m != "" {
				t.Errorf("%s:%d: %q: issue numbers belong in the tracker and CHANGELOG.md", page, i+1, m)
			}
			for _, w := range hexWord.FindAllString(line, -1) {
				if letter.MatchString(w) && digit.MatchString(w) {
					t.Errorf("%s:%d: %q looks like a commit hash: history belongs in git", page, i+1, w)
				}
			}
			if datedHdr.MatchString(line) {
				t.Errorf("%s:%d: a dated heading: the page is reference, not a diary", page, i+1)
			}
		}
	}
}

// TestNamedTestsExist: every test a page names (robustness.md's threat
// model above all) is a test of the repository, so a renamed or deleted
// test cannot leave a row pointing at nothing.
func TestNamedTestsExist(t *testing.T) {
	defined := map[string]bool{}
	funcRe := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]+)\(`)
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range funcRe.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`((?:Test|Fuzz)[A-Z][A-Za-z0-9_]*)`")
	for name := range maxSize {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range named.FindAllStringSubmatch(string(b), -1) {
			if !defined[m[1]] {
				t.Errorf("%s names %s, which no _test.go file defines", name, m[1])
			}
		}
	}
}
