"""The per-process Postgres listener a Failover swaps to: its own LISTEN
connection through psycopg 3 (imported lazily, so the hub client needs only
the standard library)."""

from __future__ import annotations

import collections
import logging
import os
import secrets
import select
import threading
import time
from typing import Any, Deque

from . import _fork, _frame
from ._events import (
    DEFAULT_MAX_PENDING,
    Listener,
    Sink,
    SlowConsumerError,
    Status,
    Wake,
    _Event,
    _OnStatus,
    _OnWake,
    make_wake,
)
from .errors import ClosedError, InvalidNameError, ListenhubError

#: Tags the local listener's backend in pg_stat_activity, distinct from the
#: hub's "listenhub", so an operator sees how many processes fell back.
DEFAULT_LOCAL_APPLICATION_NAME = "listenhub-local"
#: Bounds the connect and each subscribe's wait for its LISTEN.
DEFAULT_LOCAL_TIMEOUT = 10.0
#: An idle connection is checked (SELECT 1) this often.
HEALTH_CHECK_INTERVAL = 5.0
_BACKOFF_MIN, _BACKOFF_MAX = 0.1, 5.0

log = logging.getLogger("listenhub")


def database_url(url: str | None = None) -> str:
    """url, else LISTENHUB_DATABASE_URL, else DATABASE_URL, else "" (libpq's
    PG* variables alone)."""
    return url or os.environ.get("LISTENHUB_DATABASE_URL") or os.environ.get("DATABASE_URL") or ""


def _connect(url: str, application_name: str, timeout: float) -> Any:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(url)
    kwargs: dict[str, Any] = {"autocommit": True}
    if "application_name" not in params and not os.environ.get("PGAPPNAME"):
        kwargs["application_name"] = application_name
    if "connect_timeout" not in params and not os.environ.get("PGCONNECT_TIMEOUT"):
        kwargs["connect_timeout"] = max(2, int(timeout))
    if "keepalives" not in params:
        # A dead peer on TCP is noticed within about half a minute.
        kwargs.update(keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3)
    return psycopg.connect(url, **kwargs)


#: Bounds the delivery check's wait for its notification (twice the hub's
#: --health-check-timeout default: a client's machine may be busy).
DELIVERY_CHECK_TIMEOUT = 2.0

#: The most likely reason notifications from another session do not arrive
#: through a pooler: the advice the hub gives too.
_POOLER_ADVICE = "a transaction-pooling PgBouncer? use a direct URL"


def check_delivery(
    conn: Any,
    url: str,
    application_name: str,
    timeout: float = DELIVERY_CHECK_TIMEOUT,
) -> None:
    """Proves that notifications arrive on conn (the hub's delivery check,
    docs/design.md rule 13), or raises ListenhubError saying what it most
    likely looks at.

    LISTENs on a private channel and compares pg_backend_pid() with the
    pid of BackendKeyData (conn.info.backend_pid). Equal: a direct
    connection, and its own NOTIFY must come back. Different: something
    sits between that made up its own key (PgBouncer does, in every pool
    mode); through a transaction pooler our own NOTIFY comes back all the
    same, so the NOTIFY comes from a second session, which only a session
    pooler delivers. The channel is UNLISTENed afterwards."""
    import psycopg

    ch = "listenhub.check.%d.%s" % (os.getpid(), secrets.token_hex(4))
    payload = secrets.token_hex(8)
    got = []

    def on_notify(n: Any) -> None:
        if n.channel == ch:
            got.append(n.payload)

    conn.add_notify_handler(on_notify)
    try:
        conn.execute("LISTEN " + _frame.quote_ident(ch))
        server_pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        key_pid = conn.info.backend_pid
        pooled = server_pid != key_pid
        if not pooled:
            conn.execute("SELECT pg_notify(%s, %s)", (ch, payload))
        else:
            try:
                with _connect(url, application_name + "-check", timeout + 2) as other:
                    other.execute("SELECT pg_notify(%s, %s)", (ch, payload))
            except psycopg.Error as e:
                raise ListenhubError(
                    "listenhub: notifications do not arrive on this connection: a pooler sits between (pg_backend_pid() %d is not "
                    "BackendKeyData's %d) and a second connection to check it failed: %s" % (server_pid, key_pid, e)
                ) from e
        deadline = time.monotonic() + timeout
        pg = conn.pgconn
        enc = conn.info.encoding
        while payload not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                if pooled:
                    raise ListenhubError(
                        "listenhub: notifications do not arrive on this connection: %s (pg_backend_pid() %d is not BackendKeyData's %d: "
                        "a pooler sits between, and a NOTIFY from a second session did not arrive within %gs)"
                        % (_POOLER_ADVICE, server_pid, key_pid, timeout)
                    )
                raise ListenhubError(
                    "listenhub: notifications do not arrive on this connection: LISTEN and NOTIFY on it brought nothing back within %gs" % timeout
                )
            r, _, _ = select.select([conn.fileno()], [], [], left)
            if r:
                pg.consume_input()
                while True:
                    n = pg.notifies()
                    if n is None:
                        break
                    if n.relname.decode(enc, "replace") == ch:
                        got.append(n.extra.decode(enc, "replace"))
        if pooled:
            log.info("listenhub local listener: connected through a pooler that delivers notifications (session pooling): "
                     "pid %d, BackendKeyData pid %d", server_pid, key_pid)
        conn.execute("UNLISTEN " + _frame.quote_ident(ch))
    finally:
        conn.remove_notify_handler(on_notify)


def _connect_checked(url: str, application_name: str, timeout: float) -> Any:
    """_connect, then the delivery check; the connection is closed if it
    fails."""
    conn = _connect(url, application_name, timeout)
    try:
        check_delivery(conn, url, application_name, min(timeout, DELIVERY_CHECK_TIMEOUT))
    except BaseException:
        conn.close()
        raise
    return conn


class _Op:
    __slots__ = ("q", "listen", "reply", "err", "payload")

    def __init__(
        self, q: str | None, listen: bool | None, reply: threading.Event | None, payload: str | None = None
    ) -> None:
        self.q, self.listen, self.reply = q, listen, reply
        self.err: BaseException | None = None
        self.payload = payload  # not None: a NOTIFY of q's channel


class Local(Listener):
    """A listener over this process's own Postgres connection (session
    mode: LISTEN does not work through a transaction-pooling PgBouncer).

    One thread owns the connection: it runs LISTEN/UNLISTEN in call order and
    reads notifications in between. A lost connection is reconnected with
    backoff (capped at 5 s); once every name is LISTENed again it reports
    Status(True) and delivers one durable wake per name (NOTIFYs in the gap
    are gone). A Local dies only by close().

    Same delivery as Client: on_wake(Wake)/on_status(bool) callbacks, from
    the listener's thread, or events()/get().
    """

    def __init__(
        self,
        database_url_: str | None = None,
        *,
        channel_prefix: str = '',
        channel_suffix: str = '',
        application_name: str = DEFAULT_LOCAL_APPLICATION_NAME,
        command_timeout: float = DEFAULT_LOCAL_TIMEOUT,
        on_wake: _OnWake | None = None,
        on_status: _OnStatus | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.url = database_url(database_url_)
        self.prefix, self.suffix = channel_prefix, channel_suffix
        self.application_name = application_name or DEFAULT_LOCAL_APPLICATION_NAME
        self.command_timeout = command_timeout or DEFAULT_LOCAL_TIMEOUT
        self._sink = Sink(on_wake, on_status, max_pending)
        self._conn = _connect_checked(self.url, self.application_name, self.command_timeout)
        self._conn.add_notify_handler(self._on_notify)

        self._mu = threading.Lock()
        self._ops: Deque[_Op] = collections.deque()
        self._listening: set[str] = set()
        self.err = None
        self.done = threading.Event()
        self._healthy = True
        self._dispatch = threading.Lock()
        self._in_handler = False
        self._closing = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._pipe_mu = threading.Lock()  # no kick into a closed (or reused) fd
        self._pipe_open = True
        self._thread = threading.Thread(target=self._run, name="listenhub-local", daemon=True)
        self._thread.start()
        _fork.track(self)

    def _after_fork_in_child(self, err: BaseException) -> None:
        """In a forked child (see _fork): dead with err. The child's copy of
        the Postgres socket is left alone: psycopg would send Terminate on
        it, ending the parent's session."""
        self._mu = threading.Lock()
        self._dispatch = threading.Lock()
        self._pipe_mu = threading.Lock()
        self.err = err
        self.done = threading.Event()
        self.done.set()
        self._sink = Sink(None, None, 1)
        self._sink.end()

    def channel(self, q: str) -> str:
        return self.prefix + q + self.suffix

    def backend_pid(self) -> int:
        """The pid of the current Postgres backend (tests, diagnostics)."""
        pid: int = self._conn.info.backend_pid
        return pid

    def subscribe(self, q: str, timeout: float | None = None) -> None:
        """LISTENs to q's channel; returns once Postgres confirmed it.
        InvalidNameError for a name no channel can carry. ``timeout``
        (default the command timeout) bounds the wait: TimeoutError, and the
        LISTEN still happens later (harmless over-delivery)."""
        problem = _frame.name_problem(q) or _frame.channel_problem(self.channel(q))
        if problem:
            raise InvalidNameError(q, problem)
        reply = threading.Event()
        with self._mu:
            if self.err is not None:
                raise self.err
            if q in self._listening and not self._unlisten_queued(q):
                return
            op = _Op(q, True, reply)
            self._ops.append(op)
        self._kick()
        if not reply.wait(self.command_timeout if timeout is None else timeout):
            if self.err is not None:
                raise self.err
            raise TimeoutError("listenhub: local LISTEN of %r not confirmed in time" % q)
        if op.err is not None:
            raise op.err

    def sync(self, timeout: float | None = None) -> None:
        """A round trip on the connection, in order after every LISTEN and
        UNLISTEN queued before it: every notification the server sent before
        it has been delivered when it returns (a fail-back drains the local
        listener so before closing it)."""
        reply = threading.Event()
        with self._mu:
            if self.err is not None:
                raise self.err
            op = _Op(None, None, reply)
            self._ops.append(op)
        self._kick()
        if not reply.wait(self.command_timeout if timeout is None else timeout):
            raise TimeoutError("listenhub: local round trip not done in time")
        if op.err is not None:
            raise op.err

    def _notify(self, q: str, payload: str, timeout: float | None = None) -> None:
        """Commits NOTIFY on q's channel with payload on this connection, in
        order after the LISTENs and UNLISTENs queued before it (a
        fail-back's marker: see Failover)."""
        reply = threading.Event()
        with self._mu:
            if self.err is not None:
                raise self.err
            op = _Op(q, None, reply, payload)
            self._ops.append(op)
        self._kick()
        if not reply.wait(self.command_timeout if timeout is None else timeout):
            raise TimeoutError("listenhub: local NOTIFY of %r not done in time" % q)
        if op.err is not None:
            raise op.err

    def _unlisten_queued(self, q: str) -> bool:
        for op in reversed(self._ops):
            if op.q == q and op.payload is None:
                return not op.listen
        return False

    def unsubscribe(self, q: str) -> None:
        """Queues an UNLISTEN of q's channel; never blocks."""
        with self._mu:
            if self.err is not None:
                return
            self._ops.append(_Op(q, False, None))
        self._kick()

    @property
    def healthy(self) -> bool:
        return not self.done.is_set() and self._healthy

    def close(self) -> None:
        """Closes the connection. Waiting subscribes raise ClosedError; no
        new callback starts. Idempotent; safe from a callback."""
        self._closing = True
        if not self._die(ClosedError()):
            return
        if not self._in_handler:
            with self._dispatch:
                pass
            if threading.current_thread() is not self._thread:
                self._thread.join(2.0)

    # --- internals -----------------------------------------------------------

    def _die(self, err: BaseException) -> bool:
        with self._mu:
            if self.err is not None:
                return False
            self.err = err
            ops, self._ops = list(self._ops), collections.deque()
            self.done.set()
        for op in ops:
            if op.reply is not None:
                op.err = err
                op.reply.set()
        self._healthy = False
        self._sink.end()
        self._kick()
        return True

    def _kick(self) -> None:
        with self._pipe_mu:
            if not self._pipe_open:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass  # full: a kick is pending anyway

    def _drain_kick(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # a bug here must not leave callers hanging
            log.exception("listenhub local listener crashed")
            self._die(ListenhubError("local listener crashed: %s" % e))
        finally:
            try:
                self._conn.close()
            except Exception:
                pass
            with self._pipe_mu:
                self._pipe_open = False
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _loop(self) -> None:
        import psycopg

        last_traffic = time.monotonic()
        while not self.done.is_set():
            try:
                self._run_ops()
                r, _, _ = select.select([self._conn.fileno(), self._wake_r], [], [], HEALTH_CHECK_INTERVAL)
                if self._wake_r in r:
                    self._drain_kick()
                if self.done.is_set():
                    return
                if self._conn.fileno() in r:
                    last_traffic = time.monotonic()
                    self._read_notifies()
                elif time.monotonic() - last_traffic >= HEALTH_CHECK_INTERVAL:
                    self._conn.execute("SELECT 1")
                    last_traffic = time.monotonic()
            except psycopg.Error as e:
                if self.done.is_set():
                    return
                log.warning("listenhub local listener: connection lost: %s", e)
                self._reconnect()
                last_traffic = time.monotonic()

    def _run_ops(self) -> None:
        import psycopg

        while True:
            with self._mu:
                if self.err is not None or not self._ops:
                    return
                op = self._ops[0]
                skip = op.q is not None and op.payload is None and op.listen == (op.q in self._listening)
            if op.payload is not None and op.q is not None:
                try:
                    self._conn.execute("SELECT pg_notify(%s, %s)", (self.channel(op.q), op.payload))
                except psycopg.OperationalError:
                    raise
                except psycopg.Error as e:
                    op.err = ListenhubError("local NOTIFY %r failed: %s" % (op.q, e))
            elif op.q is None:
                self._conn.execute("SELECT 1")  # sync(): notifications before it are delivered
            elif not skip:
                verb = "LISTEN " if op.listen else "UNLISTEN "
                try:
                    self._conn.execute(verb + _frame.quote_ident(self.channel(op.q)))
                except psycopg.OperationalError:
                    raise  # connection trouble: the op stays queued for after the reconnect
                except psycopg.Error as e:
                    op.err = ListenhubError("local %s%r failed: %s" % (verb, op.q, e))
            with self._mu:
                if self._ops and self._ops[0] is op:
                    self._ops.popleft()
                if op.err is None and op.q is not None and op.payload is None:
                    if op.listen:
                        self._listening.add(op.q)
                    else:
                        self._listening.discard(op.q)
            if op.reply is not None:
                op.reply.set()

    def _read_notifies(self) -> None:
        import psycopg

        pg = self._conn.pgconn
        pg.consume_input()
        if pg.status != psycopg.pq.ConnStatus.OK:
            raise psycopg.OperationalError("connection lost")
        enc = self._conn.info.encoding
        while True:
            n = pg.notifies()
            if n is None:
                return
            self._on_channel(n.relname.decode(enc, "replace"), n.extra.decode(enc, "replace"))

    def _on_notify(self, n: Any) -> None:
        # Notifications that arrived while a LISTEN ran.
        self._on_channel(n.channel, n.payload)

    def _on_channel(self, ch: str, payload: str) -> None:
        if not (ch.startswith(self.prefix) and ch.endswith(self.suffix)) or len(ch) < len(self.prefix) + len(self.suffix):
            log.debug("listenhub local listener: notification outside the mapping: %r", ch)
            return
        q = ch[len(self.prefix) : len(ch) - len(self.suffix)]
        self._deliver(make_wake(q, payload))

    def _deliver(self, ev: _Event) -> None:
        cb = self._sink.callback(ev)
        if cb is None:
            if not self._sink.put(ev):
                self._die(SlowConsumerError("listenhub: more than %d events not taken from events()" % self._sink.max_pending))
            return
        arg = ev if isinstance(ev, Wake) else ev.healthy
        with self._dispatch:
            self._in_handler = True
            try:
                if self._closing:
                    return
                try:
                    cb(arg)
                except Exception:
                    log.exception("listenhub local listener: callback raised")
            finally:
                self._in_handler = False

    def _reconnect(self) -> None:
        """Replaces a lost connection, re-LISTENs the set, reports health and
        one durable wake per name. Returns when connected or closed."""
        self._healthy = False
        self._deliver(Status(False))
        try:
            self._conn.close()
        except Exception:
            pass
        backoff = _BACKOFF_MIN
        while not self.done.is_set():
            conn = None
            try:
                conn = _connect_checked(self.url, self.application_name, self.command_timeout)
                conn.add_notify_handler(self._on_notify)
                with self._mu:
                    names = sorted(self._listening)
                for q in names:
                    conn.execute("LISTEN " + _frame.quote_ident(self.channel(q)))
            except Exception as e:
                log.warning("listenhub local listener: reconnect failed: %s", e)
                if conn is not None:
                    conn.close()
                self._wait_kick(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
                continue
            self._conn = conn
            self._healthy = True
            self._deliver(Status(True))
            for q in names:
                self._deliver(Wake(q, None, True))
            return

    def _wait_kick(self, seconds: float | None) -> None:
        select.select([self._wake_r], [], [], seconds)
        self._drain_kick()
