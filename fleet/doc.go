// Package fleet carries a fleet's LISTEN on NATS: PostgreSQL signals every
// listening backend of a database on each NOTIFY, so H hosts with a hub
// each cost the primary about H times one listener's work per NOTIFY. Here
// one Bridge (two or more for HA, one active under a lease) holds the
// fleet's one LISTEN connection per database and publishes each
// notification on NATS; the hubs of the other hosts take them through an
// Upstream (hub.Config.Upstream) and open no Postgres connection at all.
//
// # Subjects
//
// Under a prefix (default "listenhub") and the database's name, each a
// single token:
//
//	PREFIX.DB.n.CHANNEL   one message per notification: the payload as the
//	                      body; headers Lh-Epoch (the active bridge's),
//	                      Lh-Seq (per channel, from 1 in each epoch)
//	PREFIX.DB.hb          the active bridge's heartbeat (JSON: epoch, pg)
//	PREFIX.DB.interest    a hub's channels, by request/reply (JSON)
//
// A channel or database name becomes a token by keeping [A-Za-z0-9_-] and
// writing every other byte as ~XX (two hex digits), so every name maps to a
// subject and back, and two databases or two prefixes never share one.
//
// # The ack rule, end to end
//
// A hub's Listen returns only once its NATS subscription is flushed to the
// server and the active bridge replied that its LISTEN of the channel is
// confirmed by Postgres: a NOTIFY committed after that reaches the hub. The
// bridge keeps a channel while any hub's interest in it is leased; hubs
// renew theirs every third of the lease, and a dead host's interest
// expires.
//
// # No gap is silent
//
// A hub is healthy while NATS is connected, the active bridge's heartbeat
// is fresh and says its Postgres connection is healthy. A new epoch (a
// bridge took over), a sequence gap or a NATS reconnect is a gap: the hub
// tells its workers healthy:false, registers its channels again, and says
// healthy:true, which makes it send one durable wake per channel, as after
// a Postgres reconnect.
package fleet
