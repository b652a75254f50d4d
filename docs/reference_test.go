package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/internal/testutil"
)

// The reference pages stay reference: each within the size a newcomer
// reads (docs/design.md, "Reference, not notebook"), the history in git and the
// CHANGELOG.
var maxSize = map[string]int{
	"design.md":      30 << 10,
	"performance.md": 20 << 10,
	"robustness.md":  20 << 10,
	"relay.md":       12 << 10,
}

// docsBudget is what the README and docs/*.md may hold together: a
// reference a user can read through, each fact said once. (The fleet's
// page raised it from 150 KiB: a new part, not more words for the old.)
const docsBudget = 160 << 10

func TestReferenceSizes(t *testing.T) {
	pages, _ := filepath.Glob("*.md")
	total := int64(0)
	for _, page := range append(pages, "../README.md") {
		fi, err := os.Stat(page)
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
	}
	if total > docsBudget {
		t.Errorf("README.md and docs/*.md hold %d bytes together, over %d: say each fact once, where a user looks for it", total, docsBudget)
	}
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
	// A date outside performance.md, whose figures carry the date of
	// their run once: anywhere else a date is a diary's.
	dateWord = regexp.MustCompile(`\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b`)
	// A figure's former value ("2 ms (was 2 s)"), a remark on an earlier
	// run or on the machine's load at the time: history, the CHANGELOG's
	// to keep.
	formerValue = regexp.MustCompile(`(?i)\(was\b|\b(previous|earlier|last) runs?\b|\bthan before\b|\bthe run before\b|\bload (average )?[0-9]`)
	// A commit hash: 7 to 40 lowercase hex digits with a letter and a digit
	// among them (so "deadbeef" and plain numbers pass).
	hexWord  = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
	letter   = regexp.MustCompile(`[a-f]`)
	digit    = regexp.MustCompile(`[0-9]`)
	datedHdr = regexp.MustCompile(`^#+ .*\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b`)
)

// TestNoNotebook is the one test of what the reference pages (docs/, the
// README, the clients' READMEs) must not hold: an issue number, a commit
// hash, a dated heading, a date outside performance.md, a former value or
// a remark on an earlier run. A figure carries its machine and date once,
// in performance.md's sentence about its run.
func TestNoNotebook(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("no pages: %v", err)
	}
	more, _ := filepath.Glob("../clients/*/README.md")
	pages = append(append(pages, "../README.md"), more...)
	for _, page := range pages {
		b := testutil.ReadFile(t, page)
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
			} else if m := dateWord.FindString(line); m != "" && page != "performance.md" {
				t.Errorf("%s:%d: %q: a date belongs to a run's figures (performance.md) or to the CHANGELOG", page, i+1, m)
			}
			if m := formerValue.FindString(line); m != "" {
				t.Errorf("%s:%d: %q: former values and earlier runs are history, the CHANGELOG's", page, i+1, m)
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
		b := testutil.ReadFile(t, name)
		for _, m := range named.FindAllStringSubmatch(string(b), -1) {
			if !defined[m[1]] {
				t.Errorf("%s names %s, which no _test.go file defines", name, m[1])
			}
		}
	}
}

// docSection returns the body of the "## heading" section of the file.
func docSection(t *testing.T, file, heading string) string {
	t.Helper()
	b := testutil.ReadFile(t, file)
	_, section, ok := strings.Cut(string(b), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("%s has no %s section", file, heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	return section
}

// TestDesignLayout: design.md's Layout table names every top-level folder
// of the repository, every package under internal/, every example and
// every client, and each name it gives exists; so the table cannot fall
// behind a move.
func TestDesignLayout(t *testing.T) {
	layout := docSection(t, "design.md", "Layout")
	rows := map[string]string{} // first column → the rest of the row
	for _, line := range strings.Split(layout, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		rows[strings.Trim(strings.TrimSpace(cells[1]), "`")] = strings.Join(cells[2:], "|")
	}
	named := regexp.MustCompile("`([a-z0-9_./-]+)`")
	mentions := func(row, name string) bool {
		for _, m := range named.FindAllStringSubmatch(rows[row], -1) {
			if strings.TrimSuffix(m[1], "/") == name {
				return true
			}
		}
		return false
	}
	dirs := func(parent string) []string {
		entries, err := os.ReadDir(filepath.Join("..", parent))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range entries {
			n := e.Name()
			hidden := strings.HasPrefix(n, ".") && n != ".ci" // .git, an editor's
			if e.IsDir() && !hidden && n != "dist" && n != "bin" && n != "node_modules" && n != "testdata" && n != "__pycache__" {
				out = append(out, n)
			}
		}
		return out
	}
	top := map[string]bool{}
	for _, d := range dirs(".") {
		top[d] = true
		row := d + "/"
		if d == "cmd" {
			row = "cmd/listenhub/"
		}
		if _, ok := rows[row]; !ok {
			t.Errorf("design.md, Layout: no row for the folder %s/", d)
		}
	}
	for row := range rows {
		first, _, _ := strings.Cut(row, "/")
		if !top[first] {
			t.Errorf("design.md, Layout: a row for %s, which is not a folder of the repository", row)
		}
	}
	for _, sub := range []struct{ parent, row string }{{"internal", "internal/"}, {"examples", "examples/"}, {"clients", "clients/"}} {
		for _, d := range dirs(sub.parent) {
			if !mentions(sub.row, d) {
				t.Errorf("design.md, Layout: the %s row does not name %s", sub.row, d)
			}
		}
	}
	for _, m := range named.FindAllStringSubmatch(rows["internal/"], -1) {
		if _, err := os.Stat(filepath.Join("..", "internal", m[1])); err != nil && !strings.Contains(m[1], ".") {
			t.Errorf("design.md, Layout: internal/%s does not exist", m[1])
		}
	}
	for _, m := range named.FindAllStringSubmatch(rows["hub/"], -1) {
		if strings.HasSuffix(m[1], ".go") {
			if _, err := os.Stat(filepath.Join("..", "hub", m[1])); err != nil {
				t.Errorf("design.md, Layout: hub/%s does not exist", m[1])
			}
		}
	}
}

// TestMicrobenchmarksExist: performance.md's microbenchmark command names
// packages that exist, and every benchmark of its table (pkg.Name, "vs"
// naming a second one of the same package) is a Benchmark of one of them.
func TestMicrobenchmarksExist(t *testing.T) {
	section := docSection(t, "performance.md", "Microbenchmarks")
	cmd := regexp.MustCompile("`(go test [^`]*-bench[^`]*)`").FindStringSubmatch(strings.ReplaceAll(section, "\n", " "))
	if cmd == nil {
		t.Fatal("performance.md, Microbenchmarks: no go test -bench command")
	}
	dirs := map[string]string{} // package name → its folder
	for _, w := range strings.Fields(cmd[1]) {
		if !strings.HasPrefix(w, "./") {
			continue
		}
		dir := filepath.Join("..", filepath.Clean(w))
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("performance.md, Microbenchmarks: %s does not exist", w)
		}
		dirs[filepath.Base(dir)] = dir
	}
	benchRe := regexp.MustCompile(`(?m)^func (Benchmark[A-Za-z0-9_]+)\(`)
	row := regexp.MustCompile(`(?m)^\| ([a-z]+)\.([A-Z][A-Za-z0-9]*)(?: vs ([A-Z][A-Za-z0-9]*))?`)
	lastWord := regexp.MustCompile(`[A-Z][a-z]*[0-9]*$`)
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		pkg, names := m[1], []string{m[2]}
		if m[3] != "" {
			names = append(names, m[3])
		}
		dir, ok := dirs[pkg]
		if !ok {
			t.Errorf("performance.md, Microbenchmarks: %s.%s is of a package the command does not run", pkg, m[2])
			continue
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
		defined := map[string]bool{}
		for _, f := range files {
			src := testutil.ReadFile(t, f)
			for _, d := range benchRe.FindAllStringSubmatch(string(src), -1) {
				defined[d[1]] = true
			}
		}
		for i, n := range names {
			full := "Benchmark" + n
			if i > 0 && !defined[full] {
				// "FanoutWrite64Batch1 vs Batch16": the second shares the
				// first's stem, all but its last word.
				full = "Benchmark" + lastWord.ReplaceAllString(names[0], "") + n
			}
			if !defined[full] {
				t.Errorf("performance.md, Microbenchmarks: %s.%s: no %s in %s", pkg, n, full, dir)
			}
		}
	}
}
