package monitor

import (
	"bytes"
	"fmt"
	"net/http"

	"github.com/listenhub/listenhub/relay"
)

// RelayStatus is the body of /relay, the relay section of `listenhub
// status`: the relay's settings, its counters and where it stands.
type RelayStatus struct {
	State               string  `json:"state"`
	Publication         string  `json:"publication"`
	Slot                string  `json:"slot"`
	TemporarySlot       bool    `json:"temporary_slot"`
	ChannelTemplate     string  `json:"channel_template"`
	Ops                 string  `json:"ops"`
	WindowSeconds       float64 `json:"window_seconds"`
	Transactions        uint64  `json:"transactions"`
	Changes             uint64  `json:"changes"`
	Notifies            uint64  `json:"notifies"`
	Batches             uint64  `json:"batches"`
	Coalesced           uint64  `json:"coalesced"`
	ChannelsTooLong     uint64  `json:"channels_too_long"`
	VisibilityWaits     uint64  `json:"visibility_waits"`
	Reconnects          uint64  `json:"reconnects"`
	Takeovers           uint64  `json:"takeovers"`
	LagBytes            int64   `json:"lag_bytes"`
	LagSeconds          float64 `json:"lag_seconds"`
	ConfirmedLSN        string  `json:"confirmed_lsn"`
	Tables              int64   `json:"tables"`
	TablesFiltered      int64   `json:"tables_filtered"`
	CommitToNotifyP50   float64 `json:"commit_to_notify_p50_seconds"`
	CommitToNotifyP99   float64 `json:"commit_to_notify_p99_seconds"`
	CommitToNotifyCount uint64  `json:"commit_to_notify_count"`
	// LastError is why the relay is not streaming, with the fix when
	// one is known, or what its set-up waits on; empty while it streams
	// or stands by.
	LastError string `json:"last_error,omitempty"`
	// Warning is what is wrong while the relay is up, with the fix when
	// one is known: lagging past --max-lag, or (on a standby) an active
	// relay that is not confirming.
	Warning string `json:"warning,omitempty"`
}

// registerRelay adds GET /relay to mux and, when the relay runs on its own
// (h nil in Handler), its /metrics and /healthz.
func registerRelay(mux *http.ServeMux, rl *relay.Relay, b build, alone bool) {
	mux.HandleFunc("GET /relay", func(w http.ResponseWriter, r *http.Request) {
		s, o, h := rl.Stats(), rl.Options(), rl.CommitToNotify()
		writeJSON(w, http.StatusOK, RelayStatus{
			State: s.State.String(), Publication: o.Publication, Slot: o.Slot, TemporarySlot: o.TemporarySlot,
			ChannelTemplate: o.ChannelTemplate, Ops: o.Ops.String(), WindowSeconds: o.Window.Seconds(),
			Transactions: s.Transactions, Changes: s.Changes, Notifies: s.Notifies, Batches: s.Batches,
			Coalesced: s.Coalesced, ChannelsTooLong: s.ChannelsTooLong, VisibilityWaits: s.VisibilityWaits,
			Reconnects: s.Reconnects, Takeovers: s.Takeovers, LagBytes: s.LagBytes, LagSeconds: s.LagSeconds,
			Tables: s.Tables, TablesFiltered: s.TablesFiltered,
			ConfirmedLSN:        fmt.Sprintf("%X/%X", s.ConfirmedLSN>>32, uint32(s.ConfirmedLSN)),
			CommitToNotifyP50:   h.Quantile(0.5).Seconds(),
			CommitToNotifyP99:   h.Quantile(0.99).Seconds(),
			CommitToNotifyCount: h.Count,
			LastError:           s.LastError,
			Warning:             s.Warning,
		})
	})
	if !alone {
		return
	}
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		writeRelayMetrics(&buf, rl)
		writeBuildInfo(&buf, b)
		writeProcessMetrics(&buf)
		writeExposition(w, &buf)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch s := rl.Stats(); s.State {
		case relay.StateStandby:
			// A standby that sees the active relay stuck says so with a
			// 503: every wake stalls, and restarting a standby costs
			// nothing.
			if s.Warning != "" {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, relayHealth(s))
				return
			}
			fmt.Fprintf(w, "ok (%s)\n", s.State)
		case relay.StateActive:
			// A lagging active relay stays 200, the lag on a second
			// line: a probe that restarted it would restart a long
			// decode from its beginning.
			fmt.Fprintf(w, "ok (%s)\n", s.State)
			if s.Warning != "" {
				fmt.Fprintln(w, relayHealth(s))
			}
		default:
			// Why, too: a slot creation waiting on a transaction, a
			// lost connection.
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, relayHealth(s))
		}
	})
}

// relayUp: the relay streams, or stands by for one that does.
func relayUp(st relay.State) bool { return st == relay.StateActive || st == relay.StateStandby }

// relayHealth is the relay's line in /healthz when it is not up, or up
// with a warning: the hub answers for itself, and says what is wrong with
// its guest.
func relayHealth(s relay.Stats) string {
	why := s.LastError
	if relayUp(s.State) {
		if s.Warning == "" {
			return ""
		}
		why = s.Warning
	}
	line := "relay " + s.State.String()
	if why != "" {
		line += ": " + why
	}
	return line
}

// relayMetrics are the listenhub_relay_* families but the histogram.
var relayMetrics = []struct {
	name, typ, help string
	value           func(s *relay.Stats) float64
}{
	{"listenhub_relay_up", "gauge", "1 while the relay streams or stands by (it can deliver), 0 while it is down, retrying or starting.",
		func(s *relay.Stats) float64 { return b2f(relayUp(s.State)) }},
	{"listenhub_relay_active", "gauge", "1 while this relay streams from the slot, else 0.",
		func(s *relay.Stats) float64 { return b2f(s.State == relay.StateActive) }},
	{"listenhub_relay_standby", "gauge", "1 while another relay has the slot and this one waits to take over, else 0.",
		func(s *relay.Stats) float64 { return b2f(s.State == relay.StateStandby) }},
	{"listenhub_relay_tables", "gauge", "Tables the publication covers, as of the relay's last look while streaming.",
		func(s *relay.Stats) float64 { return float64(s.Tables) }},
	{"listenhub_relay_tables_filtered", "gauge", "Published tables with a row filter: their changes outside it get no wake.",
		func(s *relay.Stats) float64 { return float64(s.TablesFiltered) }},
	{"listenhub_relay_transactions_total", "counter", "Committed transactions decoded.",
		func(s *relay.Stats) float64 { return float64(s.Transactions) }},
	{"listenhub_relay_changes_total", "counter", "Row changes decoded (a TRUNCATE counts one per table).",
		func(s *relay.Stats) float64 { return float64(s.Changes) }},
	{"listenhub_relay_notifies_total", "counter", "Channels NOTIFYed.",
		func(s *relay.Stats) float64 { return float64(s.Notifies) }},
	{"listenhub_relay_batches_total", "counter", "NOTIFY transactions committed.",
		func(s *relay.Stats) float64 { return float64(s.Batches) }},
	{"listenhub_relay_coalesced_total", "counter", "Wakes (one per transaction and channel) merged into another NOTIFY of the same batch.",
		func(s *relay.Stats) float64 { return float64(s.Coalesced) }},
	{"listenhub_relay_channels_too_long_total", "counter", "Changes not NOTIFYed because their channel would exceed 63 bytes.",
		func(s *relay.Stats) float64 { return float64(s.ChannelsTooLong) }},
	{"listenhub_relay_visibility_waits_total", "counter", "Times a batch waited for a decoded commit to become visible.",
		func(s *relay.Stats) float64 { return float64(s.VisibilityWaits) }},
	{"listenhub_relay_reconnects_total", "counter", "Sessions streaming again after a lost connection.",
		func(s *relay.Stats) float64 { return float64(s.Reconnects) }},
	{"listenhub_relay_takeovers_total", "counter", "Times this relay took the slot over from another.",
		func(s *relay.Stats) float64 { return float64(s.Takeovers) }},
	{"listenhub_relay_lag_bytes", "gauge", "WAL between the server's position and the slot's confirmed one.",
		func(s *relay.Stats) float64 { return float64(s.LagBytes) }},
	{"listenhub_relay_lag_seconds", "gauge", "How far the last NOTIFY was behind the commit of the newest transaction it covered; 0 when caught up.",
		func(s *relay.Stats) float64 { return s.LagSeconds }},
}

// writeRelayMetrics writes the listenhub_relay_* families.
func writeRelayMetrics(buf *bytes.Buffer, rl *relay.Relay) {
	s := rl.Stats()
	for _, m := range relayMetrics {
		writeSample(buf, m.name, m.typ, m.help, m.value(&s))
	}
	h := rl.CommitToNotify()
	writeHistogram(buf, "listenhub_relay_commit_to_notify_seconds",
		"Per transaction: from its commit timestamp (the server's clock) to the commit of the NOTIFY that covered it.",
		h)
	d := rl.CommitToDecode()
	writeHistogram(buf, "listenhub_relay_commit_to_decode_seconds",
		"Per transaction: from its commit timestamp to the relay reading its Commit message (the server's share of commit_to_notify).",
		d)
}
