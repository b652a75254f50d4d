"""The wire codec (docs/protocol.md): 4-byte big-endian length + one JSON
object. No I/O here."""

from __future__ import annotations

import base64
import json
import struct
import time
from typing import Any, Iterator

#: Largest frame body either side may send (4 MiB). A longer length header is
#: a protocol error: the reader closes the connection without allocating.
MAX_LEN = 4 << 20

#: Postgres truncates identifiers at NAMEDATALEN-1 bytes.
MAX_NAME_BYTES = 63

_HDR = struct.Struct(">I")


def encode(msg: dict[str, Any]) -> bytes:
    """One frame: header + compact JSON body (raw UTF-8, like the hub)."""
    # surrogatepass: a str with a lone surrogate (which name_problem refuses
    # before a sub is ever encoded) goes out as the bytes wire_bytes says.
    body = json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    return _HDR.pack(len(body)) + body


def sub(q: str) -> bytes:
    return encode({"t": "sub", "q": q})


def unsub(q: str) -> bytes:
    return encode({"t": "unsub", "q": q})


class FrameError(ValueError):
    """A malformed frame from the hub: the connection is unusable."""


class Decoder:
    """Incremental decoder: feed() what a read returned, then next() until it
    returns None. A stream socket has no message boundaries, so one read may
    hold half a frame or twenty.

    Linear in the bytes fed: a frame's bytes are appended once (amortized)
    and copied out once, however small the reads it came in.
    ``partial_since`` is the time.monotonic() at which the incomplete frame
    now buffered began (None when nothing is buffered), for the reader's
    frame timeout."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._off = 0
        self.partial_since: float | None = None

    def feed(self, data: bytes) -> None:
        if self._off and self._off == len(self._buf):
            self._buf.clear()
            self._off = 0
        if data and self.partial_since is None:
            self.partial_since = time.monotonic()
        self._buf += data

    def buffered(self) -> int:
        return len(self._buf) - self._off

    def next(self) -> dict[str, Any] | None:
        """The next whole message (a dict with a string "t"), or None when
        more bytes are needed. Raises FrameError on a malformed frame."""
        if self.buffered() < 4:
            return None
        (n,) = _HDR.unpack_from(self._buf, self._off)
        if n == 0 or n > MAX_LEN:
            raise FrameError("bad frame length %d" % n)
        if self.buffered() < 4 + n:
            return None
        start = self._off + 4
        body = bytes(self._buf[start : start + n])
        self._off = start + n
        self.partial_since = time.monotonic() if self._off < len(self._buf) else None
        if self._off > 65536 and self._off * 2 > len(self._buf):
            del self._buf[: self._off]
            self._off = 0
        try:
            msg = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise FrameError("bad frame body: %s" % e) from None
        if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
            raise FrameError("frame is not an object with a string \"t\"")
        return msg

    def messages(self) -> Iterator[dict[str, Any]]:
        """Yields the whole messages fed so far (next() until it returns
        None). Raises FrameError on a malformed frame."""
        while True:
            m = self.next()
            if m is None:
                return
            yield m


def wire_bytes(q: str) -> bytes:
    """q's bytes as a hub reports a name that is not valid UTF-8 ("q64" in
    its nack): UTF-8, a lone surrogate as its 3-byte form."""
    return q.encode("utf-8", "surrogatepass")


def q64_bytes(q64: str) -> bytes:
    """The bytes of a nack's "q64" (base64); b"" if it is not base64."""
    try:
        return base64.b64decode(q64, validate=True)
    except ValueError:
        return b""


def name_problem(q: object) -> str | None:
    """Why q can never be a subscription name whatever the hub's prefix and
    suffix (None if it may be): checked before any round trip."""
    if not isinstance(q, str):
        return "not a string"
    try:
        b = q.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid UTF-8"
    return _length_or_nul(q, b)


def channel_problem(channel: str) -> str | None:
    """Why the mapped channel is refused (None if fine): empty, too long, NUL."""
    if channel == "":
        return "invalid channel: empty"
    problem = _length_or_nul(channel, channel.encode("utf-8", "surrogatepass"))
    return problem and "invalid channel: " + problem


def _length_or_nul(s: str, b: bytes) -> str | None:
    """The problem of a name or channel s (b: its bytes) that is too long or
    holds a NUL; None if neither."""
    if len(b) > MAX_NAME_BYTES:
        return "%d bytes, the limit is %d" % (len(b), MAX_NAME_BYTES)
    if "\x00" in s:
        return "contains NUL"
    return None


def invalid_name_reason(reason: str | None) -> bool:
    """Tells a nack about the name (final for that name, the connection is
    fine) from any other nack (this hub cannot serve: fail over). Protocol v1
    has no codes, so the reason words are the contract; same rule as the Go
    client."""
    r = (reason or "").lower()
    return (
        r.startswith("invalid")
        or "invalid channel" in r
        or "too long" in r
        or "contains nul" in r
    )


def limit_reason(reason: str | None) -> bool:
    """Tells a refusal at one of the hub's caps ("too many subscriptions",
    "too many channels"): final for that subscribe, the connection stays."""
    return (reason or "").lower().startswith("too many ")


def quote_ident(channel: str) -> str:
    """A channel as a Postgres quoted identifier, every '"' doubled: no name
    can inject SQL, and case is kept."""
    return '"' + channel.replace('"', '""') + '"'
