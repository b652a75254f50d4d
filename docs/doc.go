// Package docs holds listenhub's prose documentation (protocol.md, …). It
// has no code of its own; its tests parse the documents and check their
// examples against the real encoders, decoders and defaults, so that the
// documentation cannot drift from the code.
package docs
