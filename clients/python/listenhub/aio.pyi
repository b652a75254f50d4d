# Type hints of listenhub.aio (the code is aio.py).

import asyncio
from typing import AsyncIterator, Callable, Collection, Optional, Set, TypeVar

from ._events import _Event, _OnStatus, _OnWake
from .failover import _Mode

_A = TypeVar("_A", bound="_AsyncListener")

class _AsyncListener:
    err: Optional[BaseException]
    done: asyncio.Event
    def events(self) -> AsyncIterator[_Event]: ...
    async def get(self, timeout: Optional[float] = ...) -> Optional[_Event]: ...
    async def wait(self) -> Optional[BaseException]: ...
    async def __aenter__(self: _A) -> _A: ...
    async def __aexit__(self, *exc: object) -> None: ...

class AsyncClient(_AsyncListener):
    path: str
    ack_timeout: float
    write_timeout: float
    frame_timeout: float
    def __init__(
        self,
        path: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        on_wake: Optional[_OnWake],
        on_status: Optional[_OnStatus],
        ack_timeout: float,
        write_timeout: float,
        max_pending: int,
        frame_timeout: float = ...,
    ) -> None: ...
    async def subscribe(self, q: str) -> None: ...
    def unsubscribe(self, q: str) -> None: ...
    def healthy(self) -> bool: ...
    def subscriptions(self) -> Set[str]: ...
    def close(self) -> None: ...

async def connect(
    path: str,
    *,
    on_wake: Optional[_OnWake] = ...,
    on_status: Optional[_OnStatus] = ...,
    ack_timeout: float = ...,
    write_timeout: float = ...,
    connect_timeout: float = ...,
    frame_timeout: float = ...,
    peer_check: bool = ...,
    allowed_uids: Collection[int] = ...,
    max_pending: int = ...,
) -> AsyncClient: ...

class AsyncFailover(_AsyncListener):
    socket_path: str
    ack_timeout: float
    reason: Optional[BaseException]
    def __init__(self, socket_path: str, kw: dict[str, object]) -> None: ...
    @classmethod
    async def create(
        cls,
        socket_path: str,
        *,
        database_url: Optional[str] = ...,
        channel_prefix: str = ...,
        channel_suffix: str = ...,
        application_name: str = ...,
        ack_timeout: float = ...,
        write_timeout: float = ...,
        connect_timeout: float = ...,
        local_timeout: float = ...,
        peer_check: bool = ...,
        allowed_uids: Collection[int] = ...,
        one_way: bool = ...,
        min_local: float = ...,
        probe_interval: float = ...,
        probe_max_interval: float = ...,
        on_wake: Optional[_OnWake] = ...,
        on_status: Optional[_OnStatus] = ...,
        on_failover: Optional[Callable[[BaseException], object]] = ...,
        on_failback: Optional[Callable[[], object]] = ...,
        max_pending: int = ...,
    ) -> "AsyncFailover": ...
    def mode(self) -> _Mode: ...
    async def subscribe(self, q: str) -> None: ...
    def unsubscribe(self, q: str) -> None: ...
    def healthy(self) -> bool: ...
    def subscriptions(self) -> Set[str]: ...
    def close(self) -> None: ...
