package clients_test

// The quick starts, run as a newcomer pastes them. Each one is a Markdown
// section whose code blocks, in order, are the whole recipe: shell blocks
// are commands, and a block whose first line is a comment naming a file
// ("// main.go", "# app.py: …") is that file, written where the commands
// have got to. The test turns the section into one bash script and runs it
// in an empty directory against a real hub and a real cluster, with three
// changes and no more:
//
//   - `git clone https://github.com/listenhub/listenhub` becomes a symlink
//     to this checkout (the repository is what is under test);
//   - `apt-get` lines are left out: they install what .ci/run has
//     installed (and need root);
//   - the socket path /run/listenhub/listenhub.sock becomes the test hub's.
//
// DATABASE_URL is in the environment, as the quick starts say it must be.
// The script's last command is the app; the test waits until every worker
// it starts has printed a wake of "orders" that came through the hub, and
// logs the time from the first command to the first wake (the figure the
// quick starts state). Downloads go through the ordinary clients (the Go
// module proxy, npm) into whatever caches the environment names: .ci/run
// gives the Go ones an empty module cache of its own.

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/testutil"
)

// codeBlock is one fenced block of a Markdown section.
type codeBlock struct {
	lang, body string
}

// sectionBlocks returns the code blocks under the heading, in order, up to
// the next heading of the same or a higher level.
func sectionBlocks(t *testing.T, path, heading string) []codeBlock {
	t.Helper()
	level := len(heading) - len(strings.TrimLeft(heading, "#"))
	var blocks []codeBlock
	in, fenced := false, false
	indent := "" // the fence's: blocks inside list items are indented
	var cur codeBlock
	var body strings.Builder
	for _, line := range strings.Split(string(testutil.ReadFile(t, path)), "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fenced && strings.HasPrefix(trimmed, "```"):
			if in {
				cur.body = body.String()
				blocks = append(blocks, cur)
			}
			body.Reset()
			fenced = false
		case fenced:
			body.WriteString(strings.TrimPrefix(line, indent) + "\n")
		case strings.HasPrefix(trimmed, "```"):
			fenced, indent = true, line[:len(line)-len(trimmed)]
			cur = codeBlock{lang: strings.TrimPrefix(trimmed, "```")}
		case strings.HasPrefix(line, "#"):
			l := len(line) - len(strings.TrimLeft(line, "#"))
			if line == heading {
				in = true
			} else if in && l <= level {
				in = false
			}
		}
	}
	if len(blocks) == 0 {
		t.Fatalf("%s has no code under %q", path, heading)
	}
	return blocks
}

// fileComment is the first line of a block that is a file: a comment
// naming it.
var fileComment = regexp.MustCompile(`^(?://|#)\s*([A-Za-z0-9_./-]+\.[a-z]+|Gemfile)(?::.*)?$`)

const checkoutURL = "https://github.com/listenhub/listenhub"

// quickStartScript turns a section into the bash script described above.
func quickStartScript(t *testing.T, path, heading, sock string) string {
	t.Helper()
	repo := absPath(t, "..")
	var s strings.Builder
	s.WriteString("set -euo pipefail\n")
	for i, b := range sectionBlocks(t, path, heading) {
		if b.lang == "sh" {
			for _, line := range strings.Split(strings.TrimRight(b.body, "\n"), "\n") {
				cmd := strings.TrimPrefix(strings.TrimSpace(line), "sudo ")
				switch {
				case strings.HasPrefix(cmd, "apt-get "):
					continue
				case strings.HasPrefix(cmd, "git clone "+checkoutURL):
					line = "ln -s " + shellQuote(repo) + " listenhub"
				}
				s.WriteString(strings.ReplaceAll(line, readmeSocket, sock) + "\n")
			}
			continue
		}
		first, _, _ := strings.Cut(b.body, "\n")
		m := fileComment.FindStringSubmatch(first)
		if m == nil {
			t.Fatalf("%s %s: block %d (%s) is neither a shell block nor a file (its first line, %q, names none)", path, heading, i+1, b.lang, first)
		}
		name := shellQuote(m[1])
		s.WriteString("mkdir -p \"$(dirname " + name + ")\"\ncat >" + name + " <<'LISTENHUB_QUICKSTART'\n" +
			strings.ReplaceAll(b.body, readmeSocket, sock) + "LISTENHUB_QUICKSTART\n")
	}
	return s.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// networkDown matches what the Go and npm clients print when there is no
// network at all (not when a module is missing: that is a failure).
var networkDown = regexp.MustCompile(`dial tcp: lookup .*(no such host|server misbehaving)|network is unreachable|getaddrinfo E(NOTFOUND|AI_AGAIN)`)

// runQuickStart runs the section as a script until workers processes have
// printed a wake through the hub, and returns the time to the first wake.
func runQuickStart(t *testing.T, path, heading string, workers int, env ...string) time.Duration {
	t.Helper()
	sock := startHub(t)
	dir := t.TempDir()
	script := filepath.Join(t.TempDir(), "quickstart.sh")
	if err := os.WriteFile(script, []byte(quickStartScript(t, path, heading, sock)), 0o644); err != nil {
		t.Fatal(err)
	}
	notifyUntilDone(t, "orders")
	start := time.Now()
	cmd := exec.Command("bash", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"DATABASE_URL=" + db.URL()}, env...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	w := &lineWatcher{}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	read := make(chan struct{})
	go func() { w.feed(pr); close(read) }()
	exited := make(chan struct{})
	var exitErr error // set before exited is closed
	go func() { exitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// Ctrl-C, as the user stops it: `go run` then removes its
		// build directory, and the apps close their clients.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // and whatever it started
		pr.Close()
		<-read
		if t.Failed() {
			t.Logf("the quick start's output:\n%s", w)
		}
	})
	re := regexp.MustCompile(`^\d+ orders n`)
	var first time.Duration
	deadline := time.After(5 * time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		got := len(w.pidsWith(re))
		if got > 0 && first == 0 {
			first = time.Since(start)
		}
		if got >= workers {
			break
		}
		select {
		case <-exited:
			<-read
			out := w.String()
			if os.Getenv("CI") != "true" && networkDown.MatchString(out) {
				t.Skipf("%s %s: no network for the downloads it makes (%v):\n%s", path, heading, exitErr, out)
			}
			t.Fatalf("%s %s: the script ended (%v) before %d workers printed a wake", path, heading, exitErr, workers)
		case <-deadline:
			t.Fatalf("%s %s: %d of %d workers printed a wake within 5 minutes", path, heading, got, workers)
		case <-tick.C:
		}
	}
	waitWorkers(t, w, workers)
	t.Logf("%s %s: first wake %.1f s after the first command", path, heading, first.Seconds())
	return first
}

// systemPython puts a directory holding python3 (the interpreter that has
// Debian's psycopg, which a pyenv python3 first on PATH does not see) first
// on PATH, so that the quick start's python3 is the system's, as on a
// fresh Debian machine.
func systemPython(t *testing.T) string {
	t.Helper()
	py := findPython(t)
	if exec.Command(py, "-c", "import gunicorn, venv, setuptools, wheel").Run() != nil {
		missing(t, "the Python quick starts need venv, setuptools, wheel and gunicorn; on Debian: apt-get install -y python3-venv python3-setuptools python3-wheel gunicorn")
	}
	bin := t.TempDir()
	if err := os.Symlink(py, filepath.Join(bin, "python3")); err != nil {
		t.Fatal(err)
	}
	return "PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")
}

// needNode skips (fails under CI=true) without node and npm: the quick
// starts install the client from the checkout themselves.
func needNode(t *testing.T) {
	t.Helper()
	for _, c := range []string{"node", "npm"} {
		if _, err := exec.LookPath(c); err != nil {
			missing(t, "the Node quick starts need node (>= 18) and npm; on Debian: apt-get install -y nodejs npm")
		}
	}
}

func TestQuickStartGo(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		missing(t, "the Go quick start needs go on PATH")
	}
	runQuickStart(t, "../README.md", "### Go", 1)
}

func TestQuickStartPythonGunicorn(t *testing.T) {
	runQuickStart(t, "../README.md", "### Python under gunicorn", 4, systemPython(t))
}

func TestQuickStartNodeCluster(t *testing.T) {
	needNode(t)
	runQuickStart(t, "../README.md", "### Node cluster", 4)
}

func TestQuickStartPythonClient(t *testing.T) {
	runQuickStart(t, "python/README.md", "## Quick start", 1, systemPython(t))
}

func TestQuickStartNodeClient(t *testing.T) {
	needNode(t)
	runQuickStart(t, "node/README.md", "## Quick start", 1)
}

func TestQuickStartRubyClient(t *testing.T) {
	findRuby(t)
	runQuickStart(t, "ruby/README.md", "## Quick start", 1)
}
