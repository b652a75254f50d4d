# Type hints of listenhub.local (the code is local.py).

import logging
import threading
from typing import Any, Iterator, Optional, Set

from ._events import _Event, _OnStatus, _OnWake

DEFAULT_LOCAL_APPLICATION_NAME: str
DEFAULT_LOCAL_TIMEOUT: float
HEALTH_CHECK_INTERVAL: float
DELIVERY_CHECK_TIMEOUT: float

def database_url(url: Optional[str] = ...) -> str: ...

log: logging.Logger

def check_delivery(conn: Any, url: str, application_name: str, timeout: float = ...) -> None: ...

class Local:
    url: str
    prefix: str
    suffix: str
    application_name: str
    command_timeout: float
    err: Optional[BaseException]
    done: threading.Event
    def __init__(
        self,
        database_url_: Optional[str] = ...,
        *,
        channel_prefix: str = ...,
        channel_suffix: str = ...,
        application_name: str = ...,
        command_timeout: float = ...,
        on_wake: Optional[_OnWake] = ...,
        on_status: Optional[_OnStatus] = ...,
        max_pending: int = ...,
    ) -> None: ...
    def channel(self, q: str) -> str: ...
    def backend_pid(self) -> int: ...
    def subscribe(self, q: str, timeout: Optional[float] = ...) -> None: ...
    def sync(self, timeout: Optional[float] = ...) -> None: ...
    def unsubscribe(self, q: str) -> None: ...
    def healthy(self) -> bool: ...
    def events(self) -> Iterator[_Event]: ...
    def get(self, timeout: Optional[float] = ...) -> Optional[_Event]: ...
    def close(self) -> None: ...
    def wait(self, timeout: Optional[float] = ...) -> Optional[BaseException]: ...
    def __enter__(self) -> "Local": ...
    def __exit__(self, *exc: object) -> None: ...
