package main

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"
)

// The demo's notifier: a connection of its own that NOTIFYs the demo's
// channel at the asked rate, each payload carrying its send time.

// demoNotifier sends rate NOTIFYs per second on its own connection.
type demoNotifier struct {
	sent   atomic.Int64 // NOTIFYs committed
	cancel context.CancelFunc
	done   chan struct{}
	failed chan error // one error, if the notifier stopped on its own
}

func startNotifier(ctx context.Context, url, channel string, rate int) (*demoNotifier, error) {
	conn, err := connectAs(ctx, url, "listenhub-demo-notifier")
	if err != nil {
		return nil, err
	}
	nctx, cancel := context.WithCancel(context.Background())
	n := &demoNotifier{cancel: cancel, done: make(chan struct{}), failed: make(chan error, 1)}
	go func() {
		defer close(n.done)
		defer func() {
			cctx, c := context.WithTimeout(context.Background(), demoStopTimeout)
			conn.Close(cctx)
			c()
		}()
		start := time.Now()
		var sent int64
		tick := time.NewTicker(demoTick)
		defer tick.Stop()
		for {
			select {
			case <-nctx.Done():
				return
			case <-tick.C:
			}
			owed := int64(time.Since(start).Seconds()*float64(rate)) - sent
			if owed <= 0 {
				continue
			}
			owed = min(owed, demoMaxBatch)
			// Distinct payloads: Postgres folds identical NOTIFYs of one
			// transaction into one.
			_, err := conn.Exec(nctx, `SELECT pg_notify($1, ($2::bigint + g)::text || ' ' || $3::text)
				FROM generate_series(0, $4::int - 1) AS g`,
				channel, sent, strconv.FormatInt(time.Now().UnixNano(), 10), owed)
			if err != nil {
				if nctx.Err() == nil {
					n.failed <- err
				}
				return
			}
			sent += owed
			n.sent.Store(sent)
		}
	}()
	return n, nil
}

func (n *demoNotifier) stop() error {
	n.cancel()
	<-n.done
	return nil
}
