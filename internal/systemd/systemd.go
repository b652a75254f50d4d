// Package systemd speaks the two systemd protocols a service needs, written
// by hand so that the main module takes no dependency for them:
//
//   - sd_notify(3): state lines ("READY=1", "STATUS=…", "STOPPING=1",
//     "WATCHDOG=1", "MAINPID=…") sent as one datagram to the AF_UNIX socket
//     named by $NOTIFY_SOCKET (a path, or an abstract name written with a
//     leading '@');
//   - sd_listen_fds(3): sockets passed by a socket unit, as descriptors from
//     3 up, announced by $LISTEN_PID (which must be this process) and
//     $LISTEN_FDS, optionally named by $LISTEN_FDNAMES.
//
// Outside systemd every function is a no-op: no $NOTIFY_SOCKET means
// nothing to notify, no $LISTEN_FDS means no inherited socket. systemd is
// Linux's, so off Linux every function is a silent no-op whatever the
// environment says: no Notifier, no watchdog, no inherited sockets.
package systemd

import "os"

// listenFDsStart is SD_LISTEN_FDS_START: the first passed descriptor.
const listenFDsStart = 3

// Listener is one socket passed by the service manager.
type Listener struct {
	File *os.File
	// Name is the socket's FileDescriptorName= (default: the socket
	// unit's name), "" when $LISTEN_FDNAMES is unset.
	Name string
}
