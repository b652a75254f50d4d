package monitor

import (
	"context"
	"runtime"
	"strconv"
	"time"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/jsonstr"
)

// The pages of /workers and /channels are encoded by hand, byte for byte
// what encoding/json gives (TestListJSONMatchesEncodingJSON holds that)
// wherever json.Marshal succeeds: it refuses times outside years 0-9999,
// which a hub's connection times are not.
// Under an introspection flood, json.Marshal of a 10,000-worker page was
// the hub's largest cost after the HTTP stack itself, most of it
// time.Time's MarshalJSON and the re-validation of its output, and it
// held one of the process's two Ps for ~10 ms at a time: the loop's
// goroutine, back from epoll_wait, queued behind it. The encoders here
// take a fraction of that and yield the P every listChunk entries, and
// stop as soon as the client is gone.

// listChunk is how many entries are encoded between two yields.
const listChunk = 256

func appendWorkerList(ctx context.Context, b []byte, l hub.WorkerList) ([]byte, error) {
	b = appendListHead(b, l.Total, l.Offset, l.Limit, string(l.Sort), "workers")
	return appendEntries(ctx, b, l.Workers, appendWorkerInfo)
}

func appendChannelList(ctx context.Context, b []byte, l hub.ChannelList) ([]byte, error) {
	b = appendListHead(b, l.Total, l.Offset, l.Limit, string(l.Sort), "channels")
	return appendEntries(ctx, b, l.Channels, appendChannelInfo)
}

// appendListHead appends a page's fields up to its list's key.
func appendListHead(b []byte, total, offset, limit int, sort, key string) []byte {
	b = append(b, `{"total":`...)
	b = strconv.AppendInt(b, int64(total), 10)
	b = append(b, `,"offset":`...)
	b = strconv.AppendInt(b, int64(offset), 10)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, int64(limit), 10)
	b = append(b, `,"sort":`...)
	b = jsonstr.AppendHTML(b, sort)
	b = append(b, `,"`...)
	b = append(b, key...)
	return append(b, `":`...)
}

// appendEntries appends a page's list and closes the page, yielding every
// listChunk entries.
func appendEntries[E any](ctx context.Context, b []byte, list []E, one func([]byte, *E) []byte) ([]byte, error) {
	if list == nil {
		return append(b, "null}"...), nil
	}
	b = append(b, '[')
	for i := range list {
		if i > 0 {
			b = append(b, ',')
			if i%listChunk == 0 {
				if err := yieldP(ctx); err != nil {
					return b, err
				}
			}
		}
		b = one(b, &list[i])
	}
	return append(b, "]}"...), nil
}

func appendWorkerInfo(b []byte, w *hub.WorkerInfo) []byte {
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, w.ID, 10)
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(w.PID), 10)
	b = append(b, `,"uid":`...)
	b = strconv.AppendInt(b, int64(w.UID), 10)
	b = append(b, `,"connected_at":"`...)
	b = w.ConnectedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","subscriptions":`...)
	b = strconv.AppendInt(b, int64(w.Subscriptions), 10)
	b = append(b, `,"names":`...)
	if w.Names == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, n := range w.Names {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonstr.AppendHTML(b, n)
		}
		b = append(b, ']')
	}
	b = append(b, `,"backlog_frames":`...)
	b = strconv.AppendInt(b, int64(w.BacklogFrames), 10)
	b = append(b, `,"backlog_bytes":`...)
	b = strconv.AppendInt(b, int64(w.BacklogBytes), 10)
	b = append(b, `,"durable_pending":`...)
	b = strconv.AppendInt(b, int64(w.DurablePending), 10)
	b = append(b, `,"frames_sent":`...)
	b = strconv.AppendUint(b, w.FramesSent, 10)
	b = append(b, `,"durable_coalesced":`...)
	b = strconv.AppendUint(b, w.DurableCoalesced, 10)
	b = append(b, `,"durable_dropped":`...)
	b = strconv.AppendUint(b, w.DurableDropped, 10)
	return append(b, '}')
}

func appendChannelInfo(b []byte, c *hub.ChannelInfo) []byte {
	b = append(b, `{"name":`...)
	b = jsonstr.AppendHTML(b, c.Name)
	b = append(b, `,"channel":`...)
	b = jsonstr.AppendHTML(b, c.Channel)
	b = append(b, `,"subscribers":`...)
	b = strconv.AppendInt(b, int64(c.Subscribers), 10)
	b = append(b, `,"state":`...)
	b = jsonstr.AppendHTML(b, c.State)
	b = append(b, `,"waiting":`...)
	b = strconv.AppendInt(b, int64(c.Waiting), 10)
	b = append(b, `,"wakes_received":`...)
	b = strconv.AppendUint(b, c.WakesReceived, 10)
	b = append(b, `,"wakes_delivered":`...)
	b = strconv.AppendUint(b, c.WakesDelivered, 10)
	return append(b, '}')
}

// yieldP lets a goroutine waiting for a P run (the loop's, above all),
// and reports a client that went away.
func yieldP(ctx context.Context) error {
	runtime.Gosched()
	return ctx.Err()
}
