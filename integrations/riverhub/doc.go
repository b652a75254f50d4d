// Package riverhub runs River's notifier through the host's listenhub hub:
// every River client of every process on the host shares the hub's one
// LISTEN connection instead of holding a Postgres backend of its own.
//
//	import "github.com/listenhub/listenhub/integrations/riverhub"
//
//	driver := riverhub.New(pool, riverhub.Options{
//		Failover: client.FailoverOptions{Hub: client.Options{SocketPath: "/run/listenhub/listenhub.sock"}},
//	})
//	riverClient, err := river.NewClient(driver, &river.Config{...})
//
// Driver is riverpgxv5's driver with one part replaced: the listener River's
// notifier gets from GetListener. Everything else (executors, migrations,
// transactions) is riverpgxv5's, on the same pool. The listener is a
// client.Failover: the hub while it works, a LISTEN connection of this
// process's own (on the pool's connection settings) while it does not, and
// the hub again once it is back, with no notification twice or lost at the
// switch back.
//
// River's contract, kept: topics are the schema-qualified channels River
// NOTIFYs ("<schema>.river_insert"), so the hub must serve them unmapped (no
// --channel-prefix or --channel-suffix); payloads pass byte for byte;
// WaitForNotification returns at once when its context ends (River's
// notifier cancels it to run Listen and Unlisten); a notification committed
// before a Listen of its topic began is not delivered, one committed after
// it returned is (a marker NOTIFY, committed as the Listen begins, says
// which is which); Ping fails only when the listener is dead, and
// WaitForNotification then returns the error, on which River's notifier
// reconnects.
//
// Gaps: when the hub or the local connection loses notifications (a hub
// killed, a failover, the hub's own reconnect to Postgres), the client
// delivers a durable wake per name. On the insert topic this listener turns
// it into one insert notification per queue that has available jobs, so
// that River's producers fetch at once instead of at their next poll. On the
// control and leadership topics it is dropped: River's own polling covers
// those (leader election re-checks on its interval).
package riverhub
