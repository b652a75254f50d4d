package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/testutil"

	"github.com/listenhub/listenhub/monitor"
)

// introspected is a hub with workers to look at: worker i (0-based) holds
// the first i+1 of a, b, c (the last one all three, and 12 names besides);
// one NOTIFY on a reached all four.
type introspected struct {
	p       *proc
	addr    string
	workers []*worker
}

func introspectedHub(t *testing.T) introspected {
	t.Helper()
	path := sockPath(t)
	// No periodic status re-send: frames sent stay what the test did.
	p, addr := serveMetrics(t, path, "--status-interval", "1h")
	ws := make([]*worker, 4)
	for i := range ws {
		ws[i] = dialWorker(t, path)
		for _, q := range []string{"a", "b", "c"}[:min(i+1, 3)] {
			ws[i].sub(q)
		}
	}
	for j := range 12 {
		ws[3].sub(fmt.Sprintf("many%02d", j))
	}
	notify(t, "NOTIFY a, 'x'")
	for _, w := range ws {
		if m := w.expect("wake"); m.Name != "a" {
			t.Fatalf("wake %+v", m)
		}
	}
	// The ready probe's connection may still be open for a moment.
	testutil.WaitFor(t, timeout, "4 workers", func() bool {
		var l hub.WorkerList
		code, _ := getBody(t, addr, "/workers", &l)
		return code == 200 && l.Total == 4
	})
	return introspected{p, addr, ws}
}

// getBody GETs path from the metrics server and decodes a 200's JSON into v.
func getBody(t testing.TB, addr, path string, v any) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", path, ct)
	}
	if resp.StatusCode == 200 && v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v in %s", path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

// /workers, /channels and /status of the real binary with four workers:
// every worker with its pid, names bounded, counters; paging, sorting and
// the bounds of limit and offset; a bad parameter is a 400 saying why.
func TestServeIntrospectionEndpoints(t *testing.T) {
	h := introspectedHub(t)
	var l hub.WorkerList
	if code, body := getBody(t, h.addr, "/workers", &l); code != 200 {
		t.Fatalf("/workers: %d %s", code, body)
	}
	if l.Total != 4 || l.Limit != 100 || l.Offset != 0 || l.Sort != "id" || len(l.Workers) != 4 {
		t.Fatalf("/workers: %+v", l)
	}
	var ids []uint64
	for i, w := range l.Workers {
		ids = append(ids, w.ID)
		subs := []int{1, 2, 3, 15}[i]
		if w.PID != os.Getpid() || w.UID != os.Getuid() || w.Subscriptions != subs ||
			len(w.Names) != min(subs, hub.MaxWorkerNames) || w.ConnectedAt.IsZero() {
			t.Errorf("worker %d: %+v; want our pid and uid, %d subscriptions", i, w, subs)
		}
		// The status on connect, an ack per name, the wake on a.
		if want := uint64(2 + subs); w.FramesSent != want || w.BacklogFrames != 0 {
			t.Errorf("worker %d: sent %d backlog %d, want %d and 0", i, w.FramesSent, w.BacklogFrames, want)
		}
	}
	if !slices.IsSorted(ids) {
		t.Errorf("default order %v, want ascending ids", ids)
	}
	if got := l.Workers[1].Names; !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("names %v, want [a b]", got)
	}

	var page hub.WorkerList
	getBody(t, h.addr, "/workers?limit=2&offset=1", &page)
	if page.Total != 4 || len(page.Workers) != 2 || page.Workers[0].ID != ids[1] || page.Workers[1].ID != ids[2] {
		t.Errorf("limit=2&offset=1: %+v, want workers %v", page, ids[1:3])
	}
	page = hub.WorkerList{}
	getBody(t, h.addr, "/workers?offset=10", &page)
	if page.Total != 4 || page.Workers == nil || len(page.Workers) != 0 {
		t.Errorf("offset=10: %+v, want [] and total 4", page)
	}
	getBody(t, h.addr, "/workers?sort=subscriptions&limit=1", &page)
	if len(page.Workers) != 1 || page.Workers[0].ID != ids[3] || page.Sort != "subscriptions" {
		t.Errorf("sort=subscriptions&limit=1: %+v, want worker %d", page, ids[3])
	}
	if code, body := getBody(t, h.addr, "/workers?limit=10000", nil); code != 200 {
		t.Errorf("limit=10000: %d %s", code, body)
	}
	if code, body := getBody(t, h.addr, "/workers?offset=9223372036854775807&limit=10000", &page); code != 200 || len(page.Workers) != 0 || page.Total != 4 {
		t.Errorf("offset=MaxInt64: %d %s", code, body)
	}
	for _, q := range []string{"limit=10001", "limit=0", "limit=-1", "limit=many", "offset=-1", "offset=9223372036854775808", "sort=bogus"} {
		code, body := getBody(t, h.addr, "/workers?"+q, nil)
		var e struct{ Error string }
		if code != 400 || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
			t.Errorf("/workers?%s: %d %s, want 400 with an error", q, code, body)
		}
	}
	if code, _ := getBody(t, h.addr, "/channels?sort=id", nil); code != 400 {
		t.Errorf("/channels?sort=id: %d, want 400", code)
	}

	var cl hub.ChannelList
	getBody(t, h.addr, "/channels?limit=3", &cl)
	if cl.Total != 15 || len(cl.Channels) != 3 || cl.Sort != "name" {
		t.Fatalf("/channels?limit=3: %+v", cl)
	}
	wantA := hub.ChannelInfo{Name: "a", Channel: "a", Subscribers: 4, State: "listening", WakesReceived: 1, WakesDelivered: 4}
	if cl.Channels[0] != wantA || cl.Channels[1].Name != "b" || cl.Channels[2].Name != "c" {
		t.Errorf("/channels: %+v, want a (%+v), b, c", cl.Channels, wantA)
	}
	getBody(t, h.addr, "/channels?sort=subscribers&limit=2&offset=1", &cl)
	if len(cl.Channels) != 2 || cl.Channels[0].Name != "b" || cl.Channels[1].Name != "c" {
		t.Errorf("sort=subscribers&limit=2&offset=1: %+v, want b, c", cl.Channels)
	}

	var st monitor.Status
	getBody(t, h.addr, "/status", &st)
	if !st.Healthy || st.Workers != 4 || st.Channels != 15 || st.PID != h.p.pid() || st.UptimeSeconds <= 0 ||
		st.GoVersion != runtime.Version() || st.WakesReceived != 1 {
		t.Errorf("/status: %+v", st)
	}
}

// `listenhub status` against the real binary: the summary, both tables
// with a row per worker and channel, one sorted page with a hint for the
// next, the JSON, and one clear line for each mistake.
func TestStatusCommand(t *testing.T) {
	h := introspectedHub(t)
	code, out, errOut := runCmd([]string{"status", "--metrics-addr", h.addr})
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	t.Logf("listenhub status:\n%s", out)
	for _, re := range []string{
		`(?m)^hub +` + regexp.QuoteMeta(h.addr) + fmt.Sprintf(` \(pid %d\)$`, h.p.pid()),
		`(?m)^healthy +yes$`,
		`(?m)^uptime +\d+[hms0-9]*$`,
		`(?m)^workers +4$`,
		`(?m)^channels +15 LISTENed$`,
		`(?m)^workers 1-4 of 4, by id$`,
		`(?m)^ID +PID +UID +CONNECTED +SUBS +NAMES +BACKLOG +BYTES +DURABLE +SENT +COALESCED +DROPPED$`,
		fmt.Sprintf(`(?m)^\d+ +%d +%d +\d+s ago +2 +a,b +0 +0 +0 +4 +0 +0$`, os.Getpid(), os.Getuid()),
		fmt.Sprintf(`(?m)^\d+ +%d +%d +\d+s ago +15 +a,b,c,many\S+ \+5 +0 +0 +0 +17 +0 +0$`, os.Getpid(), os.Getuid()),
		`(?m)^channels 1-15 of 15, by name$`,
		`(?m)^NAME +CHANNEL +STATE +SUBSCRIBERS +WAITING +RECEIVED +DELIVERED$`,
		`(?m)^a +a +listening +4 +0 +1 +4$`,
		`(?m)^many11 +many11 +listening +1 +0 +0 +0$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status output lacks %s", re)
		}
	}

	code, out, _ = runCmd([]string{"status", "--metrics-addr", "http://" + h.addr + "/", "--workers", "--sort", "subscriptions", "--limit", "1"})
	if code != 0 || !strings.HasPrefix(out, "workers 1-1 of 4, by subscriptions (more with --offset 1)\n") ||
		strings.Count(out, "\n") != 3 || !strings.Contains(out, " 15 ") {
		t.Errorf("--workers --sort subscriptions --limit 1: exit %d\n%s", code, out)
	}
	code, out, _ = runCmd([]string{"status", "--metrics-addr", h.addr, "--channels", "--offset", "20"})
	if code != 0 || out != "channels: none at offset 20 of 15\n" {
		t.Errorf("--channels --offset 20: exit %d %q", code, out)
	}

	var all struct {
		Status   monitor.Status
		Workers  hub.WorkerList
		Channels hub.ChannelList
	}
	code, out, _ = runCmd([]string{"status", "--metrics-addr", h.addr, "--json"})
	if err := json.Unmarshal([]byte(out), &all); code != 0 || err != nil || all.Status.Workers != 4 ||
		all.Workers.Total != 4 || all.Channels.Total != 15 {
		t.Errorf("--json: exit %d, %v: %s", code, err, out)
	}
	var cl hub.ChannelList
	code, out, _ = runCmd([]string{"status", "--metrics-addr", h.addr, "--channels", "--json", "--sort", "subscribers", "--limit", "1"})
	if err := json.Unmarshal([]byte(out), &cl); code != 0 || err != nil || len(cl.Channels) != 1 || cl.Channels[0].Name != "a" {
		t.Errorf("--channels --json: exit %d, %v: %s", code, err, out)
	}
	t.Setenv("LISTENHUB_METRICS_ADDR", h.addr)
	if code, out, _ := runCmd([]string{"status", "--workers"}); code != 0 || !strings.HasPrefix(out, "workers 1-4 of 4") {
		t.Errorf("LISTENHUB_METRICS_ADDR: exit %d %q", code, out)
	}
	t.Setenv("LISTENHUB_METRICS_ADDR", "")

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--metrics-addr", ""}, 2, "--metrics-addr must not be empty"},
		{[]string{"--metrics-addr", h.addr, "--workers", "--channels"}, 2, "exclude each other"},
		{[]string{"--metrics-addr", h.addr, "--sort", "sent"}, 2, "--sort needs --workers or --channels"},
		{[]string{"--metrics-addr", h.addr, "--limit", "0"}, 2, "--limit must be 1 to 10000"},
		{[]string{"--metrics-addr", h.addr, "--limit", "10001"}, 2, "--limit must be 1 to 10000"},
		{[]string{"--metrics-addr", h.addr, "--workers", "--sort", "bogus"}, 1, `unknown sort "bogus"`},
	} {
		code, out, errOut := runCmd(append([]string{"status"}, c.args...))
		if code != c.code || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("status %q: exit %d, stdout %q, stderr %q; want %d and one line with %q", c.args, code, out, errOut, c.code, c.want)
		}
	}
}

// census prints what it counted, and --json the same as an object.
func TestCensusOutput(t *testing.T) {
	c := needDB(t)
	path := sockPath(t)
	p := serve(t, path, nil)
	p.ready()
	code, out, errOut := runCmd([]string{"census", "--database-url", c.URL(), "--application-name", p.app})
	if want := fmt.Sprintf("backends with application_name %q: 1\n", p.app); code != 0 || out != want {
		t.Errorf("census: exit %d %q (%s), want %q", code, out, errOut, want)
	}
	code, out, _ = runCmd([]string{"census", "--database-url", c.URL(), "--application-name", p.app + "-none", "--json"})
	if want := fmt.Sprintf(`{"application_name":%q,"backends":0}`+"\n", p.app+"-none"); code != 0 || out != want {
		t.Errorf("census --json: exit %d %q, want %q", code, out, want)
	}
}

// The help and the errors of every command: an unknown command lists them
// all; the top-level help shows every command's flags (demo's --rate and
// --duration too); -h spells flags --name and names an environment
// variable the command reads; a duration without a unit says how to write
// one.
func TestCLIHelpAndErrors(t *testing.T) {
	code, _, errOut := runCmd([]string{"bogus"})
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	if code != 2 || !strings.HasPrefix(errOut, `listenhub: unknown command "bogus" (want `+strings.Join(names, ", ")+` or help)`) ||
		!strings.Contains(errOut, commandList()) {
		t.Errorf("unknown command: exit %d\n%s", code, errOut)
	}
	_, help, _ := runCmd([]string{"help"})
	for _, want := range []string{"listenhub demo [--workers N] [--rate N] [--duration D]", "listenhub status [--metrics-addr ADDR]", "listenhub version"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q:\n%s", want, help)
		}
	}
	for _, c := range []struct{ cmd, env string }{
		{"serve", "LISTENHUB_SOCKET"}, {"tail", "LISTENHUB_SOCKET"}, {"census", "LISTENHUB_DATABASE_URL"},
		{"status", "LISTENHUB_METRICS_ADDR"}, {"demo", ""},
	} {
		_, out, _ := runCmd([]string{c.cmd, "-h"})
		example := regexp.MustCompile(`e\.g\. (LISTENHUB_[A-Z_]+)\)`).FindStringSubmatch(out)
		switch {
		case c.env == "" && example != nil:
			t.Errorf("%s -h names %s, but %s reads no environment", c.cmd, example[1], c.cmd)
		case c.env != "" && (example == nil || example[1] != c.env):
			t.Errorf("%s -h: want the example %s in\n%s", c.cmd, c.env, out)
		}
		if regexp.MustCompile(`(?m)^  -[a-z]`).MatchString(out) {
			t.Errorf("%s -h spells a flag -name:\n%s", c.cmd, out)
		}
	}
	if _, out, _ := runCmd([]string{"census", "-h"}); strings.Contains(out, "SOCKET") {
		t.Errorf("census -h mentions a socket:\n%s", out)
	}
	for _, args := range [][]string{
		{"serve", "--socket", "/tmp/x", "--status-interval", "5"},
		{"demo", "--duration", "5"},
	} {
		code, _, errOut := runCmd(args)
		if want := `invalid duration "5": use a unit, e.g. 5s or 500ms`; code != 2 || !strings.Contains(errOut, want) ||
			strings.Contains(errOut, "parse error") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%q: exit %d %q, want 2 and one line with %q", args, code, errOut, want)
		}
	}
	t.Setenv("LISTENHUB_HEALTH_CHECK_TIMEOUT", "2")
	if _, _, errOut := runCmd([]string{"serve", "--socket", "/tmp/x"}); !strings.Contains(errOut, `invalid value "2" for LISTENHUB_HEALTH_CHECK_TIMEOUT: invalid duration "2": use a unit`) {
		t.Errorf("duration from the environment: %q", errOut)
	}
}

// version says the module version, the VCS revision of the build (with
// +dirty for a modified tree) and the Go version, and /metrics'
// listenhub_build_info carries the same labels.
func TestVersionBuildInfo(t *testing.T) {
	_, out, _ := runCmd([]string{"version"})
	if !strings.HasPrefix(out, "listenhub ") || !strings.HasSuffix(out, ", "+runtime.Version()+")\n") {
		t.Errorf("version (test binary): %q", out)
	}
	path := sockPath(t)
	p := serve(t, path, nil, "--metrics-addr", "127.0.0.1:0")
	p.ready()
	b, err := exec.Command(hubBinary(t), "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	version := regexp.MustCompile(`^listenhub (\S+) \(revision ([0-9a-f]{12}(?:\+dirty)?|unknown), (go\S+)\)\n$`).FindStringSubmatch(string(b))
	if version == nil || version[3] != runtime.Version() {
		t.Fatalf("version: %q", b)
	}
	m := scrape(t, p.metricsAddr())
	info := fmt.Sprintf(`listenhub_build_info{version=%q,revision=%q,goversion=%q}`, version[1], version[2], version[3])
	if version[2] != "unknown" {
		info = "" // the label has the whole revision; checked below
	}
	found := false
	for k, v := range m {
		if strings.HasPrefix(k, "listenhub_build_info{") {
			found = v == 1 && (info == "" || k == info) && strings.Contains(k, `revision="`+strings.TrimSuffix(version[2], "+dirty"))
			if !found {
				t.Errorf("%s %v; version printed %q", k, v, b)
			}
		}
	}
	if !found {
		t.Errorf("no listenhub_build_info")
	}

	// A build stamped with its VCS state (go build -buildvcs=true from a
	// checkout with a .git directory: a git worktree's .git file is not
	// stamped) names its commit, and +dirty exactly when the tree is
	// modified.
	dir, _ := filepath.Abs("../..")
	if fi, err := os.Stat(filepath.Join(dir, ".git")); err != nil || !fi.IsDir() {
		t.Logf("no .git directory in %s: the VCS stamp is not checked", dir)
		return
	}
	head, err := exec.Command("git", "-C", dir, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Logf("git rev-parse: %v: the VCS stamp is not checked", err)
		return
	}
	bin := filepath.Join(t.TempDir(), "listenhub")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/listenhub")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	b, err = exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	rev := strings.TrimSpace(string(head))[:12]
	dirty, _ := exec.Command("git", "-C", dir, "status", "--porcelain", "--untracked-files=no").Output()
	if len(bytes.TrimSpace(dirty)) > 0 {
		rev += "+dirty"
	}
	if !strings.Contains(string(b), "(revision "+rev+", ") {
		t.Errorf("stamped build: version %q, want revision %s", b, rev)
	}
}

// The process_* series describe the hub process itself.
func TestServeProcessMetrics(t *testing.T) {
	path := sockPath(t)
	before := time.Now()
	p := serve(t, path, nil, "--metrics-addr", "127.0.0.1:0")
	p.ready()
	m := scrape(t, p.metricsAddr())
	fds := float64(p.fds())
	if got := m["process_open_fds"]; got < fds-3 || got > fds+3 {
		t.Errorf("process_open_fds %v, /proc/PID/fd has %v", got, fds)
	}
	rss := float64(p.rssKiB()) * 1024
	if got := m["process_resident_memory_bytes"]; got < rss/2 || got > rss*2 {
		t.Errorf("process_resident_memory_bytes %v, VmRSS %v", got, rss)
	}
	if m["process_virtual_memory_bytes"] < m["process_resident_memory_bytes"] || m["process_max_fds"] < 1024 ||
		m["process_cpu_seconds_total"] < 0 {
		t.Errorf("process metrics %v", m)
	}
	// Clock ticks of 10 ms, and btime rounded to the second.
	if start := m["process_start_time_seconds"]; start < float64(before.Unix())-2 || start > float64(time.Now().Unix())+2 {
		t.Errorf("process_start_time_seconds %v; the process started between %v and now", start, before)
	}
}
