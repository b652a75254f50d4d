package hub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Introspection: who is connected and what is LISTENed, for an operator
// (the binary serves it as JSON next to /metrics). The snapshot is taken on
// the loop goroutine, which owns the state; the loop's work is bounded by
// what is asked: one pass over the workers (or channels) to pick the
// requested page, and a copy of that page only.

// List bounds.
const (
	DefaultListLimit = 100
	MaxListLimit     = 10000
	// WorkerNames is how many subscription names a WorkerInfo carries at
	// most; Subscriptions has the full count.
	WorkerNames = 10
)

// WorkerSorts returns the orders Hub.Workers accepts (a copy), the default
// first: id ascending (connection order), then the largest first by
// pending bytes, frames sent, subscriptions, durable wakes dropped (ties by
// id).
func WorkerSorts() []string { return slices.Clone(workerSorts) }

// ChannelSorts returns the orders Hub.Channels accepts (a copy), the
// default first: name ascending, then the largest first by subscribers,
// NOTIFYs received, wakes delivered (ties by name).
func ChannelSorts() []string { return slices.Clone(channelSorts) }

var workerSorts = []string{"id", "backlog", "sent", "subscriptions", "dropped"}

var channelSorts = []string{"name", "subscribers", "received", "delivered"}

// ListOptions selects a page of Hub.Workers or Hub.Channels.
type ListOptions struct {
	// Limit is the page size: 0 means DefaultListLimit; above
	// MaxListLimit is an error.
	Limit int
	// Offset skips that many entries of the sorted list.
	Offset int
	// Sort is one of WorkerSorts or ChannelSorts; empty means the first.
	Sort string
}

// WorkerInfo is one connected worker. The JSON names are those of the
// binary's /workers endpoint.
type WorkerInfo struct {
	ID          uint64    `json:"id"` // the hub's, in connection order; the log lines' "worker"
	PID         int       `json:"pid"`
	UID         int       `json:"uid"`
	ConnectedAt time.Time `json:"connected_at"`
	// Subscriptions is how many names it subscribed to; Names holds at
	// most WorkerNames of them, sorted.
	Subscriptions int      `json:"subscriptions"`
	Names         []string `json:"names"`
	// BacklogFrames and BacklogBytes are pending for it (produced, not
	// yet taken by its socket), DurablePending the durable wakes among
	// them.
	BacklogFrames  int `json:"backlog_frames"`
	BacklogBytes   int `json:"backlog_bytes"`
	DurablePending int `json:"durable_pending"`
	// Its share of the hub's counters since it connected.
	FramesSent       uint64 `json:"frames_sent"`
	DurableCoalesced uint64 `json:"durable_coalesced"`
	DurableDropped   uint64 `json:"durable_dropped"`
}

// WorkerList is a page of workers.
type WorkerList struct {
	Total   int          `json:"total"` // workers connected, all pages
	Offset  int          `json:"offset"`
	Limit   int          `json:"limit"`
	Sort    string       `json:"sort"`
	Workers []WorkerInfo `json:"workers"`
}

// ChannelInfo is one channel of the union.
type ChannelInfo struct {
	Name        string `json:"name"`    // the subscription name workers use
	Channel     string `json:"channel"` // the Postgres channel: prefix + name + suffix
	Subscribers int    `json:"subscribers"`
	// State is where its LISTEN stands: "listening" (confirmed by
	// Postgres), "listen-in-flight", "unlisten-in-flight" or
	// "unlisten-failed" (retried when the connection is back).
	State string `json:"state"`
	// Waiting is the subs still owed an ack or nack.
	Waiting int `json:"waiting"`
	// WakesReceived counts its NOTIFYs; WakesDelivered the wake frames
	// queued for its subscribers (one per subscriber and NOTIFY, durable
	// wakes that were coalesced or dropped aside, resync wakes included).
	WakesReceived  uint64 `json:"wakes_received"`
	WakesDelivered uint64 `json:"wakes_delivered"`
}

// ChannelList is a page of channels.
type ChannelList struct {
	Total    int           `json:"total"` // channels in the union, all pages
	Offset   int           `json:"offset"`
	Limit    int           `json:"limit"`
	Sort     string        `json:"sort"`
	Channels []ChannelInfo `json:"channels"`
}

// ErrNotRunning is returned by Workers and Channels when the hub is not
// running (not started yet, or stopped).
var ErrNotRunning = errors.New("hub: not running")

func (o ListOptions) check(sorts []string) (ListOptions, error) {
	if o.Sort == "" {
		o.Sort = sorts[0]
	}
	if !slices.Contains(sorts, o.Sort) {
		return o, fmt.Errorf("hub: unknown sort %q (want one of %v)", o.Sort, sorts)
	}
	switch {
	case o.Limit == 0:
		o.Limit = DefaultListLimit
	case o.Limit < 0 || o.Limit > MaxListLimit:
		return o, fmt.Errorf("hub: limit %d out of range 1..%d", o.Limit, MaxListLimit)
	}
	if o.Offset < 0 {
		return o, fmt.Errorf("hub: negative offset %d", o.Offset)
	}
	return o, nil
}

// Workers returns a page of the connected workers. It waits for the loop
// goroutine to take the snapshot, until ctx is done. Safe from any
// goroutine.
func (h *Hub) Workers(ctx context.Context, opts ListOptions) (WorkerList, error) {
	opts, err := opts.check(workerSorts)
	if err != nil {
		return WorkerList{}, err
	}
	return onLoop(ctx, h, func() WorkerList { return h.listWorkers(opts) })
}

// Channels returns a page of the channels of the union. As Workers.
func (h *Hub) Channels(ctx context.Context, opts ListOptions) (ChannelList, error) {
	opts, err := opts.check(channelSorts)
	if err != nil {
		return ChannelList{}, err
	}
	return onLoop(ctx, h, func() ChannelList { return h.listChannels(opts) })
}

// onLoop runs f on the loop goroutine and returns its result.
func onLoop[T any](ctx context.Context, h *Hub, f func() T) (T, error) {
	var zero T
	if !h.started.Load() || h.loop == nil {
		return zero, ErrNotRunning
	}
	res := make(chan T, 1) // f never blocks, even once nobody waits
	if err := h.loop.Post(func() { res <- f() }); err != nil {
		return zero, ErrNotRunning
	}
	select {
	case v := <-res:
		return v, nil
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-h.done:
		return zero, ErrNotRunning
	}
}

// ranked is a list entry with its sort key: larger keys first, ties by id
// (workers) or name (channels).
type ranked[T any] struct {
	v   T
	key int64
}

func (h *Hub) listWorkers(o ListOptions) WorkerList {
	var key func(w *worker) int64
	switch o.Sort {
	case "backlog":
		key = func(w *worker) int64 { return int64(w.out.Len()) }
	case "sent":
		key = func(w *worker) int64 { return int64(w.framesSent) }
	case "subscriptions":
		key = func(w *worker) int64 { return int64(w.subs.len()) }
	case "dropped":
		key = func(w *worker) int64 { return int64(w.durableDropped) }
	default: // "id"
		key = func(*worker) int64 { return 0 }
	}
	less := func(a, b ranked[*worker]) bool {
		if a.key != b.key {
			return a.key > b.key
		}
		return a.v.id < b.v.id
	}
	page := topK(h.workers.len(), o, less, func(add func(ranked[*worker])) {
		for w := range h.workers.all() {
			add(ranked[*worker]{w, key(w)})
		}
	})
	out := WorkerList{Total: h.workers.len(), Offset: o.Offset, Limit: o.Limit, Sort: o.Sort,
		Workers: make([]WorkerInfo, 0, len(page))}
	for _, r := range page {
		w := r.v
		n := min(w.subs.len(), WorkerNames)
		names := make([]string, n)
		for i := range n {
			names[i] = w.subs.list[i].ch.q
		}
		slices.Sort(names)
		out.Workers = append(out.Workers, WorkerInfo{
			ID:               w.id,
			PID:              int(w.pid),
			UID:              int(w.uid),
			ConnectedAt:      time.Unix(0, w.connectedAt),
			Subscriptions:    w.subs.len(),
			Names:            names,
			BacklogFrames:    w.out.Frames(),
			BacklogBytes:     w.out.Len(),
			DurablePending:   w.pendingDurable(),
			FramesSent:       w.framesSent,
			DurableCoalesced: w.durableCoalesced,
			DurableDropped:   w.durableDropped,
		})
	}
	return out
}

func (h *Hub) listChannels(o ListOptions) ChannelList {
	var key func(ch *channel) int64
	switch o.Sort {
	case "subscribers":
		key = func(ch *channel) int64 { return int64(len(ch.subs)) }
	case "received":
		key = func(ch *channel) int64 { return int64(ch.wakesReceived) }
	case "delivered":
		key = func(ch *channel) int64 { return int64(ch.wakesDelivered) }
	default: // "name"
		key = func(*channel) int64 { return 0 }
	}
	less := func(a, b ranked[*channel]) bool {
		if a.key != b.key {
			return a.key > b.key
		}
		return a.v.q < b.v.q
	}
	page := topK(len(h.channels), o, less, func(add func(ranked[*channel])) {
		for _, ch := range h.channels {
			add(ranked[*channel]{ch, key(ch)})
		}
	})
	out := ChannelList{Total: len(h.channels), Offset: o.Offset, Limit: o.Limit, Sort: o.Sort,
		Channels: make([]ChannelInfo, 0, len(page))}
	for _, r := range page {
		ch := r.v
		state := ch.state.String()
		if ch.unlistenFailed {
			state = "unlisten-failed"
		}
		out.Channels = append(out.Channels, ChannelInfo{
			Name:           ch.q,
			Channel:        ch.pg,
			Subscribers:    len(ch.subs),
			State:          state,
			Waiting:        len(ch.waiters),
			WakesReceived:  ch.wakesReceived,
			WakesDelivered: ch.wakesDelivered,
		})
	}
	return out
}

// topK returns entries [o.Offset, o.Offset+o.Limit) of the n entries that
// each yields, in less order. It keeps only the best Offset+Limit in a
// bounded heap (worst at the root): O(n log k) time and k entries of
// storage, however many workers the hub holds.
func topK[T any](n int, o ListOptions, less func(a, b T) bool, each func(add func(T))) []T {
	if o.Offset >= n {
		return nil
	}
	k := n
	if o.Limit < n-o.Offset { // not o.Offset+o.Limit < n: that can overflow
		k = o.Offset + o.Limit
	}
	heap := make([]T, 0, k)
	// worse reports whether heap[i] ranks after heap[j]: the root is the
	// worst entry kept.
	worse := func(i, j int) bool { return less(heap[j], heap[i]) }
	down := func(i int) {
		for {
			c := 2*i + 1
			if c >= len(heap) {
				return
			}
			if c+1 < len(heap) && worse(c+1, c) {
				c++
			}
			if !worse(c, i) {
				return
			}
			heap[i], heap[c] = heap[c], heap[i]
			i = c
		}
	}
	each(func(v T) {
		if len(heap) < k {
			heap = append(heap, v)
			for i := len(heap) - 1; i > 0; {
				p := (i - 1) / 2
				if !worse(i, p) {
					break
				}
				heap[i], heap[p] = heap[p], heap[i]
				i = p
			}
			return
		}
		if less(v, heap[0]) {
			heap[0] = v
			down(0)
		}
	})
	slices.SortFunc(heap, func(a, b T) int {
		switch {
		case less(a, b):
			return -1
		case less(b, a):
			return 1
		}
		return 0
	})
	return heap[o.Offset:]
}
