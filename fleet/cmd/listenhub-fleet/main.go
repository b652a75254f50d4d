// Command listenhub-fleet runs the NATS side of a listenhub fleet: the
// bridge that holds a database's one LISTEN connection for every host, and
// a hub fed through NATS instead of a Postgres connection of its own. It is
// built from the fleet module, so that the main module (and the listenhub
// binary) keep their dependencies: x/sys and pgx.
//
//	listenhub-fleet bridge --database-url URL --nats URL [flags]
//	listenhub-fleet serve --socket PATH --upstream URL --database NAME [flags]
//	listenhub-fleet demo [--hubs N]
//
// Every flag is also read from LISTENHUB_ and its name in capitals, dashes
// as underscores; the command line wins.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"

	"github.com/listenhub/listenhub/fleet"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/monitor"
)

const usage = `listenhub-fleet bridge --database-url URL --nats URL [--subject-prefix P] [--database NAME] [--nats-ca FILE] [--nats-user U --nats-password-file F | --nats-token-file F]
    hold the database's one LISTEN for the fleet and publish every notification on NATS (run two or more: one is active)
listenhub-fleet serve --socket PATH --upstream URL (--database NAME | --database-url URL) [--subject-prefix P] [--hub-id ID] [--metrics-addr ADDR] [NATS flags as bridge's]
    a hub whose notifications come from NATS through the active bridge; no Postgres connection
listenhub-fleet demo [--hubs N] [--rate N] [--duration D] [--database-url URL]
    a local NATS, a throwaway cluster, a bridge and N hubs with a worker each; a line a second
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var err error
	switch os.Args[1] {
	case "bridge":
		err = runBridge(ctx, log, os.Args[2:])
	case "serve":
		err = runServe(ctx, log, os.Args[2:])
	case "demo":
		err = runDemo(ctx, os.Stdout, os.Args[2:])
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "listenhub-fleet: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, "listenhub-fleet:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "listenhub-fleet:", err)
		os.Exit(1)
	}
}

type usageError struct{ error }

// natsFlags are the NATS connection's flags, bridge's and serve's.
type natsFlags struct {
	url, ca, user, passwordFile, tokenFile, prefix, database *string
}

func addNATSFlags(fs *flag.FlagSet, urlFlag, urlHelp string) natsFlags {
	return natsFlags{
		url:          fs.String(urlFlag, "", urlHelp),
		ca:           fs.String("nats-ca", "", "PEM file of the CA that signed the NATS servers' certificates (TLS)"),
		user:         fs.String("nats-user", "", "NATS user (its password from --nats-password-file)"),
		passwordFile: fs.String("nats-password-file", "", "file holding the NATS user's password"),
		tokenFile:    fs.String("nats-token-file", "", "file holding a NATS token"),
		prefix:       fs.String("subject-prefix", fleet.DefaultPrefix, "the subjects' prefix (one fleet's, on a shared NATS)"),
		database:     fs.String("database", "", "the database's name in the subjects (bridge: the URL's by default)"),
	}
}

// parse reads the flags, then LISTENHUB_ variables for those not given.
func parse(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		if v, ok := os.LookupEnv("LISTENHUB_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))); ok {
			if e := f.Value.Set(v); e != nil {
				err = usageError{fmt.Errorf("LISTENHUB_%s: %w", strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_")), e)}
			}
		}
	})
	return err
}

// redact is a URL for a log line: its password or token never printed.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(a NATS URL that does not parse)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		} else {
			u.User = url.User("xxxxx") // a token
		}
	}
	return u.String()
}

func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// connect dials NATS for ever (reconnects included), with the handlers
// given.
func (nf natsFlags) connect(log *slog.Logger, name string, extra ...nats.Option) (*nats.Conn, error) {
	if *nf.url == "" {
		return nil, usageError{errors.New("no NATS URL")}
	}
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true)}
	if *nf.ca != "" {
		pem, err := os.ReadFile(*nf.ca)
		if err != nil {
			return nil, fmt.Errorf("--nats-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--nats-ca: no certificate in %s", *nf.ca)
		}
		opts = append(opts, nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	}
	switch {
	case *nf.user != "":
		pw := ""
		if *nf.passwordFile != "" {
			var err error
			if pw, err = readSecret(*nf.passwordFile); err != nil {
				return nil, fmt.Errorf("--nats-password-file: %w", err)
			}
		}
		opts = append(opts, nats.UserInfo(*nf.user, pw))
	case *nf.tokenFile != "":
		tok, err := readSecret(*nf.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--nats-token-file: %w", err)
		}
		opts = append(opts, nats.Token(tok))
	}
	opts = append(opts, extra...)
	nc, err := nats.Connect(*nf.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("NATS %s: %w", redact(*nf.url), err)
	}
	log.Info("NATS", "url", redact(*nf.url), "connected", nc.IsConnected())
	return nc, nil
}

func runBridge(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("bridge", flag.ContinueOnError)
	dbURL := fs.String("database-url", "", "the database whose LISTEN the fleet shares (direct or session-pooled)")
	nf := addNATSFlags(fs, "nats", "NATS URL(s), comma-separated (nats://host:4222)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *dbURL == "" {
		return usageError{errors.New("bridge: no --database-url")}
	}
	cc, err := pgconn.ParseConfig(*dbURL)
	if err != nil {
		return fmt.Errorf("bridge: --database-url: %w", err)
	}
	name := *nf.database
	if name == "" {
		name = cc.Database
	}
	subj, err := fleet.NewSubjects(*nf.prefix, name)
	if err != nil {
		return usageError{err}
	}
	nc, err := nf.connect(log, "listenhub-fleet bridge")
	if err != nil {
		return err
	}
	defer nc.Close()
	b, err := fleet.NewBridge(fleet.BridgeOptions{ConnConfig: cc, NATS: nc, Subjects: subj, Logger: log})
	if err != nil {
		return err
	}
	log.Info("fleet bridge: starting", "database", name, "prefix", *nf.prefix)
	return b.Run(ctx)
}

func runServe(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	socket := fs.String("socket", "", "the hub's Unix socket")
	hubID := fs.String("hub-id", "", "this hub's name at the bridge (default: the host name and the socket)")
	metricsAddr := fs.String("metrics-addr", "", "host:port of /metrics, /healthz and /status (empty: none)")
	dbURL := fs.String("database-url", "", "only for the database's name in the subjects, when --database is not given (no connection is made)")
	nf := addNATSFlags(fs, "upstream", "NATS URL(s) the hub takes its notifications from (nats://host:4222)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *socket == "" {
		return usageError{errors.New("serve: no --socket")}
	}
	if *nf.database == "" && *dbURL != "" {
		cc, err := pgconn.ParseConfig(*dbURL)
		if err != nil {
			return usageError{fmt.Errorf("serve: --database-url: %w", err)}
		}
		*nf.database = cc.Database
	}
	if *nf.database == "" {
		return usageError{errors.New("serve: no --database (the bridge's database name in the subjects) nor --database-url")}
	}
	subj, err := fleet.NewSubjects(*nf.prefix, *nf.database)
	if err != nil {
		return usageError{err}
	}
	if *hubID == "" {
		host, _ := os.Hostname()
		*hubID = host + ":" + *socket
	}
	// The handlers run on NATS's goroutines, before the Upstream exists
	// for the first connect.
	var upp atomic.Pointer[fleet.Upstream]
	nc, err := nf.connect(log, "listenhub-fleet hub "+*hubID,
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if up := upp.Load(); up != nil {
				d, _ := up.Watch()
				d(c, err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			if up := upp.Load(); up != nil {
				_, r := up.Watch()
				r(c)
			}
		}))
	if err != nil {
		return err
	}
	defer nc.Close()
	up, err := fleet.NewUpstream(fleet.UpstreamOptions{NATS: nc, Subjects: subj, HubID: *hubID, Logger: log})
	if err != nil {
		return err
	}
	upp.Store(up)
	h, err := hub.New(hub.Config{SocketPath: *socket, Upstream: up, Logger: log})
	if err != nil {
		return err
	}
	if err := h.Start(ctx); err != nil {
		return err
	}
	if *metricsAddr != "" {
		srv, err := monitor.Start(ctx, *metricsAddr, h, monitor.Options{Logger: log})
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	select {
	case <-ctx.Done():
	case <-h.Done():
		return h.Wait()
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return h.Stop(sctx)
}
