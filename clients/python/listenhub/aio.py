"""The asyncio API: AsyncClient (the hub over asyncio streams) and
AsyncFailover. Same rules as the synchronous classes; see their docs."""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import threading
import time
from typing import Any, AsyncIterator, Callable, Collection, Set, TypeVar, cast

from . import _fork, _frame, _subs
from ._events import DEFAULT_MAX_PENDING, Mode, SlowConsumerError, Status, Wake, _Event, _OnStatus, _OnWake, make_wake
from .client import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_SILENCE_TIMEOUT,
    DEFAULT_WRITE_TIMEOUT,
    _dial,
)
from .errors import (
    AckTimeoutError,
    ClosedError,
    ConnError,
    FailoverError,
    InvalidNameError,
    LimitError,
    ListenhubError,
    NackError,
    OtherDatabaseError,
    RefusedError,
)
from .failover import (
    DEFAULT_MIN_LOCAL,
    DEFAULT_PROBE_INTERVAL,
    DEFAULT_PROBE_MAX_INTERVAL,
    FAILBACK_PARALLEL,
    HUB,
    LOCAL,
    _say,
    cut_fits,
    jitter,
    notify_probe,
    wrong_database,
)
from .local import DEFAULT_LOCAL_APPLICATION_NAME, DEFAULT_LOCAL_TIMEOUT, Local


_A = TypeVar('_A', bound='_AsyncListener')

log = logging.getLogger("listenhub")

_END = object()


class _AsyncSink:
    """Callbacks (plain functions or coroutine functions, awaited in order)
    or a bounded queue for events()."""

    def __init__(self, on_wake: _OnWake | None, on_status: _OnStatus | None, max_pending: int | None) -> None:
        self.on_wake, self.on_status = on_wake, on_status
        self.max_pending = max_pending or DEFAULT_MAX_PENDING
        self._q: asyncio.Queue[object] = asyncio.Queue()
        self._ended = False

    def callback(self, ev: _Event) -> Callable[[Any], object] | None:
        return self.on_wake if isinstance(ev, Wake) else self.on_status

    def put(self, ev: _Event) -> bool:
        if self._ended:
            return True
        if self._q.qsize() >= self.max_pending:
            return False
        self._q.put_nowait(ev)
        return True

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self._q.put_nowait(_END)

    async def get(self, timeout: float | None = None) -> _Event | None:
        if self._q.empty() and self._ended:
            return None
        try:
            ev = await asyncio.wait_for(self._q.get(), timeout)
        except asyncio.TimeoutError:
            return None
        if ev is _END:
            self._q.put_nowait(_END)  # later get()s end too
            return None
        return cast(_Event, ev)

    async def events(self) -> AsyncIterator[_Event]:
        while True:
            ev = await self.get()
            if ev is None:
                return
            yield ev


async def _run_callback(cb: Callable[[Any], object], arg: object) -> None:
    try:
        r = cb(arg)
        if inspect.isawaitable(r):
            await r
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("listenhub: callback raised")


class _Call:
    __slots__ = ("fut", "waiters", "timer")

    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.fut = fut
        self.waiters = 0
        self.timer: asyncio.TimerHandle | None = None


class _AsyncListener:
    """What AsyncClient and AsyncFailover share: the queued events, waiting
    for the end, and use as an async context manager. A subclass sets _sink
    (an _AsyncSink), err and done (an asyncio.Event set at death) and
    defines close()."""

    _sink: _AsyncSink
    #: Why the listener died (None while it lives).
    err: BaseException | None
    #: Set when the listener is dead.
    done: asyncio.Event

    def close(self) -> None:
        raise NotImplementedError

    def events(self) -> AsyncIterator[_Event]:
        """Async iterator over the events without a callback, until the
        listener is dead and the queue drained."""
        return self._sink.events()

    async def get(self, timeout: float | None = None) -> _Event | None:
        return await self._sink.get(timeout)

    async def wait(self) -> BaseException | None:
        """Waits until the listener is dead; returns err."""
        await self.done.wait()
        return self.err

    async def __aenter__(self: _A) -> _A:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_AsyncListener):
    """A connection to a listenhub hub for asyncio. Make one with
    ``await listenhub.aio.connect(path, ...)``.

    Alive until its first failure, then dead for good: ``err`` (ClosedError,
    ConnError, AckTimeoutError, NackError), ``done`` (an asyncio.Event).
    Wakes and statuses go to on_wake(Wake)/on_status(bool) — plain functions
    or coroutine functions, awaited one at a time in wire order by the
    reader task (while one runs nothing is read) — or to ``events()``, an
    async iterator.
    """

    def __init__(
        self,
        path: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        on_wake: _OnWake | None,
        on_status: _OnStatus | None,
        ack_timeout: float,
        write_timeout: float,
        max_pending: int,
        frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
        silence_timeout: float = DEFAULT_SILENCE_TIMEOUT,
    ) -> None:
        self.path = path
        self.ack_timeout = ack_timeout or DEFAULT_ACK_TIMEOUT
        self.write_timeout = write_timeout or DEFAULT_WRITE_TIMEOUT
        self.frame_timeout = frame_timeout or DEFAULT_FRAME_TIMEOUT
        self.silence_timeout = silence_timeout or DEFAULT_SILENCE_TIMEOUT
        self._greeted = False
        self._held = bytearray()
        self._reader, self._writer = reader, writer
        # drain() then waits until the kernel took every byte.
        writer.transport.set_write_buffer_limits(high=0, low=0)
        self._sink = _AsyncSink(on_wake, on_status, max_pending)
        self._subs: dict[str, _subs.Sub] = {}
        self.err: BaseException | None = None
        self.done = asyncio.Event()
        self._healthy = False
        self._saw_status = False  # a status arrived (see _ack_timeout)
        self._closing = False
        self._drainer: asyncio.Task[None] | None = None
        self._lh_state: dict[str, Any] = {}  # an AsyncFailover's view of this client
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._read_loop())
        _fork.track(self)

    def _after_fork_in_child(self, err: BaseException) -> None:
        """In a forked child (see _fork): dead with err (the event loop
        does not survive fork either). The socket is closed, not shut down."""
        self.err = err
        self._subs = {}
        self._healthy = False
        try:
            self._writer.get_extra_info("socket").close()
        except Exception:
            pass

    async def subscribe(self, q: str) -> None:
        """Subscribes to q; returns once the hub acked it. Raises
        InvalidNameError (client alive), NackError / AckTimeoutError /
        ConnError (client dead), the client's error when already dead.
        Cancelling the caller (asyncio.timeout, wait_for) abandons the
        subscription: the client unsubscribes once the ack arrives unless
        another caller waits for it."""
        problem = _frame.name_problem(q)
        if problem:
            raise InvalidNameError(q, problem)
        if self.err is not None:
            raise self.err
        s, fresh = _subs.join(self._subs, q, lambda: _Call(self._loop.create_future()))
        if s is None:
            return
        c = s.call
        if fresh:
            c.timer = self._loop.call_later(self.ack_timeout, self._ack_timeout, c, q)
            self._write(_frame.sub(q))
        try:
            await asyncio.shield(c.fut)
        except asyncio.CancelledError:
            if not c.fut.done():
                _subs.abandon(s, c)
            raise

    def unsubscribe(self, q: str) -> None:
        """Drops q and tells the hub; never blocks."""
        if self.err is None and _subs.drop(self._subs, q):
            self._write(_frame.unsub(q))

    @property
    def healthy(self) -> bool:
        return self.err is None and self._healthy

    def subscriptions(self) -> set[str]:
        return _subs.acked(self._subs)

    def close(self) -> None:
        """Kills the client with ClosedError and closes the socket. No new
        callback starts once called. Idempotent; safe from a callback."""
        self._closing = True
        self._die(ClosedError())

    # --- internals -----------------------------------------------------------

    def _write(self, b: bytes) -> None:
        if not self._greeted:
            # Nothing is written before the hub's first frame (status, or
            # the refusal): see Client._write_loop.
            self._held += b
            return
        self._writer.write(b)
        if self._drainer is None and self._writer.transport.get_write_buffer_size() > 0:
            self._drainer = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await asyncio.wait_for(self._writer.drain(), self.write_timeout)
        except asyncio.TimeoutError:
            self._die(ConnError("write", self.path, "stalled for %gs: the hub stopped reading" % self.write_timeout))
        except (ConnectionError, OSError) as e:
            self._die(ConnError("write", self.path, e))
        finally:
            self._drainer = None
        if self.err is None and self._writer.transport.get_write_buffer_size() > 0:
            self._drainer = self._loop.create_task(self._drain())

    def _ack_timeout(self, c: _Call, q: str) -> None:
        if c.fut.done() or self.err is not None:
            return
        if self._saw_status and not self._healthy:
            # The hub's Postgres is down: the ack comes once it is back
            # (the healthy status restarts the timer); look again later.
            c.timer = self._loop.call_later(self.ack_timeout, self._ack_timeout, c, q)
            return
        self._die(AckTimeoutError(q, self.ack_timeout))

    def _die(self, err: BaseException) -> None:
        if self.err is not None:
            return
        self.err = err
        for s in self._subs.values():
            c = s.call
            if c is not None and not c.fut.done():
                if c.timer is not None:
                    c.timer.cancel()
                c.fut.set_exception(err)
                c.fut.exception()  # retrieved: no "never retrieved" warning without waiters
        self._subs = {}
        self._healthy = False
        self.done.set()
        self._writer.close()
        if self._drainer is not None and self._drainer is not asyncio.current_task():
            self._drainer.cancel()
        self._sink.end()
        if isinstance(err, ClosedError):
            log.debug("listenhub client closed")
        else:
            log.warning("listenhub client dead: %s", err)

    async def _read_loop(self) -> None:
        dec = _frame.Decoder()
        while True:
            try:
                if dec.partial_since is None:
                    data = await asyncio.wait_for(self._reader.read(64 << 10), self.silence_timeout)
                else:
                    left = dec.partial_since + self.frame_timeout - time.monotonic()
                    data = await asyncio.wait_for(self._reader.read(64 << 10), max(left, 0))
            except asyncio.TimeoutError:
                if dec.partial_since is None:
                    self._die(ConnError("read", self.path, "no frame from the hub for %gs (silence timeout; it re-sends its status every few seconds): frozen or wedged" % self.silence_timeout))
                else:
                    self._die(ConnError("read", self.path, "a frame from the hub stalled: %d bytes of it in %gs (frame timeout)" % (dec.buffered(), self.frame_timeout)))
                return
            except (ConnectionError, OSError) as e:
                self._die(ConnError("read", self.path, e))
                return
            if self.err is not None:
                return
            if not data:
                why = "unexpected EOF (inside a frame)" if dec.buffered() else "EOF: the hub closed the connection"
                self._die(ConnError("read", self.path, why))
                return
            dec.feed(data)
            try:
                for m in dec.messages():
                    await self._handle(m)
                    if self.err is not None:
                        return
            except _frame.FrameError as e:
                self._die(ConnError("read", self.path, e))
                return

    async def _handle(self, m: dict[str, Any]) -> None:
        t: str = m["t"]
        q: Any = m.get("q")  # a str, or what a broken hub sent
        if not self._greeted:
            self._greeted = True
            if t == "nack":
                # The hub's refusal of this connection (docs/protocol.md).
                self._die(RefusedError(self.path, m.get("error") or "no reason given"))
                return
            if self._held:
                held, self._held = bytes(self._held), bytearray()
                self._write(held)
        if t == "ack":
            c, unsub = _subs.ack(self._subs, q)
            if c is None:
                log.debug("listenhub client: ack without a pending sub: %r", q)
                return
            c.timer.cancel()
            c.fut.set_result(None)
            if unsub:
                self._write(_frame.unsub(q))
        elif t == "nack":
            reason = m.get("error") or ""
            q = _subs.nacked_name(self._subs, q, m.get("q64"))
            if not _subs.pending(self._subs, q):
                log.debug("listenhub client: nack without a pending sub: %r %s", q, reason)
                return
            limit = _frame.limit_reason(reason)
            if not limit and not _frame.invalid_name_reason(reason):
                self._die(NackError(q, reason))
                return
            c = _subs.refuse(self._subs, q)
            c.timer.cancel()
            c.fut.set_exception((LimitError if limit else InvalidNameError)(q, reason))
            c.fut.exception()
        elif t == "wake":
            if isinstance(q, str) and q in self._subs:
                p = m.get("p")
                await self._deliver(make_wake(q, p if isinstance(p, str) else None))
        elif t == "status":
            healthy = bool(m.get("healthy"))
            was, self._healthy, self._saw_status = self._healthy, healthy, True
            if healthy and not was:
                # Postgres is back: every sub still waiting gets a whole
                # ack timeout from now.
                for q, s in self._subs.items():
                    c = s.call
                    if c is not None and not c.fut.done():
                        if c.timer is not None:
                            c.timer.cancel()
                        c.timer = self._loop.call_later(self.ack_timeout, self._ack_timeout, c, q)
            await self._deliver(Status(healthy))
        else:
            log.debug("listenhub client: skipping unknown frame type %r", t)

    async def _deliver(self, ev: _Event) -> None:
        if self._closing:
            return
        cb = self._sink.callback(ev)
        if cb is None:
            if not self._sink.put(ev):
                self._die(SlowConsumerError("listenhub: more than %d events not taken from events()" % self._sink.max_pending))
            return
        await _run_callback(cb, ev if isinstance(ev, Wake) else ev.healthy)


async def connect(
    path: str,
    *,
    on_wake: _OnWake | None = None,
    on_status: _OnStatus | None = None,
    ack_timeout: float = DEFAULT_ACK_TIMEOUT,
    write_timeout: float = DEFAULT_WRITE_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
    silence_timeout: float = DEFAULT_SILENCE_TIMEOUT,
    peer_check: bool = True,
    allowed_uids: Collection[int] = (),
    max_pending: int = DEFAULT_MAX_PENDING,
) -> AsyncClient:
    """Connects to the hub at path. ConnError when there is no hub (ENOENT,
    ECONNREFUSED) or the socket is not our hub's (the same checks as the
    synchronous client's dial, run in the default executor)."""
    loop = asyncio.get_running_loop()
    sock = await loop.run_in_executor(None, _dial, path, connect_timeout or DEFAULT_CONNECT_TIMEOUT, peer_check, allowed_uids)
    try:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
    except OSError as e:
        sock.close()
        raise ConnError("dial", path, e) from e
    return AsyncClient(
        path,
        reader,
        writer,
        on_wake=on_wake,
        on_status=on_status,
        ack_timeout=ack_timeout,
        write_timeout=write_timeout,
        max_pending=max_pending,
        frame_timeout=frame_timeout,
        silence_timeout=silence_timeout,
    )


class _AsyncLocal:
    """The synchronous Local (its own thread owns the psycopg connection)
    seen from the event loop: its callbacks are handed to the loop in order,
    subscribe runs in the default executor."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[_AsyncLocal, _Event], object],
        on_dead: Callable[[BaseException | None], object],
        local_args: dict[str, Any],
    ) -> None:
        # retired: a fail-back swapped it out; its events still queued for
        # the loop are the hub's to deliver now.
        self.retired = False
        self._loop = loop
        self._on_event = on_event
        args = dict(local_args)
        args["on_wake"] = self._from_thread
        args["on_status"] = lambda h: self._from_thread(Status(h))
        self.local = Local(**args)
        threading.Thread(target=self._watch, args=(on_dead,), daemon=True).start()

    @classmethod
    async def create(
        cls,
        on_event: Callable[[_AsyncLocal, _Event], object],
        on_dead: Callable[[BaseException | None], object],
        local_args: dict[str, Any],
    ) -> _AsyncLocal:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, cls, loop, on_event, on_dead, local_args)

    def _from_thread(self, ev: _Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._on_event, self, ev)
        except RuntimeError:
            pass  # loop closed

    def _watch(self, on_dead: Callable[[BaseException | None], object]) -> None:
        self.local.done.wait()
        self._from_thread_dead(on_dead)

    def _from_thread_dead(self, on_dead: Callable[[BaseException | None], object]) -> None:
        try:
            self._loop.call_soon_threadsafe(on_dead, self.local.err)
        except RuntimeError:
            pass

    async def subscribe(self, q: str) -> None:
        await self._loop.run_in_executor(None, self.local.subscribe, q)

    def unsubscribe(self, q: str) -> None:
        self.local.unsubscribe(q)

    async def sync(self, timeout: float | None) -> None:
        await self._loop.run_in_executor(None, self.local.sync, timeout)

    @property
    def healthy(self) -> bool:
        return self.local.healthy

    def close(self) -> None:
        # Local.close may wait briefly for its thread: not on the loop.
        threading.Thread(target=self.local.close, daemon=True).start()


class AsyncFailover(_AsyncListener):
    """Failover for asyncio: the AsyncClient while the hub works, a local
    psycopg LISTEN connection while it does not, the hub again once it is
    back; the same rules as listenhub.Failover (see there: failover, one
    durable wake per name after each swap, fail-back make-before-break
    unless one_way). Make one with ``await AsyncFailover.create(socket_path,
    ...)``. The local listener is the synchronous Local on its own thread,
    its events handed to the loop in order."""

    def __init__(self, socket_path: str, kw: dict[str, Any]) -> None:
        self.socket_path = socket_path
        self._kw = kw
        self.ack_timeout: float = kw.get("ack_timeout") or DEFAULT_ACK_TIMEOUT
        self._local_args: dict[str, Any] = dict(
            database_url_=kw.get("database_url"),
            channel_prefix=kw.get("channel_prefix", ""),
            channel_suffix=kw.get("channel_suffix", ""),
            application_name=kw.get("application_name", DEFAULT_LOCAL_APPLICATION_NAME),
            command_timeout=kw.get("local_timeout", DEFAULT_LOCAL_TIMEOUT),
        )
        self._sink = _AsyncSink(kw.get("on_wake"), kw.get("on_status"), kw.get("max_pending", DEFAULT_MAX_PENDING))
        self._mode = HUB
        self.reason: BaseException | None = None
        self._hub: AsyncClient | None = None
        self._local: _AsyncLocal | None = None
        self._cand: AsyncClient | None = None
        self._subs: set[str] = set()
        self._swap: asyncio.Task[None] | None = None  # the failover task while it runs
        self._failback_task: asyncio.Task[None] | None = None
        self.err: BaseException | None = None
        self.done = asyncio.Event()
        self._cb_lock = asyncio.Lock()  # one callback at a time across hub and local
        self._cut: _AsyncCut | None = None  # a fail-back's switch point
        # The start's database check: name, token, and an event set when
        # it came back through the hub.
        self._probe: tuple[str, str, asyncio.Event] | None = None
        self._wrong_database = False

    @classmethod
    async def create(
        cls,
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
    ) -> 'AsyncFailover':
        kw = dict(locals())
        del kw["cls"], kw["socket_path"]
        f = cls(socket_path, kw)
        try:
            hub = await f._new_hub(current=True)
            try:
                await f._check_database(hub)
            except OtherDatabaseError:
                hub.close()
                raise
            f._hub = hub
            if hub._lh_state.get("unverified"):
                asyncio.get_running_loop().create_task(f._verify_later(hub))
        except (ConnError, OtherDatabaseError) as e:
            if isinstance(e, OtherDatabaseError):
                log.error("%s", e)
                _say(str(e))
            else:
                log.warning("listenhub: hub unreachable (%s), listening locally", e)
                _say("listenhub: hub unreachable (%s), listening locally" % e)
            try:
                local = await _AsyncLocal.create(f._local_event, f._local_died, f._local_args)
            except Exception as le:
                raise FailoverError(e, le) from le
            f._mode, f.reason, f._local = LOCAL, e, local
            await f._deliver(Status(local.healthy))
            f._start_local(local)
            return f
        return f

    @property
    def mode(self) -> Mode:
        """Mode.HUB or Mode.LOCAL: where wakes come from now."""
        return self._mode

    async def subscribe(self, q: str) -> None:
        """See Failover.subscribe; cancel the caller to bound it."""
        problem = _frame.name_problem(q)
        if problem:
            raise InvalidNameError(q, problem)
        while True:
            if self.err is not None:
                raise self.err
            self._subs.add(q)
            if self._swap is not None:
                await asyncio.shield(self._swap)
                continue
            cur: AsyncClient | _AsyncLocal | None = self._hub if self._mode == HUB else self._local
            assert cur is not None  # set whenever no swap runs
            try:
                await cur.subscribe(q)
                return
            except (InvalidNameError, LimitError):
                self._subs.discard(q)
                raise
            except ListenhubError as e:
                if isinstance(cur, AsyncClient) and cur is self._hub and cur.err is not None and not isinstance(cur.err, ClosedError):
                    self._start_failover(cur, cur.err)
                    continue
                if self.err is None and cur is not self._hub and cur is not self._local:
                    continue  # replaced by a swap meanwhile: subscribe the new one
                raise self.err or e

    def unsubscribe(self, q: str) -> None:
        self._subs.discard(q)
        if self.err is not None or self._swap is not None:
            return
        cur: AsyncClient | _AsyncLocal | None = self._hub if self._mode == HUB else self._local
        if cur is not None:
            cur.unsubscribe(q)

    @property
    def healthy(self) -> bool:
        if self.err is not None or self._swap is not None:
            return False
        cur: AsyncClient | _AsyncLocal | None = self._hub if self._mode == HUB else self._local
        return cur is not None and cur.healthy

    def subscriptions(self) -> set[str]:
        return set(self._subs)

    def close(self) -> None:
        if self.err is not None:
            return
        self.err = ClosedError()
        self.done.set()
        for x in (self._hub, self._local, self._cand):
            if x is not None:
                x.close()
        if self._failback_task is not None:
            self._failback_task.cancel()
        self._sink.end()

    # --- internals -----------------------------------------------------------

    async def _new_hub(self, current: bool) -> AsyncClient:
        """A hub client whose statuses are delivered only while it is the
        current one; c._lh_healthy is set at its first healthy status."""
        kw = self._kw
        state: dict[str, Any] = {"current": current, "healthy": asyncio.Event()}

        async def on_status(h: bool) -> None:
            if h:
                state["healthy"].set()
            if state["current"]:
                await self._deliver(Status(h))

        holder: list[AsyncClient] = []
        c = await connect(
            self.socket_path,
            on_wake=lambda w: self._hub_wake(holder, state, w),
            on_status=on_status,
            ack_timeout=self.ack_timeout,
            write_timeout=kw["write_timeout"],
            connect_timeout=kw["connect_timeout"],
            silence_timeout=kw["silence_timeout"],
            peer_check=kw["peer_check"],
            allowed_uids=kw["allowed_uids"],
        )
        holder.append(c)
        c._lh_state = state
        asyncio.get_running_loop().create_task(self._watch_hub(c))
        return c

    async def _check_database(self, hub: AsyncClient) -> None:
        """See Failover._check_database: a NOTIFY of a private name,
        committed on a short connection of this process's own, must come
        back through the hub within the ack timeout, or OtherDatabaseError."""
        state = hub._lh_state
        if not cut_fits(self._local_args) or hub.err is not None:
            return
        try:
            await asyncio.wait_for(state["healthy"].wait(), self.ack_timeout)
        except asyncio.TimeoutError:
            # Not healthy yet (its Postgres is down): not trusted either;
            # its wakes wait until _verify_later has checked it.
            if hub.err is None:
                state["unverified"], state["held"] = True, []
            return
        await self._probe_database(hub)

    async def _verify_later(self, hub: AsyncClient) -> None:
        """As Failover._verify_later: the start's check once the hub first
        says healthy; its held wakes delivered if it hears this database,
        dropped (another database's) if not, then a local listener."""
        state = hub._lh_state
        healthy = asyncio.ensure_future(state["healthy"].wait())
        dead = asyncio.ensure_future(hub.done.wait())
        try:
            await asyncio.wait({healthy, dead}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            healthy.cancel()
            dead.cancel()
        if hub.err is not None or self.err is not None:
            self._release_held(state, False)
            return
        try:
            await self._probe_database(hub)
        except OtherDatabaseError as e:
            log.error("%s", e)
            self._release_held(state, False)
            self._start_failover(hub, e)
            hub.close()
            return
        except Exception:  # noqa: BLE001 - the check could not run: trusted, as at start
            pass
        self._release_held(state, True)

    def _release_held(self, state: dict[str, Any], deliver: bool) -> None:
        held = state.get("held") or []
        state["unverified"], state["held"] = False, []
        if deliver and state["current"]:
            loop = asyncio.get_running_loop()
            for w in held:
                loop.create_task(self._deliver(w))

    async def _probe_database(self, hub: AsyncClient) -> None:
        """The check itself (see _check_database)."""
        token = secrets.token_hex(8)
        q = "lh.db." + token[:8]
        came = asyncio.Event()
        self._probe = (q, token, came)
        try:
            try:
                await hub.subscribe(q)
            except Exception:
                return  # the hub's own failure shows elsewhere
            loop = asyncio.get_running_loop()
            database = await loop.run_in_executor(None, notify_probe, self._local_args, q, token, self.ack_timeout)
            if database is None:
                return
            try:
                await asyncio.wait_for(came.wait(), self.ack_timeout)
                return
            except asyncio.TimeoutError:
                raise OtherDatabaseError(self.socket_path, database, self.ack_timeout) from None
        finally:
            self._probe = None
            if hub.err is None:
                hub.unsubscribe(q)

    # --- the cut of a fail-back (see failover.Failover) ----------------------

    async def _hub_wake(self, holder: list[AsyncClient], state: dict[str, Any], w: Wake) -> None:
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
            # In line behind the local listener's wakes (tasks, taken
            # by _deliver's lock in the order they were made).
            asyncio.get_running_loop().create_task(self._deliver(w))
            return
        elif not state["current"]:
            return  # a candidate given up: the local listener delivered it
        await self._deliver(w)

    def _local_wake(self, w: Wake) -> bool:
        """Routes a local wake through the cut; False when it is not to be
        delivered."""
        cut = self._cut
        if cut is None:
            return True
        if w.name == cut.q:
            if w.payload == cut.token and not cut.local_past:
                cut.local_past = True
                loop = asyncio.get_running_loop()
                for b in cut.buf:
                    loop.create_task(self._deliver(b))
                cut.buf = []
                cut.passed()
            return False
        if cut.local_past and not cut.hub_past:
            cut.held.append(w)  # the hub's, once it passes; ours if it never does
            return False
        return not cut.local_past  # after the marker: the hub delivers it

    def _abandon(self, cut: "_AsyncCut") -> None:
        """Removes the cut of a fail-back given up and makes up for what it
        held back (as Failover._abandon): the local listener's wakes after
        its marker when the hub never passed its own, in order; when both
        had passed, a durable wake per name."""
        if self._cut is not cut:
            return
        self._cut = None
        loop = asyncio.get_running_loop()
        if cut.local_past and not cut.hub_past:
            for w in cut.held:
                loop.create_task(self._deliver(w))
        elif cut.local_past and cut.hub_past:
            for q in sorted(self._subs):
                loop.create_task(self._deliver(Wake(q, None, True)))
        cut.held = []

    async def _watch_hub(self, hub: AsyncClient) -> None:
        await hub.done.wait()
        if not isinstance(hub.err, ClosedError):
            self._start_failover(hub, hub.err)

    def _start_failover(self, hub: AsyncClient, reason: BaseException | None) -> None:
        if self.err is not None or self._mode != HUB or self._hub is not hub or self._swap is not None:
            return
        self._swap = asyncio.get_running_loop().create_task(self._failover(reason))

    async def _failover(self, reason: BaseException | None) -> None:
        log.warning("listenhub: hub failed (%s), failing over to a local listener", reason)
        _say("listenhub: hub failed (%s), failing over to a local listener" % reason)
        await self._deliver(Status(False))
        try:
            local = await _AsyncLocal.create(self._local_event, self._local_died, self._local_args)
        except Exception as e:
            self._swap = None
            await self._die(FailoverError(reason, e))
            return
        listened: set[str] = set()
        while True:
            if self.err is not None:
                local.close()
                self._swap = None
                return
            todo = self._subs - listened
            if not todo:
                break
            for q in sorted(todo):
                try:
                    await local.subscribe(q)
                except (InvalidNameError, LimitError):
                    self._subs.discard(q)
                    continue
                except Exception as e:
                    local.close()
                    self._swap = None
                    await self._die(FailoverError(reason, "subscribe %r: %s" % (q, e)))
                    return
                listened.add(q)
        for q in listened - self._subs:
            local.unsubscribe(q)
        recorded = sorted(self._subs)
        self._mode, self.reason, self._local, self._hub, self._swap = LOCAL, reason, local, None, None
        log.info("listenhub: local listener active, %d subscriptions", len(recorded))
        on_failover = self._kw.get("on_failover")
        if on_failover is not None:
            await _run_callback(on_failover, reason)
        await self._deliver(Status(local.healthy))
        for q in recorded:
            await self._deliver(Wake(q, None, True))
        self._start_local(local)

    def _start_local(self, local: _AsyncLocal) -> None:
        if not self._kw.get("one_way"):
            self._failback_task = asyncio.get_running_loop().create_task(self._failback_loop(local))

    async def _failback_loop(self, local: _AsyncLocal) -> None:
        wait = self._kw["min_local"]
        nxt = self._kw["probe_interval"]
        top = max(self._kw["probe_max_interval"], nxt)
        attempt = 0
        while True:
            await asyncio.sleep(wait)
            attempt += 1
            if await self._failback(local, attempt):
                return
            wait = jitter(nxt)
            nxt = min(2 * nxt, top)

    async def _failback(self, local: _AsyncLocal, attempt: int) -> bool:
        if self.err is not None or self._swap is not None or self._mode != LOCAL or self._local is not local:
            return True
        try:
            cand = await self._new_hub(current=False)
        except ConnError as e:
            log.debug("listenhub: fail-back attempt %d: %s", attempt, e)
            return False
        if self.err is not None:
            cand.close()
            return True
        self._cand = cand
        swapped = False
        cut: _AsyncCut | None = None
        try:
            try:
                await asyncio.wait_for(cand._lh_state["healthy"].wait(), self.ack_timeout)
            except asyncio.TimeoutError:
                return False
            if cand.err is not None:
                return False
            log.info("listenhub: hub is back, subscribing it before leaving the local listener")
            if cut_fits(self._local_args):
                cut = _AsyncCut(cand)
                self._cut = cut
                try:
                    await local.subscribe(cut.q)
                    await cand.subscribe(cut.q)
                except Exception as e:
                    log.debug("listenhub: fail-back attempt %d: marker: %s", attempt, e)
                    return False
            marked_at: int | None = None
            acked: set[str] = set()
            drained = False
            while True:
                if self.err is not None:
                    return True
                todo = self._subs - acked
                if not todo and not drained:
                    # A NOTIFY committed just before the hub's LISTEN reaches
                    # only the local listener: let it arrive before closing.
                    try:
                        await local.sync(self.ack_timeout)
                    except Exception as e:
                        log.debug("listenhub: local listener not drained before the fail-back: %s", e)
                    drained = True
                    continue
                if not todo and cut is not None and marked_at is None:
                    why = await self._send_marker(local, cut)
                    if why is not None:
                        log.debug("listenhub: fail-back attempt %d: %s", attempt, why)
                        return False
                    marked_at = len(acked)
                    continue
                if not todo:
                    if not cand.healthy:
                        return False
                    if cut is not None and len(acked) != marked_at:
                        return False  # a name acked after the marker: start again
                    for q in acked - self._subs:
                        cand.unsubscribe(q)
                    recorded = sorted(self._subs)
                    self._mode, self.reason, self._hub, self._local, self._cand = HUB, None, cand, None, None
                    cand._lh_state["current"] = True
                    swapped = True
                    break
                err = await self._subscribe_all(cand, sorted(todo), acked)
                if err is not None:
                    log.debug("listenhub: fail-back attempt %d: %s", attempt, err)
                    return False
                drained = False
        finally:
            if not swapped:
                if self._cand is cand:
                    self._cand = None
                cand.close()
                if cut is not None:
                    self._abandon(cut)
                    local.unsubscribe(cut.q)
        local.retired = True
        local.close()  # break, after make
        if cut is not None:
            self._cut = None
            cand.unsubscribe(cut.q)
        log.info("listenhub: back on the hub, local listener closed (attempt %d)", attempt)
        on_failback: Callable[[], object] | None = self._kw.get("on_failback")
        if on_failback is not None:
            cb = on_failback
            await _run_callback(lambda _: cb(), None)
        await self._deliver(Status(cand.healthy))
        for q in recorded:
            await self._deliver(Wake(q, None, True))
        return True

    async def _send_marker(self, local: _AsyncLocal, cut: _AsyncCut) -> str | None:
        """Commits the marker on the local connection and waits until both
        listeners delivered it; None when they did, else why not."""
        try:
            await asyncio.get_running_loop().run_in_executor(None, local.local._notify, cut.q, cut.token, self.ack_timeout)
        except Exception as e:
            return str(e)
        try:
            await asyncio.wait_for(cut.both.wait(), self.ack_timeout)
            return None
        except asyncio.TimeoutError:
            pass
        if cut.hub_past:
            return "the local listener did not deliver the fail-back marker in time"
        msg, self._wrong_database = wrong_database(self.socket_path, self.ack_timeout, self._wrong_database)
        return msg

    async def _subscribe_all(self, c: AsyncClient, todo: Collection[str], acked: set[str]) -> BaseException | None:
        sem = asyncio.Semaphore(FAILBACK_PARALLEL)
        first = []

        async def one(q: str) -> None:
            async with sem:
                try:
                    await c.subscribe(q)
                    acked.add(q)
                except (InvalidNameError, LimitError):
                    self._subs.discard(q)
                except ListenhubError as e:
                    first.append(e)

        await asyncio.gather(*(one(q) for q in todo))
        return first[0] if first else None

    async def _die(self, err: BaseException) -> None:
        if self.err is not None:
            return
        self.err = err
        self.done.set()
        log.error("listenhub: no listener left: %s", err)
        for x in (self._hub, self._local, self._cand):
            if x is not None:
                x.close()
        if self._failback_task is not None and self._failback_task is not asyncio.current_task():
            self._failback_task.cancel()
        await self._deliver(Status(False), force=True)
        self._sink.end()

    def _local_event(self, local: _AsyncLocal, ev: _Event) -> None:
        if local.retired:
            return
        if isinstance(ev, Status) and not (self._mode == LOCAL and self.err is None):
            return  # before the swap, the swap reports the local health itself
        if self.err is not None:
            return
        if isinstance(ev, Wake) and not self._local_wake(ev):
            return
        asyncio.get_running_loop().create_task(self._deliver(ev))

    def _local_died(self, err: BaseException | None) -> None:
        if not isinstance(err, ClosedError) and self.err is None:
            asyncio.get_running_loop().create_task(self._die(FailoverError(self.reason, err)))

    async def _deliver(self, ev: _Event, force: bool = False) -> None:
        async with self._cb_lock:
            if isinstance(self.err, ClosedError) or (self.err is not None and not force):
                return
            cb = self._sink.callback(ev)
            if cb is None:
                if not self._sink.put(ev):
                    asyncio.get_running_loop().create_task(
                        self._die(SlowConsumerError("listenhub: more than %d events not taken from events()" % self._sink.max_pending))
                    )
                return
            await _run_callback(cb, ev if isinstance(ev, Wake) else ev.healthy)


__all__ = ["AsyncClient", "AsyncFailover", "connect"]


class _AsyncCut:
    """A fail-back's switch point (failover._Cut, on the event loop): a
    private name and a random payload (the marker), which listener has
    passed it, and the hub's wakes held until the local listener has."""

    def __init__(self, hub: AsyncClient) -> None:
        self.hub = hub
        token = secrets.token_hex(8)
        self.q, self.token = "lh.cut." + token[:8], token
        self.hub_past = self.local_past = False
        self.buf: list[Wake] = []  # the hub's wakes after its marker, before local passed
        self.held: list[Wake] = []  # the local listener's wakes after its marker, before the hub passed
        self.both = asyncio.Event()

    def passed(self) -> None:
        if self.hub_past and self.local_past:
            self.both.set()
