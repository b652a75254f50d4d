package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/monitor"
)

// defaultMetricsAddr is where the shipped units and manifests serve the
// metrics, so `listenhub status` on the same host needs no flag. Port 9064:
// Prometheus' exporter range (9100-9999, and its continuation past 10000)
// is fully allocated, 9090-9094 are Prometheus' own components, and 9187,
// the port first used here, is postgres_exporter's.
const defaultMetricsAddr = "127.0.0.1:9064"

// statusTimeout bounds the whole of `listenhub status`: a few small HTTP
// requests to a server on this host.
const statusTimeout = 10 * time.Second

// runStatus is `listenhub status`: the summary, workers and channels of a
// running hub, read from the JSON endpoints of its --metrics-addr
// (package monitor) and printed as aligned tables, or as that JSON.
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("status")
	addr := fs.String("metrics-addr", defaultMetricsAddr, "the hub's --metrics-addr: host:port, or an http:// URL")
	onlyWorkers := fs.Bool("workers", false, "only the workers table")
	onlyChannels := fs.Bool("channels", false, "only the channels table")
	limit := fs.Int("limit", hub.DefaultListLimit, fmt.Sprintf("rows per table, 1 to %d", hub.MaxListLimit))
	offset := fs.Int("offset", 0, "skip this many rows of the sorted list")
	sortBy := fs.String("sort", "", fmt.Sprintf("with --workers: %s; with --channels: %s (largest first; default the first, ascending)",
		strings.Join(hub.WorkerSorts(), ", "), strings.Join(hub.ChannelSorts(), ", ")))
	asJSON := fs.Bool("json", false, "print the JSON of the endpoints instead of tables")
	tokenFile := fs.String("metrics-token-file", "", "the bearer token file of serve --metrics-token-file, when the hub requires one")
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, "status", true)
		}
		return flagError(stderr, "status", err)
	}
	bad := func(err error) int { return flagError(stderr, "status", err) }
	switch {
	case *addr == "":
		return bad(errors.New("--metrics-addr must not be empty (the address serve --metrics-addr listens on)"))
	case *onlyWorkers && *onlyChannels:
		return bad(errors.New("--workers and --channels exclude each other (neither shows both)"))
	case *sortBy != "" && !*onlyWorkers && !*onlyChannels:
		return bad(errors.New("--sort needs --workers or --channels"))
	case *limit < 1 || *limit > hub.MaxListLimit:
		return bad(fmt.Errorf("--limit must be 1 to %d (got %d)", hub.MaxListLimit, *limit))
	case *offset < 0:
		return bad(fmt.Errorf("--offset must not be negative (got %d)", *offset))
	}
	var token string
	if *tokenFile != "" {
		var err error
		if token, err = monitor.ReadTokenFile(*tokenFile); err != nil {
			return bad(fmt.Errorf("--metrics-token-file: %w", err))
		}
	}
	base := *addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	base = strings.TrimSuffix(base, "/")
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	page := url.Values{"limit": {strconv.Itoa(*limit)}, "offset": {strconv.Itoa(*offset)}}
	if *sortBy != "" {
		page.Set("sort", *sortBy)
	}
	get := func(path string, v any) (json.RawMessage, error) {
		return getJSON(ctx, base+path, token, v)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "listenhub status: %v\n", err)
		if errors.As(err, new(*unreachableError)) {
			fmt.Fprintln(stderr, unreachableHint(*addr, isSet(fs, "metrics-addr")))
		}
		return 1
	}

	var (
		st        monitor.Status
		ws        hub.WorkerList
		cs        hub.ChannelList
		raw       = map[string]json.RawMessage{}
		wantW     = !*onlyChannels
		wantC     = !*onlyWorkers
		wantStats = !*onlyWorkers && !*onlyChannels
		err       error
	)
	// A relay (serve --relay, or listenhub relay on its own) answers
	// /relay; a relay on its own has no hub endpoints.
	rj, relayRaw, err := getRelay(ctx, base, token)
	if err != nil {
		return fail(err)
	}
	if rj != nil {
		if _, found, err := getOptional(ctx, base+"/status", token, &st); err != nil {
			return fail(err)
		} else if !found {
			if !wantStats {
				return fail(errors.New("this is a relay's metrics server: it has no workers or channels"))
			}
			if *asJSON {
				fmt.Fprintf(stdout, "{\"relay\":%s}\n", relayRaw)
				return 0
			}
			printRelay(stdout, *addr, rj)
			return 0
		}
	}
	if wantStats {
		if raw["status"], err = get("/status", &st); err != nil {
			return fail(err)
		}
	}
	if wantW {
		if raw["workers"], err = get("/workers?"+page.Encode(), &ws); err != nil {
			return fail(err)
		}
	}
	if wantC {
		if raw["channels"], err = get("/channels?"+page.Encode(), &cs); err != nil {
			return fail(err)
		}
	}

	if *asJSON {
		var out []byte
		switch {
		case *onlyWorkers:
			out = raw["workers"]
		case *onlyChannels:
			out = raw["channels"]
		default:
			out, _ = json.Marshal(struct {
				Status   json.RawMessage `json:"status"`
				Relay    json.RawMessage `json:"relay,omitempty"`
				Workers  json.RawMessage `json:"workers"`
				Channels json.RawMessage `json:"channels"`
			}{raw["status"], relayRaw, raw["workers"], raw["channels"]})
		}
		fmt.Fprintf(stdout, "%s\n", out)
		return 0
	}

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	if wantStats {
		healthy := "no"
		if st.Healthy {
			healthy = "yes"
		}
		fmt.Fprintf(tw, "hub\t%s (pid %d)\n", *addr, st.PID)
		fmt.Fprintf(tw, "healthy\t%s\n", healthy)
		fmt.Fprintf(tw, "uptime\t%s\n", time.Duration(st.UptimeSeconds*float64(time.Second)).Round(time.Second))
		fmt.Fprintf(tw, "workers\t%d\n", st.Workers)
		fmt.Fprintf(tw, "channels\t%d LISTENed\n", st.Channels)
		fmt.Fprintf(tw, "version\t%s (revision %s, %s)\n", st.Version, shortRevision(st.Revision), st.GoVersion)
		tw.Flush()
		if rj != nil {
			fmt.Fprintln(stdout)
			printRelay(stdout, "", rj)
		}
	}
	now := time.Now()
	if wantW {
		if wantStats {
			fmt.Fprintln(stdout)
		}
		fmt.Fprintln(stdout, pageTitle("workers", ws.Offset, len(ws.Workers), ws.Total, ws.Sort))
		if len(ws.Workers) > 0 {
			fmt.Fprintln(tw, "ID\tPID\tUID\tCONNECTED\tSUBS\tNAMES\tBACKLOG\tBYTES\tDURABLE\tSENT\tCOALESCED\tDROPPED")
			for _, w := range ws.Workers {
				fmt.Fprintf(tw, "%d\t%d\t%d\t%s ago\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n",
					w.ID, w.PID, w.UID, now.Sub(w.ConnectedAt).Round(time.Second), w.Subscriptions,
					nameList(w.Names, w.Subscriptions), w.BacklogFrames, w.BacklogBytes, w.DurablePending,
					w.FramesSent, w.DurableCoalesced, w.DurableDropped)
			}
			tw.Flush()
		}
	}
	if wantC {
		if wantStats || wantW {
			fmt.Fprintln(stdout)
		}
		fmt.Fprintln(stdout, pageTitle("channels", cs.Offset, len(cs.Channels), cs.Total, cs.Sort))
		if len(cs.Channels) > 0 {
			fmt.Fprintln(tw, "NAME\tCHANNEL\tSTATE\tSUBSCRIBERS\tWAITING\tRECEIVED\tDELIVERED")
			for _, c := range cs.Channels {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", cell(c.Name), cell(c.Channel), c.State,
					c.Subscribers, c.Waiting, c.WakesReceived, c.WakesDelivered)
			}
			tw.Flush()
		}
	}
	return 0
}

// pageTitle says which rows a table shows: "workers 1-3 of 3, by id".
func pageTitle(what string, offset, n, total int, sort string) string {
	if n == 0 {
		if total == 0 {
			return what + ": none"
		}
		return fmt.Sprintf("%s: none at offset %d of %d", what, offset, total)
	}
	s := fmt.Sprintf("%s %d-%d of %d, by %s", what, offset+1, offset+n, total, sort)
	if offset+n < total {
		s += fmt.Sprintf(" (more with --offset %d)", offset+n)
	}
	return s
}

// nameList is the NAMES cell: the names the hub sent, and how many more
// the worker has.
func nameList(names []string, total int) string {
	if total == 0 {
		return "-"
	}
	cells := make([]string, len(names))
	for i, n := range names {
		cells[i] = cell(n)
	}
	s := strings.Join(cells, ",")
	if more := total - len(names); more > 0 {
		s += fmt.Sprintf(" +%d", more)
	}
	return s
}

// cell quotes a name that would break the table: empty, or holding
// spaces, commas, quotes or unprintable characters.
func cell(s string) string {
	if s == "" || strings.ContainsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || !unicode.IsPrint(r) || r == ',' || r == '"'
	}) {
		return strconv.Quote(s)
	}
	return s
}

// errNotFound is a 404 from the metrics server.
var errNotFound = errors.New("404 Not Found")

// getJSON fetches one endpoint into v and returns its body as well; token,
// when set, goes in an Authorization header.
func getJSON(ctx context.Context, u, token string, v any) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, &unreachableError{err: fmt.Errorf("cannot reach the hub's metrics server: %w", err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("GET %s: %w (is this a listenhub --metrics-addr?)", u, errNotFound)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return nil, fmt.Errorf("GET %s: %s: %s", u, resp.Status, e.Error)
		}
		return nil, fmt.Errorf("GET %s: %s (is this a listenhub --metrics-addr?)", u, resp.Status)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	return json.RawMessage(body[:len(body)-len(trailingSpace(body))]), nil
}

// unreachableError is getJSON's error when no server answered at all.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }

// unreachableHint is what `listenhub status` suggests when nothing answers
// at addr; given says whether --metrics-addr (or its variable) named it.
func unreachableHint(addr string, given bool) string {
	other := "a hub on another address: listenhub status --metrics-addr HOST:PORT (its serve --metrics-addr)"
	if given {
		other = fmt.Sprintf("is %s the hub's serve --metrics-addr? (without the flag, status tries %s, the shipped units' address)", addr, defaultMetricsAddr)
	}
	return fmt.Sprintf("  nothing answers at %s; try:\n"+
		"  - is the hub running? systemctl status listenhub (listenhub@NAME for the templates), or look for listenhub serve in ps\n"+
		"  - the hub serves status only with --metrics-addr (off by default): start serve with --metrics-addr %s (or %s=%s)\n"+
		"  - %s",
		addr, addr, envName("metrics-addr"), addr, other)
}

func trailingSpace(b []byte) []byte {
	i := len(b)
	for i > 0 && (b[i-1] == '\n' || b[i-1] == ' ' || b[i-1] == '\r') {
		i--
	}
	return b[i:]
}

// getOptional is getJSON for an endpoint that may not exist: found is
// false on 404.
func getOptional(ctx context.Context, u, token string, v any) (raw json.RawMessage, found bool, err error) {
	raw, err = getJSON(ctx, u, token, v)
	if errors.Is(err, errNotFound) {
		return nil, false, nil
	}
	return raw, err == nil, err
}

// getRelay reads /relay, nil when the server runs no relay.
func getRelay(ctx context.Context, base, token string) (*monitor.RelayStatus, json.RawMessage, error) {
	var rj monitor.RelayStatus
	raw, found, err := getOptional(ctx, base+"/relay", token, &rj)
	if err != nil || !found {
		return nil, nil, err
	}
	return &rj, raw, nil
}

// printRelay prints the relay section of listenhub status.
func printRelay(w io.Writer, addr string, r *monitor.RelayStatus) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	state := r.State
	if addr != "" {
		state += " (" + addr + ")"
	}
	slot := r.Slot
	if r.TemporarySlot {
		slot += " (temporary)"
	}
	fmt.Fprintf(tw, "relay\t%s\n", state)
	fmt.Fprintf(tw, "slot\t%s, publication %s, confirmed %s\n", slot, r.Publication, r.ConfirmedLSN)
	fmt.Fprintf(tw, "channels\t%s (ops %s, window %s)\n", r.ChannelTemplate, r.Ops,
		time.Duration(r.WindowSeconds*float64(time.Second)))
	fmt.Fprintf(tw, "decoded\t%d transactions, %d changes\n", r.Transactions, r.Changes)
	fmt.Fprintf(tw, "notified\t%d channels in %d transactions (%d wakes coalesced)\n", r.Notifies, r.Batches, r.Coalesced)
	fmt.Fprintf(tw, "commit→notify\tp50 %s, p99 %s (%d transactions)\n",
		time.Duration(r.CommitToNotifyP50*float64(time.Second)), time.Duration(r.CommitToNotifyP99*float64(time.Second)), r.CommitToNotifyCount)
	fmt.Fprintf(tw, "lag\t%d bytes, %s\n", r.LagBytes, time.Duration(r.LagSeconds*float64(time.Second)).Round(time.Millisecond))
	if r.ChannelsTooLong > 0 {
		fmt.Fprintf(tw, "too long\t%d changes not NOTIFYed: channel over 63 bytes\n", r.ChannelsTooLong)
	}
	tw.Flush()
}
