package main

// version is the release version of listenhub, kept in this one place:
// `listenhub version`, the version label of listenhub_build_info and the
// release script (scripts/release, which reads this line) all take it from
// here, and CHANGELOG.md's newest release must name it (a test checks).
// Bump it together with a new CHANGELOG.md entry when releasing.
const version = "0.1.0"

// revision is the VCS revision, stamped by scripts/release with
// -ldflags "-X main.revision=…" (release builds use -buildvcs=false); when
// empty, the revision `go build` stamps from a checkout is used.
var revision = ""
