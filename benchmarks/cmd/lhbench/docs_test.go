package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPerformanceCommands holds docs/performance.md's "Reproduce" to this
// command: every lhbench command line and every flag it names exists (the
// run's flags, or report's for `lhbench report`), every scenario of --only
// is one, and the report line re-prints its saved run, with no issue
// number in what it prints.
func TestPerformanceCommands(t *testing.T) {
	b, err := os.ReadFile("../../../docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Reproduce\n")
	if !ok {
		t.Fatal("docs/performance.md has no Reproduce section")
	}
	section, _, _ = strings.Cut(section, "\n## ")

	bin := filepath.Join(t.TempDir(), "lhbench")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	flagLine := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)
	flagsOf := func(args ...string) map[string]bool {
		out, _ := exec.Command(bin, append(args, "-h")...).CombinedOutput()
		set := map[string]bool{}
		for _, m := range flagLine.FindAllStringSubmatch(string(out), -1) {
			set[m[1]] = true
		}
		if len(set) == 0 {
			t.Fatalf("lhbench %v -h listed no flags:\n%s", args, out)
		}
		return set
	}
	runFlags, reportFlags := flagsOf(), flagsOf("report")
	scenarios := regexp.MustCompile(`census,paced[a-z,]*`).FindString(helpOf(t, bin))

	// The command lines: in code blocks, and inline (a paragraph's lines
	// joined, so a span may wrap).
	var commands []string
	var inline strings.Builder
	inBlock := false
	for _, line := range strings.Split(section, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			inBlock = !inBlock
		case inBlock:
			cmd, _, _ := strings.Cut(line, "#")
			commands = append(commands, strings.TrimSpace(cmd))
		default:
			inline.WriteString(line + " ")
		}
	}
	spans := regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(inline.String(), -1)
	var loose []string // inline spans that are flags alone: `--keep`
	for _, m := range spans {
		switch s := m[1]; {
		case strings.HasPrefix(s, "go run ./cmd/lhbench"):
			commands = append(commands, s)
		case strings.HasPrefix(s, "--"):
			loose = append(loose, s)
		}
	}
	if len(commands) < 4 {
		t.Fatalf("docs/performance.md, Reproduce: %d lhbench commands, want the four and more: %q", len(commands), commands)
	}
	check := func(words []string, set map[string]bool, where string) {
		for i, w := range words {
			if !strings.HasPrefix(w, "--") {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimPrefix(w, "--"), "=")
			if !set[name] {
				t.Errorf("docs/performance.md: %s: lhbench has no flag --%s", where, name)
			}
			if name == "only" && i+1 < len(words) {
				for _, sc := range strings.Split(words[i+1], ",") {
					if !strings.Contains(","+scenarios+",", ","+sc+",") {
						t.Errorf("docs/performance.md: %s: --only %s is no scenario (%s)", where, sc, scenarios)
					}
				}
			}
		}
	}
	for _, c := range commands {
		words := strings.Fields(c)
		if len(words) < 3 || words[0] != "go" || words[1] != "run" || words[2] != "./cmd/lhbench" {
			t.Errorf("docs/performance.md: %q is not an lhbench command", c)
			continue
		}
		words = words[3:]
		if len(words) > 0 && words[0] == "report" {
			check(words[1:], reportFlags, c)
			cmd := exec.Command(bin, words...)
			cmd.Dir = "../.." // "From benchmarks/"
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("%s: %v\n%s", c, err, out)
			} else if !strings.Contains(string(out), "## Census") {
				t.Errorf("%s printed no tables:\n%s", c, out)
			} else if m := regexp.MustCompile(`(?i)\bissue ?#?[0-9]+`).FindString(string(out)); m != "" {
				t.Errorf("%s prints %q: issue numbers stay in the tracker", c, m)
			}
			continue
		}
		check(words, runFlags, c)
	}
	for _, s := range loose {
		check(strings.Fields(s), runFlags, "`"+s+"`")
	}
}

// helpOf is lhbench -h's text.
func helpOf(t *testing.T, bin string) string {
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	return string(out)
}
