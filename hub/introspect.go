package hub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Introspection: who is connected and what is LISTENed, for an operator
// (the binary serves it as JSON next to /metrics). The loop owns the state,
// so the loop copies it, but never more than a slice of loop time per
// iteration, whatever is asked and however many ask (pages.go): the
// copy is a compact record per worker or channel, taken in slices of at
// most introspectSlice across loop iterations; the callers waiting at the
// same moment share one copy; copies start at a bounded rate; a copy
// nobody waits for any more is dropped half-way. Sorting and paging run on
// the caller's goroutine, from the copy.

// List bounds.
const (
	DefaultListLimit = 100
	MaxListLimit     = 10000
	// MaxWorkerNames is how many subscription names a WorkerInfo carries at
	// most; Subscriptions has the full count.
	MaxWorkerNames = 10
)

// Sort is the order of a page of Hub.Workers or Hub.Channels; its values
// are the words the binary's ?sort= takes.
type Sort string

// The orders of Hub.Workers: id ascending (connection order, the default),
// then the largest first by pending bytes, frames sent, subscriptions,
// durable wakes dropped (ties by id).
const (
	SortID            Sort = "id"
	SortBacklog       Sort = "backlog"
	SortSent          Sort = "sent"
	SortSubscriptions Sort = "subscriptions"
	SortDropped       Sort = "dropped"
)

// The orders of Hub.Channels: name ascending (the default), then the
// largest first by subscribers, NOTIFYs received, wakes delivered (ties by
// name).
const (
	SortName        Sort = "name"
	SortSubscribers Sort = "subscribers"
	SortReceived    Sort = "received"
	SortDelivered   Sort = "delivered"
)

var workerSorts = []Sort{SortID, SortBacklog, SortSent, SortSubscriptions, SortDropped}

var channelSorts = []Sort{SortName, SortSubscribers, SortReceived, SortDelivered}

// ListOptions selects a page of Hub.Workers or Hub.Channels.
type ListOptions struct {
	// Limit is the page size: 0 means DefaultListLimit; above
	// MaxListLimit is an error.
	Limit int
	// Offset skips that many entries of the sorted list.
	Offset int
	// Sort is one of the orders of the list asked for; empty means its
	// default (SortID, SortName).
	Sort Sort
}

// WorkerInfo is one connected worker. The JSON names are those of the
// binary's /workers endpoint.
type WorkerInfo struct {
	ID          uint64    `json:"id"` // the hub's, in connection order; the log lines' "worker"
	PID         int       `json:"pid"`
	UID         int       `json:"uid"`
	ConnectedAt time.Time `json:"connected_at"`
	// Subscriptions is how many names it subscribed to; Names holds at
	// most MaxWorkerNames of them, sorted.
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
	Sort    Sort         `json:"sort"`
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
	Sort     Sort          `json:"sort"`
	Channels []ChannelInfo `json:"channels"`
}

// ErrNotRunning is returned by Workers and Channels when the hub is not
// running (not started yet, or stopped).
var ErrNotRunning = errors.New("hub: not running")

func (o ListOptions) check(sorts []Sort) (ListOptions, error) {
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

// Workers returns a page of the connected workers, from a snapshot begun
// after the call: what it shows happened before it was called (the
// workers that connected while it was taken may be missing, those that
// left are). It waits for the snapshot until ctx is done; a caller that
// gives up costs the loop nothing more. However many goroutines call it,
// they share the snapshots, and the loop spends at most introspectSlice
// per iteration on them. Safe from any goroutine.
func (h *Hub) Workers(ctx context.Context, opts ListOptions) (WorkerList, error) {
	return listPage(ctx, h, opts, workerSorts, &h.snaps.workers, func(j *snapJob, o ListOptions) WorkerList { return j.workers.page(o) })
}

// Channels returns a page of the channels of the union. As Workers.
func (h *Hub) Channels(ctx context.Context, opts ListOptions) (ChannelList, error) {
	return listPage(ctx, h, opts, channelSorts, &h.snaps.channels, func(j *snapJob, o ListOptions) ChannelList { return j.channels.page(o) })
}

// listPage checks opts against sorts, waits for s's snapshot and returns
// the page of it.
func listPage[L any](ctx context.Context, h *Hub, opts ListOptions, sorts []Sort, s *snapper, page func(*snapJob, ListOptions) L) (L, error) {
	var none L
	opts, err := opts.check(sorts)
	if err != nil {
		return none, err
	}
	if !h.started.Load() || h.loop == nil {
		return none, ErrNotRunning
	}
	j, err := s.wait(ctx, h)
	if err != nil {
		return none, err
	}
	return page(j, opts), nil
}
