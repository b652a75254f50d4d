# Type hints of listenhub.local (the code is local.py).

import logging
from typing import Any, Optional, Set

from ._events import Listener, _OnStatus, _OnWake

DEFAULT_LOCAL_APPLICATION_NAME: str
DEFAULT_LOCAL_TIMEOUT: float
HEALTH_CHECK_INTERVAL: float
DELIVERY_CHECK_TIMEOUT: float

def database_url(url: Optional[str] = ...) -> str: ...

log: logging.Logger

def check_delivery(conn: Any, url: str, application_name: str, timeout: float = ...) -> None: ...

class Local(Listener):
    url: str
    prefix: str
    suffix: str
    application_name: str
    command_timeout: float
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
    def close(self) -> None: ...
