package main

import (
	"strings"
	"testing"
)

// TestREADMEInstallSnippet: docs/operations.md's install snippet makes the env
// file private (0600, read by systemd) before the password goes in, leaves
// /etc/listenhub readable for a config file the hub (a user of its own)
// reads itself, and names the workers' uid.
func TestREADMEInstallSnippet(t *testing.T) {
	doc := readmeSection(t, readDoc(t, opsPath), "## systemd")
	for _, want := range []string{
		"install -d -m 0755 /etc/listenhub",
		"install -m 0600 /dev/null /etc/listenhub/env",
		"LISTENHUB_ALLOW_UID=",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/operations.md's install snippet lacks %q", want)
		}
	}
}
