'use strict';

// Errors of the listenhub client. Everything thrown is a ListenhubError.

class ListenhubError extends Error {
  constructor(message) {
    super(message);
    this.name = this.constructor.name;
  }
}

// The client (or failover listener) was closed by its owner.
class ClosedError extends ListenhubError {
  constructor() {
    super('listenhub: closed');
  }
}

// The subscription name itself is refused (longer than 63 bytes once
// mapped, a NUL, or the hub's "invalid channel" nack): final for that name,
// harmless for the transport. The client stays alive and a failover does not
// fail over because of it.
class InvalidNameError extends ListenhubError {
  constructor(name, reason) {
    super(`listenhub: invalid subscription name ${JSON.stringify(name)}: ${reason}`);
    this.subscriptionName = name;
    this.reason = reason;
  }
}

// The hub refused the subscription at one of its caps ("too many
// subscriptions" for this connection, "too many channels" for the hub). Like
// a name refusal it is final for that subscribe and harmless for the
// transport: the hub keeps the connection, so the client stays alive and a
// failover does not fail over (its own connection would only move the load
// onto a backend of its own). Not an InvalidNameError: the name is fine, and
// the same subscribe may pass once the hub has room.
class LimitError extends ListenhubError {
  constructor(name, reason) {
    super(`listenhub: hub limit reached for ${JSON.stringify(name)}: ${reason}`);
    this.subscriptionName = name;
    this.reason = reason;
  }
}

// The hub refused a subscription for a reason other than the name (LISTEN
// failed, its Postgres is down): the client is dead after it.
class NackError extends ListenhubError {
  constructor(name, reason) {
    super(`listenhub: hub refused ${JSON.stringify(name)}: ${reason}`);
    this.subscriptionName = name;
    this.reason = reason;
  }
}

// No ack or nack within the ack timeout: a wedged hub. The client is dead.
class AckTimeoutError extends ListenhubError {
  constructor(name, timeoutMs) {
    super(`listenhub: no ack for ${JSON.stringify(name)} within ${timeoutMs} ms`);
    this.subscriptionName = name;
    this.timeout = timeoutMs;
  }
}

// A transport failure: op is "dial" (no socket, stale socket), "peer" (the
// socket is not owned by our user or root), "read" (EOF, which is also what
// an eviction looks like; a malformed frame) or "write" (including a write
// stalled past the write timeout).
class ConnError extends ListenhubError {
  constructor(op, path, cause) {
    super(`listenhub: ${op} ${path}: ${cause && cause.message ? cause.message : cause}`);
    this.op = op;
    this.path = path;
    this.cause = cause;
  }
}

// The hub refused this connection at accept and said why (its first frame
// was a nack, e.g. "uid 1000 is not allowed (--allow-uid)"): the client is
// dead, and a failover listener fails over.
class RefusedError extends ListenhubError {
  constructor(path, reason) {
    super(`listenhub: the hub at ${path} refused this connection: ${reason}`);
    this.path = path;
    this.reason = reason;
  }
}

// The events() iterator was not drained: more than maxPending events were
// waiting. The listener is dead, as a worker that stops reading is evicted.
class SlowConsumerError extends ListenhubError {}

// The hub does not deliver the notifications of the database the failover
// listener was given: a NOTIFY committed there did not come back through
// the hub. It serves another database (or cluster); the failover listener
// listens on its own connection instead.
class OtherDatabaseError extends ListenhubError {
  constructor(path, database, timeoutMs) {
    super(
      `listenhub: the hub at ${path} does not deliver the notifications of ${database} (a NOTIFY committed there did not ` +
        `come back through it within ${timeoutMs} ms): it serves another database; listening on this process's own ` +
        `connection (run the hub with this database's URL)`,
    );
    this.path = path;
    this.database = database;
  }
}

// The local listener failed too, after the hub failed.
class FailoverError extends ListenhubError {
  constructor(hub, local) {
    super(`listenhub: local listener failed (${local && local.message ? local.message : local}) after hub failure (${hub && hub.message ? hub.message : hub})`);
    this.hub = hub;
    this.local = local;
  }
}

module.exports = {
  ListenhubError,
  ClosedError,
  InvalidNameError,
  LimitError,
  NackError,
  AckTimeoutError,
  ConnError,
  RefusedError,
  SlowConsumerError,
  OtherDatabaseError,
  FailoverError,
};
