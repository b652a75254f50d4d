//go:build !listenhub_poll

package testutil

// buildTags are the tags Binary builds with (see tags_poll.go).
var buildTags []string
