package main

import (
	"strings"
	"testing"
)

// TestREADMEInstallSnippet: the README's install snippet makes
// /etc/listenhub private before the password goes in, and names the
// workers' uid (the hub runs as a user of its own).
func TestREADMEInstallSnippet(t *testing.T) {
	doc := readmeSection(t, readREADME(t), "## Deployment")
	for _, want := range []string{
		"install -d -m 0700 /etc/listenhub",
		"install -m 0600 /dev/null /etc/listenhub/env",
		"LISTENHUB_ALLOW_UID=",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("README's install snippet lacks %q", want)
		}
	}
}
