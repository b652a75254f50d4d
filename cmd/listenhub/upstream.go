package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// fleetBinary is the command that serves a hub fed through NATS: built
// from the fleet module, so that this binary keeps its dependencies (x/sys
// and pgx; NATS is nats.go's).
const fleetBinary = "listenhub-fleet"

// upstreamArg returns the --upstream value of serve's arguments, if any.
func upstreamArg(args []string) (string, bool) {
	for i, a := range args {
		switch {
		case a == "--upstream" || a == "-upstream":
			if i+1 < len(args) {
				return args[i+1], true
			}
			return "", true
		case strings.HasPrefix(a, "--upstream=") || strings.HasPrefix(a, "-upstream="):
			return a[strings.IndexByte(a, '=')+1:], true
		}
	}
	return "", false
}

// serveUpstream hands `serve --upstream URL …` to listenhub-fleet serve
// (found beside this binary, or on PATH), which takes the same --socket,
// --metrics-addr and --database-url (for the database's name in the
// subjects) and opens no Postgres connection. It returns only when it
// cannot: exit status 2, with what to install.
func serveUpstream(args []string, stderr io.Writer) int {
	bin := ""
	if self, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(self), fleetBinary); isExecutable(p) {
			bin = p
		}
	}
	if bin == "" {
		if p, err := exec.LookPath(fleetBinary); err == nil {
			bin = p
		}
	}
	if bin == "" {
		fmt.Fprintf(stderr, "listenhub serve: --upstream (a hub fed through NATS) is served by %s, found neither beside this binary nor on PATH: "+
			"build it with `cd fleet && go build -o /usr/local/bin/%s ./cmd/%s` (docs/fleet.md)\n", fleetBinary, fleetBinary, fleetBinary)
		return 2
	}
	argv := append([]string{fleetBinary, "serve"}, args...)
	err := syscall.Exec(bin, argv, os.Environ())
	fmt.Fprintf(stderr, "listenhub serve: --upstream: exec %s: %v\n", bin, err)
	return 1
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}
