"""Failover: the hub while it works, this process's own LISTEN connection
after its first failure. Same rules as the Go client's client.Failover."""

import logging
import threading

from . import _frame
from ._events import DEFAULT_MAX_PENDING, Sink, SlowConsumerError, Status, Wake
from .client import DEFAULT_ACK_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_WRITE_TIMEOUT, Client
from .errors import ClosedError, ConnError, FailoverError, InvalidNameError, ListenhubError
from .local import DEFAULT_LOCAL_APPLICATION_NAME, DEFAULT_LOCAL_TIMEOUT, Local

HUB = "hub"
LOCAL = "local"

log = logging.getLogger("listenhub")


class Failover:
    """A listener that uses the hub while it can and its own Postgres
    connection after that.

    It records the subscription set. On the hub client's first failure —
    connect refused or socket missing (at start: local mode from the start),
    ack timeout, a nack other than an invalid name, EOF (hub gone, or this
    process evicted as a slow consumer), a stalled write — it opens a Local
    listener (psycopg), LISTENs the recorded set (channel = prefix + q +
    suffix, quoted identifiers), swaps it in, and then delivers one durable
    wake per recorded name: NOTIFYs committed between the hub's failure and
    the local LISTENs are lost, durable readers re-read; an ephemeral
    payload sent in that gap is gone (as in a hub reconnect to Postgres).

    The swap happens once and is one-way: a Failover never goes back to the
    hub (a restarted hub serves the processes started after it; this one
    keeps its own connection until it exits).

    A subscribe that meets the failure waits for the swap and subscribes the
    local listener; if the local listener cannot be built, the Failover is
    dead with a FailoverError. Delivery: on_wake(Wake)/on_status(bool)
    callbacks (one call at a time across hub and local), or events()/get().
    on_failover(reason), when given, is called once after the swap (not
    when the hub was absent at start).
    """

    def __init__(
        self,
        socket_path,
        *,
        database_url=None,
        channel_prefix="",
        channel_suffix="",
        application_name=DEFAULT_LOCAL_APPLICATION_NAME,
        ack_timeout=DEFAULT_ACK_TIMEOUT,
        write_timeout=DEFAULT_WRITE_TIMEOUT,
        connect_timeout=DEFAULT_CONNECT_TIMEOUT,
        local_timeout=DEFAULT_LOCAL_TIMEOUT,
        peer_check=True,
        allowed_uids=(),
        on_wake=None,
        on_status=None,
        on_failover=None,
        max_pending=DEFAULT_MAX_PENDING,
    ):
        self.socket_path = socket_path
        self._local_args = dict(
            database_url_=database_url,
            channel_prefix=channel_prefix,
            channel_suffix=channel_suffix,
            application_name=application_name,
            command_timeout=local_timeout,
            on_wake=self._local_wake,
            on_status=self._local_status,
        )
        self._sink = Sink(on_wake, on_status, max_pending)
        self._on_failover = on_failover
        self._dispatch = threading.Lock()  # one callback at a time across hub and local
        self._mu = threading.Lock()
        self._mode = HUB
        self.reason = None
        self._hub = None
        self._local = None
        self._subs = set()
        self._swapping = False
        self._settled = threading.Event()  # a swap ended, or death: waiters look again
        self.err = None
        self.done = threading.Event()

        try:
            hub = Client(
                socket_path,
                on_wake=self._hub_wake,
                on_status=self._hub_status,
                ack_timeout=ack_timeout,
                write_timeout=write_timeout,
                connect_timeout=connect_timeout,
                peer_check=peer_check,
                allowed_uids=allowed_uids,
            )
        except ConnError as e:
            log.warning("listenhub: hub unreachable (%s), listening locally", e)
            try:
                local = Local(**self._local_args)
            except Exception as le:
                raise FailoverError(e, le) from le
            with self._mu:
                self._mode, self.reason, self._local = LOCAL, e, local
            self._settled.set()
            self._watch(local, self._local_died)
            self._deliver(Status(local.healthy()))
            return
        with self._mu:
            self._hub = hub
        self._watch(hub, self._hub_died)

    # --- API -----------------------------------------------------------------

    def mode(self):
        """"hub" or "local": where wakes come from now."""
        with self._mu:
            return self._mode

    def subscribe(self, q, timeout=None):
        """Records q and subscribes the current listener. In hub mode a hub
        failure (anything but an invalid name or this caller's timeout)
        triggers the failover and the subscription is made locally. Raises
        InvalidNameError, FailoverError, ClosedError, TimeoutError (this
        caller's timeout)."""
        problem = _frame.name_problem(q)
        if problem:
            raise InvalidNameError(q, problem)
        with self._mu:
            if self.err is not None:
                raise self.err
            self._subs.add(q)  # before the call: a failover meanwhile includes q
            hub = self._hub
            in_hub = self._mode == HUB and not self._swapping
        if in_hub:
            try:
                hub.subscribe(q, timeout)
                return
            except InvalidNameError:
                self._forget(q)
                raise
            except TimeoutError:
                raise  # this caller's timeout; the hub client is fine
            except ListenhubError as e:
                if isinstance(hub.err, ClosedError):
                    raise self.err or e
                # The watcher starts the same failover; whoever is first
                # does it, the other waits.
                threading.Thread(target=self._failover, args=(hub.err,), daemon=True).start()
        if not self._settled.wait(timeout):
            raise TimeoutError("listenhub: failover not finished in time")
        with self._mu:
            local, err = self._local, self.err
        if err is not None:
            raise err
        try:
            local.subscribe(q, timeout)
        except InvalidNameError:
            self._forget(q)
            raise

    def unsubscribe(self, q):
        """Drops q from the recorded set and the current listener. Never
        blocks."""
        with self._mu:
            self._subs.discard(q)
            cur = None
            if self.err is None and not self._swapping:
                cur = self._hub if self._mode == HUB else self._local
        if cur is not None:
            cur.unsubscribe(q)

    def healthy(self):
        with self._mu:
            if self.err is not None or self._swapping:
                return False
            cur = self._hub if self._mode == HUB else self._local
        return cur.healthy()

    def subscriptions(self):
        """The recorded set."""
        with self._mu:
            return set(self._subs)

    def events(self):
        return self._sink.events()

    def get(self, timeout=None):
        return self._sink.get(timeout)

    def close(self):
        """Closes whichever listeners exist. Idempotent; safe from a
        callback."""
        with self._mu:
            if self.err is not None:
                return
            self.err = ClosedError()
            self.done.set()
            hub, local = self._hub, self._local
        self._settled.set()
        if hub is not None:
            hub.close()
        if local is not None:
            local.close()
        self._sink.end()

    def wait(self, timeout=None):
        self.done.wait(timeout)
        return self.err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- internals -----------------------------------------------------------

    def _watch(self, listener, then):
        def run():
            listener.done.wait()
            then(listener.err)

        threading.Thread(target=run, name="listenhub-failover-watch", daemon=True).start()

    def _hub_died(self, err):
        if not isinstance(err, ClosedError):
            self._failover(err)

    def _local_died(self, err):
        if not isinstance(err, ClosedError):
            self._die(FailoverError(self.reason, err))

    def _forget(self, q):
        with self._mu:
            self._subs.discard(q)

    def _failover(self, reason):
        with self._mu:
            if self.err is not None or self._mode == LOCAL:
                return
            if self._swapping:
                wait = True
            else:
                wait = False
                self._swapping = True
        if wait:
            self._settled.wait()
            return
        log.warning("listenhub: hub failed (%s), failing over to a local listener", reason)
        self._deliver(Status(False))
        try:
            local = Local(**self._local_args)
        except Exception as e:
            self._die(FailoverError(reason, e))
            return
        listened = set()
        while True:
            with self._mu:
                todo = self._subs - listened
                closed = self.err is not None
                if not todo and not closed:
                    extra = listened - self._subs
                    recorded = sorted(self._subs)
                    self._mode, self.reason, self._local, self._swapping = LOCAL, reason, local, False
                    break
            if closed:
                local.close()
                with self._mu:
                    self._swapping = False
                self._settled.set()
                return
            for q in sorted(todo):
                try:
                    local.subscribe(q)
                except InvalidNameError:
                    self._forget(q)
                    continue
                except Exception as e:
                    local.close()
                    self._die(FailoverError(reason, "subscribe %r: %s" % (q, e)))
                    return
                listened.add(q)
        self._settled.set()
        for q in extra:
            local.unsubscribe(q)
        self._watch(local, self._local_died)
        log.info("listenhub: local listener active, %d subscriptions", len(recorded))
        if self._on_failover is not None:
            with self._dispatch:
                try:
                    self._on_failover(reason)
                except Exception:
                    log.exception("listenhub: on_failover raised")
        self._deliver(Status(local.healthy()))
        for q in recorded:
            self._deliver(Wake(q, None, True))

    def _die(self, err):
        with self._mu:
            if self.err is None:
                self.err = err
                self.done.set()
                log.error("listenhub: no listener left: %s", err)
            self._swapping = False
            hub, local = self._hub, self._local
        self._settled.set()
        if hub is not None:
            hub.close()
        if local is not None:
            local.close()
        self._deliver(Status(False), force=True)
        self._sink.end()

    def _deliver(self, ev, force=False):
        cb = self._sink.callback(ev)
        with self._dispatch:
            if isinstance(self.err, ClosedError) or (self.err is not None and not force):
                return
            if cb is None:
                if not self._sink.put(ev):
                    threading.Thread(
                        target=self._die,
                        args=(SlowConsumerError("listenhub: more than %d events not taken from events()" % self._sink.max_pending),),
                        daemon=True,
                    ).start()
                return
            try:
                cb(ev if isinstance(ev, Wake) else ev.healthy)
            except Exception:
                log.exception("listenhub: callback raised")

    def _hub_wake(self, w):
        self._deliver(w)

    def _hub_status(self, healthy):
        self._deliver(Status(healthy))

    def _local_wake(self, w):
        self._deliver(w)

    def _local_status(self, healthy):
        with self._mu:
            current = self._mode == LOCAL and self.err is None
        if current:  # before the swap, the swap reports the local health itself
            self._deliver(Status(healthy))
