# Type hints of the listenhub package (the code is __init__.py).

from ._events import SlowConsumerError as SlowConsumerError, Status as Status, Wake as Wake
from .client import DEFAULT_ACK_TIMEOUT as DEFAULT_ACK_TIMEOUT, DEFAULT_WRITE_TIMEOUT as DEFAULT_WRITE_TIMEOUT, Client as Client, connect as connect
from .errors import (
    AckTimeoutError as AckTimeoutError,
    ClosedError as ClosedError,
    ConnError as ConnError,
    FailoverError as FailoverError,
    ForkedError as ForkedError,
    InvalidNameError as InvalidNameError,
    LimitError as LimitError,
    ListenhubError as ListenhubError,
    NackError as NackError,
    RefusedError as RefusedError,
)
from .failover import HUB as HUB, LOCAL as LOCAL, Failover as Failover
from .local import Local as Local

__version__: str
__all__ = [
    "AckTimeoutError",
    "Client",
    "ClosedError",
    "ConnError",
    "DEFAULT_ACK_TIMEOUT",
    "DEFAULT_WRITE_TIMEOUT",
    "Failover",
    "FailoverError",
    "ForkedError",
    "HUB",
    "InvalidNameError",
    "LimitError",
    "ListenhubError",
    "LOCAL",
    "Local",
    "NackError",
    "RefusedError",
    "SlowConsumerError",
    "Status",
    "Wake",
    "connect",
]
