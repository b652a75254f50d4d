package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --metrics-token-file: every path but /healthz needs the bearer token;
// `listenhub status` sends it; a token file other users can read is
// refused at start.
func TestServeMetricsToken(t *testing.T) {
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte("s3cret-token\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	p := serve(t, sockPath(t), nil, "--metrics-addr", "127.0.0.1:0", "--metrics-token-file", tokFile)
	p.ready()
	addr := p.metricsAddr()
	get := func(path, auth string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("WWW-Authenticate") + " " + string(b)
	}
	for _, path := range []string{"/metrics", "/status", "/workers", "/channels"} {
		for _, auth := range []string{"", "Bearer wrong", "Bearer s3cret-tokenX", "Basic czNjcmV0LXRva2Vu"} {
			if code, body := get(path, auth); code != http.StatusUnauthorized || !strings.Contains(body, "Bearer") {
				t.Errorf("%s with %q: %d %s, want 401 with WWW-Authenticate: Bearer", path, auth, code, body)
			}
		}
		if code, body := get(path, "Bearer s3cret-token"); code != 200 {
			t.Errorf("%s with the token: %d %s", path, code, body)
		}
	}
	if code, body := get("/healthz", ""); code != 200 {
		t.Errorf("/healthz without a token: %d %s", code, body)
	}
	if code, out, errOut := runCmd([]string{"status", "--metrics-addr", addr, "--metrics-token-file", tokFile}); code != 0 || !strings.Contains(out, "healthy   yes") {
		t.Errorf("status with the token file: %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := runCmd([]string{"status", "--metrics-addr", addr}); code != 1 || !strings.Contains(errOut, "401") {
		t.Errorf("status without the token: %d %s", code, errOut)
	}

	// Refused: readable by others, empty.
	loose := filepath.Join(dir, "loose")
	os.WriteFile(loose, []byte("tok"), 0o644)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	for file, want := range map[string]string{loose: "other users", empty: "empty", filepath.Join(dir, "none"): "no such file"} {
		q := serve(t, sockPath(t), nil, "--metrics-addr", "127.0.0.1:0", "--metrics-token-file", file)
		if code := q.exit(); code != 2 || !strings.Contains(q.stderr.String(), want) {
			t.Errorf("token file %s: exit %d, %s; want 2 and %q", filepath.Base(file), code, q.stderr.String(), want)
		}
	}
}
