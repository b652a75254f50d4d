package fleet

import (
	"encoding/json"
	"strconv"
	"time"
)

// Header names of a notification message.
const (
	hdrEpoch = "Lh-Epoch"
	hdrSeq   = "Lh-Seq"
)

// heartbeat is the body of the active bridge's heartbeat.
type heartbeat struct {
	Epoch uint64 `json:"epoch"`
	PG    bool   `json:"pg"` // the bridge's LISTEN connection is healthy
}

// interestRequest is a hub's registration: the channels it listens to
// (all of them, at a renewal) and those it gave up.
type interestRequest struct {
	Hub      string   `json:"hub"`
	Listen   []string `json:"listen,omitempty"`
	Unlisten []string `json:"unlisten,omitempty"`
	TTLMS    int64    `json:"ttl_ms"`
}

// interestReply is the bridge's answer: its epoch once every channel of
// Listen is LISTENed, or why not.
type interestReply struct {
	Epoch uint64 `json:"epoch,omitempty"`
	Error string `json:"error,omitempty"`
	// Added are the channels of Listen the bridge did not hold for this
	// hub: all of them at a first Listen; at a renewal, channels whose
	// lease had expired (or that a new bridge never had), whose
	// notifications the hub may have missed.
	Added []string `json:"added,omitempty"`
}

func (r interestRequest) ttl() time.Duration { return time.Duration(r.TTLMS) * time.Millisecond }

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func formatUint(n uint64) string { return strconv.FormatUint(n, 10) }
