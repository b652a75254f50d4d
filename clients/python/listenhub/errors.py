"""Errors of the listenhub clients. Everything raised is a ListenhubError."""

from __future__ import annotations


class ListenhubError(Exception):
    """Base class."""


class ClosedError(ListenhubError):
    """The client (or failover listener) was closed by its owner."""

    def __init__(self, msg: str = 'listenhub: closed') -> None:
        super().__init__(msg)


class InvalidNameError(ListenhubError):
    """The subscription name itself is refused: longer than 63 bytes once
    mapped to a Postgres channel, a NUL, not UTF-8. Final for that name and
    harmless for the transport: the client stays alive and a failover
    listener does not fail over because of it."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__("listenhub: invalid subscription name %r: %s" % (name, reason))
        self.name = name
        self.reason = reason


class LimitError(ListenhubError):
    """The hub refused the subscription at one of its caps ("too many
    subscriptions" for this connection, "too many channels" for the hub).
    Like a name refusal it is final for that subscribe and harmless for the
    transport: the hub keeps the connection, so the client stays alive and a
    failover listener does not fail over (its own connection would only move
    the load onto a backend of its own). Not an InvalidNameError: the name
    is fine, and the same subscribe may pass once the hub has room."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__("listenhub: hub limit reached for %r: %s" % (name, reason))
        self.name = name
        self.reason = reason


class NackError(ListenhubError):
    """The hub refused a subscription for a reason other than the name (its
    LISTEN failed, its Postgres is down): the client is dead after it."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__("listenhub: hub refused %r: %s" % (name, reason))
        self.name = name
        self.reason = reason


class AckTimeoutError(ListenhubError):
    """No ack or nack within the ack timeout: the hub is wedged (or an old
    hub dropped what it refused). The client is dead after it."""

    def __init__(self, name: str, timeout: float) -> None:
        super().__init__("listenhub: no ack for %r within %gs" % (name, timeout))
        self.name = name
        self.timeout = timeout


class ConnError(ListenhubError):
    """A transport failure of the hub connection: the connect (no socket,
    stale socket, wrong peer), a read (EOF, which is also what an eviction
    by the hub looks like; a malformed frame) or a write (including one that
    stalled past the write timeout)."""

    def __init__(self, op: str, path: str, cause: object) -> None:
        super().__init__("listenhub: %s %s: %s" % (op, path, cause))
        self.op = op
        self.path = path
        self.cause = cause


class ForkedError(ClosedError):
    """The listener was made in another process, before fork(): the child
    must make its own (a client is never shared across fork, and is not
    reconnected behind the child's back). Raised at once by every call in
    the child; the parent's listener is not affected."""

    def __init__(self, parent_pid: int) -> None:
        super().__init__(
            "listenhub: this listener was created in process %d before fork(); "
            "create it in the child (after fork), e.g. in gunicorn's post_fork or lazily on first use, "
            "not at import under --preload" % parent_pid
        )
        self.parent_pid = parent_pid


class RefusedError(ListenhubError):
    """The hub refused this connection at accept and said why (its first
    frame was a nack, e.g. "uid 1000 is not allowed (--allow-uid)"): the
    client is dead, and a failover listener fails over."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__("listenhub: the hub at %s refused this connection: %s" % (path, reason))
        self.path = path
        self.reason = reason


class OtherDatabaseError(ListenhubError):
    """The hub does not deliver the notifications of the database the
    failover listener was given: a NOTIFY committed on it did not come back
    through the hub. It serves another database (or cluster); the failover
    listener listens on its own connection instead."""

    def __init__(self, path: str, database: str, timeout: float) -> None:
        super().__init__(
            "listenhub: the hub at %s does not deliver the notifications of %s (a NOTIFY committed there did not "
            "come back through it within %ss): it serves another database; listening on this process's own "
            "connection (run the hub with this database's URL)" % (path, database, timeout)
        )
        self.path = path
        self.database = database


class FailoverError(ListenhubError):
    """The local listener failed too, after the hub failed (``hub``): the
    failover listener is dead."""

    def __init__(self, hub: object, local: object) -> None:
        super().__init__(
            "listenhub: local listener failed (%s) after hub failure (%s)" % (local, hub)
        )
        self.hub = hub
        self.local = local


class ListenhubWarning(UserWarning):
    """A Failover listening on a connection of its own, and why: the hub is
    unreachable, failed, or serves another database. Issued with
    warnings.warn, which a default interpreter prints to stderr (once per
    place in the code), so that a fallback is never silent even when the
    application configured no logging; filter it with the warnings module
    once your logging shows the "listenhub" logger's lines."""
