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
	q, code := parseStatus(args, stdout, stderr)
	if q == nil {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	r, err := q.fetch(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "listenhub status: %v\n", err)
		if errors.As(err, new(*unreachableError)) {
			fmt.Fprintln(stderr, unreachableHint(q.addr, q.addrGiven))
		}
		return 1
	}
	if q.asJSON {
		q.printJSON(stdout, r)
	} else {
		q.print(stdout, r)
	}
	return 0
}

// statusQuery is what `listenhub status` asks, from its flags.
type statusQuery struct {
	addr         string // as given, for the title
	addrGiven    bool   // by --metrics-addr or its variable (not the default)
	base         string // the URL the endpoints' paths follow
	token        string
	page         url.Values // limit, offset and sort of /workers and /channels
	wantW, wantC bool       // the workers table, the channels table
	wantStats    bool       // the summary (neither --workers nor --channels)
	asJSON       bool
}

// parseStatus parses and checks the flags; nil and the exit status when
// they are wrong (or -h was asked).
func parseStatus(args []string, stdout, stderr io.Writer) (*statusQuery, int) {
	fs := newFlagSet("status")
	addr := fs.String("metrics-addr", defaultMetricsAddr, "the hub's --metrics-addr: host:port, or an http:// URL")
	onlyWorkers := fs.Bool("workers", false, "only the workers table")
	onlyChannels := fs.Bool("channels", false, "only the channels table")
	limit := fs.Int("limit", hub.DefaultListLimit, fmt.Sprintf("rows per table, 1 to %d", hub.MaxListLimit))
	offset := fs.Int("offset", 0, "skip this many rows of the sorted list")
	sortBy := fs.String("sort", "", fmt.Sprintf("with --workers: %s; with --channels: %s (largest first; default the first, ascending)",
		joinSorts(hub.SortID, hub.SortBacklog, hub.SortSent, hub.SortSubscriptions, hub.SortDropped),
		joinSorts(hub.SortName, hub.SortSubscribers, hub.SortReceived, hub.SortDelivered)))
	asJSON := fs.Bool("json", false, "print the JSON of the endpoints instead of tables")
	tokenFile := fs.String("metrics-token-file", "", "the bearer token file of serve --metrics-token-file, when the hub requires one")
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, "status", true)
		}
		return nil, flagError(stderr, "status", err)
	}
	bad := func(err error) (*statusQuery, int) { return nil, flagError(stderr, "status", err) }
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
	q := &statusQuery{addr: *addr, addrGiven: isSet(fs, "metrics-addr"), asJSON: *asJSON,
		wantW: !*onlyChannels, wantC: !*onlyWorkers, wantStats: !*onlyWorkers && !*onlyChannels}
	if *tokenFile != "" {
		var err error
		if q.token, err = monitor.ReadTokenFile(*tokenFile); err != nil {
			return bad(fmt.Errorf("--metrics-token-file: %w", err))
		}
	}
	q.base = *addr
	if !strings.Contains(q.base, "://") {
		q.base = "http://" + q.base
	}
	q.base = strings.TrimSuffix(q.base, "/")
	q.page = url.Values{"limit": {strconv.Itoa(*limit)}, "offset": {strconv.Itoa(*offset)}}
	if *sortBy != "" {
		q.page.Set("sort", *sortBy)
	}
	return q, 0
}

// statusReport is what the endpoints answered.
type statusReport struct {
	st         monitor.Status
	ws         hub.WorkerList
	cs         hub.ChannelList
	raw        map[string]json.RawMessage // the bodies, for --json
	relay      *monitor.RelayStatus       // nil without a relay
	relayRaw   json.RawMessage
	relayAlone bool // a relay's own metrics server: no hub endpoints
}

// fetch asks the endpoints q wants.
func (q *statusQuery) fetch(ctx context.Context) (*statusReport, error) {
	r := &statusReport{raw: map[string]json.RawMessage{}}
	// A relay (serve --relay, or listenhub relay on its own) answers
	// /relay; a relay on its own has no hub endpoints.
	var err error
	if r.relay, r.relayRaw, err = getRelay(ctx, q.base, q.token); err != nil {
		return nil, err
	}
	if r.relay != nil {
		if _, found, err := getOptional(ctx, q.base+"/status", q.token, &r.st); err != nil {
			return nil, err
		} else if !found {
			if !q.wantStats {
				return nil, errors.New("this is a relay's metrics server: it has no workers or channels")
			}
			r.relayAlone = true
			return r, nil
		}
	}
	for _, e := range []struct {
		want bool
		key  string
		path string
		v    any
	}{
		{q.wantStats, "status", "/status", &r.st},
		{q.wantW, "workers", "/workers?" + q.page.Encode(), &r.ws},
		{q.wantC, "channels", "/channels?" + q.page.Encode(), &r.cs},
	} {
		if !e.want {
			continue
		}
		if r.raw[e.key], err = getJSON(ctx, q.base+e.path, q.token, e.v); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// printJSON prints the bodies as one JSON document: the one asked for
// alone, or all of them under their names.
func (q *statusQuery) printJSON(w io.Writer, r *statusReport) {
	var out []byte
	switch {
	case r.relayAlone:
		out = fmt.Appendf(nil, "{\"relay\":%s}", r.relayRaw)
	case !q.wantC:
		out = r.raw["workers"]
	case !q.wantW:
		out = r.raw["channels"]
	default:
		out, _ = json.Marshal(struct {
			Status   json.RawMessage `json:"status"`
			Relay    json.RawMessage `json:"relay,omitempty"`
			Workers  json.RawMessage `json:"workers"`
			Channels json.RawMessage `json:"channels"`
		}{r.raw["status"], r.relayRaw, r.raw["workers"], r.raw["channels"]})
	}
	fmt.Fprintf(w, "%s\n", out)
}

// print prints the summary and the tables q asked for.
func (q *statusQuery) print(w io.Writer, r *statusReport) {
	if r.relayAlone {
		printRelay(w, q.addr, r.relay)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if q.wantStats {
		st := r.st
		healthy := "no"
		if st.Healthy {
			healthy = "yes"
		}
		fmt.Fprintf(tw, "hub\t%s (pid %d)\n", q.addr, st.PID)
		fmt.Fprintf(tw, "healthy\t%s\n", healthy)
		fmt.Fprintf(tw, "uptime\t%s\n", time.Duration(st.UptimeSeconds*float64(time.Second)).Round(time.Second))
		fmt.Fprintf(tw, "workers\t%d\n", st.Workers)
		fmt.Fprintf(tw, "channels\t%d LISTENed\n", st.Channels)
		fmt.Fprintf(tw, "version\t%s (revision %s, %s)\n", st.Version, shortRevision(st.Revision), st.GoVersion)
		tw.Flush()
		if r.relay != nil {
			fmt.Fprintln(w)
			printRelay(w, "", r.relay)
		}
	}
	if q.wantW {
		if q.wantStats {
			fmt.Fprintln(w)
		}
		printWorkers(w, tw, r.ws, time.Now())
	}
	if q.wantC {
		if q.wantStats || q.wantW {
			fmt.Fprintln(w)
		}
		printChannels(w, tw, r.cs)
	}
}

// printWorkers prints a page of workers: its title, then its table on tw.
func printWorkers(w io.Writer, tw *tabwriter.Writer, ws hub.WorkerList, now time.Time) {
	fmt.Fprintln(w, pageTitle("workers", ws.Offset, len(ws.Workers), ws.Total, string(ws.Sort)))
	if len(ws.Workers) == 0 {
		return
	}
	fmt.Fprintln(tw, "ID\tPID\tUID\tCONNECTED\tSUBS\tNAMES\tBACKLOG\tBYTES\tDURABLE\tSENT\tCOALESCED\tDROPPED")
	for _, w := range ws.Workers {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s ago\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n",
			w.ID, w.PID, w.UID, now.Sub(w.ConnectedAt).Round(time.Second), w.Subscriptions,
			nameList(w.Names, w.Subscriptions), w.BacklogFrames, w.BacklogBytes, w.DurablePending,
			w.FramesSent, w.DurableCoalesced, w.DurableDropped)
	}
	tw.Flush()
}

// printChannels prints a page of channels: its title, then its table on
// tw.
func printChannels(w io.Writer, tw *tabwriter.Writer, cs hub.ChannelList) {
	fmt.Fprintln(w, pageTitle("channels", cs.Offset, len(cs.Channels), cs.Total, string(cs.Sort)))
	if len(cs.Channels) == 0 {
		return
	}
	fmt.Fprintln(tw, "NAME\tCHANNEL\tSTATE\tSUBSCRIBERS\tWAITING\tRECEIVED\tDELIVERED")
	for _, c := range cs.Channels {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", cell(c.Name), cell(c.Channel), c.State,
			c.Subscribers, c.Waiting, c.WakesReceived, c.WakesDelivered)
	}
	tw.Flush()
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
	if r.LastError != "" {
		fmt.Fprintf(tw, "last error\t%s\n", r.LastError)
	}
	tw.Flush()
}

// joinSorts lists orders for a flag's help.
func joinSorts(sorts ...hub.Sort) string {
	s := make([]string, len(sorts))
	for i, o := range sorts {
		s[i] = string(o)
	}
	return strings.Join(s, ", ")
}
