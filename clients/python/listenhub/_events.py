"""What listeners deliver (Wake, Status) and the sink that hands it to
callbacks or to an iterator."""

from __future__ import annotations

import collections
import enum
import threading
import time
from typing import Callable, Deque, Iterator, NamedTuple, TypeVar

from .errors import ListenhubError


_L = TypeVar('_L', bound='Listener')

#: Default bound of the event queue behind events() (wakes and statuses not
#: yet taken by the iterator).
DEFAULT_MAX_PENDING = 65536


class Mode(str, enum.Enum):
    """Where a failover listener's wakes come from now. A str, so that
    ``mode == "hub"`` holds too."""

    #: The shared hub, over its Unix socket.
    HUB = "hub"
    #: This process's own Postgres connection.
    LOCAL = "local"

    def __str__(self) -> str:
        return self.value


class Wake(NamedTuple):
    """One NOTIFY as the hub (or the local listener) delivered it."""

    #: The subscription name (the channel without the hub's prefix/suffix).
    name: str
    #: The NOTIFY payload; None for a durable wake.
    payload: str | None
    #: True for a wake without payload ("something changed, re-read"): may be
    #: coalesced and may be synthesized after a gap (hub reconnect,
    #: failover). False means the payload may be the only copy.
    durable: bool


class Status(NamedTuple):
    """The hub's (or the local listener's) Postgres connection is (not)
    healthy. Do not fail over because of False: the hub keeps your
    subscriptions and sends one durable wake per name once it is back."""

    healthy: bool


_Event = Wake | Status
#: on_wake: called with each Wake (its return value is ignored; asyncio
#: listeners await it when it is a coroutine).
_OnWake = Callable[[Wake], object]
#: on_status: called with the health of the listener's Postgres connection.
_OnStatus = Callable[[bool], object]


class SlowConsumerError(ListenhubError):
    """The events() iterator was not drained: more than max_pending events
    were waiting. The listener is dead after it, as a worker that stops
    reading is evicted by the hub."""


def make_wake(q: str, p: str | None) -> Wake:
    if p is None or p == "":
        return Wake(q, None, True)
    return Wake(q, p, False)


class Sink:
    """Delivers events to on_wake/on_status when given, else queues them for
    events(). Thread-safe; callbacks run on the caller's thread."""

    def __init__(
        self,
        on_wake: _OnWake | None,
        on_status: _OnStatus | None,
        max_pending: int | None,
    ) -> None:
        self.on_wake = on_wake
        self.on_status = on_status
        self.max_pending = max_pending or DEFAULT_MAX_PENDING
        self._q: Deque[_Event] = collections.deque()
        self._cond = threading.Condition()
        self._ended = False

    def put(self, ev: _Event) -> bool:
        """Queues ev for events(); False when the queue is full."""
        with self._cond:
            if self._ended:
                return True
            if len(self._q) >= self.max_pending:
                return False
            self._q.append(ev)
            self._cond.notify_all()
            return True

    def callback(self, ev: _Event) -> Callable[..., object] | None:
        """The callback for ev, or None when it goes to the queue."""
        if isinstance(ev, Wake):
            return self.on_wake
        return self.on_status

    def end(self) -> None:
        """No more events: the iterator stops once the queue is drained."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def get(self, timeout: float | None = None) -> _Event | None:
        """The next queued event, waiting up to timeout seconds (None: for
        ever); None on timeout or once the listener is dead and the queue
        drained."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._q and not self._ended:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            if not self._q:
                return None
            return self._q.popleft()

    def events(self) -> Iterator[_Event]:
        """Yields queued events until the listener is dead and the queue
        drained."""
        while True:
            ev = self.get()
            if ev is None:
                return
            yield ev


class Listener:
    """What Client, Local and Failover share: the queued events, waiting for
    the end, and use as a context manager. A subclass sets _sink (a Sink),
    err and done (a threading.Event set at death) and defines close()."""

    _sink: Sink
    #: Why the listener died (None while it lives).
    err: BaseException | None
    #: Set when the listener is dead.
    done: threading.Event

    def close(self) -> None:
        raise NotImplementedError

    def subscribe(self, q: str, timeout: float | None = None) -> None:
        raise NotImplementedError

    def unsubscribe(self, q: str) -> None:
        raise NotImplementedError

    @property
    def healthy(self) -> bool:
        raise NotImplementedError

    def events(self) -> Iterator[_Event]:
        """Iterates the queued events (the kinds without a callback) until
        the listener is dead and the queue drained."""
        return self._sink.events()

    def get(self, timeout: float | None = None) -> _Event | None:
        """The next queued event, or None after timeout seconds or at the
        end."""
        return self._sink.get(timeout)

    def wait(self, timeout: float | None = None) -> BaseException | None:
        """Waits until the listener is dead; returns err (None on
        timeout)."""
        self.done.wait(timeout)
        return self.err

    def __enter__(self: _L) -> _L:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
