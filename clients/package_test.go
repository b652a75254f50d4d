package clients_test

// The clients as packages a team installs: the Node package as `npm pack`
// makes it, installed into a fresh app (with its dependency pg, so a
// failover works), used from CommonJS, ESM and TypeScript; the Python
// package as a wheel built offline, installed into a fresh venv; the Ruby
// gem as `gem build` makes it offline, installed into a GEM_PATH of its
// own. No build may leave files in the source tree.

import (
	"archive/tar"
	"archive/zip"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/listenhub/listenhub/internal/testutil"
)

// startHub runs `listenhub serve` on a fresh socket, with flags added, and
// returns the socket's path once it accepts.
func startHub(t *testing.T, flags ...string) string {
	t.Helper()
	bin := testutil.Binary(t, "github.com/listenhub/listenhub/cmd/listenhub")
	sock := filepath.Join(t.TempDir(), "hub.sock")
	cmd := exec.Command(bin, append([]string{"serve", "--database-url", db.URL(), "--socket", sock}, flags...)...)
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("hub log:\n%s", out)
		}
	})
	testutil.WaitFor(t, 10*time.Second, "the hub to accept", func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return sock
}

// notifyUntilDone sends a NOTIFY with a payload on channel every 50 ms
// until the test ends: a consumer that subscribes at any point gets one.
func notifyUntilDone(t *testing.T, channel string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	conn, err := pgx.Connect(ctx, db.URL())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		defer conn.Close(context.Background())
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := conn.Exec(ctx, "SELECT pg_notify($1, $2)", channel, "n"+strings.Repeat("x", i%3)); err != nil && ctx.Err() == nil {
				t.Errorf("notify: %v", err)
				return
			}
		}
	}()
}

// runIn runs a command in dir and returns its combined output, failing the
// test with it on a non-zero exit.
func runIn(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// untracked lists the files under dir that git does not track and does not
// ignore, plus ignored build leftovers: what a build left behind.
// checkLeftovers fails the test when the files git does not track in src
// are not what they were before (what: the build that ran).
func checkLeftovers(t *testing.T, src string, before []string, what string) {
	t.Helper()
	if after := leftovers(t, src); !slices.Equal(before, after) {
		t.Errorf("%s left files in the source tree: %v (before: %v)", what, after, before)
	}
}

// absPath is filepath.Abs, or the test fails.
func absPath(t *testing.T, path string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// appDir makes work/app holding a copy of testdata/dir/file.
func appDir(t *testing.T, work, dir, file string) string {
	t.Helper()
	app := filepath.Join(work, "app")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	b := testutil.ReadFile(t, filepath.Join("testdata", dir, file))
	if err := os.WriteFile(filepath.Join(app, file), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return app
}

func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", dir, "status", "--porcelain", "--ignored", "--untracked-files=all", ".").Output()
	if err != nil {
		t.Skipf("git status: %v (not a git checkout?)", err)
	}
	var files []string
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, "??") && !strings.HasPrefix(l, "!!") {
			continue
		}
		f := strings.TrimSpace(l[2:])
		if strings.Contains(f, "node_modules/") || strings.Contains(f, "__pycache__/") {
			continue // npm ci's and the test suites' own
		}
		files = append(files, f)
	}
	return files
}

func TestNodePackage(t *testing.T) {
	npm, err := exec.LookPath("npm")
	if err != nil {
		missing(t, "the node package test needs npm; on Debian: apt-get install -y nodejs npm")
	}
	src := absPath(t, "node")
	tsc := filepath.Join(src, "node_modules", "typescript", "bin", "tsc")
	if _, err := os.Stat(tsc); err != nil {
		missing(t, "the node package test needs the dev dependencies: run `npm ci` in clients/node")
	}
	before := leftovers(t, src)

	// npm pack, into a directory of ours.
	dist := t.TempDir()
	var packed []struct {
		Filename string
		Files    []struct{ Path string }
	}
	if err := json.Unmarshal([]byte(runIn(t, src, nil, npm, "pack", "--json", "--pack-destination", dist)), &packed); err != nil || len(packed) != 1 {
		t.Fatalf("npm pack --json: %v (%d packages)", err, len(packed))
	}
	tarball := filepath.Join(dist, packed[0].Filename)
	var files []string
	for _, f := range tarFiles(t, tarball) {
		files = append(files, strings.TrimPrefix(f, "package/"))
	}
	for _, want := range []string{"package.json", "index.js", "index.mjs", "index.d.ts", "lib/client.js", "pg-listen.js", "pg-listen.mjs", "pg-listen.d.ts",
		"graphile-worker.js", "graphile-worker.mjs", "graphile-worker.d.ts", "README.md", "LICENSE"} {
		if !slices.Contains(files, want) {
			t.Errorf("the tarball lacks %s: %v", want, files)
		}
	}
	for _, f := range files {
		if strings.HasPrefix(f, "test/") || strings.HasPrefix(f, "node_modules/") {
			t.Errorf("the tarball ships %s", f)
		}
	}

	// A fresh app that installs the tarball: pg must come with it.
	app := t.TempDir()
	if err := os.WriteFile(filepath.Join(app, "package.json"), []byte(`{"name":"app","private":true}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runIn(t, app, nil, npm, "install", "--no-audit", "--no-fund", "--prefer-offline", tarball)
	if _, err := os.Stat(filepath.Join(app, "node_modules", "pg", "package.json")); err != nil {
		t.Fatalf("pg was not installed with the package: %v", err)
	}
	for _, f := range []string{"cjs.js", "esm.mjs", "consumer.ts"} {
		b := testutil.ReadFile(t, filepath.Join("testdata", "nodeapp", f))
		if err := os.WriteFile(filepath.Join(app, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// TypeScript: the declarations as installed, strict.
	tsconfig := `{"compilerOptions": {"strict": true, "noEmit": true, "module": "nodenext", "moduleResolution": "nodenext",
	 "target": "es2022", "types": ["node"], "typeRoots": [` + jsonString(filepath.Join(src, "node_modules", "@types")) + `]}, "files": ["consumer.ts"]}`
	if err := os.WriteFile(filepath.Join(app, "tsconfig.json"), []byte(tsconfig), 0o644); err != nil {
		t.Fatal(err)
	}
	runIn(t, app, nil, "node", tsc, "-p", app)

	// And for real: CommonJS and ESM through a hub, ESM's failover through pg.
	sock := startHub(t)
	q := "pkg_node"
	notifyUntilDone(t, q)
	t.Log(runIn(t, app, nil, "node", "cjs.js", sock, q))
	t.Log(runIn(t, app, nil, "node", "esm.mjs", sock, q, filepath.Join(app, "no-hub.sock"), db.URL()))

	checkLeftovers(t, src, before, "npm pack")
}

func tarFiles(t *testing.T, path string) []string {
	t.Helper()
	return tgzNames(t, openFile(t, path))
}

// openFile opens path for reading until the test ends.
func openFile(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// tgzNames lists the files of the gzip-compressed tar r.
func tgzNames(t *testing.T, r io.Reader) []string {
	t.Helper()
	zr, err := gzip.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestPythonPackage(t *testing.T) {
	py := findPython(t)
	if exec.Command(py, "-c", "import setuptools, wheel, venv, ensurepip").Run() != nil {
		missing(t, "the python package test needs setuptools, wheel and venv; on Debian: apt-get install -y python3-setuptools python3-wheel python3-venv")
	}
	src := absPath(t, "python")
	before := leftovers(t, src)

	// pip builds through _build/backend.py, which runs setuptools on a
	// copy: the build must leave nothing in the source tree (checked last).
	work := t.TempDir()
	dist := filepath.Join(work, "dist")
	runIn(t, work, nil, py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", dist, src)
	wheels, _ := filepath.Glob(filepath.Join(dist, "listenhub-*.whl"))
	if len(wheels) != 1 {
		t.Fatalf("pip wheel made %v, want one listenhub wheel", wheels)
	}
	names := zipNames(t, wheels[0])
	for _, want := range []string{"listenhub/__init__.py", "listenhub/py.typed", "listenhub/aio.py", "listenhub/failover.py"} {
		if !slices.Contains(names, want) {
			t.Errorf("the wheel lacks %s: %v", want, names)
		}
	}
	if !slices.ContainsFunc(names, func(n string) bool { return strings.HasSuffix(n, ".dist-info/LICENSE") }) {
		t.Errorf("the wheel carries no LICENSE: %v", names)
	}
	for _, n := range names {
		if strings.HasPrefix(n, "tests/") {
			t.Errorf("the wheel ships %s", n)
		}
	}

	// A fresh venv (seeing the system's psycopg, as an app's would see its
	// own) with the wheel installed.
	venv := filepath.Join(work, "venv")
	runIn(t, work, nil, py, "-m", "venv", "--system-site-packages", venv)
	vpy := filepath.Join(venv, "bin", "python")
	runIn(t, work, nil, vpy, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", wheels[0])
	app := appDir(t, work, "pyapp", "consumer.py")

	// The hints, as installed (inline, with py.typed): the package passes
	// mypy --strict, and they are enough for a strict consumer.
	if exec.Command(py, "-m", "mypy", "--version").Run() != nil {
		missing(t, "the python package test needs mypy; on Debian: apt-get install -y mypy")
	}
	cache := filepath.Join(work, "mypy-cache")
	mypyEnv := []string{"PYTHONDONTWRITEBYTECODE=1", "MYPY_CACHE_DIR=" + cache}
	runIn(t, app, mypyEnv, vpy, "-m", "mypy", "--strict", "-p", "listenhub")
	runIn(t, app, mypyEnv, vpy, "-m", "mypy", "--strict", "consumer.py")

	sock := startHub(t)
	q := "pkg_python"
	notifyUntilDone(t, q)
	t.Log(runIn(t, app, []string{"PYTHONDONTWRITEBYTECODE=1"}, vpy, "consumer.py", sock, q, filepath.Join(work, "no-hub.sock"), db.URL()))

	checkLeftovers(t, src, before, "the wheel build")
}

func zipNames(t *testing.T, path string) []string {
	t.Helper()
	r, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var names []string
	for _, f := range r.File {
		names = append(names, f.Name)
	}
	return names
}

// The packages carry the repository's license as a file of their own (npm
// and setuptools take it from the package's folder); the copies must be the
// repository's LICENSE, byte for byte.
func TestClientLicenses(t *testing.T) {
	want := testutil.ReadFile(t, filepath.Join("..", "LICENSE"))
	for _, f := range []string{"node/LICENSE", "python/LICENSE", "ruby/LICENSE"} {
		got, err := os.ReadFile(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if string(got) != string(want) {
			t.Errorf("%s differs from the repository's LICENSE: cp LICENSE clients/%s", f, f)
		}
	}
}

// The client packages are released with the hub: their versions are the one
// in cmd/listenhub/version.go (scripts/release and CHANGELOG.md follow it).
func TestClientVersions(t *testing.T) {
	src := testutil.ReadFile(t, filepath.Join("..", "cmd", "listenhub", "version.go"))
	m := regexp.MustCompile(`(?m)^const version = "([^"]+)"`).FindSubmatch(src)
	if m == nil {
		t.Fatal("cmd/listenhub/version.go: no `const version = \"…\"` line")
	}
	want := string(m[1])
	var pkg struct{ Version string }
	b := testutil.ReadFile(t, filepath.Join("node", "package.json"))
	if err := json.Unmarshal(b, &pkg); err != nil {
		t.Fatal(err)
	}
	if pkg.Version != want {
		t.Errorf("clients/node/package.json version %q, the release is %q (bump it with npm version --no-git-tag-version)", pkg.Version, want)
	}
	b = testutil.ReadFile(t, filepath.Join("python", "listenhub", "__init__.py"))
	if pm := regexp.MustCompile(`(?m)^__version__ = "([^"]+)"`).FindSubmatch(b); pm == nil || string(pm[1]) != want {
		t.Errorf("clients/python/listenhub/__init__.py __version__ %q, the release is %q", pm, want)
	}
	b = testutil.ReadFile(t, filepath.Join("ruby", "lib", "listenhub", "version.rb"))
	if rm := regexp.MustCompile(`(?m)^\s*VERSION = "([^"]+)"`).FindSubmatch(b); rm == nil || string(rm[1]) != want {
		t.Errorf("clients/ruby/lib/listenhub/version.rb VERSION %q, the release is %q", rm, want)
	}
}

func TestRubyPackage(t *testing.T) {
	rb := findRuby(t)
	gemBin := filepath.Join(filepath.Dir(rb), "gem")
	if _, err := os.Stat(gemBin); err != nil {
		if gemBin, err = exec.LookPath("gem"); err != nil {
			missing(t, "the ruby package test needs gem (RubyGems); on Debian it comes with ruby")
		}
	}
	src := absPath(t, "ruby")
	before := leftovers(t, src)

	// gem build, offline, into a directory of ours.
	work := t.TempDir()
	pkg := filepath.Join(work, "listenhub.gem")
	runIn(t, src, []string{"SOURCE_DATE_EPOCH=1700000000"}, gemBin, "build", "listenhub.gemspec", "--output", pkg)
	files := gemFiles(t, pkg)
	for _, want := range []string{"lib/listenhub.rb", "lib/listenhub/client.rb", "lib/listenhub/failover.rb",
		"lib/action_cable/subscription_adapter/listenhub.rb", "README.md", "LICENSE", "listenhub.gemspec"} {
		if !slices.Contains(files, want) {
			t.Errorf("the gem lacks %s: %v", want, files)
		}
	}
	for _, f := range files {
		if strings.HasPrefix(f, "test/") {
			t.Errorf("the gem ships %s", f)
		}
	}

	// Installed into a GEM_PATH of its own (before the system's, which has
	// Debian's pg and Action Cable), with no registry.
	gems := filepath.Join(work, "gems")
	runIn(t, work, nil, gemBin, "install", "--local", "--ignore-dependencies", "--no-document", "--install-dir", gems, pkg)
	sys := strings.TrimSpace(runIn(t, work, nil, rb, "-e", `print Gem.path.join(":")`))
	app := appDir(t, work, "rubyapp", "consumer.rb")
	sock := startHub(t)
	q := "pkg_ruby"
	notifyUntilDone(t, q)
	env := []string{"GEM_PATH=" + gems + ":" + sys, "GEM_HOME=" + gems, "RUBYLIB=", "RUBYOPT="}
	t.Log(runIn(t, app, env, rb, "consumer.rb", sock, q, filepath.Join(work, "no-hub.sock"), db.URL()))

	checkLeftovers(t, src, before, "gem build")
}

// gemFiles lists the files of a .gem (a tar holding data.tar.gz).
func gemFiles(t *testing.T, path string) []string {
	t.Helper()
	tr := tar.NewReader(openFile(t, path))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("%s holds no data.tar.gz", path)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != "data.tar.gz" {
			continue
		}
		return tgzNames(t, tr)
	}
}
