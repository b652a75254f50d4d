# Type hints of listenhub.failover (the code is failover.py).

import logging
from typing import Callable, Collection, Literal, Optional, Set

from ._events import Listener, _OnStatus, _OnWake

HUB: Literal["hub"]
LOCAL: Literal["local"]
_Mode = Literal["hub", "local"]
DEFAULT_MIN_LOCAL: float
DEFAULT_PROBE_INTERVAL: float
DEFAULT_PROBE_MAX_INTERVAL: float
PROBE_JITTER: float
FAILBACK_PARALLEL: int

def jitter(d: float) -> float: ...

log: logging.Logger

class Failover(Listener):
    socket_path: str
    ack_timeout: float
    one_way: bool
    min_local: float
    probe_interval: float
    probe_max_interval: float
    #: The hub's error that caused the last failover (None on the hub).
    reason: Optional[BaseException]
    def __init__(
        self,
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
    ) -> None: ...
    def mode(self) -> _Mode: ...
    def subscribe(self, q: str, timeout: Optional[float] = ...) -> None: ...
    def unsubscribe(self, q: str) -> None: ...
    def healthy(self) -> bool: ...
    def subscriptions(self) -> Set[str]: ...
    def close(self) -> None: ...
