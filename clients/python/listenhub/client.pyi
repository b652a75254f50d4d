# Type hints of listenhub.client (the code is client.py).

import os
import socket
from typing import Collection, Optional, Set

from ._events import Listener, _OnStatus, _OnWake, Status as Status, Wake as Wake
from .errors import ListenhubError as ListenhubError

DEFAULT_ACK_TIMEOUT: float
DEFAULT_WRITE_TIMEOUT: float
DEFAULT_CONNECT_TIMEOUT: float
DEFAULT_FRAME_TIMEOUT: float

def check_peer(sock: socket.socket, path: str, allowed_uids: Collection[int] = ...) -> None: ...
def dir_problem(st: os.stat_result, trusted: Collection[int]) -> Optional[str]: ...
def sock_problem(st: os.stat_result, trusted: Collection[int]) -> Optional[str]: ...
def dial(path: str, timeout: Optional[float], peer_check: bool, allowed_uids: Collection[int]) -> socket.socket: ...

class Client(Listener):
    path: str
    ack_timeout: float
    write_timeout: float
    frame_timeout: float
    def __init__(
        self,
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
        _sock: Optional[socket.socket] = ...,
    ) -> None: ...
    def subscribe(self, q: str, timeout: Optional[float] = ...) -> None: ...
    def unsubscribe(self, q: str) -> None: ...
    def healthy(self) -> bool: ...
    def subscriptions(self) -> Set[str]: ...
    def close(self) -> None: ...

def connect(
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
) -> Client: ...
