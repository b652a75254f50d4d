// Package relayfix holds the one fix text per relay set-up problem that
// both the relay (its error line) and `listenhub doctor` (its finding)
// name, so that the two never give different advice for one problem.
package relayfix

import "github.com/listenhub/listenhub/internal/pgquote"

// WalLevel is the fix for a wal_level other than logical.
const WalLevel = "run ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"

// ReplicationRole is the fix for a role without the REPLICATION attribute.
func ReplicationRole(user string) string {
	u := pgquote.Ident(user)
	return "run ALTER ROLE " + u + " REPLICATION; as a superuser (on a managed service, its replication grant, e.g. GRANT rds_replication TO " + u + ")"
}

// MissingPublication is the fix for a publication that does not exist.
func MissingPublication(pub string) string {
	return "run CREATE PUBLICATION " + pgquote.Ident(pub) + " FOR TABLES IN SCHEMA pgmq; (or FOR TABLE ..., FOR ALL TABLES), or start the relay with --create-publication 'TABLES IN SCHEMA pgmq'"
}

// SetPublish is the fix for a publication that does not publish an op the
// relay NOTIFYs: ops is what it should publish, e.g. "insert,update".
func SetPublish(pub, ops string) string {
	return "run ALTER PUBLICATION " + pgquote.Ident(pub) + " SET (publish = " + pgquote.Literal(ops) + ");"
}

// RecreateSlot is the fix for a slot that can no longer decode (invalidated,
// or its position predates its publication): a new slot, whose resync
// NOTIFYs every channel once.
func RecreateSlot(slot string) string {
	return "drop it (SELECT pg_drop_replication_slot(" + pgquote.Literal(slot) + ");) and start the relay again, whose new slot NOTIFYs every channel once; or start the relay with --recreate-invalid-slot"
}

// Pooler is the fix for a connection pooler between the relay and
// PostgreSQL.
const Pooler = "point the relay at PostgreSQL itself, not at a connection pooler (PgBouncer, pgcat, RDS Proxy)"
