package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/monitor"
	"github.com/listenhub/listenhub/relay"
)

const (
	readmePath = "../../README.md"
	usagePath  = "../../docs/usage.md"
	opsPath    = "../../docs/operations.md"
)

func readREADME(t *testing.T) string {
	t.Helper()
	return readDoc(t, readmePath)
}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	b := testutil.ReadFile(t, path)
	return string(b)
}

// readmeSection returns the text under the heading line `heading` up to the
// next heading of the same or a higher level.
func readmeSection(t *testing.T, doc, heading string) string {
	t.Helper()
	level := strings.IndexByte(heading, ' ')
	var out []string
	in := false
	fence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(line, "#") {
			l := strings.IndexByte(line, ' ')
			if in && l > 0 && l <= level {
				break
			}
			if line == heading {
				in = true
				continue
			}
		}
		if in {
			out = append(out, line)
		}
	}
	if !in {
		t.Fatalf("no %q section", heading)
	}
	return strings.Join(out, "\n")
}

// markdownTable returns the body rows of the first table in text, split
// into trimmed cells, after checking its header.
func markdownTable(t *testing.T, text string, header []string) [][]string {
	t.Helper()
	var rows [][]string
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "|") {
			if rows != nil {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	if len(rows) < 2 || !slices.Equal(rows[0], header) {
		t.Fatalf("want a table with header %q, got %q", header, rows)
	}
	return rows[2:] // header and |---|
}

var backticked = regexp.MustCompile("`([^`]*)`")

// firstCode returns the first `code` span of a cell, "" if none.
func firstCode(cell string) string {
	if m := backticked.FindStringSubmatch(cell); m != nil {
		return m[1]
	}
	return ""
}

// helpFlag is one flag as `listenhub CMD -h` prints it.
type helpFlag struct {
	def   string // the default as printed, "" when it is the zero value
	usage string // the usage text, without the "(default …)" printDefaults adds
}

// commandHelp runs `listenhub CMD -h` and parses it: the synopsis of its
// first line and the flag list (printDefaults' layout).
func commandHelp(t *testing.T, cmd string) (synopsis string, flags map[string]helpFlag) {
	t.Helper()
	var out, errw bytes.Buffer
	if code := run(context.Background(), []string{cmd, "-h"}, &out, &errw); code != 0 {
		t.Fatalf("%s -h exited %d: %s", cmd, code, errw.String())
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	synopsis, ok := strings.CutPrefix(first, "usage: listenhub ")
	if !ok {
		t.Fatalf("%s -h: first line %q, want usage: listenhub …", cmd, first)
	}
	flagLine := regexp.MustCompile(`^  --([a-z0-9-]+)( \S+)?$`)
	defRE := regexp.MustCompile(` \(default ([^)]*)\)$`)
	flags = map[string]helpFlag{}
	var cur string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "  -") && !strings.HasPrefix(line, "  --") {
			t.Errorf("%s -h prints %q: flags are spelled --name", cmd, line)
		}
		if m := flagLine.FindStringSubmatch(line); m != nil {
			cur = m[1]
			flags[cur] = helpFlag{}
			continue
		}
		if u, ok := strings.CutPrefix(line, "    \t"); ok && cur != "" {
			f := flags[cur]
			if m := defRE.FindStringSubmatch(u); m != nil {
				v := m[1]
				if uq, err := strconv.Unquote(v); err == nil {
					v = uq
				}
				f.def = v
				u = strings.TrimSuffix(u, m[0])
			}
			f.usage = u
			flags[cur] = f
		}
	}
	return synopsis, flags
}

// helpAside is the trailing remark of a usage text that the flag tables
// environment and default columns say instead.
var helpAside = regexp.MustCompile(` \((env |default: |required|off when empty|not checked when empty)[^()]*\)?$`)

// relayFlagNames are the flags serve shares with relay (relayFlags):
// docs/usage.md documents them once, in relay's table.
func relayFlagNames() map[string]bool {
	fs := newFlagSet("x")
	var rf relayFlags
	rf.register(fs)
	names := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	return names
}

// TestUsageFlags fails when a flag table of docs/usage.md and the
// command's -h disagree, for every command with flags: a flag missing from
// either side, a wrong default, or a meaning that does not say what -h
// says (markdown aside; the default remarks of -h are the table's other
// column). The LISTENHUB_ variables follow one rule, said once above the
// tables, as -h says it. The relay flags serve shares are in relay's
// table.
func TestUsageFlags(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("docs/usage.md's tables are the Linux build's -h (it says what differs elsewhere)")
	}
	doc := readDoc(t, usagePath)
	for _, c := range commands {
		_, flags := commandHelp(t, c.name)
		if len(flags) == 0 {
			continue
		}
		var elsewhere map[string]bool
		if c.name == "serve" {
			elsewhere = relayFlagNames()
		}
		t.Run(c.name, func(t *testing.T) {
			checkFlagTable(t, doc, c.name, flags, elsewhere)
		})
	}
}

func checkFlagTable(t *testing.T, doc, cmd string, flags map[string]helpFlag, elsewhere map[string]bool) {
	t.Helper()
	header := []string{"flag", "default", "meaning"}
	rows := markdownTable(t, readmeSection(t, doc, "## `listenhub "+cmd+"`"), header)
	seen := map[string]bool{}
	markdown := strings.NewReplacer("`", "", "**", "")
	for _, r := range rows {
		name := strings.TrimPrefix(firstCode(r[0]), "--")
		if name == "" || seen[name] {
			t.Errorf("usage.md %s flag row %q: no flag, or a duplicate", cmd, r[0])
			continue
		}
		seen[name] = true
		f, ok := flags[name]
		if !ok {
			t.Errorf("usage.md documents %s --%s, which %s -h lacks", cmd, name, cmd)
			continue
		}
		def, meaning := r[1], r[2]
		// A non-zero default must appear as the cell's first code span;
		// a zero default must not look like a value (the cell says
		// "empty", "off", "none" or what the command does instead).
		if got := firstCode(def); got != f.def {
			if f.def == "" {
				t.Errorf("usage.md: %s --%s has no default, the table says `%s`", cmd, name, got)
			} else {
				t.Errorf("usage.md: %s --%s defaults to %q, the table says %q", cmd, name, f.def, got)
			}
		}
		if help, doc := helpAside.ReplaceAllString(f.usage, ""), markdown.Replace(meaning); help != doc {
			t.Errorf("usage.md: %s --%s means\n  %q in the table,\n  %q in %s -h", cmd, name, doc, help, cmd)
		}
	}
	for name := range flags {
		if !seen[name] && !elsewhere[name] {
			t.Errorf("%s has --%s, which the flag table of docs/usage.md lacks", cmd, name)
		}
	}
}

// metricFamilies returns "name type" of every family in an exposition.
func metricFamilies(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			out = append(out, f[2]+" "+f[3])
		}
	}
	return out
}

// exposition returns what handler serves on /metrics.
func exposition(t *testing.T, handler http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// idleHubAndRelay returns a hub and a relay (with the relay command's
// defaults) that are never started, on a server nobody listens at.
func idleHubAndRelay(t *testing.T) (*hub.Hub, *relay.Relay) {
	t.Helper()
	const url = "postgres://u@127.0.0.1:1/x"
	h, err := hub.New(hub.Config{SocketPath: filepath.Join(t.TempDir(), "hub.sock"), DatabaseURL: url})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var rf relayFlags
	rf.register(newFlagSet("relay"))
	opts, err := rf.options(cc)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return h, rl
}

// TestUsageMetrics fails when the metrics tables of docs/usage.md and
// /metrics disagree: every family the hub's and the relay's expositions
// write, in their order, with their type.
func TestUsageMetrics(t *testing.T) {
	sec := readmeSection(t, readDoc(t, usagePath), "## Metrics")
	hubRows := markdownTable(t, sec, []string{"metric", "type", "meaning"})
	_, rest, _ := strings.Cut(sec, "The relay's, on")
	relayRows := markdownTable(t, rest, []string{"metric", "type", "meaning"})

	// A hub and a relay never started: their /metrics has every family,
	// at zero.
	h, rl := idleHubAndRelay(t)
	hubCode := metricFamilies(exposition(t, monitor.Handler(h, monitor.Options{})))
	var relayCode []string
	for _, f := range metricFamilies(exposition(t, monitor.Handler(nil, monitor.Options{Relay: rl}))) {
		if strings.HasPrefix(f, "listenhub_relay_") {
			relayCode = append(relayCode, f)
		}
	}
	for _, c := range []struct {
		what string
		rows [][]string
		code []string
	}{{"hub", hubRows, hubCode}, {"relay", relayRows, relayCode}} {
		var doc []string
		for _, r := range c.rows {
			doc = append(doc, firstCode(r[0])+" "+r[1])
		}
		if !slices.Equal(doc, c.code) {
			t.Errorf("usage.md's %s metrics table\n  %q\nthe exposition writes\n  %q", c.what, doc, c.code)
		}
	}
}

// TestUsageCommands holds docs/usage.md's command list, the README's
// commands section, the usage and every command's -h to the same
// synopses: the list is the usage's, word for word; the README names every
// command, in order; each command's -h starts with its synopsis; and the
// flags a synopsis names are exactly the flags the command has (serve's and
// relay's are in their tables, checked above).
func TestUsageCommands(t *testing.T) {
	usage := readDoc(t, usagePath)
	block, ok := codeBlock(readmeSection(t, usage, "## Commands"))
	if !ok || block != commandList() {
		t.Errorf("usage.md's command list\n%s\nis not what listenhub help prints\n%s", block, commandList())
	}
	_, help, _ := runCmd([]string{"help"})
	if !strings.Contains(help, commandList()) {
		t.Errorf("listenhub help does not list every command:\n%s", help)
	}
	// The README names every command, in the usage's order.
	var named []string
	for _, m := range backticked.FindAllStringSubmatch(readmeSection(t, readREADME(t), "## The commands"), -1) {
		named = append(named, strings.TrimPrefix(m[1], "listenhub "))
	}
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	if !slices.Equal(named, names) {
		t.Errorf("README's commands section names\n  %q\nthe commands are\n  %q", named, names)
	}
	flagRE := regexp.MustCompile(`--([a-z0-9-]+)`)
	for _, c := range commands {
		syn, flags := commandHelp(t, c.name)
		if syn != c.synopsis {
			t.Errorf("%s -h says usage: listenhub %s; the command list says %s", c.name, syn, c.synopsis)
		}
		if c.name == "serve" || c.name == "relay" { // their flag tables, above
			continue
		}
		named := map[string]bool{}
		for _, m := range flagRE.FindAllStringSubmatch(c.synopsis, -1) {
			named[m[1]] = true
			if _, ok := flags[m[1]]; !ok {
				t.Errorf("the synopsis of %s names --%s, which %s -h lacks", c.name, m[1], c.name)
			}
		}
		for f := range flags {
			if !named[f] {
				t.Errorf("%s has --%s, which its synopsis (the command list) lacks", c.name, f)
			}
		}
	}
}

// TestREADMEFirstCommands checks the two commands a fresh clone starts
// with, each in a code block, and that .ci/run runs the README's test
// command itself (read from the README, so the two cannot drift apart).
func TestREADMEFirstCommands(t *testing.T) {
	doc := readREADME(t)
	for heading, want := range map[string]*regexp.Regexp{
		"## Run it":  regexp.MustCompile("(?m)^```\n" + regexp.QuoteMeta("go run ./cmd/listenhub demo") + "\n```$"),
		"## Test it": regexp.MustCompile("(?m)^```sh\n(.*\n)?" + regexp.QuoteMeta("go test -race -timeout 30m ./...") + "\n```$"),
	} {
		if !want.MatchString(readmeSection(t, doc, heading)) {
			t.Errorf("README %s: want a code block matching %q", heading, want)
		}
	}
	ci := string(testutil.ReadFile(t, "../../.ci/run"))
	if !strings.Contains(ci, "/^## Test it/") || !strings.Contains(ci, "${readme_test/go test/go test -count=1 -json}") {
		t.Errorf(".ci/run does not run the README's test command (read from its \"## Test it\" section)")
	}
}

// codeBlock returns the body of the first fenced code block in text.
func codeBlock(text string) (string, bool) {
	_, rest, ok := strings.Cut(text, "```\n")
	if !ok {
		return "", false
	}
	body, _, ok := strings.Cut(rest, "```")
	return body, ok
}

// jsonKeys returns the keys a usage.md row lists for an endpoint: the
// first {"a","b",…} of the cell.
func jsonKeys(cell string) []string {
	m := regexp.MustCompile(`\{("[a-z_0-9]+"(?:,"[a-z_0-9]+")*)`).FindStringSubmatch(cell)
	if m == nil {
		return nil
	}
	keys := strings.Split(strings.ReplaceAll(m[1], `"`, ""), ",")
	slices.Sort(keys)
	return keys
}

// TestUsageJSON holds the JSON endpoints' table of docs/usage.md to what
// /status, /relay and the lists' heads answer: the same keys.
func TestUsageJSON(t *testing.T) {
	rows := markdownTable(t, readmeSection(t, readDoc(t, usagePath), "## The JSON endpoints"), []string{"endpoint", "answers"})
	doc := map[string][]string{}
	for _, r := range rows {
		path, _, _ := strings.Cut(strings.TrimPrefix(firstCode(r[0]), "GET "), "?")
		doc[path] = jsonKeys(r[1])
	}
	h, rl := idleHubAndRelay(t)
	handler := monitor.Handler(h, monitor.Options{Relay: rl})
	for _, path := range []string{"/status", "/relay"} {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %v: %s", path, err, rec.Body)
		}
		var keys []string
		for k := range body {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		// A key left out when empty (omitempty) is answered only then.
		want := slices.DeleteFunc(slices.Clone(doc[path]), func(k string) bool { return omitEmpty[k] && !slices.Contains(keys, k) })
		if !slices.Equal(keys, want) {
			t.Errorf("usage.md: GET %s answers\n  %q\nthe table says\n  %q", path, keys, doc[path])
		}
	}
}

// omitEmpty are the keys of the status bodies that are left out when empty.
var omitEmpty = func() map[string]bool {
	m := map[string]bool{}
	for _, v := range []any{monitor.Status{}, monitor.RelayStatus{}} {
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			name, opts, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			if strings.Contains(opts, "omitempty") {
				m[name] = true
			}
		}
	}
	return m
}()
