package main

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/internal/testutil"
	"github.com/listenhub/listenhub/monitor"
)

// A channel-prefix change carried by an upgrade (the config file changed,
// then SIGUSR2) is refused by the new process: the old one serves on with
// the mapping its workers subscribed under, one line in the log says why
// and what to do, and status, /channels and /metrics agree. The mapping
// set back, the next upgrade goes through.
func TestUpgradeRefusesMappingChange(t *testing.T) {
	c := needDB(t)
	conf := filepath.Join(t.TempDir(), "listenhub.conf")
	writeConfig(t, conf, "channel-prefix = a.\n")
	u := startUpHub(t, c.URL(), "--config", conf, "--metrics-addr", "127.0.0.1:0")
	addr := u.metricsAddr()
	w := dialWorker(t, u.socket)
	w.sub("x")

	writeConfig(t, conf, "channel-prefix = b.\n")
	old := u.pid()
	if err := syscall.Kill(old, syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the upgrade refused", func() bool {
		return strings.Contains(u.log(), "upgrade abandoned")
	})
	var why string
	for _, l := range strings.Split(u.log(), "\n") {
		if strings.Contains(l, "upgrade abandoned") {
			why = l
		}
	}
	for _, want := range []string{"channel mapping", `\"a.\"`, `\"b.\"`, "restart"} {
		if !strings.Contains(why, want) {
			t.Fatalf("the old process's line lacks %s: %s", want, why)
		}
	}
	if !strings.Contains(why, "the new process refused: hub: upgrade refused: the channel mapping changed") {
		t.Fatalf("the refusal is not the new process's: %s", why)
	}
	if p := u.pid(); p != old || !alive(old) {
		t.Fatalf("pid file %d, old %d (alive %v): the old process must serve on", p, old, alive(old))
	}
	t.Logf("refused: %s", why)

	// The old mapping, for the worker connected before and a new one.
	notify(t, `NOTIFY "a.x", 'one'`)
	if m := w.expect("wake"); m.Name != "x" || m.Payload != "one" {
		t.Fatalf("worker after the refused upgrade: %+v", m)
	}
	w2 := dialWorker(t, u.socket)
	w2.sub("y")
	notify(t, `NOTIFY "a.y", 'two'`)
	if m := w2.expect("wake"); m.Name != "y" || m.Payload != "two" {
		t.Fatalf("new worker after the refused upgrade: %+v", m)
	}
	agree := func(want int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var st monitor.Status
		var cs hub.ChannelList
		if _, err := getJSON(ctx, "http://"+addr+"/status", "", &st); err != nil {
			t.Fatal(err)
		}
		if _, err := getJSON(ctx, "http://"+addr+"/channels", "", &cs); err != nil {
			t.Fatal(err)
		}
		m := scrape(t, addr)
		var names []string
		for _, ch := range cs.Channels {
			names = append(names, ch.Channel)
		}
		if st.Channels != int64(want) || cs.Total != want || m["listenhub_channels"] != float64(want) {
			t.Fatalf("channels: status %d, /channels %d %v, /metrics %v; want %d", st.Channels, cs.Total, names, m["listenhub_channels"], want)
		}
	}
	agree(2)

	// Set back, the mapping lets the upgrade through.
	writeConfig(t, conf, "channel-prefix = a.\n")
	u.upgrade()
	notify(t, `NOTIFY "a.x", 'three'`)
	if m := w.expect("wake"); m.Name != "x" || m.Payload != "three" {
		t.Fatalf("worker after the upgrade: %+v", m)
	}
	agree(2)
}
