"""Failover: the hub while it works, this process's own LISTEN connection
after its failure, and back to the hub once it returns. Same rules as the Go
client's client.Failover."""

from __future__ import annotations

import concurrent.futures
import logging
import random
import secrets
import threading
import warnings
from typing import Any, Callable, Collection

from . import _fork, _frame
from ._events import DEFAULT_MAX_PENDING, Listener, Mode, Sink, SlowConsumerError, Status, Wake, _Event, _OnStatus, _OnWake
from .client import DEFAULT_ACK_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_SILENCE_TIMEOUT, DEFAULT_WRITE_TIMEOUT, Client
from .errors import ClosedError, ConnError, FailoverError, InvalidNameError, LimitError, ListenhubError, ListenhubWarning, OtherDatabaseError
from .local import DEFAULT_LOCAL_APPLICATION_NAME, DEFAULT_LOCAL_TIMEOUT, Local, _connect, database_url


HUB = Mode.HUB
LOCAL = Mode.LOCAL

#: Least time on the local listener before the hub is tried again: a hub
#: that keeps failing costs at most one hub -> local -> hub trip per this.
DEFAULT_MIN_LOCAL = 5.0
#: Wait after a failed fail-back attempt, doubling up to the max.
DEFAULT_PROBE_INTERVAL = 1.0
DEFAULT_PROBE_MAX_INTERVAL = 30.0
#: Each wait between attempts is scaled by a random factor in [0.8, 1.2], so
#: that the processes of a host do not all knock on a restarted hub at once.
PROBE_JITTER = 0.2
#: Sub frames a fail-back has in flight at once.
FAILBACK_PARALLEL = 64

log = logging.getLogger("listenhub")


def _say(msg: str) -> None:
    """A fallback is never silent: besides the log line (which an
    application without logging configured never sees), a warning a
    default interpreter prints."""
    warnings.warn(msg, ListenhubWarning, stacklevel=3)


def jitter(d: float) -> float:
    return d * (1 - PROBE_JITTER + 2 * PROBE_JITTER * random.random())


class Failover(Listener):
    """A listener that uses the hub while it can, its own Postgres
    connection while it cannot, and the hub again once it is back.

    It records the subscription set. On the hub client's failure — connect
    refused or socket missing (at start: local mode from the start), ack
    timeout, a nack other than an invalid name, EOF (hub gone, or this
    process evicted as a slow consumer), a stalled write — it reports
    Status(False), opens a Local listener (psycopg), LISTENs the recorded
    set (channel = prefix + q + suffix, quoted identifiers), swaps it in,
    calls on_failover(reason) and delivers one durable wake per recorded
    name: NOTIFYs committed between the hub's failure and the local LISTENs
    are lost, durable readers re-read; an ephemeral payload sent in that gap
    is gone (as in a hub reconnect to Postgres).

    Fail-back (unless one_way): in local mode it tries the hub again,
    min_local after the swap, then with backoff (probe_interval doubling to
    probe_max_interval, with jitter). An attempt connects a second hub
    client, waits (up to the ack timeout) for it to report healthy,
    subscribes the whole recorded set and waits for every ack, while the
    local listener keeps delivering; only then does it swap the hub in and
    close the local listener (make before break: a NOTIFY in the overlap may
    be delivered twice, none is lost; a round trip on the local connection
    after the last ack lets a NOTIFY committed just before the hub's LISTEN,
    which only the local listener gets, arrive before it is closed), call
    on_failback() and deliver one
    durable wake per recorded name. A failed attempt is abandoned and
    retried later. Back on the hub, the cycle can repeat. one_way=True keeps
    pgbus's rule: once local, local until close().

    A subscribe that meets the failure waits for the swap and subscribes the
    local listener; if the local listener cannot be built, the Failover is
    dead with a FailoverError. Delivery: on_wake(Wake)/on_status(bool)
    callbacks (one call at a time across hub and local), or events()/get().
    During a fail-back both listeners deliver wakes; statuses come from the
    current one only.
    """

    def __init__(
        self,
        socket_path: str,
        *,
        database_url: str | None = None,
        channel_prefix: str = '',
        channel_suffix: str = '',
        application_name: str = DEFAULT_LOCAL_APPLICATION_NAME,
        ack_timeout: float = DEFAULT_ACK_TIMEOUT,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        silence_timeout: float = DEFAULT_SILENCE_TIMEOUT,
        local_timeout: float = DEFAULT_LOCAL_TIMEOUT,
        peer_check: bool = True,
        allowed_uids: Collection[int] = (),
        one_way: bool = False,
        min_local: float = DEFAULT_MIN_LOCAL,
        probe_interval: float = DEFAULT_PROBE_INTERVAL,
        probe_max_interval: float = DEFAULT_PROBE_MAX_INTERVAL,
        on_wake: _OnWake | None = None,
        on_status: _OnStatus | None = None,
        on_failover: Callable[[BaseException], object] | None = None,
        on_failback: Callable[[], object] | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.socket_path = socket_path
        self.ack_timeout = ack_timeout or DEFAULT_ACK_TIMEOUT
        self._hub_args: dict[str, Any] = dict(
            ack_timeout=self.ack_timeout,
            write_timeout=write_timeout,
            connect_timeout=connect_timeout,
            silence_timeout=silence_timeout,
            peer_check=peer_check,
            allowed_uids=allowed_uids,
        )
        self._local_args: dict[str, Any] = dict(
            database_url_=database_url,
            channel_prefix=channel_prefix,
            channel_suffix=channel_suffix,
            application_name=application_name,
            command_timeout=local_timeout,
            on_wake=self._local_wake,
            on_status=self._local_status,
        )
        self.one_way = one_way
        self.min_local = min_local
        self.probe_interval = probe_interval
        self.probe_max_interval = max(probe_max_interval, probe_interval)
        self._sink = Sink(on_wake, on_status, max_pending)
        self._on_failover = on_failover
        self._on_failback = on_failback
        self._dispatch = threading.Lock()  # one callback at a time across hub and local
        # Routing of wakes during a fail-back's cut (_Cut), taken before
        # _dispatch: what is delivered and in which order.
        self._route = threading.Lock()
        self._cut: _Cut | None = None
        # The start's database check: name, token, and an event set when
        # it came back through the hub.
        self._probe: tuple[str, str, threading.Event] | None = None
        self._wrong_database = False
        self._mu = threading.Lock()
        self._mode = HUB
        self.reason: BaseException | None = None
        self._hub: Client | None = None
        self._hub_state: dict[str, Any] | None = None
        self._local: Local | None = None
        self._cand: Client | None = None  # a fail-back's hub client until swapped in or given up
        self._subs: set[str] = set()
        self._swapping = False
        self._settled = threading.Event()  # set while no failover runs
        self._settled.set()
        self.err: BaseException | None = None
        self.done = threading.Event()
        _fork.track(self)

        try:
            hub, state = self._new_hub(current=True)
            self._check_database(hub, state)
        except (ConnError, OtherDatabaseError) as e:
            if isinstance(e, OtherDatabaseError):
                log.error("%s", e)
                _say(str(e))
            else:
                log.warning("listenhub: hub unreachable (%s), listening locally", e)
                _say("listenhub: hub unreachable (%s), listening locally" % e)
            try:
                local = Local(**self._local_args)
            except Exception as le:
                raise FailoverError(e, le) from le
            with self._mu:
                self._mode, self.reason, self._local = LOCAL, e, local
            self._deliver(Status(local.healthy))
            self._start_local(local)
            return
        with self._mu:
            self._hub, self._hub_state = hub, state
        self._watch(hub, self._hub_died)
        if state.get("unverified"):
            threading.Thread(target=self._verify_later, args=(hub, state), name="listenhub-verify", daemon=True).start()

    def _check_database(self, hub: Client, state: dict[str, Any]) -> None:
        """At start: the hub must hear the database this listener was given.
        A private name is subscribed through it, a NOTIFY of it committed on
        a short connection of this process's own, and it must come back
        through the hub within the ack timeout; if not, the hub is closed
        and OtherDatabaseError raised. A hub not healthy within the ack
        timeout (its Postgres is down) is not trusted either: it is left
        unverified, its wakes held, until _verify_later has checked it once
        it says healthy. Whatever else keeps the check from running (a
        database this process cannot reach, no room for the name) leaves
        the hub trusted."""
        if not self._cut_fits() or hub.err is not None:
            return
        if not state["healthy"].wait(self.ack_timeout):
            if hub.err is None:
                with self._route:
                    state["unverified"], state["held"] = True, []
            return
        self._probe_database(hub)

    def _verify_later(self, hub: Client, state: dict[str, Any]) -> None:
        """The start's check, once the hub first says healthy: verified, the
        held wakes are delivered; a hub on another database is left for a
        local listener (reason OtherDatabaseError), its held wakes, another
        database's, dropped."""
        while not state["healthy"].wait(0.5):
            if hub.err is not None or self.err is not None:
                self._release_held(state, False)
                return
        try:
            self._probe_database(hub)
        except OtherDatabaseError as e:
            log.error("%s", e)
            self._release_held(state, False)
            self._begin_failover(hub, e, in_thread=False)
            return
        self._release_held(state, True)

    def _release_held(self, state: dict[str, Any], deliver: bool) -> None:
        with self._route:
            held = state.get("held") or []
            state["unverified"], state["held"] = False, []
            if deliver and state["current"]:
                for w in held:
                    self._deliver(w)

    def _probe_database(self, hub: Client) -> None:
        """The check itself (see _check_database)."""
        token = secrets.token_hex(8)
        q = "lh.db." + token[:8]
        came = threading.Event()
        with self._route:
            self._probe = (q, token, came)
        try:
            try:
                hub.subscribe(q, self.ack_timeout)
            except Exception:
                return  # the hub's own failure shows elsewhere
            database = notify_probe(self._local_args, q, token, self.ack_timeout)
            if database is None or came.wait(self.ack_timeout):
                return
            hub.close()
            raise OtherDatabaseError(self.socket_path, database, self.ack_timeout)
        finally:
            with self._route:
                self._probe = None
            if hub.err is None:
                hub.unsubscribe(q)

    def _after_fork_in_child(self, err: BaseException) -> None:
        """In a forked child (see _fork): dead with err, taking no lock a
        parent's thread may have held at fork."""
        self._mu = threading.Lock()
        self._dispatch = threading.Lock()
        self.err = err
        self._settled = threading.Event()
        self._settled.set()
        self.done = threading.Event()
        self.done.set()
        self._sink = Sink(None, None, 1)
        self._sink.end()

    # --- API -----------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        """Mode.HUB or Mode.LOCAL: where wakes come from now."""
        with self._mu:
            return self._mode

    def subscribe(self, q: str, timeout: float | None = None) -> None:
        """Records q and subscribes the current listener. In hub mode a hub
        failure (anything but an invalid name or this caller's timeout)
        triggers the failover and the subscription is made locally. Raises
        InvalidNameError, FailoverError, ClosedError, TimeoutError (this
        caller's timeout)."""
        problem = _frame.name_problem(q)
        if problem:
            raise InvalidNameError(q, problem)
        while True:
            with self._mu:
                if self.err is not None:
                    raise self.err
                self._subs.add(q)  # before the call: a swap meanwhile includes q
                mode, swapping, hub, local = self._mode, self._swapping, self._hub, self._local
            if swapping:
                if not self._settled.wait(timeout):
                    raise TimeoutError("listenhub: failover not finished in time")
                continue
            cur: Listener | None = hub if mode == HUB else local
            assert cur is not None  # set whenever no swap runs
            try:
                cur.subscribe(q, timeout)
                return
            except (InvalidNameError, LimitError):
                self._forget(q)
                raise
            except TimeoutError:
                raise  # this caller's timeout; the listener is fine
            except ListenhubError as e:
                if not isinstance(cur.err, ClosedError):
                    if mode == HUB and cur.err is not None:
                        self._begin_failover(cur, cur.err, in_thread=True)
                        continue
                    raise
                with self._mu:
                    replaced = self.err is None and cur is not self._hub and cur is not self._local
                if not replaced:
                    raise self.err or e
                # Closed by a swap (a fail-back closing the local listener):
                # subscribe the new current one.

    def unsubscribe(self, q: str) -> None:
        """Drops q from the recorded set and the current listener. Never
        blocks."""
        with self._mu:
            self._subs.discard(q)
            cur: Listener | None = None
            if self.err is None and not self._swapping:
                cur = self._hub if self._mode == HUB else self._local
        if cur is not None:
            cur.unsubscribe(q)

    @property
    def healthy(self) -> bool:
        """Whether the current listener's Postgres connection is healthy."""
        with self._mu:
            if self.err is not None or self._swapping:
                return False
            cur: Listener | None = self._hub if self._mode == HUB else self._local
        return cur is not None and cur.healthy

    def subscriptions(self) -> set[str]:
        """The recorded set."""
        with self._mu:
            return set(self._subs)

    def close(self) -> None:
        """Closes whichever listeners exist. Idempotent; safe from a
        callback."""
        with self._mu:
            if self.err is not None:
                return
            self.err = ClosedError()
            self.done.set()
            hub, local, cand = self._hub, self._local, self._cand
        self._settled.set()
        for x in (hub, local, cand):
            if x is not None:
                x.close()
        self._sink.end()

    # --- internals -----------------------------------------------------------

    def _new_hub(self, current: bool) -> tuple[Client, dict[str, Any]]:
        """A hub client whose statuses are delivered only while it is the
        current one (state["current"]); state["healthy"] is set at its
        first healthy status."""
        state: dict[str, Any] = {"current": current, "healthy": threading.Event()}

        def on_status(h: bool) -> None:
            if h:
                state["healthy"].set()
            if state["current"]:
                self._deliver(Status(h))

        holder: list[Client] = []
        c = Client(self.socket_path, on_wake=lambda w: self._hub_wake(holder, state, w), on_status=on_status, **self._hub_args)
        holder.append(c)
        return c, state

    # --- the cut of a fail-back ---------------------------------------------
    #
    # Both listeners receive one Postgres's notifications in commit order,
    # so a marker NOTIFY committed on the local connection while both listen
    # is at the same place in both streams: the local listener's wakes are
    # delivered up to it and the hub's after it (held until the local
    # listener has passed it): none twice, none lost. A marker the hub never
    # delivers means a hub on another database: the fail-back is refused,
    # and the local listener's wakes held after its marker are delivered
    # then (_abandon), so a refused fail-back loses nothing either.

    def _cut_fits(self) -> bool:
        return cut_fits(self._local_args)

    def _hub_wake(self, holder: list[Client], state: dict[str, Any], w: Wake) -> None:
        with self._route:
            probe = self._probe
            if probe is not None and w.name == probe[0]:
                if w.payload == probe[1]:
                    probe[2].set()
                return
            if state.get("unverified"):
                state["held"].append(w)  # _verify_later delivers or drops them
                return
            cut = self._cut
            if cut is not None and holder and cut.hub is holder[0]:
                if w.name == cut.q:
                    if w.payload == cut.token and not cut.hub_past:
                        cut.hub_past = True
                        cut.held = []  # the hub delivers them from here on
                        cut.passed()
                    return
                if not cut.hub_past:
                    return  # before the marker: the local listener delivers it
                if not cut.local_past:
                    cut.buf.append(w)
                    return
            elif not state["current"]:
                return  # a candidate given up: the local listener delivered it
            self._deliver(w)

    def _local_wake(self, w: Wake) -> None:
        with self._route:
            cut = self._cut
            if cut is not None:
                if w.name == cut.q:
                    if w.payload == cut.token and not cut.local_past:
                        cut.local_past = True
                        for b in cut.buf:
                            self._deliver(b)
                        cut.buf = []
                        cut.passed()
                    return
                if cut.local_past and not cut.hub_past:
                    cut.held.append(w)  # the hub's, once it passes; ours if it never does
                    return
                if cut.local_past:
                    return  # after the marker: the hub delivers it
            self._deliver(w)

    def _set_cut(self, cut: _Cut | None) -> None:
        with self._route:
            self._cut = cut

    def _abandon(self, cut: _Cut) -> None:
        """Removes the cut of a fail-back given up and makes up for what it
        held back: the local listener's wakes after its marker when the hub
        never passed its own (a hub on another database), in order, before
        any later one; when both had passed, a durable wake per name (the
        wakes in flight as the hub stopped delivering may have reached
        neither side)."""
        with self._route:
            if self._cut is not cut:
                return
            self._cut = None
            if cut.local_past and not cut.hub_past:
                for w in cut.held:
                    self._deliver(w)
            cut.held = []
            owed = cut.local_past and cut.hub_past
        if owed:
            with self._mu:
                names = sorted(self._subs)
            for q in names:
                self._deliver(Wake(q, None, True))

    def _send_marker(self, local: Local, cut: _Cut) -> str | None:
        """Commits the marker and waits until both listeners delivered it;
        None when they did, else why not."""
        try:
            local._notify(cut.q, cut.token, self.ack_timeout)
        except Exception as e:
            return str(e)
        if cut.both.wait(self.ack_timeout):
            return None
        if cut.hub_past:
            return "the local listener did not deliver the fail-back marker in time"
        msg, self._wrong_database = wrong_database(self.socket_path, self.ack_timeout, self._wrong_database)
        return msg

    def _watch(self, listener: Listener, then: Callable[[Any, BaseException | None], None]) -> None:
        def run() -> None:
            listener.done.wait()
            then(listener, listener.err)

        threading.Thread(target=run, name="listenhub-failover-watch", daemon=True).start()

    def _hub_died(self, hub: Client, err: BaseException | None) -> None:
        if err is not None and not isinstance(err, ClosedError):
            self._begin_failover(hub, err, in_thread=False)

    def _local_died(self, local: Local, err: BaseException | None) -> None:
        if not isinstance(err, ClosedError):
            self._die(FailoverError(self.reason, err))

    def _forget(self, q: str) -> None:
        with self._mu:
            self._subs.discard(q)

    def _begin_failover(self, hub: Listener, reason: BaseException, in_thread: bool) -> None:
        """Starts the failover from hub (once: a concurrent caller, or a hub
        that is no longer current, does nothing)."""
        with self._mu:
            if self.err is not None or self._mode != HUB or self._hub is not hub or self._swapping:
                return
            self._swapping = True
            self._settled.clear()
        if in_thread:
            threading.Thread(target=self._failover, args=(reason,), daemon=True).start()
        else:
            self._failover(reason)

    def _end_swap(self) -> None:
        with self._mu:
            self._swapping = False
        self._settled.set()

    def _failover(self, reason: BaseException) -> None:
        log.warning("listenhub: hub failed (%s), failing over to a local listener", reason)
        _say("listenhub: hub failed (%s), failing over to a local listener" % reason)
        self._deliver(Status(False))
        try:
            local = Local(**self._local_args)
        except Exception as e:
            self._end_swap()
            self._die(FailoverError(reason, e))
            return
        listened: set[str] = set()
        while True:
            with self._mu:
                todo = self._subs - listened
                closed = self.err is not None
                if not todo and not closed:
                    extra = listened - self._subs
                    recorded = sorted(self._subs)
                    self._mode, self.reason, self._local, self._hub, self._hub_state = LOCAL, reason, local, None, None
                    break
            if closed:
                local.close()
                self._end_swap()
                return
            for q in sorted(todo):
                try:
                    local.subscribe(q)
                except (InvalidNameError, LimitError):
                    self._forget(q)
                    continue
                except Exception as e:
                    local.close()
                    self._end_swap()
                    self._die(FailoverError(reason, "subscribe %r: %s" % (q, e)))
                    return
                listened.add(q)
        self._end_swap()
        for q in extra:
            local.unsubscribe(q)
        log.info("listenhub: local listener active, %d subscriptions", len(recorded))
        if self._on_failover is not None:
            self._call(self._on_failover, reason)
        self._deliver(Status(local.healthy))
        for q in recorded:
            self._deliver(Wake(q, None, True))
        self._start_local(local)

    def _start_local(self, local: Local) -> None:
        """local is current: watch it, and try the hub again."""
        self._watch(local, self._local_died)
        if not self.one_way:
            threading.Thread(target=self._failback_loop, args=(local,), name="listenhub-failback", daemon=True).start()

    def _failback_loop(self, local: Local) -> None:
        wait, nxt, attempt = self.min_local, self.probe_interval, 0
        while True:
            if self.done.wait(wait):
                return
            attempt += 1
            if self._failback(local, attempt):
                return
            wait = jitter(nxt)
            nxt = min(2 * nxt, self.probe_max_interval)

    def _failback(self, local: Local, attempt: int) -> bool:
        """One attempt to return to the hub; True means stop trying (back on
        the hub, local no longer current, or dead)."""
        with self._mu:
            if self.err is not None or self._swapping or self._mode != LOCAL or self._local is not local:
                return True
        try:
            cand, state = self._new_hub(current=False)
        except ConnError as e:
            log.debug("listenhub: fail-back attempt %d: %s", attempt, e)
            return False
        swapped = False
        cut = None
        try:
            with self._mu:
                if self.err is not None:
                    return True
                self._cand = cand
            if not state["healthy"].wait(self.ack_timeout) or cand.err is not None:
                log.debug("listenhub: fail-back attempt %d: hub not healthy", attempt)
                return False
            log.info("listenhub: hub is back, subscribing it before leaving the local listener")
            if self._cut_fits():
                cut = _Cut(cand)
                self._set_cut(cut)
                try:
                    local.subscribe(cut.q, self.ack_timeout)
                    cand.subscribe(cut.q, self.ack_timeout)
                except Exception as e:
                    log.debug("listenhub: fail-back attempt %d: marker: %s", attempt, e)
                    return False
            marked_at = None
            acked: set[str] = set()
            drained = False
            while True:
                with self._mu:
                    if self.err is not None:
                        return True
                    todo = self._subs - acked
                if not todo and not drained:
                    # A NOTIFY committed just before the hub's LISTEN of its
                    # name reaches only the local listener: let it arrive
                    # before the local listener is closed.
                    try:
                        local.sync(self.ack_timeout)
                    except Exception as e:
                        log.debug("listenhub: local listener not drained before the fail-back: %s", e)
                    drained = True
                    continue  # names subscribed meanwhile need their acks first
                if not todo and cut is not None and marked_at is None:
                    why = self._send_marker(local, cut)
                    if why is not None:
                        log.debug("listenhub: fail-back attempt %d: %s", attempt, why)
                        return False
                    marked_at = len(acked)
                    continue
                with self._mu:
                    if self.err is not None:
                        return True
                    todo = self._subs - acked
                    if not todo:
                        if not cand.healthy:
                            return False
                        if cut is not None and len(acked) != marked_at:
                            return False  # a name acked after the marker: start again
                        for q in acked - self._subs:
                            cand.unsubscribe(q)
                        recorded = sorted(self._subs)
                        self._mode, self.reason, self._hub, self._hub_state = HUB, None, cand, state
                        self._local, self._cand = None, None
                        state["current"] = True
                        swapped = True
                        break
                err = self._subscribe_all(cand, sorted(todo), acked)
                if err is not None:
                    log.debug("listenhub: fail-back attempt %d: %s", attempt, err)
                    return False
                drained = False
        finally:
            if not swapped:
                with self._mu:
                    if self._cand is cand:
                        self._cand = None
                cand.close()
                if cut is not None:
                    self._abandon(cut)
                    local.unsubscribe(cut.q)
        self._watch(cand, self._hub_died)
        local.close()  # break, after make
        if cut is not None:
            self._set_cut(None)
            cand.unsubscribe(cut.q)
        log.info("listenhub: back on the hub, local listener closed (attempt %d)", attempt)
        if self._on_failback is not None:
            self._call(self._on_failback)
        self._deliver(Status(cand.healthy))
        for q in recorded:
            self._deliver(Wake(q, None, True))
        return True

    def _subscribe_all(self, c: Client, todo: Collection[str], acked: set[str]) -> BaseException | None:
        """Subscribes c to todo, FAILBACK_PARALLEL at a time; the acked names
        join acked, invalid ones are forgotten; the first other error is
        returned (c is dead then)."""
        first: BaseException | None = None
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(FAILBACK_PARALLEL, len(todo))) as ex:
            futs = [(q, ex.submit(c.subscribe, q)) for q in todo]
            for q, fut in futs:
                try:
                    fut.result()
                    acked.add(q)
                except (InvalidNameError, LimitError):
                    self._forget(q)
                except Exception as e:
                    first = first or e
        return first

    def _die(self, err: BaseException) -> None:
        with self._mu:
            if self.err is not None:
                return
            self.err = err
            self.done.set()
            log.error("listenhub: no listener left: %s", err)
            hub, local, cand = self._hub, self._local, self._cand
        self._settled.set()
        for x in (hub, local, cand):
            if x is not None:
                x.close()
        self._deliver(Status(False), force=True)
        self._sink.end()

    def _call(self, cb: Callable[..., object], *args: Any) -> None:
        with self._dispatch:
            if self.err is not None:
                return
            try:
                cb(*args)
            except Exception:
                log.exception("listenhub: callback raised")

    def _deliver(self, ev: _Event, force: bool = False) -> None:
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

    def _local_status(self, healthy: bool) -> None:
        with self._mu:
            current = self._mode == LOCAL and self.err is None
        if current:  # before the swap, the swap reports the local health itself
            self._deliver(Status(healthy))


def cut_fits(local_args: dict[str, Any]) -> bool:
    """Whether a marker's name (lh.cut. and 8 hex digits) fits in a channel
    between the hub's prefix and suffix."""
    prefix, suffix = local_args["channel_prefix"] or "", local_args["channel_suffix"] or ""
    return len(prefix.encode()) + len("lh.cut.") + 8 + len(suffix.encode()) <= 63


def notify_probe(local_args: dict[str, Any], q: str, token: str, timeout: float) -> str | None:
    """Commits a NOTIFY of q's channel with token on a short connection of
    this process's own (a start's database check); returns the database it
    went to ("name at host:port"), or None when it could not be sent."""
    a = local_args
    try:
        conn = _connect(database_url(a["database_url_"]), a["application_name"], timeout)
    except Exception:
        return None
    try:
        conn.execute("SELECT pg_notify(%s, %s)", ((a["channel_prefix"] or "") + q + (a["channel_suffix"] or ""), token))
        return "%s at %s:%s" % (conn.info.dbname, conn.info.host, conn.info.port)
    except Exception:
        return None
    finally:
        conn.close()


def wrong_database(socket_path: str, timeout: float, said: bool) -> tuple[str, bool]:
    """A fail-back marker that did not come back through the hub: the
    reason, logged at ERROR the first time (said: already once) and at
    DEBUG after; returns it and the new said."""
    msg = (
        "listenhub: the hub at %s does not deliver this database's notifications (a marker did not come back "
        "through it within %ss): it serves another database or cluster; staying on the local listener"
        % (socket_path, timeout)
    )
    if said:
        log.debug(msg)
    else:
        log.error(msg)
    return msg, True


class _Cut:
    """A fail-back's switch point: a private name and a random payload
    (the marker), which listener has passed it, and the hub's wakes held
    until the local listener has."""

    def __init__(self, hub: Client) -> None:
        self.hub = hub
        token = secrets.token_hex(8)
        self.q, self.token = "lh.cut." + token[:8], token
        self.hub_past = self.local_past = False
        self.buf: list[Wake] = []  # the hub's wakes after its marker, before local passed
        self.held: list[Wake] = []  # the local listener's wakes after its marker, before the hub passed
        self.both = threading.Event()

    def passed(self) -> None:
        if self.hub_past and self.local_past:
            self.both.set()
