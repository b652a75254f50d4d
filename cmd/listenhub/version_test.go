package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/internal/testutil"
)

// TestVersionOnePlace holds the version to one place: CHANGELOG.md's newest
// release names the version constant, the release script reads that
// constant rather than keeping its own, and `listenhub version` and
// listenhub_build_info print it.
func TestVersionOnePlace(t *testing.T) {
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`).MatchString(version) {
		t.Fatalf("version %q is not a semantic version", version)
	}
	b := testutil.ReadFile(t, "../../CHANGELOG.md")
	heading := regexp.MustCompile(`(?m)^## \[([^\]]+)\](.*)$`)
	newest := ""
	for _, m := range heading.FindAllStringSubmatch(string(b), -1) {
		if m[1] == "Unreleased" {
			continue
		}
		newest = m[1]
		if !regexp.MustCompile(`^ - [0-9]{4}-[0-9]{2}-[0-9]{2}$`).MatchString(m[2]) {
			t.Errorf("CHANGELOG.md: %q: want ## [%s] - YYYY-MM-DD", m[0], m[1])
		}
		break
	}
	if newest != version {
		t.Errorf("CHANGELOG.md's newest release is %q, cmd/listenhub/version.go says %q: add the entry (or bump the constant) with the release", newest, version)
	}
	if !strings.Contains(string(b), "\n["+version+"]: ") {
		t.Errorf("CHANGELOG.md has no link for [%s]", version)
	}

	script := testutil.ReadFile(t, "../../scripts/release")
	if !strings.Contains(string(script), "cmd/listenhub/version.go") || regexp.MustCompile(`(?m)^\s*version=["']?[0-9]`).Match(script) {
		t.Errorf("scripts/release must read the version from cmd/listenhub/version.go, not keep its own")
	}

	_, out, _ := runCmd([]string{"version"})
	if !strings.HasPrefix(out, "listenhub "+version+" (") {
		t.Errorf("listenhub version prints %q, want version %s", out, version)
	}
	if b := readBuildInfo(); b.version != version {
		t.Errorf("build info version %q, want %s", b.version, version)
	}
}
