"""Fork safety: a client made before fork() is dead in the child.

A forked child shares the parent's socket (and Postgres connection) but has
none of its threads: a subscribe there would queue a frame nobody writes and
wait forever. After fork, every live client, failover listener and local
listener in the child fails every call at once with ForkedError; the
child's copy of the descriptor is closed (never shut down: that would cut
the parent's connection too). The parent is not affected. Make clients after
fork (gunicorn: in the worker, e.g. lazily on first use or in post_fork; not
at import under --preload).
"""

import os
import weakref
from typing import Any

from .errors import ForkedError

_live: "weakref.WeakSet[Any]" = weakref.WeakSet()


def track(obj: Any) -> None:
    """Registers obj, which has _after_fork_in_child(err), for the next
    fork."""
    _live.add(obj)


def _after_in_child() -> None:
    parent = os.getppid()
    for obj in list(_live):
        try:
            obj._after_fork_in_child(ForkedError(parent))
        except Exception:  # never break the child's fork for our sake
            pass
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_in_child)
