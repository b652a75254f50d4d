// Command listenhub runs the hub that shares one PostgreSQL LISTEN connection
// among the worker processes of a host, and a few tools around it.
//
//	listenhub serve  --database-url URL --socket PATH [flags]   run the hub
//	listenhub tail   --socket PATH Q [Q…]                        subscribe, print each frame as a JSON line
//	listenhub census --database-url URL                          count this hub's backends
//	listenhub demo   [--workers N] [--database-url URL]          hub, workers and a notifier on a throwaway cluster
//	listenhub version
//
// Every command is a function run(ctx, args, stdout, stderr) int, so the
// tests call them in-process as well as through the built binary.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version from the build info is used.
var version = ""

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  listenhub serve  --database-url URL --socket PATH [flags]   run the hub
  listenhub tail   --socket PATH Q [Q...]                      subscribe, print each frame as a JSON line
  listenhub census --database-url URL                          count this hub's backends (pg_stat_activity by application_name)
  listenhub demo   [--workers N] [--database-url URL]          hub, N workers and a notifier; a throwaway cluster without a URL
  listenhub version

Run "listenhub COMMAND -h" for the flags of a command.
`

// run dispatches a command line (without the program name) and returns the
// exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return runServe(ctx, args[1:], stdout, stderr)
	case "tail":
		return runTail(ctx, args[1:], stdout, stderr)
	case "census":
		return runCensus(ctx, args[1:], stdout, stderr)
	case "demo":
		return runDemo(ctx, args[1:], stdout, stderr)
	case "demo-worker": // hidden: a worker process of the demo (demo.go)
		return runDemoWorker(ctx, args[1:], stdout, stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, "listenhub", versionString())
		return 0
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "listenhub: unknown command %q (want serve, tail, census or version)\n", args[0])
	return 2
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}
