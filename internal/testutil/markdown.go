package testutil

import "strings"

// GitHubAnchor is GitHub's anchor for a Markdown heading: lower case,
// spaces to hyphens, punctuation dropped.
func GitHubAnchor(heading string) string {
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
