//go:build listenhub_poll

package testutil

// buildTags are the tags Binary builds with: those of the test binary
// that select code, so that a hub started by a test under
// -tags listenhub_poll runs the poll(2) loop as the test's own code does.
var buildTags = []string{"-tags", "listenhub_poll"}
