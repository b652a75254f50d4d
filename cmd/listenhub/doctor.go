package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/frame"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/pglisten"
	"github.com/listenhub/listenhub/internal/relayfix"
	"github.com/listenhub/listenhub/internal/sockdir"
	"github.com/listenhub/listenhub/listener"
	"github.com/listenhub/listenhub/relay"
)

// doctorApp is the doctor's own application_name, so that its census does
// not count itself.
const doctorApp = "listenhub-doctor"

// doctorTimeout bounds each wait of the doctor's checks (a notification, the
// hub's first frame).
const doctorTimeout = 3 * time.Second

// finding is one line of `listenhub doctor`: a check, its verdict, what was
// seen and, unless it passed, what to do about it.
type finding struct {
	Check   string `json:"check"`
	Status  string `json:"status"` // pass, warn or fail
	Message string `json:"message"`
	Fix     string `json:"fix,omitempty"`
}

const (
	statusPass = "pass"
	statusWarn = "warn"
	statusFail = "fail"
)

const doctorDescription = `
Checks a set-up and prints one line per check: pass, warn or fail, what was
seen and, unless it passed, the fix. Exits 1 when any check failed.

  database     the URL connects
  delivery     notifications arrive on it (a private LISTEN and NOTIFY; a
               second session's NOTIFY when a pooler is suspected)
  connections  max_connections headroom against the backends in use and
               the LISTEN backends of hubs and fallen-back workers
  socket       (--socket) exists, is a socket, its mode and owner, and a
               live hub answers on it with its status
  hub-database (--socket, a healthy hub) a NOTIFY of a private name
               committed on the URL's database comes back through the hub
               (--channel-prefix, --channel-suffix: the hub's)
  relay        (--publication, --slot) wal_level, the REPLICATION
               attribute, the publication and what it publishes, the
               slot and its lag
  scheduler    (relay checks, a server on this host) the kernel's
               autogroup scheduling, which delays a busy server's walsender
`

// runDoctor is `listenhub doctor`.
func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("doctor")
	databaseURL := fs.String("database-url", "", "PostgreSQL `URL` or key=value DSN to check (env "+envName("database-url")+", then DATABASE_URL, then the libpq PG* variables)")
	socket := fs.String("socket", "", "the hub's socket `PATH` to check (env "+envName("socket")+"; not checked when empty)")
	appName := fs.String("application-name", hub.DefaultConfig().ApplicationName, "the hubs' application_name `NAME`, counted as LISTEN backends (and NAME-local for fallen-back workers)")
	publication := fs.String("publication", "", "the relay's publication `NAME` to check (relay checks off when this and --slot are empty)")
	slot := fs.String("slot", "", "the relay's replication slot `NAME` to check")
	prefix := fs.String("channel-prefix", "", "the hub's --channel-prefix, for the check that it hears the URL's database")
	suffix := fs.String("channel-suffix", "", "the hub's --channel-suffix, for the check that it hears the URL's database")
	asJSON := fs.Bool("json", false, "print the findings as a JSON array")
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, "doctor", true)
			fmt.Fprint(stdout, doctorDescription)
		}
		return flagError(stderr, "doctor", err)
	}
	if !isSet(fs, "database-url") && os.Getenv("DATABASE_URL") != "" {
		*databaseURL = os.Getenv("DATABASE_URL")
	}
	var fs2 []finding
	add := func(f finding) { fs2 = append(fs2, f) }
	ctx, cancel := context.WithTimeout(ctx, 2*connectTimeout)
	defer cancel()

	doctorDatabase(ctx, *databaseURL, *appName, *publication, *slot, add)
	if *socket != "" && doctorSocket(*socket, add) {
		doctorHubDatabase(ctx, *socket, *databaseURL, *prefix, *suffix, add)
	}

	failed := false
	for _, f := range fs2 {
		failed = failed || f.Status == statusFail
	}
	if *asJSON {
		b, _ := json.MarshalIndent(fs2, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		for _, f := range fs2 {
			line := fmt.Sprintf("%-4s  %-11s  %s", f.Status, f.Check, f.Message)
			if f.Fix != "" {
				line += " (fix: " + f.Fix + ")"
			}
			fmt.Fprintln(stdout, line)
		}
	}
	if failed {
		return 1
	}
	return 0
}

// doctorDatabase runs the checks of the URL: it connects, proves delivery,
// counts the connection budget and, when asked, the relay's prerequisites.
func doctorDatabase(ctx context.Context, url, app, publication, slot string, add func(finding)) {
	if url == "" && !pgEnvNamesServer() {
		add(finding{"database", statusFail, "no database named",
			"give --database-url URL (or set " + envName("database-url") + ", DATABASE_URL or PGHOST…)"})
		return
	}
	cc, err := listener.ParseConfig(url, doctorApp)
	if err != nil {
		add(finding{"database", statusFail, oneLine(err), "a URL looks like postgres://user:password@host:5432/dbname"})
		return
	}
	cc.RuntimeParams["application_name"] = doctorApp
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	conn, err := pgconn.ConnectConfig(cctx, cc)
	cancel()
	if err != nil {
		add(finding{"database", statusFail, oneLine(connectError(err)), "check the host, port, user, password and database of the URL"})
		return
	}
	defer conn.Close(context.Background())
	add(finding{"database", statusPass, fmt.Sprintf("connected to %s as %s, database %s", hostPort(cc), cc.User, cc.Database), ""})

	d, err := pglisten.CheckDelivery(ctx, cc, doctorTimeout)
	switch {
	case err == nil && d.Pooled():
		add(finding{"delivery", statusPass, fmt.Sprintf("notifications arrive, through a pooler in session mode (backend pid %d, BackendKeyData pid %d)", d.BackendPID, d.KeyDataPID), ""})
	case err == nil:
		add(finding{"delivery", statusPass, fmt.Sprintf("notifications arrive; direct connection (backend pid %d)", d.BackendPID), ""})
	case errors.Is(err, listener.ErrNotDelivered) && d.Pooled():
		add(finding{"delivery", statusFail, oneLine(err), "point --database-url at PostgreSQL itself (or a session-pooled PgBouncer database), not a transaction pooler"})
	default:
		add(finding{"delivery", statusFail, oneLine(err), "LISTEN/NOTIFY must work on this connection: a direct URL to the primary"})
	}

	doctorBudget(ctx, conn, app, add)
	if publication != "" || slot != "" {
		doctorRelay(ctx, conn, publication, slot, add)
		if serverOnThisHost(conn) {
			doctorScheduler(autogroupFile, add)
		}
	}
}

// autogroupFile is the kernel's autogroup switch (a variable for tests).
var autogroupFile = "/proc/sys/kernel/sched_autogroup_enabled"

// doctorScheduler warns when the kernel's autogroup scheduling is on where
// PostgreSQL runs. Every PostgreSQL backend calls setsid, so with autogroup
// each one is a scheduling entity of its own, and on a host whose cores the
// writers fill the walsender fell far behind the commits: at 16 writers the
// relay's wake p99 was about 8 times what it was with autogroup off
// (docs/relay.md). A kernel without the switch has no autogroup: nothing to
// say.
func doctorScheduler(path string, add func(finding)) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	switch v := strings.TrimSpace(string(b)); v {
	case "":
	case "0":
		add(finding{"scheduler", statusPass, "kernel.sched_autogroup_enabled is 0", ""})
	default:
		add(finding{"scheduler", statusWarn, "kernel.sched_autogroup_enabled is " + v + " on the database's host: a busy server's walsender falls behind and wakes come late",
			"sysctl -w kernel.sched_autogroup_enabled=0, and the same line in /etc/sysctl.d/ to keep it"})
	}
}

// serverOnThisHost reports whether conn's server runs on this host: the
// connection is a Unix socket or goes to a loopback address, and its
// backend (BackendKeyData's pid) is a postgres process here. A forwarder on
// localhost (ssh -L, kubectl port-forward, a proxy or a pooler) fails the
// second test, and the sysctl read here would be the wrong host's.
func serverOnThisHost(conn *pgconn.PgConn) bool {
	return localAddr(conn.Conn().RemoteAddr()) && isPostgresProcess(int(conn.PID()))
}

func localAddr(a net.Addr) bool {
	switch a := a.(type) {
	case *net.UnixAddr:
		return true
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	}
	return false
}

// isPostgresProcess reports whether pid is a PostgreSQL process on this
// host (its title, in /proc/PID/cmdline, starts "postgres").
func isPostgresProcess(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && strings.HasPrefix(string(b), "postgres")
}

// connectError is listener's wording of a failed connect: when the server
// refused us, its reason comes first (pgconn lists every attempt in order,
// so "tls error: server refused TLS connection" would lead).
func connectError(err error) error {
	var pe *pgconn.PgError
	var ce *pgconn.ConnectError
	if errors.As(err, &pe) && errors.As(err, &ce) && ce.Config != nil {
		return fmt.Errorf("connect to `user=%s database=%s`: %s", ce.Config.User, ce.Config.Database, pe.Error())
	}
	return fmt.Errorf("connect: %w", err)
}

func hostPort(cc *pgconn.Config) string {
	if strings.HasPrefix(cc.Host, "/") {
		return fmt.Sprintf("%s (socket, port %d)", cc.Host, cc.Port)
	}
	return net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
}

// query runs sql with text params and returns the first row's columns.
func query(ctx context.Context, conn *pgconn.PgConn, sql string, params ...string) ([]string, error) {
	var ps [][]byte
	for _, p := range params {
		ps = append(ps, []byte(p))
	}
	qctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()
	res := conn.ExecParams(qctx, sql, ps, nil, nil, nil).Read()
	if res.Err != nil {
		return nil, res.Err
	}
	if len(res.Rows) == 0 {
		return nil, nil
	}
	row := make([]string, len(res.Rows[0]))
	for i, v := range res.Rows[0] {
		row[i] = string(v)
	}
	return row, nil
}

// doctorBudget weighs max_connections against what is in use: every worker
// whose hub goes away opens a LISTEN connection of its own, so a server with
// no room left turns a hub restart into refused connections.
func doctorBudget(ctx context.Context, conn *pgconn.PgConn, app string, add func(finding)) {
	row, err := query(ctx, conn, `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int,
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int,
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND application_name = $1)::int,
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND application_name = $2)::int`,
		app, app+"-local")
	if err != nil || len(row) != 5 {
		add(finding{"connections", statusWarn, fmt.Sprintf("cannot read the connection budget: %v", err), "run the doctor as a role that may read pg_stat_activity and pg_settings"})
		return
	}
	n := make([]int, 5)
	for i, v := range row {
		n[i], _ = strconv.Atoi(v)
	}
	maxConn, reserved, inUse, hubs, locals := n[0], n[1], n[2], n[3], n[4]
	free := maxConn - reserved - inUse
	msg := fmt.Sprintf("max_connections %d (%d reserved), %d in use, %d free; LISTEN backends: %d of hubs (%q), %d of workers listening on their own (%q)",
		maxConn, reserved, inUse, free, hubs, app, locals, app+"-local")
	switch {
	case free < 2:
		add(finding{"connections", statusFail, msg, "raise max_connections or close idle connections: a hub needs one to reconnect, and every worker that falls back needs its own"})
	case free < max(5, maxConn/10):
		add(finding{"connections", statusWarn, msg, "little headroom: if the hub goes away, each of its workers opens a LISTEN connection of its own; raise max_connections or keep the hub up"})
	case locals > 0:
		add(finding{"connections", statusWarn, msg, "workers are on their own LISTEN connections: is their hub down, or their --socket wrong?"})
	default:
		add(finding{"connections", statusPass, msg, ""})
	}
}

// doctorRelay checks what `listenhub relay` needs: logical decoding, its
// publication, its slot and how far behind the slot is.
func doctorRelay(ctx context.Context, conn *pgconn.PgConn, publication, slot string, add func(finding)) {
	row, err := query(ctx, conn, "SELECT current_setting('wal_level')")
	switch {
	case err != nil || len(row) != 1:
		add(finding{"relay", statusFail, fmt.Sprintf("cannot read wal_level: %v", err), ""})
		return
	case row[0] != "logical":
		add(finding{"relay", statusFail, fmt.Sprintf("wal_level is %s", row[0]), relayfix.WalLevel})
	default:
		add(finding{"relay", statusPass, "wal_level is logical", ""})
	}
	// The relay's replication connection needs the REPLICATION attribute.
	row, err = query(ctx, conn, "SELECT (rolreplication OR rolsuper)::text, current_user FROM pg_roles WHERE rolname = current_user")
	switch {
	case err != nil || len(row) != 2:
		add(finding{"relay", statusFail, fmt.Sprintf("cannot read the role's attributes: %v", err), ""})
	case row[0] != "true":
		add(finding{"relay", statusFail, fmt.Sprintf("role %q may not open a replication connection", row[1]), relayfix.ReplicationRole(row[1])})
	default:
		add(finding{"relay", statusPass, fmt.Sprintf("role %q may open a replication connection", row[1]), ""})
	}
	if publication != "" {
		row, err := query(ctx, conn, "SELECT count(*) FROM pg_publication WHERE pubname = $1", publication)
		switch {
		case err != nil || len(row) != 1:
			add(finding{"relay", statusFail, fmt.Sprintf("cannot look up publication %q: %v", publication, err), ""})
		case row[0] == "0":
			add(finding{"relay", statusFail, fmt.Sprintf("publication %q does not exist", publication), relayfix.MissingPublication(publication)})
		default:
			add(finding{"relay", statusPass, fmt.Sprintf("publication %q exists", publication), ""})
			doctorPublished(ctx, conn, publication, add)
		}
	}
	if slot != "" {
		row, err := query(ctx, conn, `SELECT active::text, coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint,
			coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, slot)
		switch {
		case err != nil:
			add(finding{"relay", statusFail, fmt.Sprintf("cannot look up slot %q: %v", slot, err), ""})
		case len(row) == 3 && row[2] == "lost":
			add(finding{"relay", statusFail, fmt.Sprintf("slot %q is invalidated (wal_status lost: past max_slot_wal_keep_size)", slot), relayfix.RecreateSlot(slot)})
		case len(row) != 3:
			add(finding{"relay", statusWarn, fmt.Sprintf("slot %q does not exist yet", slot), "listenhub relay creates it at its first start"})
		default:
			lag, _ := strconv.ParseInt(row[1], 10, 64)
			msg := fmt.Sprintf("slot %q: active %s, %s of WAL behind", slot, row[0], byteSize(lag))
			switch {
			case lag > 1<<30:
				add(finding{"relay", statusWarn, msg, "the slot holds WAL back: is the relay running and keeping up? (drop the slot if the relay is gone for good)"})
			case row[0] != "true":
				add(finding{"relay", statusWarn, msg, "no relay is streaming from the slot: start listenhub relay"})
			default:
				add(finding{"relay", statusPass, msg, ""})
			}
		}
	}
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// doctorSocket checks the hub's socket: the file (without following a
// link), its mode and owner, and that a hub answers on it with a status.
// doctorSocket checks the socket and the hub on it; it reports whether a
// healthy hub answered.
func doctorSocket(path string, add func(finding)) bool {
	// What every client checks before it connects (internal/sockdir): a
	// directory on the way that it refuses makes it fall back to a
	// connection of its own, however well the hub runs. Checked before
	// the socket, so that a set-up is checked before its first serve.
	trusted := func(uid uint32) bool { return uid == 0 || int(uid) == os.Geteuid() }
	if u, err := sockdir.Chain(filepath.Dir(path), trusted); err == nil && u != nil {
		add(finding{"socket", statusFail, fmt.Sprintf("%s: clients refuse it: %v", path, u), u.Fix})
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		fix := "start listenhub serve --socket " + path + ", or give the --socket it was started with"
		if dir := filepath.Dir(path); errors.Is(err, fs.ErrNotExist) && !exists(dir) {
			fix = "install -d -m 0755 " + dir + " (owned by the hub's user), then start listenhub serve --socket " + path
		}
		add(finding{"socket", statusFail, fmt.Sprintf("%s: %v", path, err), fix})
		return false
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		add(finding{"socket", statusFail, fmt.Sprintf("%s is not a socket (%s)", path, fileType(uint32(st.Mode))), "give the path the hub listens on (serve --socket)"})
		return false
	}
	mode := os.FileMode(st.Mode & 0o777)
	desc := fmt.Sprintf("%s: socket, mode %04o, owner uid %d", path, mode, st.Uid)
	if mode&0o077 != 0 {
		add(finding{"socket", statusWarn, desc, "a hub creates its socket 0600: others than its owner may connect (the hub still checks their uid)"})
	}
	if uid := uint32(os.Geteuid()); st.Uid != uid && st.Uid != 0 {
		add(finding{"socket", statusWarn, fmt.Sprintf("%s belongs to uid %d, not to us (uid %d) or root", path, st.Uid, uid),
			"run the workers as the hub's user, or tell the client that uid (client.Options.AllowUIDs) and the hub ours (--allow-uid)"})
	}
	healthy, err := hubStatus(path)
	switch {
	case err != nil:
		add(finding{"socket", statusFail, fmt.Sprintf("%s: no hub answers: %v", desc, err), "start the hub (a stale socket file is replaced when it starts)"})
	case !healthy:
		add(finding{"socket", statusWarn, desc + "; the hub answers, healthy:false (its Postgres connection is down or does not deliver)", "see the hub's log, and this doctor's database checks against its URL"})
	default:
		add(finding{"socket", statusPass, desc + "; the hub answers, healthy:true", ""})
		return true
	}
	return false
}

// doctorHubDatabase checks that the hub on path hears the database of url,
// as the clients check at start: it subscribes a private name through the
// hub, commits a NOTIFY of it on its own connection to url, and waits for
// the hub to deliver it. A hub on another database (or cluster) acks every
// sub and delivers nothing the application commits: every worker that
// trusts it waits for wakes that never come.
func doctorHubDatabase(ctx context.Context, path, url, prefix, suffix string, add func(finding)) {
	if url == "" && !pgEnvNamesServer() {
		return // no database to compare with: said by the database check
	}
	b := make([]byte, 4)
	rand.Read(b)
	q := "lh.doctor." + hex.EncodeToString(b)
	token := hex.EncodeToString(b) + "-" + strconv.Itoa(os.Getpid())
	c, err := net.DialTimeout("unix", path, doctorTimeout)
	if err != nil {
		return // said by the socket check
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * doctorTimeout))
	if _, err := c.Write(frame.AppendSub(nil, q)); err != nil {
		return
	}
	var dec frame.Decoder
	buf := make([]byte, 4096)
	next := func() (frame.Message, error) {
		for {
			m, ok, err := dec.Next()
			if err != nil || ok {
				return m, err
			}
			n, err := c.Read(buf)
			if n > 0 {
				dec.Feed(buf[:n])
				continue
			}
			if err != nil {
				return m, err
			}
		}
	}
	for {
		m, err := next()
		if err != nil {
			add(finding{"hub-database", statusFail, fmt.Sprintf("%s: no ack for a subscription: %v", path, err), "see the hub's log"})
			return
		}
		if m.Type == frame.TypeAck && m.Name == q {
			break
		}
		if m.Type == frame.TypeNack && m.Name == q {
			add(finding{"hub-database", statusFail, fmt.Sprintf("%s: the hub refused a subscription: %s", path, m.Error), "see the hub's log"})
			return
		}
	}
	cc, err := listener.ParseConfig(url, doctorApp)
	if err != nil {
		return // said by the database check
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := pgconn.ConnectConfig(cctx, cc)
	if err != nil {
		return // said by the database check
	}
	_, err = conn.ExecParams(cctx, "SELECT pg_notify($1, $2)", [][]byte{[]byte(prefix + q + suffix), []byte(token)}, nil, nil, nil).Close()
	conn.Close(context.Background())
	if err != nil {
		return
	}
	for {
		m, err := next()
		if err != nil {
			add(finding{"hub-database", statusFail,
				fmt.Sprintf("the hub at %s does not deliver what is committed on %s at %s: a NOTIFY there did not come back through it within %v (it serves another database or cluster, or its --channel-prefix/--channel-suffix differ from the ones given here)",
					path, cc.Database, hostPort(cc), 2*doctorTimeout),
				"run the hub with this database's URL (or give doctor the hub's --channel-prefix and --channel-suffix)"})
			return
		}
		if m.Type == frame.TypeWake && m.Name == q && m.Payload == token {
			add(finding{"hub-database", statusPass, fmt.Sprintf("the hub at %s delivers what is committed on %s at %s", path, cc.Database, hostPort(cc)), ""})
			return
		}
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func fileType(m uint32) string {
	switch m & syscall.S_IFMT {
	case syscall.S_IFREG:
		return "a regular file"
	case syscall.S_IFDIR:
		return "a directory"
	case syscall.S_IFLNK:
		return "a symbolic link"
	case syscall.S_IFIFO:
		return "a FIFO"
	}
	return fmt.Sprintf("type %o", m&syscall.S_IFMT)
}

// hubStatus connects to the socket and reads the status frame a hub sends
// on connect.
func hubStatus(path string) (bool, error) {
	c, err := net.DialTimeout("unix", path, doctorTimeout)
	if err != nil {
		return false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(doctorTimeout))
	var dec frame.Decoder
	buf := make([]byte, 4096)
	for {
		m, ok, err := dec.Next()
		if err != nil {
			return false, fmt.Errorf("not a hub: %w", err)
		}
		if ok {
			if m.Type != frame.TypeStatus {
				return false, fmt.Errorf("not a hub: first frame %q, want status", m.Type)
			}
			return m.Healthy, nil
		}
		n, err := c.Read(buf)
		if n > 0 {
			dec.Feed(buf[:n])
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return false, errors.New("closed without a word (a uid the hub does not allow?)")
			}
			return false, err
		}
	}
}

// doctorPublished warns when the publication does not publish insert, the
// relay's default --ops, which the relay refuses at start (doctor does not
// know the relay's --ops: a warning, with the relay's own fix).
func doctorPublished(ctx context.Context, conn *pgconn.PgConn, publication string, add func(finding)) {
	row, err := query(ctx, conn, `SELECT concat_ws(',', CASE WHEN pubinsert THEN 'insert' END, CASE WHEN pubupdate THEN 'update' END,
		CASE WHEN pubdelete THEN 'delete' END, CASE WHEN pubtruncate THEN 'truncate' END) FROM pg_publication WHERE pubname = $1`, publication)
	if err != nil || len(row) != 1 {
		return
	}
	published, err := relay.ParseOps(row[0])
	if row[0] == "" {
		published, err = 0, nil
	}
	if err != nil || published&relay.OpInsert != 0 {
		return
	}
	add(finding{"relay", statusWarn,
		fmt.Sprintf("publication %q does not publish insert, which the relay NOTIFYs by default (--ops insert); it refuses to start on it", publication),
		relayfix.SetPublish(publication, (published | relay.OpInsert).String())})
}
