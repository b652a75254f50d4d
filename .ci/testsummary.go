// testsummary reads `go test -json` on stdin and prints what `go test`
// prints without -v (each package's result line, the output of a test that
// failed, build errors), then the tests that skipped, each with its reason:
// a skip behind an all-"ok" output is a test that did not run.
//
//	go test -json ./... | go run .ci/testsummary.go
//
// It is in .ci/, which the go tool's ./... leaves out, and uses the standard
// library only. Its exit status is 0; the pipeline's is go test's.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

func main() {
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	buffered := map[string][]string{} // package + test → its output
	var skipped []string
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	for in.Scan() {
		line := in.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line) // not an event: pass it on
			continue
		}
		key := e.Package + " " + e.Test
		switch {
		case e.Action == "build-output":
			fmt.Fprint(out, e.Output)
		case e.Test == "" && e.Action == "output":
			// The package's own lines: its result, and the test binary's
			// output outside any test (TestMain's, a panic), shown only
			// when the package failed, as go test does.
			buffered[key] = append(buffered[key], e.Output)
		case e.Test == "" && e.Action == "fail":
			for _, o := range buffered[key] {
				if !strings.HasPrefix(o, "=== ") {
					fmt.Fprint(out, o)
				}
			}
			delete(buffered, key)
		case e.Test == "" && (e.Action == "pass" || e.Action == "skip"):
			for _, o := range buffered[key] {
				if strings.HasPrefix(o, "ok  ") || strings.HasPrefix(o, "?   ") {
					fmt.Fprint(out, o)
				}
			}
			delete(buffered, key)
		case e.Test == "":
		case e.Action == "output":
			buffered[key] = append(buffered[key], e.Output)
		case e.Action == "fail":
			for _, o := range buffered[key] {
				if !strings.HasPrefix(o, "=== ") {
					fmt.Fprint(out, o)
				}
			}
			delete(buffered, key)
		case e.Action == "skip":
			skipped = append(skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, reason(buffered[key])))
			delete(buffered, key)
		case e.Action == "pass":
			delete(buffered, key)
		}
		out.Flush()
	}
	if len(skipped) == 0 {
		fmt.Fprintln(out, "skipped tests: none")
		return
	}
	sort.Strings(skipped)
	fmt.Fprintf(out, "skipped tests: %d (each still passes; what it needs is in its reason)\n", len(skipped))
	for _, s := range skipped {
		fmt.Fprintln(out, "  "+s)
	}
}

// reason is the last line a skipped test wrote before its "--- SKIP".
func reason(lines []string) string {
	r := "(no reason given)"
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- ") {
			continue
		}
		r = l
	}
	return r
}
