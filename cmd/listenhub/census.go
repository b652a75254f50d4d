package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/listener"
)

// censusApp is the census connection's own application_name, so that it
// never counts itself.
const censusApp = "listenhub-census"

// runCensus prints how many backends carry the hub's application_name: 1 per
// host with a hub, against one per worker without. The line says what was
// counted (`backends with application_name "listenhub": 1`); --json prints
// {"application_name":"listenhub","backends":1} for scripts.
func runCensus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("census")
	databaseURL := fs.String("database-url", "", "PostgreSQL URL or key=value DSN (env "+envName("database-url")+", then DATABASE_URL, then the libpq PG* variables)")
	appName := fs.String("application-name", hub.DefaultConfig().ApplicationName, "application_name to count")
	asJSON := fs.Bool("json", false, `print {"application_name":NAME,"backends":N}`)
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, "census", true)
		}
		return flagError(stderr, "census", err)
	}
	if !isSet(fs, "database-url") && os.Getenv("DATABASE_URL") != "" {
		*databaseURL = os.Getenv("DATABASE_URL")
	}
	cc, err := listener.ParseConfig(*databaseURL, censusApp)
	if err != nil {
		return flagError(stderr, "census", fmt.Errorf("--database-url: %s", oneLine(err)))
	}
	cc.RuntimeParams["application_name"] = censusApp
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		fmt.Fprintf(stderr, "listenhub census: %s\n", oneLine(connectError(err)))
		return 1
	}
	defer conn.Close(context.Background())
	res := conn.ExecParams(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
		[][]byte{[]byte(*appName)}, nil, nil, nil).Read()
	if res.Err != nil {
		fmt.Fprintf(stderr, "listenhub census: %s\n", oneLine(res.Err))
		return 1
	}
	if len(res.Rows) != 1 || len(res.Rows[0]) != 1 {
		fmt.Fprintln(stderr, "listenhub census: unexpected result")
		return 1
	}
	n, err := strconv.Atoi(string(res.Rows[0][0]))
	if err != nil {
		fmt.Fprintf(stderr, "listenhub census: unexpected count %q\n", res.Rows[0][0])
		return 1
	}
	if *asJSON {
		b, _ := json.Marshal(struct {
			ApplicationName string `json:"application_name"`
			Backends        int    `json:"backends"`
		}{*appName, n})
		fmt.Fprintf(stdout, "%s\n", b)
		return 0
	}
	fmt.Fprintf(stdout, "backends with application_name %q: %d\n", *appName, n)
	return 0
}
