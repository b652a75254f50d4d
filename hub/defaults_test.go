package hub_test

import (
	"path/filepath"
	"testing"

	"github.com/listenhub/listenhub/hub"
)

// DefaultConfig says what a zero field becomes.
func TestDefaultConfigIsWhatZeroMeans(t *testing.T) {
	h, err := hub.New(hub.Config{SocketPath: filepath.Join(t.TempDir(), "s"), DatabaseURL: "postgres://localhost/x"})
	if err != nil {
		t.Fatal(err)
	}
	got, want := h.Config(), hub.DefaultConfig()
	pairs := []struct {
		name      string
		got, want any
	}{
		{"ApplicationName", got.ApplicationName, want.ApplicationName},
		{"DurableQueueLimit", got.DurableQueueLimit, want.DurableQueueLimit},
		{"HardQueueLimit", got.HardQueueLimit, want.HardQueueLimit},
		{"HardQueueBytes", got.HardQueueBytes, want.HardQueueBytes},
		{"MaxOutboundBytes", got.MaxOutboundBytes, want.MaxOutboundBytes},
		{"StatusInterval", got.StatusInterval, want.StatusInterval},
		{"HealthCheckInterval", got.HealthCheckInterval, want.HealthCheckInterval},
		{"HealthCheckTimeout", got.HealthCheckTimeout, want.HealthCheckTimeout},
		{"AcceptBatch", got.AcceptBatch, want.AcceptBatch},
		{"MaxWorkers", got.MaxWorkers, want.MaxWorkers},
		{"MaxSubscriptions", got.MaxSubscriptions, want.MaxSubscriptions},
		{"MaxChannels", got.MaxChannels, want.MaxChannels},
		{"FrameTimeout", got.FrameTimeout, want.FrameTimeout},
		{"StallTimeout", got.StallTimeout, want.StallTimeout},
		{"SocketMode", got.SocketMode, want.SocketMode},
	}
	for _, p := range pairs {
		if p.got != p.want {
			t.Errorf("%s: a zero field became %v, DefaultConfig says %v", p.name, p.got, p.want)
		}
	}
}
