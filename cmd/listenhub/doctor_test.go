package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/relayfix"
)

// doctor runs `listenhub doctor` in-process and returns its exit status and
// findings (from --json) by check.
func doctor(t *testing.T, args ...string) (int, map[string][]finding, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append([]string{"doctor", "--json"}, args...), &out, &errOut)
	var fs []finding
	if err := json.Unmarshal(out.Bytes(), &fs); err != nil {
		t.Fatalf("doctor --json: %v: %q (stderr %q)", err, out.String(), errOut.String())
	}
	by := map[string][]finding{}
	for _, f := range fs {
		by[f.Check] = append(by[f.Check], f)
	}
	return code, by, out.String()
}

func only(t *testing.T, by map[string][]finding, check, status string) finding {
	t.Helper()
	fs := by[check]
	if len(fs) == 0 {
		t.Fatalf("no %s finding in %v", check, by)
	}
	for _, f := range fs {
		if f.Status != status {
			t.Fatalf("%s: %+v, want %s", check, f, status)
		}
	}
	return fs[0]
}

// TestDoctorGoodSetup: a direct URL and a live, healthy hub: every check
// passes, exit 0, and the text form is one line per check.
func TestDoctorGoodSetup(t *testing.T) {
	c := needDB(t)
	sock := sockPath(t)
	p := serve(t, sock, nil)
	p.ready()
	code, by, out := doctor(t, "--database-url", c.URL(), "--socket", sock, "--application-name", p.app)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	only(t, by, "database", statusPass)
	if f := only(t, by, "delivery", statusPass); !strings.Contains(f.Message, "direct connection") {
		t.Fatalf("delivery: %+v", f)
	}
	if f := only(t, by, "connections", statusPass); !strings.Contains(f.Message, "LISTEN backends: 1 of hubs") {
		t.Fatalf("connections: %+v, want the hub's one backend counted", f)
	}
	if f := only(t, by, "socket", statusPass); !strings.Contains(f.Message, "mode 0600") || !strings.Contains(f.Message, "healthy:true") {
		t.Fatalf("socket: %+v", f)
	}
	var text, errOut bytes.Buffer
	if code := run(context.Background(), []string{"doctor", "--database-url", c.URL(), "--socket", sock}, &text, &errOut); code != 0 {
		t.Fatalf("text form: exit %d: %s%s", code, text.String(), errOut.String())
	}
	for _, l := range strings.Split(strings.TrimSpace(text.String()), "\n") {
		if !strings.HasPrefix(l, "pass  ") {
			t.Fatalf("text line %q, want pass", l)
		}
	}
}

// TestDoctorHubOnAnotherDatabase: a healthy hub that serves another
// database than the URL's acks every subscription and delivers nothing
// committed on the URL's: the hub-database check fails, naming both, with
// the fix, exit 1. The same hub and its own database's URL pass.
func TestDoctorHubOnAnotherDatabase(t *testing.T) {
	c := needDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other := "lh_doctor_other"
	if err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+other); err != nil {
		t.Fatal(err)
	}
	if err := c.Exec(ctx, "CREATE DATABASE "+other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+other+" WITH (FORCE)") })
	otherURL := strings.Replace(c.URL(), "/postgres?", "/"+other+"?", 1)
	if otherURL == c.URL() {
		t.Fatalf("cannot name another database in %s", c.URL())
	}
	sock := sockPath(t)
	p := serve(t, sock, nil, "--database-url", otherURL, "--channel-prefix", "pre.")
	p.ready()
	code, by, out := doctor(t, "--database-url", c.URL(), "--socket", sock, "--channel-prefix", "pre.")
	if code != 1 {
		t.Fatalf("exit %d for a hub on another database, want 1:\n%s", code, out)
	}
	f := only(t, by, "hub-database", statusFail)
	if !strings.Contains(f.Message, "does not deliver what is committed on postgres") || !strings.Contains(f.Fix, "this database's URL") {
		t.Fatalf("hub-database: %+v", f)
	}
	code, by, out = doctor(t, "--database-url", otherURL, "--socket", sock, "--channel-prefix", "pre.")
	if code != 0 {
		t.Fatalf("exit %d for the hub's own database, want 0:\n%s", code, out)
	}
	only(t, by, "hub-database", statusPass)
}

// TestDoctorChecksDirectoriesBeforeTheFirstServe: no hub has served yet
// (no socket file), and a directory above the socket is writable by
// others: doctor names that directory and its fix, not only the missing
// socket.
func TestDoctorChecksDirectoriesBeforeTheFirstServe(t *testing.T) {
	c := needDB(t)
	top := t.TempDir()
	dir := filepath.Join(top, "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(top, 0o777); err != nil {
		t.Fatal(err)
	}
	code, by, out := doctor(t, "--database-url", c.URL(), "--socket", filepath.Join(dir, "hub.sock"))
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	found := false
	for _, f := range by["socket"] {
		if strings.Contains(f.Message, "clients refuse it") && strings.Contains(f.Message, top) && strings.Contains(f.Fix, "chmod go-w "+top) {
			found = true
		}
	}
	if !found {
		t.Fatalf("no finding names %s and its fix:\n%s", top, out)
	}
}

// TestDoctorTransactionPooler: through a transaction-pooling PgBouncer the
// delivery check fails with the pooler named and the fix, exit 1.
func TestDoctorTransactionPooler(t *testing.T) {
	c := needDB(t)
	b := pgtesting.PgBouncer(t, c, "transaction")
	code, by, out := doctor(t, "--database-url", b.URL())
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	only(t, by, "database", statusPass)
	f := only(t, by, "delivery", statusFail)
	if !strings.Contains(f.Message, "a transaction-pooling PgBouncer? use a direct URL") || !strings.Contains(f.Fix, "not a transaction pooler") {
		t.Fatalf("delivery: %+v", f)
	}
	// A session pooler delivers.
	s := pgtesting.PgBouncer(t, c, "session")
	code, by, out = doctor(t, "--database-url", s.URL())
	if code != 0 {
		t.Fatalf("session pooler: exit %d:\n%s", code, out)
	}
	if f := only(t, by, "delivery", statusPass); !strings.Contains(f.Message, "session mode") {
		t.Fatalf("delivery through a session pooler: %+v", f)
	}
}

// TestDoctorWrongSocket: a path that does not exist, a regular file and a
// socket nobody accepts on each fail the socket check, exit 1.
func TestDoctorWrongSocket(t *testing.T) {
	c := needDB(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "stale.sock")
	staleSocket(t, stale)
	for path, want := range map[string]string{
		filepath.Join(dir, "missing.sock"): "no such file",
		file:                               "is not a socket (a regular file)",
		stale:                              "no hub answers",
	} {
		code, by, out := doctor(t, "--database-url", c.URL(), "--socket", path)
		if code != 1 {
			t.Fatalf("%s: exit %d, want 1:\n%s", path, code, out)
		}
		found := false
		for _, f := range by["socket"] {
			found = found || f.Status == statusFail && strings.Contains(f.Message, want) && f.Fix != ""
		}
		if !found {
			t.Fatalf("%s: %+v, want a failure saying %q, with a fix", path, by["socket"], want)
		}
		only(t, by, "delivery", statusPass)
	}
}

// TestDoctorRelay: the relay's prerequisites on a server without logical
// decoding: wal_level and the missing publication fail, the missing slot
// is a warning (the relay creates it).
func TestDoctorRelay(t *testing.T) {
	c := needDB(t)
	code, by, out := doctor(t, "--database-url", c.URL(), "--publication", "nopub", "--slot", "noslot")
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	var wal, pub, slot bool
	for _, f := range by["relay"] {
		switch {
		case strings.HasPrefix(f.Message, "wal_level is") && f.Status == statusFail && strings.Contains(f.Fix, "wal_level = logical"):
			wal = true
		case f.Message == `publication "nopub" does not exist` && f.Status == statusFail:
			pub = true
		case f.Message == `slot "noslot" does not exist yet` && f.Status == statusWarn:
			slot = true
		}
	}
	if !wal || !pub || !slot {
		t.Fatalf("relay findings %+v", by["relay"])
	}
}

// TestDoctorScheduler: with the relay checks and a server on this host,
// the doctor reads the kernel's autogroup switch: on is a warning with the
// sysctl that turns it off, off passes, and a kernel without it says
// nothing.
func TestDoctorScheduler(t *testing.T) {
	c := needDB(t)
	pgtesting.RequireLocal(t, c)
	dir := t.TempDir()
	file := filepath.Join(dir, "sched_autogroup_enabled")
	write := func(v string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	defer func(old string) { autogroupFile = old }(autogroupFile)
	autogroupFile = file

	write("1\n")
	_, by, out := doctor(t, "--database-url", c.URL(), "--slot", "noslot")
	if f := only(t, by, "scheduler", statusWarn); !strings.Contains(f.Message, "kernel.sched_autogroup_enabled is 1") ||
		!strings.Contains(f.Fix, "sysctl -w kernel.sched_autogroup_enabled=0") {
		t.Fatalf("autogroup on: %+v\n%s", f, out)
	}
	write("0\n")
	_, by, _ = doctor(t, "--database-url", c.URL(), "--slot", "noslot")
	only(t, by, "scheduler", statusPass)
	os.Remove(file)
	if _, by, _ = doctor(t, "--database-url", c.URL(), "--slot", "noslot"); len(by["scheduler"]) != 0 {
		t.Fatalf("no switch: %+v", by["scheduler"])
	}
	write("1\n")
	if _, by, _ = doctor(t, "--database-url", c.URL()); len(by["scheduler"]) != 0 {
		t.Fatalf("without the relay checks: %+v", by["scheduler"])
	}
}

// TestServerOnThisHost: a connection counts as local only through a Unix
// socket or to a loopback address, and only when its backend is a postgres
// process here (not a forwarder's far end).
func TestServerOnThisHost(t *testing.T) {
	for _, c := range []struct {
		addr net.Addr
		want bool
	}{
		{&net.UnixAddr{Name: "/var/run/postgresql/.s.PGSQL.5432", Net: "unix"}, true},
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 5432}, true},
		{&net.TCPAddr{IP: net.ParseIP("127.0.1.1"), Port: 5432}, true},
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 5432}, true},
		{&net.TCPAddr{IP: net.ParseIP("10.0.0.5"), Port: 5432}, false},
	} {
		if got := localAddr(c.addr); got != c.want {
			t.Errorf("localAddr(%v) = %v, want %v", c.addr, got, c.want)
		}
	}
	if isPostgresProcess(os.Getpid()) {
		t.Error("the test process taken for a postgres process")
	}
	c := needDB(t)
	pgtesting.RequireLocal(t, c)
	conn := pgtesting.Connect(t, c.URL()).PgConn()
	if !serverOnThisHost(conn) {
		t.Fatalf("a connection to the test cluster (%v, backend %d) not taken for local", conn.Conn().RemoteAddr(), conn.PID())
	}
}

// staleSocket leaves a socket file at path that nobody accepts on
// (a hub that died).
func staleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}

// scratchObject runs create, the SQL that creates the database object
// kind (ROLE, PUBLICATION…) name, dropping it before and when the test ends.
func scratchObject(t *testing.T, c *pgtest.Cluster, kind, name, create string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	drop := "DROP " + kind + " IF EXISTS " + name
	c.Exec(ctx, drop)
	if err := c.Exec(ctx, create); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Exec(context.Background(), drop) })
}

// TestDoctorReplicationRole: a role without REPLICATION fails the relay
// checks with the fix the relay itself names (one text for both).
func TestDoctorReplicationRole(t *testing.T) {
	c := needDB(t)
	role := "doctor_norepl"
	scratchObject(t, c, "ROLE", role, "CREATE ROLE "+role+" LOGIN")
	u := strings.Replace(c.URL(), "postgres://postgres@", "postgres://"+role+"@", 1)
	if u == c.URL() {
		t.Skip("an external server's URL")
	}
	code, by, out := doctor(t, "--database-url", u, "--publication", "nopub")
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	want := relayfix.ReplicationRole(role)
	found := false
	for _, f := range by["relay"] {
		found = found || f.Status == statusFail && strings.Contains(f.Message, "may not open a replication connection") && f.Fix == want
	}
	if !found {
		t.Fatalf("relay findings %+v, want a failure with the fix %q", by["relay"], want)
	}
	for _, f := range by["relay"] {
		if strings.Contains(f.Message, "publication") && f.Fix != relayfix.MissingPublication("nopub") {
			t.Errorf("publication fix %q, want the relay's", f.Fix)
		}
	}
}

// TestDoctorPublicationWithoutInsert: a publication that does not publish
// insert, the relay's default --ops, is refused by the relay; doctor warns
// with the relay's own fix (relayfix.SetPublish, which the relay's error
// names too) instead of passing it.
func TestDoctorPublicationWithoutInsert(t *testing.T) {
	c := needDB(t)
	pub := "doctor_noinsert"
	scratchObject(t, c, "PUBLICATION", pub, "CREATE PUBLICATION "+pub+" WITH (publish = 'update')")
	_, by, out := doctor(t, "--database-url", c.URL(), "--publication", pub)
	want := relayfix.SetPublish(pub, "insert,update")
	found := false
	for _, f := range by["relay"] {
		found = found || f.Status == statusWarn && strings.Contains(f.Message, "does not publish insert") && f.Fix == want
	}
	if !found {
		t.Fatalf("relay findings %+v, want a warning with the fix %q\n%s", by["relay"], want, out)
	}
}
