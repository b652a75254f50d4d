package main

// Misconfigurations a user meets first (docs/robustness.md,
// "Misconfigurations"): each must say what is wrong, at once.

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/hub"
)

// TestJSONLogDurations: a duration in a JSON log line is a string such as
// "1.5s", as in the text format, never integer nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	var b bytes.Buffer
	log, err := newLogger(&b, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("x", "retry_in_max", 1500*time.Millisecond, "n", 3)
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m["retry_in_max"] != "1.5s" || m["n"] != float64(3) {
		t.Fatalf("line %s: want \"retry_in_max\":\"1.5s\", \"n\":3", b.String())
	}
}

// TestStatusRevisionLikeVersion: `status` prints the revision as `version`
// does, 12 hex digits (the hub's /status carries all 40).
func TestStatusRevisionLikeVersion(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	mux := http.NewServeMux()
	reply := func(path string, v any) {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(v)
		})
	}
	reply("/status", statusJSON{Healthy: true, Version: "v1.0.0", Revision: rev + "+dirty", GoVersion: "go1.26"})
	reply("/workers", hub.WorkerList{})
	reply("/channels", hub.ChannelList{})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	var out, errOut bytes.Buffer
	if code := runStatus(context.Background(), []string{"--metrics-addr", srv.URL}, &out, &errOut); code != 0 {
		t.Fatalf("status exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "(revision 0123456789ab+dirty, go1.26)") || strings.Contains(out.String(), rev) {
		t.Fatalf("status printed:\n%s\nwant the revision as version prints it: 0123456789ab+dirty", out.String())
	}
	if got := shortRevision(rev); got != "0123456789ab" {
		t.Fatalf("shortRevision = %q", got)
	}
}
