// Command listenhub runs the hub that shares one PostgreSQL LISTEN connection
// among the worker processes of a host, and a few tools around it.
//
// The commands are the table commands (below); `listenhub help` prints them
// and docs/usage.md lists them (a test holds both to the table).
//
// Every command is a function run(ctx, args, stdout, stderr) int, so the
// tests call them in-process as well as through the built binary.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "relay" {
		relayProcs()
	}
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command is one line of the usage. The synopsis is printed by the top-level
// usage, by `listenhub COMMAND -h` and in the command list of docs/usage.md; a test
// holds the three to the same text and to the flags each command has.
type command struct {
	name, synopsis, summary string
}

var commands = []command{
	{"serve", "serve --database-url URL --socket PATH [flags]",
		"run the hub"},
	{"tail", "tail --socket PATH Q [Q...]",
		"subscribe to each Q, print every frame the hub sends as a JSON line"},
	{"status", "status [--metrics-addr ADDR] [--metrics-token-file PATH] [--workers|--channels] [--limit N] [--offset N] [--sort F] [--json]",
		"the workers and channels of a running hub, from its --metrics-addr"},
	{"relay", "relay --database-url URL [flags]",
		"turn committed row changes into NOTIFYs (logical replication), so writers need no NOTIFY trigger"},
	{"census", "census --database-url URL [--application-name NAME] [--json]",
		"count the hub's backends (pg_stat_activity by application_name)"},
	{"doctor", "doctor --database-url URL [--socket PATH] [--channel-prefix P] [--channel-suffix S] [--application-name NAME] [--publication NAME] [--slot NAME] [--json]",
		"check a set-up: notifications arrive on the URL (no transaction pooler), connection headroom, the hub's socket, the relay's prerequisites (and, for a local server, the kernel's autogroup); exit 1 on a failure"},
	{"demo", "demo [--workers N] [--rate N] [--duration D] [--database-url URL] [--relay [--writers N]]",
		"hub, N worker processes and a notifier; a throwaway cluster without a URL; --relay: writers with a NOTIFY trigger vs the relay"},
	{"upgrade", "upgrade --pid-file PATH [--timeout D]",
		"hot-upgrade a running hub (SIGUSR2 to the pid in its --pid-file), wait for the new process to take over; Linux only"},
	{"version", "version",
		"print the version, VCS revision and Go version of this binary"},
}

// synopsis returns the synopsis of the named command.
func synopsis(name string) string {
	for _, c := range commands {
		if c.name == name {
			return c.synopsis
		}
	}
	panic("listenhub: no command " + name)
}

// commandList is the command block of the usage (and of docs/usage.md).
func commandList() string {
	var b strings.Builder
	for _, c := range commands {
		fmt.Fprintf(&b, "listenhub %s\n    %s\n", c.synopsis, c.summary)
	}
	return b.String()
}

func usage() string {
	return "usage: listenhub COMMAND [flags]\n\n" + commandList() +
		"\nRun \"listenhub COMMAND -h\" for the flags of a command.\n"
}

// run dispatches a command line (without the program name) and returns the
// exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	runs := map[string]func(context.Context, []string, io.Writer, io.Writer) int{
		"serve":       runServe,
		"tail":        runTail,
		"status":      runStatus,
		"relay":       runRelay,
		"census":      runCensus,
		"doctor":      runDoctor,
		"upgrade":     runUpgrade,
		"demo":        runDemo,
		"demo-worker": runDemoWorker, // hidden: a worker process of the demo (demo.go)
	}
	if r, ok := runs[args[0]]; ok {
		return r(ctx, args[1:], stdout, stderr)
	}
	switch args[0] {
	case "version", "-version", "--version":
		return runVersion(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage())
		return 0
	}
	names := make([]string, 0, len(commands)+1)
	for _, c := range commands {
		names = append(names, c.name)
	}
	names = append(names, "help")
	fmt.Fprintf(stderr, "listenhub: unknown command %q (want %s or %s)\n\n%s", args[0],
		strings.Join(names[:len(names)-1], ", "), names[len(names)-1], usage())
	return 2
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			fmt.Fprintf(stdout, "usage: listenhub %s\n", synopsis("version"))
			return 0
		}
		return flagError(stderr, "version", fmt.Errorf("unexpected argument %q", args[0]))
	}
	fmt.Fprintln(stdout, "listenhub", versionString())
	return 0
}

// buildInfo is what this binary knows about its own build: for
// listenhub_build_info and `listenhub version`.
type buildInfo struct {
	version   string // the release version (version.go)
	revision  string // VCS revision, "+dirty" when built from a modified tree; "unknown" without VCS stamping
	goVersion string
}

func readBuildInfo() buildInfo {
	b := buildInfo{version: version, revision: "unknown", goVersion: runtime.Version()}
	if revision != "" {
		b.revision = revision
	} else if bi, ok := debug.ReadBuildInfo(); ok {
		var rev string
		var dirty bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			b.revision = rev
			if dirty {
				b.revision += "+dirty"
			}
		}
	}
	return b
}

// versionString is the one line `listenhub version` prints after the name,
// e.g. "v1.2.0 (revision 5f0c2d1e9a7b, go1.26.8)".
func versionString() string {
	b := readBuildInfo()
	return fmt.Sprintf("%s (revision %s, %s)", b.version, shortRevision(b.revision), b.goVersion)
}

// shortRevision is the revision as people print it: the first 12 hex
// digits, "+dirty" kept. `version` and `status` both show it this way (the
// build_info metric and /status carry the whole one).
func shortRevision(rev string) string {
	if i := strings.IndexByte(rev, '+'); i > 12 {
		return rev[:12] + rev[i:]
	} else if len(rev) > 12 && i < 0 {
		return rev[:12]
	}
	return rev
}
