package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Each setting of the config file that a flag or a variable overrides is
// logged once at start, naming the key, the file and line, what overrode
// it and both values; a database URL's value is never logged.
func TestServeConfigOverridesLogged(t *testing.T) {
	c := needDB(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "listenhub.conf")
	writeConfig(t, conf, "log-format = json\nmax-channels = 5\nchannel-prefix = f.\nmax-workers = 50\ndatabase-url = postgres://u:secret@127.0.0.1:1/x\n")
	socket := filepath.Join(dir, "hub.sock")
	p := &proc{t: t, socket: socket, app: testApp(t), stderr: &syncBuf{}, done: make(chan struct{})}
	p.cmd = exec.Command(hubBinary(t), "serve", "--socket", socket, "--database-url", c.URL(),
		"--application-name", p.app, "--config", conf, "--max-channels=100")
	p.cmd.Env = append(cleanEnv(), "LISTENHUB_CHANNEL_PREFIX=g.")
	p.cmd.Stderr, p.cmd.Stdout = p.stderr, p.stderr
	p.start()
	p.ready()
	log := p.stderr.String()
	t.Logf("log:\n%s", log)
	for _, want := range []string{
		`"msg":"config: a setting of the file is overridden","key":"max-channels","file":"` + conf + `:2","by":"--max-channels","file_value":"5","in_force":"100"`,
		`"msg":"config: a setting of the file is overridden","key":"channel-prefix","file":"` + conf + `:3","by":"LISTENHUB_CHANNEL_PREFIX","file_value":"f.","in_force":"g."`,
		`"msg":"config: a setting of the file is overridden","key":"database-url","file":"` + conf + `:5","by":"--database-url"}`,
	} {
		if strings.Count(log, want) != 1 {
			t.Errorf("log has %d of %s", strings.Count(log, want), want)
		}
	}
	if strings.Contains(log, "secret") || strings.Contains(log, `"key":"max-workers"`) || strings.Contains(log, `"key":"log-format"`) {
		t.Errorf("the log names a password or a setting nobody overrode")
	}
}
