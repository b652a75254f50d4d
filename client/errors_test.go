package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/listenhub/listenhub/client"
)

// The predicates answer the caller's two questions for every error the
// package returns, wrapped or not.
func TestErrorPredicates(t *testing.T) {
	cases := []struct {
		name          string
		err           error
		timeout, safe bool
	}{
		{"closed", client.ErrClosed, false, false},
		{"name", &client.NackError{Name: "x", Reason: "invalid name", Kind: client.NackInvalidName}, false, false},
		{"limit", &client.NackError{Name: "x", Reason: "too many subscriptions", Kind: client.NackLimit}, false, false},
		{"listen failed", &client.NackError{Name: "x", Reason: "LISTEN failed", Kind: client.NackOther}, false, true},
		{"ack timeout", &client.AckTimeoutError{Name: "x"}, true, true},
		{"eof", &client.ConnError{Op: "read", Path: "/s", Err: io.EOF}, false, true},
		{"stalled write", &client.ConnError{Op: "write", Path: "/s", Err: fmt.Errorf("write: %w", os.ErrDeadlineExceeded)}, true, true},
		{"refused", &client.RefusedError{Path: "/s", Reason: "--max-workers"}, false, true},
		{"peer", &client.ConnError{Op: "dial", Path: "/s", Err: &client.PeerError{UID: 7}}, false, false},
		{"socket", &client.SocketError{Path: "/s", Problem: "world-writable"}, false, false},
		{"other database", fmt.Errorf("check: %w", client.ErrOtherDatabase), false, false},
		{"slow", &client.SlowSubscriberError{Name: "x", Buffer: 1}, false, true},
		{"foreign", errors.New("something else"), false, false},
		{"nil", nil, false, false},
	}
	for _, c := range cases {
		for _, err := range []error{c.err, fmt.Errorf("wrapped: %w", c.err)} {
			if c.err == nil {
				err = nil
			}
			if got := client.Timeout(err); got != c.timeout {
				t.Errorf("%s: Timeout(%v) = %v, want %v", c.name, err, got, c.timeout)
			}
			if got := client.SafeToRetry(err); got != c.safe {
				t.Errorf("%s: SafeToRetry(%v) = %v, want %v", c.name, err, got, c.safe)
			}
		}
	}
}

// Every sentinel and error type of the package says where it comes from.
func TestErrorsSayThePackage(t *testing.T) {
	for _, err := range []error{client.ErrClosed, client.ErrInvalidName, client.ErrLimit, client.ErrAckTimeout,
		client.ErrSlowSubscriber, client.ErrNotOurHub, client.ErrRefused, client.ErrOtherDatabase,
		&client.NackError{Name: "x"}, &client.AckTimeoutError{Name: "x"}, &client.RefusedError{},
		&client.ConnError{Op: "read", Err: io.EOF}, &client.SlowSubscriberError{}} {
		if s := err.Error(); len(s) < 17 || s[:17] != "listenhub client:" {
			t.Errorf("%q does not start with \"listenhub client:\"", s)
		}
	}
}

// A negative option is refused by name; zero means the default.
func TestNegativeOptionsRefused(t *testing.T) {
	ctx := context.Background()
	sock := filepath.Join(t.TempDir(), "absent.sock")
	_, err := client.Dial(ctx, client.Options{SocketPath: sock, AckTimeout: -time.Second}, client.Handlers{})
	wantField(t, err, "Options.AckTimeout")
	_, err = client.NewLocal(ctx, client.LocalOptions{DatabaseURL: "postgres://localhost/x", CommandTimeout: -1}, client.Handlers{})
	wantField(t, err, "LocalOptions.CommandTimeout")
	_, err = client.NewFailover(ctx, client.FailoverOptions{Hub: client.Options{SocketPath: sock}, FailbackDelay: -time.Second}, client.FailoverHandlers{})
	wantField(t, err, "FailoverOptions.FailbackDelay")
	_, err = client.NewFailover(ctx, client.FailoverOptions{Hub: client.Options{SocketPath: sock, FrameTimeout: -time.Second}}, client.FailoverHandlers{})
	wantField(t, err, "Options.FrameTimeout")
	_, err = client.NewMux(client.MuxOptions{Buffer: -1})
	wantField(t, err, "MuxOptions.Buffer")
	if _, err := client.NewMux(client.MuxOptions{}); err != nil {
		t.Fatalf("zero MuxOptions: %v", err)
	}
}

func wantField(t *testing.T, err error, field string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), field+" is negative") || !strings.HasPrefix(err.Error(), "listenhub client:") {
		t.Errorf("error %v does not refuse %s", err, field)
	}
}
