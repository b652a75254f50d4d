// Package monitor serves what watches a hub: /metrics in the Prometheus
// text format, /healthz for probes, and the JSON endpoints `listenhub
// status` reads (/status, /workers, /channels, and /relay when a relay
// runs beside the hub).
//
// It is what `listenhub serve --metrics-addr` serves, so that a program
// that embeds the hub is watched with the same dashboards, alerts and
// `listenhub status` as the binary, without copying any of it. There are
// two ways to use it:
//
//   - Handler, for a program that already serves HTTP: mount it on its own
//     mux (it answers the paths above, nothing else).
//   - Start or StartListener, for a listener of its own with the caps an
//     address anyone may connect to needs: a bounded number of
//     connections, each timed, accepted at a bounded pace, and pages of
//     workers served a few at a time (see Server).
//
// Everything here reads the hub from other goroutines through its
// goroutine-safe methods (Stats, Workers, Channels, the latency
// histograms): the hub's loop is never blocked by a scrape, and a page of
// workers is taken on the loop in bounded slices by the hub itself.
package monitor

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"runtime/debug"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/relay"
)

// Options say what a Handler or a Server serves besides the hub.
type Options struct {
	// Relay, when not nil, adds its listenhub_relay_* families to
	// /metrics and serves /relay: the relay of `serve --relay`, run in
	// the hub's process.
	Relay *relay.Relay
	// Token, when not empty, is required as "Authorization: Bearer
	// TOKEN" on every path but /healthz, which says one bit and which
	// probes must reach without a secret. ReadTokenFile reads one from a
	// file the way --metrics-token-file does.
	Token string
	// Version and Revision are the labels of listenhub_build_info and the
	// fields of /status that say which build runs: the embedding
	// program's, since it is what was deployed. An empty Version is the
	// main module's version as the Go toolchain stamped it (often
	// "(devel)"), an empty Revision "unknown".
	Version, Revision string
	// Logger gets a Server's own lines (accepting stalled for want of
	// descriptors); nil is slog.Default().
	Logger *slog.Logger
}

// build is what /metrics and /status say about the build.
type build struct {
	version, revision, goVersion string
}

func (o *Options) build() build {
	b := build{version: o.Version, revision: o.Revision, goVersion: runtime.Version()}
	if b.version == "" {
		b.version = "unknown"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
			b.version = bi.Main.Version
		}
	}
	if b.revision == "" {
		b.revision = "unknown"
	}
	return b
}

// Handler serves /metrics, /healthz and the JSON endpoints for h and, when
// o.Relay is set, for the relay. With a nil h it serves the relay alone
// (as `listenhub relay --metrics-addr` does): its /metrics holds no hub
// families, /healthz reports the relay's state, and the hub's JSON
// endpoints answer 404, which is how `listenhub status` tells the two
// apart. h and o.Relay must not both be nil.
//
// The handler bounds its own work whoever serves it: at most a few
// /workers and /channels pages are built at once, one at a time, each
// within a timeout (see Server for the bounds of a listener).
func Handler(h *hub.Hub, o Options) http.Handler {
	b := o.build()
	mux := http.NewServeMux()
	if h == nil {
		registerRelay(mux, o.Relay, b, true)
		return withToken(mux, o.Token)
	}
	newIntrospection(h, b).register(mux)
	rl := o.Relay
	if rl != nil {
		registerRelay(mux, rl, b, false)
	}
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		writeMetrics(&buf, h.Stats())
		writeMoreMetrics(&buf, h.FanoutLatency(), h.AckLatency(), b)
		if rl != nil {
			writeRelayMetrics(&buf, rl)
		}
		writeExposition(w, &buf)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		var relayLine string
		if rl != nil {
			// The relay is a guest: its state is a second line, never
			// the hub's status code (listenhub_relay_up says it).
			relayLine = relayHealth(rl.Stats())
		}
		if !h.Stats().PostgresHealthy {
			w.WriteHeader(http.StatusServiceUnavailable)
			// A hub fed by an Upstream that says why (a fleet's:
			// NATS, the bridge's heartbeat, its Postgres) says it.
			if up, ok := h.Config().Upstream.(interface{ Reason() string }); ok && up.Reason() != "" {
				fmt.Fprintln(w, "upstream unhealthy:", up.Reason())
			} else {
				fmt.Fprintln(w, "postgres unhealthy")
			}
		} else {
			fmt.Fprintln(w, "ok")
		}
		if relayLine != "" {
			fmt.Fprintln(w, relayLine)
		}
	})
	return withToken(mux, o.Token)
}

// writeExposition answers a scrape with buf.
func writeExposition(w http.ResponseWriter, buf *bytes.Buffer) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write(buf.Bytes())
}
