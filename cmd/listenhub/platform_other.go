//go:build !linux

package main

import (
	"errors"
	"runtime"
)

// errNoHotUpgrade says why there is no hot upgrade here: the hand-over
// passes the backlogs in a memfd and the sockets over a SOCK_SEQPACKET
// pair, and only Linux is tested to do both. SIGUSR2 is refused with this
// line (the hub serves on), --upgrade-timeout is an error, and a process
// started as the new side of an upgrade exits 1 with it.
var errNoHotUpgrade = errors.New("hot upgrade is Linux only: on " + runtime.GOOS + " a hub cannot hand its sockets and backlogs to a new process (no memfd hand-over); restart it instead")

const upgradeTimeoutHelp = "SIGUSR2 upgrade: Linux only (no hot upgrade on " + runtime.GOOS + "; setting it is an error)"

// No systemd off Linux: no socket activation to mention.
const socketHelp = "Unix socket the workers connect to; created with --socket-mode and --socket-group (required)"

const configHelp = "file of settings, one key = value per line, the keys being these flags' names; flags and LISTENHUB_ variables override it; re-read on SIGHUP for the log level and format, the caps, the timeouts, the status interval and --allow-uid"

const allowUIDHelp = "uids allowed to connect (checked with LOCAL_PEERCRED), comma-separated or repeated (default: the hub's uid and root)"
