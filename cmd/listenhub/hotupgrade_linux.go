package main

// errNoHotUpgrade is nil: the hot upgrade (SIGUSR2) works here.
var errNoHotUpgrade error

const upgradeTimeoutHelp = "SIGUSR2 upgrade: the new process must take over within this, or the old one serves on"

const allowUIDHelp = "uids allowed to connect (checked with SO_PEERCRED), comma-separated or repeated (default: the hub's uid and root)"
