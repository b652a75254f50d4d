"""The subscription table both hub clients keep (Client under its lock,
AsyncClient on its event loop): a dict of name to Sub, acked and/or one
pending sub frame that every concurrent subscribe of the name waits on.

No I/O and no locking here: the caller holds its lock, and each function
says which frame the caller is to send."""

from __future__ import annotations

from . import _frame
from typing import Any, Callable


class Sub:
    """The client's view of one name: acked, and/or one pending sub (call,
    the client's own object with a waiters count)."""

    __slots__ = ("active", "call", "want_unsub")

    def __init__(self) -> None:
        self.active = False
        self.call: Any = None
        self.want_unsub = False


def join(
    subs: dict[str, Sub],
    q: str,
    new_call: Callable[[], Any],
) -> tuple[Sub | None, bool]:
    """Counts one more waiter on the pending sub of q, made with new_call()
    when there is none; returns its Sub and whether the call is new (then
    the caller sends a sub frame). (None, False) when q is acked already."""
    s = subs.get(q)
    if s is None:
        s = subs[q] = Sub()
    if s.active and s.call is None:
        return None, False
    fresh = s.call is None
    if fresh:
        s.call = new_call()
    s.want_unsub = False
    s.call.waiters += 1
    return s, fresh


def abandon(s: Sub, c: Any) -> None:
    """One waiter of c, the pending call of s, gave up; the last one leaves
    the name to be unsubscribed once the ack arrives."""
    c.waiters -= 1
    if c.waiters == 0:
        s.want_unsub = True


def drop(subs: dict[str, Sub], q: str) -> bool:
    """Unsubscribes q; True when the caller is to send an unsub frame now
    (with a sub pending, the unsub waits for its ack)."""
    s = subs.get(q)
    if s is None:
        return False
    if s.call is not None:
        s.want_unsub = True
        return False
    del subs[q]
    return True


def ack(subs: dict[str, Sub], q: str) -> tuple[Any, bool]:
    """Takes the pending call an ack of q answers (None when there is none)
    and says whether the caller is to send an unsub frame now (the sub was
    abandoned or unsubscribed meanwhile)."""
    s = subs.get(q)
    if s is None or s.call is None:
        return None, False
    c, s.call = s.call, None
    if s.want_unsub:
        del subs[q]
        return c, True
    s.active = True
    return c, False


def refuse(subs: dict[str, Sub], q: str) -> Any:
    """Takes the pending call a nack about the name q answers (None when
    there is none); a name that was never acked is forgotten."""
    s = subs.get(q)
    if s is None or s.call is None:
        return None
    c, s.call = s.call, None
    if not s.active:
        del subs[q]
    return c


def pending(subs: dict[str, Sub], q: str) -> bool:
    """Whether a sub of q waits for its answer."""
    s = subs.get(q)
    return s is not None and s.call is not None


def acked(subs: dict[str, Sub]) -> set[str]:
    """The acked names."""
    return {q for q, s in subs.items() if s.active}


def nacked_name(subs: dict[str, Sub], q: str, q64: object) -> str:
    """The name a nack answers. A nack for a name that was not valid UTF-8
    carries the name's bytes as sent in "q64" ("q" then holds U+FFFD in
    their place): the pending sub they match."""
    if not isinstance(q64, str):
        return q
    sent = _frame.q64_bytes(q64)
    for name, s in subs.items():
        if s.call is not None and _frame.wire_bytes(name) == sent:
            return name
    return q
