//go:build !unix

package client

import (
	"context"
	"errors"
	"net"
	"runtime"
)

// hubSupported: the hub is a Unix-socket service; here a Failover listens
// locally from the start and never tries the hub.
const hubSupported = false

// errNoHub is Dial's error where there is no hub to dial.
var errNoHub = errors.New("listenhub client: no hub on " + runtime.GOOS + " (the hub is a Unix-socket service): use a Failover or Local, which listen with this process's own connection")

func dialSocket(ctx context.Context, path string, allow []int) (net.Conn, error) {
	return nil, &ConnError{Op: "dial", Path: path, Err: errNoHub}
}

func checkPeer(conn net.Conn, allow []int) error { return errNoHub }
