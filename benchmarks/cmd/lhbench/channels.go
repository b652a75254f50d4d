package main

// The many-channels scenario: one subscriber holding C channels, four
// notifier connections flooding them round-robin. PostgreSQL (15) scans a listening
// backend's channel list for every notification it reads from the queue, so
// the rate one backend can deliver falls as C grows; the hub's
// --postgres-connections K spreads the list over K backends.

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/listenhub/listenhub/benchmarks/internal/hist"
)

// ChannelsRow is one (system, C) measurement.
type ChannelsRow struct {
	System   string `json:"system"` // direct, hub K=1, hub K=4
	Channels int    `json:"channels"`
	K        int    `json:"postgres_connections"`
	Backends int    `json:"backends"`
	// ListenSecs is the time from starting the subscriber to its last
	// ack (direct: the last LISTEN's completion).
	ListenSecs   float64 `json:"listen_s"`
	Sent         int     `json:"sent"`
	NotifyPerSec float64 `json:"notify_per_s"` // accepted by Postgres during the flood
	Recv         uint64  `json:"recv"`
	DeliveredPS  float64 `json:"delivered_per_s"` // receipts over first send → last receipt
	Lost         uint64  `json:"lost"`
	// Evicted and Durable say why wakes were lost: the subscriber evicted,
	// or a connection lost (its resync sends one durable wake per channel).
	Evicted int          `json:"evicted"`
	Durable uint64       `json:"durable"`
	Lat     hist.Summary `json:"latency"`
	// CPU per delivery: the hub process, and the LISTEN backends (the
	// Postgres side of every system; direct has only that).
	ServerNsPerDelivery  float64 `json:"server_ns_per_delivery"`
	BackendNsPerDelivery float64 `json:"backend_ns_per_delivery"`
	Err                  string  `json:"error,omitempty"`
}

// backendPIDs are the client backends with application_name app.
func (b *bench) backendPIDs(app string) ([]int, error) {
	rows, err := b.db.Query(b.ctx, `select pid from pg_stat_activity
		where backend_type = 'client backend' and application_name = $1 and pid <> pg_backend_pid()`, app)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, rows.Err()
}

func cpuOf(pids []int) time.Duration {
	var t time.Duration
	for _, p := range pids {
		t += procCPU(p)
	}
	return t
}

// channelsNotifiers is how many connections flood the channels at once.
const channelsNotifiers = 4

func (b *bench) channelsScenario() error {
	hubSys := b.sys("hub")
	var variants []*system
	if d := b.sys("direct"); d != nil {
		variants = append(variants, d)
	}
	if hubSys != nil {
		for _, k := range []int{1, 4} {
			v := *hubSys
			v.name = fmt.Sprintf("hub K=%d", k)
			v.argv = append(append([]string(nil), hubSys.argv...), "--postgres-connections", strconv.Itoa(k),
				"--max-subscriptions", "100000", "--max-channels", "100000")
			variants = append(variants, &v)
		}
	}
	for _, c := range b.p.ChannelsN {
		for _, sys := range variants {
			b.waitBackends(0)
			row := ChannelsRow{System: sys.name, Channels: c, K: 1}
			if i := strings.Index(sys.name, "K="); i >= 0 {
				row.K, _ = strconv.Atoi(sys.name[i+2:])
			}
			if err := b.withServer(sys, func() error { return b.manyChannels(sys, c, &row) }); err != nil {
				row.Err = err.Error()
			}
			b.logf("channels %s C=%d: LISTEN all in %.2fs, %d backends; %.0f NOTIFY/s sent, %.0f delivered/s, p99 %.0fµs, lost %d; CPU/delivery server %.0f ns, backends %.0f ns %s",
				sys.name, c, row.ListenSecs, row.Backends, row.NotifyPerSec, row.DeliveredPS, row.Lat.P99, row.Lost,
				row.ServerNsPerDelivery, row.BackendNsPerDelivery, row.Err)
			b.res.Channels = append(b.res.Channels, row)
		}
	}
	return nil
}

// manyChannels measures c channels on sys, which withServer runs.
func (b *bench) manyChannels(sys *system, c int, row *ChannelsRow) error {
	args := []string{"worker", "--channel", "mc", "--conns", "1", "--channels", strconv.Itoa(c)}
	if sys.direct {
		args = append(args, "--mode", "direct", "--database-url", sys.dbURL)
	} else {
		args = append(args, "--mode", "socket", "--socket", sys.socket)
	}
	t0 := time.Now()
	p, err := startProc(nil, args...)
	if err != nil {
		return err
	}
	f := &fleet{procs: []*proc{p}, conns: 1}
	defer f.stop()
	line, err := p.recv(5 * time.Minute)
	if err != nil {
		return err
	}
	if !strings.Contains(string(line), `"ready":1`) {
		return fmt.Errorf("subscriber: %s", line)
	}
	row.ListenSecs = time.Since(t0).Seconds()
	pids, err := b.backendPIDs(sys.appName)
	if err != nil {
		return err
	}
	row.Backends = len(pids)
	id := b.nextRun()
	if err := f.begin(id); err != nil {
		return err
	}
	s0, b0 := procCPU(sys.serverPID()), cpuOf(pids)
	sr, err := b.nt.floodMany(b.ctx, "mc", c, channelsNotifiers, id, b.p.FloodDur)
	if err != nil {
		return err
	}
	reps, err := f.reports(sr.Sent, 60*time.Second)
	if err != nil {
		return err
	}
	s1, b1 := procCPU(sys.serverPID()), cpuOf(pids)
	m := merge(reps)
	row.Sent, row.Recv, row.Lost = sr.Sent, m.Recv, m.LostLive+m.LostEvicted
	row.Evicted, row.Durable = m.EOF, m.Durable
	row.NotifyPerSec = sr.rate()
	if m.Last > sr.Start {
		row.DeliveredPS = float64(m.Recv) / (float64(m.Last-sr.Start) / 1e9)
	}
	row.Lat = m.h.Summarize()
	if m.Recv > 0 {
		if !sys.direct {
			row.ServerNsPerDelivery = float64(s1-s0) / float64(m.Recv)
		}
		row.BackendNsPerDelivery = float64(b1-b0) / float64(m.Recv)
	}
	return nil
}
