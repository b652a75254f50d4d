package hub

import "sync/atomic"

// Stats is a snapshot of the hub's gauges and counters, named after the
// metrics of docs/design.md ("Metrics"). Counters only grow.
type Stats struct {
	Workers         int64 // listenhub_workers: connected workers now
	Channels        int64 // listenhub_channels: channels LISTENed now
	PostgresHealthy bool  // listenhub_postgres_healthy
	// SocketRefusable is listenhub_socket_refusable: the socket's
	// directories are ones the clients refuse (served on request, with
	// Config.ServeRefusableSocket, or changed since the start).
	SocketRefusable bool

	WakesReceived      uint64 // listenhub_wakes_received_total: NOTIFYs read from Postgres
	FramesSent         uint64 // listenhub_frames_sent_total: frames fully written to workers
	DurableCoalesced   uint64 // listenhub_durable_coalesced_total
	DurableDropped     uint64 // listenhub_durable_dropped_total
	Evictions          uint64 // listenhub_evictions_total
	ProtocolErrors     uint64 // listenhub_protocol_errors_total
	PostgresReconnects uint64 // listenhub_postgres_reconnects_total
	Accepts            uint64 // listenhub_accepts_total: connections accepted, refused uids included
	// Upgrades is listenhub_upgrades_total: hot upgrades this hub took
	// over. The process that takes over counts it, and every counter is
	// carried over the hand-over, so the series goes on across upgrades.
	Upgrades uint64
	Nacks    uint64 // listenhub_nacks_total: nack frames sent (each refused sub once)
	// ConnectionsRefused is listenhub_connections_refused_total: connections
	// accepted and closed at once, past MaxWorkers (or the descriptor
	// budget) or from a peer whose uid is not allowed.
	ConnectionsRefused uint64
	// WorkersShed is listenhub_workers_shed_total: connected workers the
	// hub closed because RLIMIT_NOFILE was lowered below what they held
	// (the newest first), so that the Postgres connection and the
	// metrics server have descriptors.
	WorkersShed uint64

	// OutboundBytes is listenhub_outbound_bytes: the bytes queued for all
	// workers and not yet written, which MaxOutboundBytes bounds.
	OutboundBytes int64
	// ReadsPaused is listenhub_workers_paused: workers not read now
	// because their unread answers passed the threshold; ReadPauses is
	// listenhub_read_pauses_total, the times that happened.
	ReadsPaused int64
	ReadPauses  uint64
}

// counters are written by the loop goroutine only and read by Stats from any
// goroutine: atomics, so that the loop never takes a lock for a reader.
type counters struct {
	workers, channels  atomic.Int64
	healthy            atomic.Bool
	socketRefusable    atomic.Bool
	wakesReceived      atomic.Uint64
	framesSent         atomic.Uint64
	durableCoalesced   atomic.Uint64
	durableDropped     atomic.Uint64
	evictions          atomic.Uint64
	protocolErrors     atomic.Uint64
	postgresReconnects atomic.Uint64
	accepts            atomic.Uint64
	upgrades           atomic.Uint64
	nacks              atomic.Uint64
	refused            atomic.Uint64
	shed               atomic.Uint64
	outBytes, paused   atomic.Int64
	readPauses         atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Workers:            c.workers.Load(),
		Channels:           c.channels.Load(),
		PostgresHealthy:    c.healthy.Load(),
		SocketRefusable:    c.socketRefusable.Load(),
		WakesReceived:      c.wakesReceived.Load(),
		FramesSent:         c.framesSent.Load(),
		DurableCoalesced:   c.durableCoalesced.Load(),
		DurableDropped:     c.durableDropped.Load(),
		Evictions:          c.evictions.Load(),
		ProtocolErrors:     c.protocolErrors.Load(),
		PostgresReconnects: c.postgresReconnects.Load(),
		Accepts:            c.accepts.Load(),
		Upgrades:           c.upgrades.Load(),
		Nacks:              c.nacks.Load(),
		ConnectionsRefused: c.refused.Load(),
		WorkersShed:        c.shed.Load(),
		OutboundBytes:      c.outBytes.Load(),
		ReadsPaused:        c.paused.Load(),
		ReadPauses:         c.readPauses.Load(),
	}
}

// load sets the counters from a snapshot: a hot upgrade carries them over,
// so that every series goes on across it.
func (c *counters) load(s Stats) {
	c.workers.Store(s.Workers)
	c.channels.Store(s.Channels)
	c.healthy.Store(s.PostgresHealthy)
	c.wakesReceived.Store(s.WakesReceived)
	c.framesSent.Store(s.FramesSent)
	c.durableCoalesced.Store(s.DurableCoalesced)
	c.durableDropped.Store(s.DurableDropped)
	c.evictions.Store(s.Evictions)
	c.protocolErrors.Store(s.ProtocolErrors)
	c.postgresReconnects.Store(s.PostgresReconnects)
	c.accepts.Store(s.Accepts)
	c.upgrades.Store(s.Upgrades)
	c.nacks.Store(s.Nacks)
	c.refused.Store(s.ConnectionsRefused)
	c.shed.Store(s.WorkersShed)
	c.readPauses.Store(s.ReadPauses)
}
