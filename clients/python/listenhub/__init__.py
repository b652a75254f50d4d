"""listenhub: the Python client of a listenhub hub (one shared Postgres
LISTEN connection per host, wakes fanned out over a Unix socket).

- :func:`connect` / :class:`Client`: the hub client (standard library only).
- :class:`Failover`: the hub while it works, this process's own LISTEN
  connection (psycopg 3) after its first failure.
- :mod:`listenhub.aio`: the same for asyncio (``AsyncClient``,
  ``AsyncFailover``).

Wire protocol: docs/protocol.md in the listenhub repository.
"""

from __future__ import annotations

import logging as _logging

from ._events import Mode, SlowConsumerError, Status, Wake
from .client import DEFAULT_ACK_TIMEOUT, DEFAULT_WRITE_TIMEOUT, Client, connect
from .errors import (
    AckTimeoutError,
    ClosedError,
    ConnError,
    FailoverError,
    ForkedError,
    InvalidNameError,
    LimitError,
    ListenhubError,
    ListenhubWarning,
    NackError,
    OtherDatabaseError,
    RefusedError,
)
from .failover import HUB, LOCAL, Failover
from .local import Local

__version__ = "0.1.0"

# A library does not print unless the application configured logging.
_logging.getLogger("listenhub").addHandler(_logging.NullHandler())

__all__ = [
    "AckTimeoutError",
    "Client",
    "ClosedError",
    "ListenhubWarning",
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
    "Mode",
    "NackError",
    "OtherDatabaseError",
    "RefusedError",
    "SlowConsumerError",
    "Status",
    "Wake",
    "connect",
]
