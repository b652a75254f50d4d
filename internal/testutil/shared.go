package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// SyncBuffer is a bytes.Buffer that a process's or a logger's goroutines may
// write while the test reads it: captured stderr, hub logs shown on failure.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var (
	binMu   sync.Mutex
	binDir  string
	binPath = map[string]string{}
	binErr  = map[string]error{}
)

// Binary builds the main package pkg (an import path, e.g.
// "github.com/listenhub/listenhub/cmd/listenhub") once per test binary and
// returns the executable's path: tests about processes run the real
// program. Call RemoveBinaries from TestMain after m.Run.
func Binary(t testing.TB, pkg string) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if p, ok := binPath[pkg]; ok {
		return p
	}
	if err, ok := binErr[pkg]; ok {
		t.Fatal(err)
	}
	build := func() (string, error) {
		if binDir == "" {
			d, err := os.MkdirTemp("", "listenhub-bin-")
			if err != nil {
				return "", err
			}
			binDir = d
		}
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		out := filepath.Join(binDir, fmt.Sprintf("%s-%d", filepath.Base(pkg), len(binPath)))
		if msg, err := exec.Command(goTool, append(append([]string{"build"}, buildTags...), "-o", out, pkg)...).CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, msg)
		}
		return out, nil
	}
	p, err := build()
	if err != nil {
		binErr[pkg] = err
		t.Fatal(err)
	}
	binPath[pkg] = p
	return p
}

// RemoveBinaries removes what Binary built.
func RemoveBinaries() {
	binMu.Lock()
	defer binMu.Unlock()
	if binDir != "" {
		os.RemoveAll(binDir)
		binDir = ""
	}
	clear(binPath)
	clear(binErr)
}
