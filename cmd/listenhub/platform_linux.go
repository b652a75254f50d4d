package main

// What serve can do on Linux: all of it. The texts of its flags that
// name Linux facilities are here, beside platform_other.go's.

// errNoHotUpgrade is nil: the hot upgrade (SIGUSR2) works here.
var errNoHotUpgrade error

const upgradeTimeoutHelp = "SIGUSR2 upgrade: the new process must take over within this, or the old one serves on"

const socketHelp = "Unix socket the workers connect to; created with --socket-mode and --socket-group, or the one systemd passes (LISTEN_FDS), whose path this must then be (required unless socket-activated)"

const configHelp = "file of settings, one key = value per line, the keys being these flags' names; flags and LISTENHUB_ variables override it; re-read by the new process of every upgrade (SIGUSR2), and on SIGHUP for the log level and format, the caps, the timeouts, the status interval and --allow-uid"

const allowUIDHelp = "uids allowed to connect (checked with SO_PEERCRED), comma-separated or repeated (default: the hub's uid and root)"
