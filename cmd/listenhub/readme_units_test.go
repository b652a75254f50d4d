package main

import (
	"strings"
	"testing"
)

// TestREADMEInstallSnippet: the README's install snippet makes the env
// file private (0600, read by systemd) before the password goes in, leaves
// /etc/listenhub readable for a config file the hub (a user of its own)
// reads itself, and names the workers' uid.
func TestREADMEInstallSnippet(t *testing.T) {
	doc := readmeSection(t, readREADME(t), "## Deployment")
	for _, want := range []string{
		"install -d -m 0755 /etc/listenhub",
		"install -m 0600 /dev/null /etc/listenhub/env",
		"LISTENHUB_ALLOW_UID=",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("README's install snippet lacks %q", want)
		}
	}
}
