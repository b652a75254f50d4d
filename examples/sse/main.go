// Command sse is a small web server that streams listenhub wakes to browsers
// as Server-Sent Events: the shape of a real deployment, where every process
// of a preforking web server holds many browser streams and all of them
// share one hub connection.
//
// Each process embeds one client.Failover (the hub while it is there, its
// own Postgres LISTEN while the hub is away, and the hub again once it is
// back) and one client.Mux in front of it, so that a thousand browsers
// watching the same channel cost the process one subscription and the host
// one Postgres backend.
//
//	go run ./examples/sse --socket /run/listenhub/listenhub.sock \
//	    --database-url postgres://app@db/app --addr 127.0.0.1:8080
//
// then open http://127.0.0.1:8080/?q=chat and run, in psql,
// NOTIFY chat, 'hello'. Stop the hub and start it again: the page shows the
// process going to its own connection and coming back.
//
// # Endpoints
//
// GET / is the page. GET /healthz answers 200 "ok (hub)" or "ok (local)"
// while wakes flow, 503 otherwise.
//
// GET /events?q=NAME is a Server-Sent Events stream (text/event-stream) of
// the wakes of the subscription name NAME (required; the Postgres channel
// is --channel-prefix + NAME + --channel-suffix). 400 for a missing or
// invalid name, 503 when no listener can subscribe it. Every data line is
// one line of JSON:
//
//	event: ready  data: {"q":"chat","mode":"hub"}
//	    first, once the subscription is acked: every NOTIFY committed
//	    after the browser saw it reaches the stream. mode is where wakes
//	    come from now: "hub" (the shared hub) or "local" (this process's
//	    own Postgres connection). It also sets the EventSource's retry
//	    delay (retry: 2000).
//	event: wake   data: {"q":"chat","p":"hello","durable":false}
//	    a NOTIFY. p is the payload (absent for a durable wake, a NOTIFY
//	    without payload, which says "something changed, re-read"; one is
//	    also sent after each change of mode, to cover what a change may
//	    have missed).
//	event: mode   data: {"mode":"local"}
//	    the process changed where its wakes come from: "local" when the
//	    hub failed, "hub" when it is back. Sent only on a change after
//	    ready.
//	event: gone   data: "reason"
//	    the stream is closed by the server (this browser fell too far
//	    behind, or the process has no listener left); the EventSource
//	    reconnects, and anything sent meanwhile may be missing.
//	: heartbeat
//	    a comment every 15 s of silence, for proxies with idle timeouts.
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/client"
)

//go:embed index.html
var indexHTML []byte

const (
	// heartbeatInterval is how often an idle stream gets an SSE comment,
	// so that proxies with an idle timeout (commonly 60 s) keep it open
	// and a vanished browser is noticed by a failing write.
	heartbeatInterval = 15 * time.Second
	// writeTimeout bounds one event write. A browser that stops reading
	// fails it, which ends its stream instead of pinning the handler.
	writeTimeout = 10 * time.Second
	// retryMillis is the reconnect delay the page's EventSource uses after
	// the stream ends (server restart, slow subscriber).
	retryMillis = 2000
)

// config is the command line.
type config struct {
	Socket          string
	DatabaseURL     string
	Addr            string
	ChannelPrefix   string
	ChannelSuffix   string
	FailbackDelay   time.Duration
	DisableFailback bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// run is main without the process: it serves until ctx ends and returns the
// exit code. It prints one line to stdout once it is serving.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sse", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	fs.StringVar(&cfg.Socket, "socket", envOr("LISTENHUB_SOCKET", "/run/listenhub/listenhub.sock"),
		"the hub's Unix socket (env LISTENHUB_SOCKET)")
	fs.StringVar(&cfg.DatabaseURL, "database-url", "",
		"Postgres for the fallback LISTEN when the hub is unreachable; empty: LISTENHUB_DATABASE_URL, DATABASE_URL, then PG* variables")
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:8080", "HTTP listen address")
	fs.StringVar(&cfg.ChannelPrefix, "channel-prefix", os.Getenv("LISTENHUB_CHANNEL_PREFIX"),
		"the hub's --channel-prefix, used by the fallback listener (env LISTENHUB_CHANNEL_PREFIX)")
	fs.StringVar(&cfg.ChannelSuffix, "channel-suffix", os.Getenv("LISTENHUB_CHANNEL_SUFFIX"),
		"the hub's --channel-suffix, used by the fallback listener (env LISTENHUB_CHANNEL_SUFFIX)")
	fs.DurationVar(&cfg.FailbackDelay, "min-local", 5*time.Second,
		"least time on the fallback connection before returning to the hub")
	fs.BoolVar(&cfg.DisableFailback, "one-way", false,
		"stay on the fallback connection once the hub failed, until restarted")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sse: unexpected arguments %q\n", fs.Args())
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	a, err := newApp(ctx, cfg, log)
	if err != nil {
		// pgconn's connect errors span lines (one per address tried).
		fmt.Fprintf(stderr, "sse: %s\n", strings.Join(strings.Fields(err.Error()), " "))
		return 1
	}
	defer a.Close()

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		fmt.Fprintf(stderr, "sse: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "sse: serving http://%s/?q=chat (wakes via %s)\n", ln.Addr(), a.l.Mode())
	if err := a.serve(ctx, ln); err != nil {
		fmt.Fprintf(stderr, "sse: %v\n", err)
		return 1
	}
	return 0
}

// app is the server: one Failover listener and one Mux for the process.
type app struct {
	l     *client.Failover
	mux   *client.Mux
	modes *modeWatch
	log   *slog.Logger
}

func newApp(ctx context.Context, cfg config, log *slog.Logger) (*app, error) {
	modes := newModeWatch()
	mux, err := client.NewMux(client.MuxOptions{Logger: log})
	if err != nil {
		return nil, err
	}
	l, err := client.NewFailover(ctx, client.FailoverOptions{
		Hub:             client.Options{SocketPath: cfg.Socket},
		Local:           client.LocalOptions{DatabaseURL: cfg.DatabaseURL, ApplicationName: "listenhub-sse-local", ChannelPrefix: cfg.ChannelPrefix, ChannelSuffix: cfg.ChannelSuffix},
		FailbackDelay:   cfg.FailbackDelay,
		DisableFailback: cfg.DisableFailback,
		Logger:          log,
	}, client.FailoverHandlers{
		OnWake: mux.OnWake,
		OnFailover: func(reason error) {
			log.Warn("hub lost, listening on our own Postgres connection", "reason", reason)
			modes.set(client.ModeLocal)
		},
		OnFailback: func() {
			log.Info("hub back, our own Postgres connection closed")
			modes.set(client.ModeHub)
		},
	})
	if err != nil {
		return nil, err
	}
	if err := mux.Attach(l); err != nil {
		return nil, err
	}
	modes.initial(l.Mode())
	return &app{l: l, mux: mux, modes: modes, log: log}, nil
}

// modeWatch tells the streams when the process's wakes change source. Its
// context is cancelled (and replaced) on every change, so that a stream
// waiting for a wake can wait for a change too, without a goroutine.
type modeWatch struct {
	mu      sync.Mutex
	mode    client.Mode
	touched bool // a callback has set mode: initial must not overwrite it
	changed context.Context
	cancel  context.CancelFunc
}

func newModeWatch() *modeWatch {
	w := &modeWatch{}
	w.changed, w.cancel = context.WithCancel(context.Background())
	return w
}

// initial records the mode the Failover started in, unless a swap that
// happened meanwhile has already said something newer.
func (w *modeWatch) initial(m client.Mode) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.touched {
		w.mode = m
	}
}

// set is called from the Failover's callbacks, in the order of the swaps.
// It never blocks.
func (w *modeWatch) set(m client.Mode) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.touched = true
	if m == w.mode {
		return
	}
	w.mode = m
	w.cancel()
	w.changed, w.cancel = context.WithCancel(context.Background())
}

// get returns the mode and a context that ends at its next change.
func (w *modeWatch) get() (client.Mode, context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mode, w.changed
}

// Close ends every stream and the listener.
func (a *app) Close() error { return a.mux.Close() }

func (a *app) handler() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		w.Write(indexHTML)
	})
	m.HandleFunc("GET /events", a.events)
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if !a.l.Healthy() {
			http.Error(w, "unhealthy ("+a.l.Mode().String()+")", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "ok (%s)\n", a.l.Mode())
	})
	return m
}

// serve serves on ln until ctx ends, then ends the streams (the browsers
// reconnect to whichever process is up) and shuts the server down.
func (a *app) serve(ctx context.Context, ln net.Listener) error {
	streams, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := &http.Server{
		Handler:           a.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		// Every request context ends with streams, so that Shutdown does
		// not wait for SSE handlers, which never finish on their own.
		BaseContext: func(net.Listener) context.Context { return streams },
		ErrorLog:    slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// event is the data of one SSE "wake" event.
type event struct {
	Q       string `json:"q"`
	P       string `json:"p,omitempty"`
	Durable bool   `json:"durable"`
}

// events streams the wakes of ?q= as Server-Sent Events (the package doc
// lists the events):
//
//	event: ready   data: {"q":"chat","mode":"hub"}   once subscribed (acked)
//	event: wake    data: {"q":"chat","p":"hello","durable":false}
//	event: mode    data: {"mode":"local"}            on each change of mode
//	: heartbeat                                       every 15 s when idle
//
// The data is JSON, one line, so a payload with newlines survives the SSE
// line format. "ready" is sent only after the subscription is acked: a
// NOTIFY committed after the page saw it is guaranteed to reach the page.
func (a *app) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query().Get("q")
	if q == "" {
		http.Error(w, "missing ?q=channel", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	sub, err := a.mux.Subscribe(ctx, q)
	if err != nil {
		code := http.StatusServiceUnavailable
		if errors.Is(err, client.ErrInvalidName) {
			code = http.StatusBadRequest
		}
		if ctx.Err() == nil {
			a.log.Warn("subscribe failed", "q", q, "reason", err)
		}
		http.Error(w, err.Error(), code)
		return
	}
	defer sub.Close()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(format string, args ...any) bool {
		rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	sent, _ := a.modes.get()
	ready, _ := json.Marshal(map[string]string{"q": q, "mode": sent.String()})
	if !send("retry: %d\nevent: ready\ndata: %s\n\n", retryMillis, ready) {
		return
	}
	for {
		mode, changed := a.modes.get()
		if mode != sent {
			data, _ := json.Marshal(map[string]string{"mode": mode.String()})
			if !send("event: mode\ndata: %s\n\n", data) {
				return
			}
			sent = mode
		}
		// Wait for a wake, the heartbeat, or a change of mode.
		wctx, cancel := context.WithTimeout(ctx, heartbeatInterval)
		stop := context.AfterFunc(changed, cancel)
		wake, err := sub.Next(wctx)
		stop()
		cancel()
		switch {
		case err == nil:
			data, _ := json.Marshal(event{Q: wake.Name, P: wake.Payload, Durable: wake.Durable})
			if !send("event: wake\ndata: %s\n\n", data) {
				return
			}
		case ctx.Err() != nil:
			return // the browser left, or the server is shutting down
		case changed.Err() != nil:
			// The mode changed: the loop's top sends it.
		case errors.Is(err, context.DeadlineExceeded):
			if !send(": heartbeat\n\n") {
				return
			}
		default:
			// The subscription was closed under us (this browser fell
			// behind, or the listener died): end the stream and let the
			// page reconnect, telling it that it may have missed some.
			a.log.Warn("stream closed", "q", q, "reason", err)
			msg, _ := json.Marshal(err.Error())
			send("event: gone\ndata: %s\n\n", msg)
			return
		}
	}
}
