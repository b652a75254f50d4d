package clients_test

// The README's quick starts, as a newcomer copies them: each one is taken
// out of README.md, pointed at a real hub (its socket path replaced, the
// database in DATABASE_URL), and run in the server it is written for — the
// Go one built for every platform a release has and run on this one, the
// Python one under gunicorn, the Node one as a cluster, the Action Cable one
// in Action Cable, the pgbus one as a pgbus worker finds the hub — until
// every worker it starts has received a NOTIFY through the hub, none on a
// connection of its own.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
)

// readmeSocket is the socket path the quick starts name.
const readmeSocket = "/run/listenhub/listenhub.sock"

// quickStart returns the code blocks of the section heading of the
// Markdown file path by their language tag (blocks of one language
// joined).
func quickStart(t *testing.T, path, heading string) map[string]string {
	t.Helper()
	blocks := map[string]string{}
	for _, b := range sectionBlocks(t, path, heading) {
		lang := b.lang
		if lang == "" {
			lang = "text"
		}
		blocks[lang] += b.body
	}
	return blocks
}

// lineWatcher collects a process's output lines and waits for a condition
// on them.
type lineWatcher struct {
	mu    sync.Mutex
	lines []string
}

func (w *lineWatcher) feed(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		w.mu.Lock()
		w.lines = append(w.lines, sc.Text())
		w.mu.Unlock()
	}
}

func (w *lineWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}

// pidsWith returns the distinct first fields (pids) of the lines matching re.
func (w *lineWatcher) pidsWith(re *regexp.Regexp) map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	pids := map[string]bool{}
	for _, l := range w.lines {
		if re.MatchString(l) {
			pids[strings.Fields(l)[0]] = true
		}
	}
	return pids
}

// startApp runs an app in its own process group (killed at the end of the
// test, with whatever it forked) and watches its output.
func startApp(t *testing.T, dir string, env []string, name string, args ...string) *lineWatcher {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	w := &lineWatcher{}
	done := make(chan struct{})
	go func() { w.feed(pr); close(done) }()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything it forked
		pw.Close()
		<-done
		if t.Failed() {
			t.Logf("%s output:\n%s", name, w)
		}
	})
	return w
}

// waitWorkers waits until n distinct worker pids have printed a wake of
// the channel "orders", then checks that none of them listens on a
// connection of its own (the clients' fallback application_name).
func waitWorkers(t *testing.T, w *lineWatcher, n int) {
	t.Helper()
	re := regexp.MustCompile(`^\d+ orders n`)
	testutil.WaitFor(t, 60*time.Second, fmt.Sprintf("%d workers to print a wake", n), func() bool {
		return len(w.pidsWith(re)) >= n
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := pgtesting.Connect(t, db.URL())
	var local int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'listenhub-local'").Scan(&local); err != nil {
		t.Fatal(err)
	}
	if local != 0 {
		t.Errorf("%d workers listen on a connection of their own, want all of them on the hub", local)
	}
}

// cableCheck is a Rails process's view of config/cable.yml: Action Cable
// finds the adapter by the file's name for it, subscribes through it and
// receives a broadcast; and no connection of Active Record's LISTENs (the
// adapter's fallback), so the subscription went through the hub.
const cableCheck = `
require "yaml"
require "timeout"
require "logger"
require "pg"
require "active_support/core_ext/hash/indifferent_access"
require "action_cable"
require "active_record"

file, url = ARGV
kv = PG::Connection.conninfo_parse(url).each_with_object({}) { |o, h| h[o[:keyword]] = o[:val] if o[:val] }
ActiveRecord::Base.establish_connection({ adapter: "postgresql", host: kv["host"], port: kv["port"],
  database: kv["dbname"], username: kv["user"], password: kv["password"] }.compact)
server = ActionCable::Server::Base.new
server.config.cable = YAML.safe_load(File.read(file)).fetch("production").with_indifferent_access
server.config.logger = Logger.new($stderr)
adapter = server.pubsub
abort "config/cable.yml gave #{adapter.class}" unless adapter.class.name == "ActionCable::SubscriptionAdapter::Listenhub"
got = Queue.new
adapter.subscribe("orders", ->(msg) { got << msg }, -> { adapter.broadcast("orders", "hello") })
msg = Timeout.timeout(30) { got.pop }
abort "received #{msg.inspect}" unless msg == "hello"
local = ActiveRecord::Base.connection.select_value(
  "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%' AND application_name <> 'listenhub'")
abort "#{local} connections of the app LISTEN: the adapter did not use the hub" unless local.to_i.zero?
puts "cable: received #{msg} through the hub"
adapter.shutdown
`

// TestREADMEQuickStartRails loads the README's config/cable.yml into
// Action Cable, with the gem of clients/ruby on the load path.
func TestREADMEQuickStartRails(t *testing.T) {
	for _, doc := range []struct{ path, heading string }{
		{"../README.md", "### Rails Action Cable"},
		{"../docs/rails.md", "## Set-up"},
		{"ruby/README.md", "## Rails: Action Cable"},
	} {
		t.Run(filepath.Base(filepath.Dir(doc.path))+"/"+filepath.Base(doc.path), func(t *testing.T) {
			checkCable(t, quickStart(t, doc.path, doc.heading)["yaml"])
		})
	}
}

// checkCable runs cableCheck on a config/cable.yml.
func checkCable(t *testing.T, cable string) {
	rb := findRuby(t)
	sock := startHub(t)
	if !strings.Contains(cable, readmeSocket) {
		t.Fatalf("the cable.yml names no socket:\n%s", cable)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "cable.yml")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(cable, readmeSocket, sock)), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := filepath.Abs(filepath.Join("ruby", "lib"))
	if err != nil {
		t.Fatal(err)
	}
	out := runIn(t, dir, nil, rb, "-I", lib, "-e", cableCheck, file, db.URL())
	if !strings.Contains(out, "through the hub") {
		t.Fatalf("the cable.yml check said:\n%s", out)
	}
}

// pgbusWorker is what a pgbus app does with the README's initializer, with
// a stand-in for pgbus's configuration: the pgbus_streams plugin has set
// PGBUS_STREAMS_HUB_SOCKET to its own hub's path (MasterHubBoot#start), the
// initializer (ARGV[0]) runs after it, and a worker's streamer, with scope
// :master, reads the variable, connects there and subscribes to a queue
// with pgbus's frames (lib/pgbus/web/streamer/instance.rb and
// hub_client.rb): a 4-byte big-endian length, then the JSON.
const pgbusWorker = `
require "json"
require "socket"
require "timeout"
require "tmpdir"

module Pgbus
  class Configuration
    attr_reader :streams_listen_scope
    def initialize = (@streams_listen_scope = :master)
    def streams_listen_scope=(scope)
      raise ArgumentError, "streams_listen_scope #{scope.inspect}" unless %i[master process].include?(scope)
      @streams_listen_scope = scope
    end
  end
  def self.configuration = (@configuration ||= Configuration.new)
  def self.configure = yield(configuration)
end

ENV["PGBUS_STREAMS_HUB_SOCKET"] = File.join(Dir.tmpdir, "pgbus-streams-hub-#{Process.pid}.sock")
load ARGV[0]
abort "scope #{Pgbus.configuration.streams_listen_scope.inspect}" unless Pgbus.configuration.streams_listen_scope == :master

sock = UNIXSocket.new(ENV.fetch("PGBUS_STREAMS_HUB_SOCKET"))
send_frame = ->(h) { b = JSON.generate(h); sock.write([b.bytesize].pack("N") + b) }
read_frame = -> { JSON.parse(sock.read(sock.read(4).unpack1("N"))) }
Timeout.timeout(30) do
  send_frame.({ "t" => "sub", "q" => "orders" })
  seen = []
  loop do
    f = read_frame.()
    seen << f["t"]
    abort "refused: #{f.inspect}" if f["t"] == "nack"
    next unless f["t"] == "wake"
    abort "a wake before the ack: #{seen}" unless seen.include?("ack")
    puts "pgbus worker: wake #{f["q"]} #{f["p"].inspect}"
    break
  end
end
`

// TestREADMEQuickStartPgbus runs the pgbus quick start: the README's
// `listenhub serve` line (socket and database filled in), and its
// initializer in a stand-in for a pgbus app whose Puma plugin pointed the
// workers elsewhere first; the worker subscribes to the queue "orders" and
// receives the NOTIFY of pgmq's channel pgmq.q_orders.INSERT.
func TestREADMEQuickStartPgbus(t *testing.T) {
	blocks := quickStart(t, "../README.md", "### pgbus on Puma")
	code := blocks["ruby"]
	for _, want := range []string{`ENV["PGBUS_STREAMS_HUB_SOCKET"] = "` + readmeSocket + `"`, "streams_listen_scope = :master"} {
		if !strings.Contains(code, want) {
			t.Errorf("README.md: the pgbus quick start lacks %q:\n%s", want, code)
		}
	}
	line := strings.TrimSpace(blocks["sh"])
	args, ok := strings.CutPrefix(line, "listenhub serve ")
	if !ok || strings.Contains(line, "\n") || !strings.Contains(args, "--channel-prefix pgmq.q_ --channel-suffix .INSERT") {
		t.Fatalf("README.md: the pgbus quick start's hub is not one `listenhub serve` line mapping names to pgmq's channels:\n%s", blocks["sh"])
	}
	var flags []string
	for f := range strings.FieldsSeq(args) {
		if f == readmeSocket {
			flags = flags[:len(flags)-1] // startHub gives the socket
			continue
		}
		flags = append(flags, f)
	}
	runPgbusInitializer(t, code, flags)
}

// TestPgbusDocInitializer runs docs/pgbus.md's initializer (step 3 of
// "Switching") as TestREADMEQuickStartPgbus runs the README's.
func TestPgbusDocInitializer(t *testing.T) {
	code := quickStart(t, "../docs/pgbus.md", "## Switching")["ruby"]
	if !strings.Contains(code, "PGBUS_STREAMS_HUB_SOCKET") {
		t.Fatalf("docs/pgbus.md: the initializer does not set PGBUS_STREAMS_HUB_SOCKET:\n%s", code)
	}
	runPgbusInitializer(t, code, []string{"--channel-prefix", "pgmq.q_", "--channel-suffix", ".INSERT"})
}

// runPgbusInitializer runs pgbusWorker with the initializer code against a
// hub started with flags.
func runPgbusInitializer(t *testing.T, code string, flags []string) {
	t.Helper()
	rb, err := exec.LookPath("ruby")
	if err != nil {
		missing(t, "the pgbus quick start needs ruby; on Debian: apt-get install -y ruby")
	}
	sock := startHub(t, flags...)
	dir := t.TempDir()
	init := filepath.Join(dir, "pgbus.rb")
	if err := os.WriteFile(init, []byte(strings.ReplaceAll(code, readmeSocket, sock)), 0o644); err != nil {
		t.Fatal(err)
	}
	notifyUntilDone(t, "pgmq.q_orders.INSERT")
	out := runIn(t, dir, []string{"TMPDIR=" + dir}, rb, "-e", pgbusWorker, init)
	if !strings.Contains(out, "pgbus worker: wake orders") {
		t.Fatalf("the pgbus worker said:\n%s", out)
	}
}
