package monitor

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/client"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/pgtest"
	"github.com/listenhub/listenhub/internal/pgtest/pgtesting"
	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/relay"
)

var db *pgtest.Cluster

func TestMain(m *testing.M) { pgtesting.Main(m, pgtest.Options{}, &db) }

// startHub runs a real hub in this process against the test cluster.
func startHub(t *testing.T) (*hub.Hub, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "hub.sock")
	h, err := hub.New(hub.Config{SocketPath: sock, DatabaseURL: db.URL(), ApplicationName: "listenhub-monitor-test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		h.Stop(ctx)
	})
	return h, sock
}

// get answers GET url with the bearer token, if any.
func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	cl := http.Client{Timeout: timeout}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Start serves a hub on its own listener: /healthz to anyone, the rest
// only with the token; /metrics and /status see a worker subscribed
// through the client, /workers lists it; Shutdown closes the listener.
func TestStartServesHub(t *testing.T) {
	h, sock := startHub(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	srv, err := Start(ctx, "127.0.0.1:0", h, Options{Token: "s3cret", Version: "v9.9.9", Revision: "abc"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	base := "http://" + srv.Addr().String()
	w, err := client.Dial(ctx, client.Options{SocketPath: sock}, client.Handlers{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Subscribe(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}

	testutil.WaitFor(t, timeout, "/healthz ok without a token", func() bool {
		code, body := get(t, base+"/healthz", "")
		return code == 200 && body == "ok\n"
	})
	for _, path := range []string{"/metrics", "/status", "/workers", "/channels"} {
		if code, body := get(t, base+path, ""); code != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d %s", path, code, body)
		}
	}
	code, metrics := get(t, base+"/metrics", "s3cret")
	for _, want := range []string{"\nlistenhub_workers 1\n", "\nlistenhub_channels 1\n",
		`listenhub_build_info{version="v9.9.9",revision="abc",goversion=`} {
		if code != 200 || !strings.Contains(metrics, want) {
			t.Errorf("/metrics: %d, no %q in\n%s", code, want, metrics)
		}
	}
	var st Status
	if code, body := get(t, base+"/status", "s3cret"); code != 200 || json.Unmarshal([]byte(body), &st) != nil {
		t.Fatalf("/status: %d %s", code, body)
	}
	if !st.Healthy || st.Workers != 1 || st.PID != os.Getpid() || st.Version != "v9.9.9" || time.Since(st.StartedAt) < 0 {
		t.Errorf("/status: %+v", st)
	}
	var ws hub.WorkerList
	if code, body := get(t, base+"/workers", "s3cret"); code != 200 || json.Unmarshal([]byte(body), &ws) != nil ||
		len(ws.Workers) != 1 || ws.Workers[0].PID != os.Getpid() {
		t.Fatalf("/workers: %d %s", code, body)
	}

	sctx, scancel := context.WithTimeout(context.Background(), timeout)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("the server still answers after Shutdown")
	}
}

// A port in use is Start's error, not a server that never listens.
func TestStartPortInUse(t *testing.T) {
	h, _ := startHub(t)
	srv, err := Start(context.Background(), "127.0.0.1:0", h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if again, err := Start(context.Background(), srv.Addr().String(), h, Options{}); err == nil {
		again.Close()
		t.Fatalf("a second Start on %v succeeded", srv.Addr())
	}
}

// A relay that is up says nothing on /healthz unless it has a warning; a
// relay that is down says why.
func TestRelayHealthLine(t *testing.T) {
	for _, c := range []struct {
		s    relay.Stats
		want string
	}{
		{relay.Stats{State: relay.StateActive}, ""},
		{relay.Stats{State: relay.StateStandby}, ""},
		{relay.Stats{State: relay.StateStandby, Warning: "the active relay has not confirmed for 45s; to shorten that, run ALTER ROLE x"},
			"relay standby: the active relay has not confirmed for 45s; to shorten that, run ALTER ROLE x"},
		{relay.Stats{State: relay.StateActive, Warning: "lagging: 130s"}, "relay active: lagging: 130s"},
		{relay.Stats{State: relay.StateDown, LastError: "wal_level is replica"}, "relay down: wal_level is replica"},
	} {
		if got := relayHealth(c.s); got != c.want {
			t.Errorf("relayHealth(%+v) = %q, want %q", c.s, got, c.want)
		}
	}
}
