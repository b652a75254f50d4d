package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMetricsPortOneValue: `listenhub status` looks where the shipped
// units, the image and the manifests serve the metrics, and no file still
// names 9187 (postgres_exporter's port).
func TestMetricsPortOneValue(t *testing.T) {
	_, flags := commandHelp(t, "status")
	if got := flags["metrics-addr"].def; got != defaultMetricsAddr {
		t.Errorf("status --metrics-addr defaults to %q, want %q", got, defaultMetricsAddr)
	}
	port := defaultMetricsAddr[strings.LastIndexByte(defaultMetricsAddr, ':'):]
	for file, want := range map[string]string{
		"deploy/systemd/listenhub.service": "LISTENHUB_METRICS_ADDR=" + defaultMetricsAddr,
		"deploy/container/Containerfile":   "LISTENHUB_METRICS_ADDR=" + port,
		"deploy/kubernetes/daemonset.yaml": `value: "` + port + `"`,
		"deploy/kubernetes/sidecar.yaml":   `value: "` + port + `"`,
		"docs/usage.md":                    "`" + defaultMetricsAddr + "`",
		"docs/operations.md":               "`127.0.0.1" + port + "`",
	} {
		b, err := os.ReadFile(filepath.Join("..", "..", file))
		if err != nil {
			t.Error(err)
			continue
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s does not contain %q", file, want)
		}
		if strings.Contains(string(b), ":9187") {
			t.Errorf("%s still names port 9187, postgres_exporter's", file)
		}
	}
}
