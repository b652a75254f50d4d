package monitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/listenhub/listenhub/hub"
)

// The JSON endpoints that `listenhub status` reads:
//
//	GET /status                               the summary (no loop round trip: atomics)
//	GET /workers?limit=N&offset=N&sort=F      a page of hub.WorkerList
//	GET /channels?limit=N&offset=N&sort=F     a page of hub.ChannelList
//
// limit defaults to hub.DefaultListLimit and may not exceed
// hub.MaxListLimit; a bad parameter is a 400 with {"error": "..."}. The
// snapshot is taken on the hub's loop in bounded slices (hub.Workers),
// bounded by introspectTimeout. At most introspectInFlight /workers and
// /channels requests of one Handler are served at once; past that the
// answer is 503 with Retry-After, so that patient clients cannot pile up
// pages in memory. A client that goes away cancels its request.

const (
	// introspectTimeout bounds the wait for the hub's loop to take a
	// snapshot.
	introspectTimeout = 5 * time.Second
	// introspectInFlight caps the /workers and /channels requests served
	// at once: a page of 10,000 workers is a few MB of JSON.
	introspectInFlight = 4
	// retryAfter is the Retry-After of a 503, in seconds.
	retryAfter = "1"
)

// introspection serves the JSON endpoints of one Handler.
type introspection struct {
	h *hub.Hub
	b build
	// slots holds a token per /workers or /channels request being
	// served; work is held while one of them gets its page from the hub
	// and encodes it.
	slots, work chan struct{}
	// restUntil, read and written by work's holder only, keeps the pages
	// to half of one goroutine's time under a flood: the next starts no
	// sooner after the last one ended than the last one took, snapshot
	// and encoding. (The snapshot's share of the loop is bounded by the
	// hub.) A page of 10,000 workers takes ~15 ms: dozens a second
	// remain possible.
	restUntil time.Time
}

func newIntrospection(h *hub.Hub, b build) *introspection {
	return &introspection{h: h, b: b,
		slots: make(chan struct{}, introspectInFlight), work: make(chan struct{}, 1)}
}

// maxWorkRest caps the rest: a page that took long because the loop was
// slow to answer (a stall, not the page's own cost) must not leave the
// next request resting into its own deadline.
const maxWorkRest = 100 * time.Millisecond

// Status is the body of /status: the hub's summary, taken from atomics
// (no round trip to the loop), so that it answers even when the loop is
// slow.
type Status struct {
	Healthy       bool      `json:"healthy"` // the Postgres connection is up and the union LISTENed
	Workers       int64     `json:"workers"`
	Channels      int64     `json:"channels"` // LISTENed now
	PID           int       `json:"pid"`
	StartedAt     time.Time `json:"started_at"` // the process's start
	UptimeSeconds float64   `json:"uptime_seconds"`
	Version       string    `json:"version"` // Options.Version
	Revision      string    `json:"revision"`
	GoVersion     string    `json:"go_version"`
	WakesReceived uint64    `json:"wakes_received"`
	FramesSent    uint64    `json:"frames_sent"`
	Evictions     uint64    `json:"evictions"`
}

// register adds the JSON endpoints to mux.
func (in *introspection) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		s := in.h.Stats()
		start := processStart()
		writeJSON(w, http.StatusOK, Status{
			Healthy: s.PostgresHealthy, Workers: s.Workers, Channels: s.Channels,
			PID: os.Getpid(), StartedAt: start, UptimeSeconds: time.Since(start).Seconds(),
			Version: in.b.version, Revision: in.b.revision, GoVersion: in.b.goVersion,
			WakesReceived: s.WakesReceived, FramesSent: s.FramesSent, Evictions: s.Evictions,
		})
	})
	mux.HandleFunc("GET /workers", func(w http.ResponseWriter, r *http.Request) {
		serveList(in, w, r, in.h.Workers, appendWorkerList)
	})
	mux.HandleFunc("GET /channels", func(w http.ResponseWriter, r *http.Request) {
		serveList(in, w, r, in.h.Channels, appendChannelList)
	})
}

// pageBuffers holds the encoding buffers of pages written, so that a flood
// of requests does not allocate a page's worth of JSON each.
var pageBuffers sync.Pool

// maxPooledPage is the largest buffer kept for reuse.
const maxPooledPage = 8 << 20

// serveList answers a page request: its parameters checked, a slot
// taken, the page asked of the hub and encoded in turn with the other
// requests, and written.
func serveList[T any](in *introspection, w http.ResponseWriter, r *http.Request,
	list func(context.Context, hub.ListOptions) (T, error),
	encode func(context.Context, []byte, T) ([]byte, error)) {
	var o hub.ListOptions
	q := r.URL.Query()
	for _, p := range []struct {
		name string
		v    *int
	}{{"limit", &o.Limit}, {"offset", &o.Offset}} {
		s := q.Get(p.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, fmt.Errorf("%s=%q: not a number", p.name, s))
			return
		}
		*p.v = n
	}
	if o.Limit == 0 && q.Get("limit") != "" {
		writeJSONError(w, http.StatusBadRequest, fmt.Errorf("limit=0: want 1..%d", hub.MaxListLimit))
		return
	}
	o.Sort = hub.Sort(q.Get("sort"))
	select {
	case in.slots <- struct{}{}:
		defer func() { <-in.slots }()
	default:
		// Closing makes the client's next try a new connection, which
		// the metrics server's accept pace bounds; kept alive, a client
		// could ask again at once, as often as it likes.
		w.Header().Set("Connection", "close")
		w.Header().Set("Retry-After", retryAfter)
		writeJSONError(w, http.StatusServiceUnavailable,
			fmt.Errorf("%d introspection requests in flight already; retry later", introspectInFlight))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), introspectTimeout)
	defer cancel()
	pooled, _ := pageBuffers.Get().(*[]byte)
	if pooled == nil {
		pooled = new([]byte)
	}
	body := (*pooled)[:0]
	defer func() {
		if cap(body) <= maxPooledPage {
			*pooled = body[:0]
			pageBuffers.Put(pooled)
		}
	}()
	err := func() error {
		// One request at a time asks, pages and encodes: the snapshot is
		// begun after the request came, so queueing here costs no
		// freshness, and the work takes one core at most, leaving the
		// other to the hub's loop. Its answer is written after.
		select {
		case in.work <- struct{}{}:
			defer func() { <-in.work }()
		case <-ctx.Done():
			return ctx.Err()
		}
		if d := time.Until(in.restUntil); d > 0 {
			rest := time.NewTimer(d)
			select {
			case <-rest.C:
			case <-ctx.Done():
				rest.Stop()
				return ctx.Err()
			}
		}
		began := time.Now()
		defer func() { in.restUntil = time.Now().Add(min(time.Since(began), maxWorkRest)) }()
		v, err := list(ctx, o)
		if err != nil {
			return err
		}
		if body, err = encode(ctx, body, v); err != nil {
			return err
		}
		body = append(body, '\n')
		return nil
	}()
	switch {
	case err == nil:
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	case errors.Is(err, hub.ErrNotRunning):
		writeJSONError(w, http.StatusServiceUnavailable, err)
	case r.Context().Err() != nil:
		// The client went away; nobody reads the answer.
	case errors.Is(err, context.DeadlineExceeded):
		writeJSONError(w, http.StatusGatewayTimeout, fmt.Errorf("the hub's loop did not answer within %v", introspectTimeout))
	default:
		writeJSONError(w, http.StatusBadRequest, err) // ListOptions refused
	}
}

// writeJSON answers with v as encoding/json writes it, and a newline.
func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// writeJSONError answers {"error": "..."}, which `listenhub status`
// prints.
func writeJSONError(w http.ResponseWriter, code int, err error) {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{err.Error()})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}
