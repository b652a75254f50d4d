# Type hints of listenhub._events (the code is _events.py).

import threading
from typing import Callable, Iterator, NamedTuple, Optional, TypeVar, Union

from .errors import ListenhubError

DEFAULT_MAX_PENDING: int

class Wake(NamedTuple):
    q: str
    payload: Optional[str]
    durable: bool

class Status(NamedTuple):
    healthy: bool

_Event = Union[Wake, Status]
#: on_wake: called with each Wake (its return value is ignored; asyncio
#: listeners await it when it is a coroutine).
_OnWake = Callable[[Wake], object]
#: on_status: called with the health of the listener's Postgres connection.
_OnStatus = Callable[[bool], object]

class SlowConsumerError(ListenhubError): ...

def make_wake(q: str, p: Optional[str]) -> Wake: ...

class Sink:
    on_wake: Optional[_OnWake]
    on_status: Optional[_OnStatus]
    max_pending: int
    def __init__(self, on_wake: Optional[_OnWake], on_status: Optional[_OnStatus], max_pending: Optional[int]) -> None: ...
    def put(self, ev: _Event) -> bool: ...
    def callback(self, ev: _Event) -> Optional[Callable[..., object]]: ...
    def end(self) -> None: ...
    def get(self, timeout: Optional[float] = ...) -> Optional[_Event]: ...
    def events(self) -> Iterator[_Event]: ...

_L = TypeVar("_L", bound="Listener")

class Listener:
    err: Optional[BaseException]
    done: threading.Event
    def events(self) -> Iterator[_Event]: ...
    def get(self, timeout: Optional[float] = ...) -> Optional[_Event]: ...
    def wait(self, timeout: Optional[float] = ...) -> Optional[BaseException]: ...
    def __enter__(self: _L) -> _L: ...
    def __exit__(self, *exc: object) -> None: ...
