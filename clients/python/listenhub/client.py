"""The synchronous hub client: one Unix socket connection to a listenhub hub,
a reader thread and a writer thread."""

from __future__ import annotations

import logging
import errno
import os
import select
import socket
import stat
import struct
import threading
import time
from typing import Any, Collection

from . import _fork, _frame, _subs
from ._events import (
    DEFAULT_MAX_PENDING,
    Listener,
    Sink,
    SlowConsumerError,
    Status as Status,
    Wake as Wake,
    _Event,
    _OnStatus,
    _OnWake,
    make_wake,
)
from .errors import (
    AckTimeoutError,
    ClosedError,
    ConnError,
    InvalidNameError,
    LimitError,
    ListenhubError as ListenhubError,
    NackError,
    RefusedError,
)

#: Bound of the wait for an ack. The hub acks once Postgres confirmed the
#: LISTEN (a round trip); nothing within 2 s means a wedged hub.
DEFAULT_ACK_TIMEOUT = 2.0
#: Bound of one write to the hub. Frames to the hub are tiny, so a write that
#: cannot finish means the hub stopped reading.
DEFAULT_WRITE_TIMEOUT = 2.0
#: Bound of the connect.
DEFAULT_CONNECT_TIMEOUT = 2.0
#: Bound of one frame from the hub, from its first byte to its last: the
#: hub's own --frame-timeout default. A hub that stops in the middle of a
#: frame is wedged; without it the client would wait forever.
DEFAULT_FRAME_TIMEOUT = 10.0
# No frame at all for this long means a frozen hub (SIGSTOPped, a wedged
# loop): it re-sends its status every 5 status intervals (5 s by default),
# so this is three of those missed. Raise it above 5 times the hub's
# --status-interval when that is over 3 s.
DEFAULT_SILENCE_TIMEOUT = 15.0

_READ_SIZE = 64 << 10
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

log = logging.getLogger("listenhub")


def _check_peer(
    sock: socket.socket,
    path: str,
    allowed_uids: Collection[int] = (),
) -> None:
    """Refuses a hub that runs as another user: the peer of the socket
    (SO_PEERCRED) must be this process's uid, root, or one of allowed_uids.
    Raises ConnError(op="peer")."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, _gid = _PEERCRED.unpack(raw)
    if uid in (os.getuid(), 0) or uid in allowed_uids:
        return
    raise ConnError("peer", path, "peer pid %d runs as uid %d, not ours (%d) or root: not our hub" % (pid, uid, os.getuid()))


def _trusted(allowed_uids: Collection[int]) -> set[int]:
    return {os.getuid(), 0} | set(allowed_uids)


def _dir_problem(st: os.stat_result, trusted: Collection[int]) -> str | None:
    """Why a socket directory with stat st cannot be trusted (None if it
    can), OpenSSH's StrictModes rule: owned by us, root or an allowed uid,
    and not writable by group or other, unless sticky (like /tmp: there only
    an entry's owner can rename or remove it, and the socket's own owner is
    checked too)."""
    if st.st_uid not in trusted:
        return "directory owned by uid %d, not ours (%d), root or an allowed uid" % (st.st_uid, os.getuid())
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return "directory mode %04o is writable by group or other (and not sticky)" % stat.S_IMODE(st.st_mode)
    return None


def _ancestors_problem(d: str, trusted: Collection[int]) -> str | None:
    """Why a directory above the socket's cannot be trusted, up to / (None
    if none): any of them writable by another user could swap the socket's
    directory for one of its own. The same rule as the hub's and the Go
    client's, with the fix."""
    cur = os.path.realpath(d)
    while True:
        parent = os.path.dirname(cur)
        if parent == cur:
            return None
        cur = parent
        st = os.stat(cur)
        problem = _dir_problem(st, trusted)
        if problem:
            if st.st_uid not in trusted:
                fix = "chown %d %s (or root)" % (os.getuid(), cur)
            else:
                fix = "chmod go-w %s (or chmod +t %s)" % (cur, cur)
            return "%s above the socket: %s (fix: %s)" % (cur, problem, fix)


def _unsearchable_fix(path: str) -> str:
    """What to do about EACCES on the way to the socket at path."""
    return (
        "uid %d may not reach the socket: every directory of %s needs search (x) permission for it and the "
        "socket write permission (the hub's --socket-mode 0660 with --socket-group, this user in that group, "
        "and chmod o+x or g+x on the directories)" % (os.getuid(), os.path.dirname(path) or ".")
    )


def _sock_problem(st: os.stat_result, trusted: Collection[int]) -> str | None:
    """Why the file at the socket path (lstat: a symlink is not followed)
    is not our hub's socket (None if it may be)."""
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a socket"
        return "%s (mode %06o): not our hub's socket" % (kind, st.st_mode)
    if st.st_uid not in trusted:
        return "socket owned by uid %d, not ours (%d), root or an allowed uid: not our hub" % (st.st_uid, os.getuid())
    return None


_PROC_FD = os.path.isdir("/proc/self/fd")


def _dial(
    path: str,
    timeout: float | None,
    peer_check: bool,
    allowed_uids: Collection[int],
) -> socket.socket:
    """Connects to the hub socket; ConnError(op="dial") for a missing socket
    (ENOENT) or a stale one (ECONNREFUSED), ConnError(op="peer") for one
    that is not our hub's.

    With peer_check (the default) the socket's identity is checked the same
    way as by the Go and Node clients: the directory is opened (O_PATH) and
    checked (_dir_problem), the name is lstat'ed in it (_sock_problem), the
    connect goes through that open directory (/proc/self/fd/N/name: a
    symlink swapped into the path meanwhile changes nothing), and then the
    peer's uid is checked (SO_PEERCRED)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dfd = -1
    try:
        sock.settimeout(timeout)
        if not peer_check:
            sock.connect(path)
        else:
            trusted = _trusted(allowed_uids)
            d, name = os.path.split(path)
            if not name or name in (".", ".."):
                raise ConnError("dial", path, "not a socket path")
            try:
                dfd = os.open(d or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError as e:
                raise ConnError(
                    "dial",
                    path,
                    "%s: the socket's directory is missing: start the hub, or create it "
                    "(install -d -m 0755 %s, owned by the hub's user)" % (e, d),
                ) from e
            problem = _dir_problem(os.fstat(dfd), trusted) or _ancestors_problem(d or ".", trusted)
            if problem:
                raise ConnError("peer", path, problem)
            before = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            problem = _sock_problem(before, trusted)
            if problem:
                raise ConnError("peer", path, problem)
            via = "/proc/self/fd/%d/%s" % (dfd, name)
            if _PROC_FD and len(os.fsencode(via)) < 108:
                sock.connect(via)
            else:
                # No /proc (or a name too long for it): connect by path and
                # require the same socket file afterwards.
                sock.connect(path)
                after = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
                    raise ConnError("peer", path, "the socket file changed during the connect")
            _check_peer(sock, path, allowed_uids)
        sock.settimeout(None)
    except ConnError:
        sock.close()
        raise
    except OSError as e:
        sock.close()
        if e.errno == errno.EACCES:
            raise ConnError("dial", path, "%s: %s" % (e, _unsearchable_fix(path))) from e
        raise ConnError("dial", path, e) from e
    finally:
        if dfd >= 0:
            os.close(dfd)
    return sock


class _Call:
    """One unanswered sub; every concurrent subscribe() of the name waits on
    it."""

    __slots__ = ("done", "err", "waiters", "deadline")

    def __init__(self, deadline: float) -> None:
        self.done = threading.Event()
        self.err: BaseException | None = None
        self.waiters = 0
        self.deadline = deadline


class Client(Listener):
    """A connection to a listenhub hub. All methods are thread-safe.

    Alive until its first failure, then dead for good (never reconnects:
    that is Failover's job): ``err`` says why — ClosedError after close(),
    ConnError (EOF, which is also what an eviction looks like; a malformed
    frame; a stalled write), AckTimeoutError, or NackError (a nack that is
    not about the name). ``done`` is a threading.Event set at death.

    Wakes and statuses go to ``on_wake(Wake)`` and ``on_status(bool)`` when
    given, called from the reader thread one at a time in wire order (they
    must not block: while one runs nothing is read, acks wait and the hub
    may evict this process); otherwise they are queued for ``events()`` /
    ``get()``. Use :func:`connect` to make one.
    """

    def __init__(
        self,
        path: str,
        *,
        on_wake: _OnWake | None = None,
        on_status: _OnStatus | None = None,
        ack_timeout: float = DEFAULT_ACK_TIMEOUT,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
        silence_timeout: float = DEFAULT_SILENCE_TIMEOUT,
        peer_check: bool = True,
        allowed_uids: Collection[int] = (),
        max_pending: int = DEFAULT_MAX_PENDING,
        _sock: socket.socket | None = None,
    ) -> None:
        self.path = path
        self.ack_timeout = ack_timeout or DEFAULT_ACK_TIMEOUT
        self.write_timeout = write_timeout or DEFAULT_WRITE_TIMEOUT
        self.frame_timeout = frame_timeout or DEFAULT_FRAME_TIMEOUT
        self.silence_timeout = silence_timeout or DEFAULT_SILENCE_TIMEOUT
        self._sink = Sink(on_wake, on_status, max_pending)
        self._sock = _sock or _dial(path, connect_timeout, peer_check, allowed_uids)

        self._mu = threading.Lock()
        self._cond = threading.Condition(self._mu)  # writer: out queued, a deadline moved, death
        self._subs: dict[str, _subs.Sub] = {}
        self._out = bytearray()
        self.err = None
        self.done = threading.Event()
        self._healthy = False
        # A status arrived: until then a hub that says nothing is not one
        # whose Postgres is down (see _write_loop's ack deadlines).
        self._saw_status = False
        self._greeted = False  # a frame other than a refusal arrived

        # close(): no new callback starts once it was called (see _call).
        self._dispatch = threading.Lock()
        self._in_handler = False
        self._closing = False

        self._writer = threading.Thread(target=self._write_loop, name="listenhub-writer", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name="listenhub-reader", daemon=True)
        self._writer.start()
        self._reader.start()
        _fork.track(self)

    # --- API -----------------------------------------------------------------

    def subscribe(self, q: str, timeout: float | None = None) -> None:
        """Subscribes to q and returns once the hub acked it: from then on
        every NOTIFY committed on q's channel is delivered. Wakes for q may
        arrive before (over-delivery is harmless).

        A set, not a count: subscribing an acked name returns at once;
        concurrent calls for one name share one sub frame.

        Raises InvalidNameError for a refused name (the client stays alive);
        NackError, AckTimeoutError or ConnError when the hub failed (the
        client is dead); the client's error when already dead. ``timeout``
        (seconds) bounds this caller's wait only: TimeoutError, the client
        lives on and the subscription is abandoned (unsubscribed once acked
        unless another caller waits for it). Without it the wait is bounded
        by the ack timeout anyway, but while the hub says its Postgres is
        down: then the subscription waits for Postgres, as the hub does.
        """
        problem = _frame.name_problem(q)
        if problem:
            raise InvalidNameError(q, problem)
        with self._mu:
            if self.err is not None:
                raise self.err
            s, fresh = _subs.join(self._subs, q, lambda: _Call(time.monotonic() + self.ack_timeout))
            if s is None:
                return
            c = s.call
            if fresh:
                self._queue(_frame.sub(q))
        if c.done.wait(timeout):
            if c.err is not None:
                raise c.err
            return
        with self._mu:
            if c.done.is_set():
                if c.err is not None:
                    raise c.err
                return
            _subs.abandon(s, c)
        raise TimeoutError("listenhub: no answer for %r within %gs" % (q, timeout or 0.0))

    def unsubscribe(self, q: str) -> None:
        """Drops q and tells the hub (no answer). Never blocks; may be called
        from a callback. A pending subscribe of q completes, then the client
        unsubscribes. Unknown names and dead clients: nothing."""
        with self._mu:
            if self.err is None and _subs.drop(self._subs, q):
                self._queue(_frame.unsub(q))

    @property
    def healthy(self) -> bool:
        """Alive, and the hub's last status said its Postgres connection is
        healthy (False until the first status, which the hub sends on
        connect)."""
        return not self.done.is_set() and self._healthy

    def subscriptions(self) -> set[str]:
        """The acked names."""
        with self._mu:
            return _subs.acked(self._subs)

    def close(self) -> None:
        """Kills the client with ClosedError and closes the socket; the hub
        drops its subscriptions. Waiting subscribes raise ClosedError. No new
        callback starts once close() was called (the one already running, if
        any, is not waited for). Idempotent; safe from a callback."""
        self._closing = True
        self._die(ClosedError())
        if not self._in_handler:
            with self._dispatch:
                pass

    # --- internals -----------------------------------------------------------

    def _after_fork_in_child(self, err: BaseException) -> None:
        """In a forked child (see _fork): dead with err. No lock is taken
        (a thread of the parent may have held one at fork: it never lets go
        here) and the socket is closed, not shut down (that would cut the
        parent's connection)."""
        self._mu = threading.Lock()
        self._cond = threading.Condition(self._mu)
        self._dispatch = threading.Lock()
        self._subs = {}
        self._out = bytearray()
        self.err = err
        self._healthy = False
        self.done = threading.Event()
        self.done.set()
        self._sink = Sink(None, None, 1)
        self._sink.end()
        self._sock.close()

    def _queue(self, b: bytes) -> None:
        self._out += b
        self._cond.notify_all()

    def _die(self, err: BaseException) -> None:
        with self._mu:
            if self.err is not None:
                return
            self._die_locked(err)
        self._after_death(err)

    def _die_locked(self, err: BaseException) -> None:
        self.err = err
        for s in self._subs.values():
            if s.call is not None:
                self._resolve(s.call, err)
        self._subs = {}
        self._out = bytearray()
        self.done.set()
        self._cond.notify_all()

    def _after_death(self, err: BaseException) -> None:
        self._healthy = False
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sink.end()
        if isinstance(err, ClosedError):
            log.debug("listenhub client closed")
        else:
            log.warning("listenhub client dead: %s", err)

    @staticmethod
    def _resolve(c: _Call, err: BaseException | None) -> None:
        if not c.done.is_set():
            c.err = err
            c.done.set()

    def _write_loop(self) -> None:
        while True:
            with self._mu:
                while True:
                    if self.err is not None:
                        return
                    if self._out and self._greeted:
                        # Nothing is written before the hub's first frame
                        # (status, or the refusal of this connection): a
                        # write into a connection the hub is refusing fails
                        # with EPIPE and loses the reason it sent.
                        break
                    now = time.monotonic()
                    expired, next_deadline = None, None
                    # While the hub says its Postgres is down, a sub waits
                    # for it to come back, as the hub does; the healthy
                    # status after restarts every deadline.
                    paused = self._saw_status and not self._healthy
                    for q, s in self._subs.items():
                        c = s.call
                        if c is None or c.done.is_set() or paused:
                            continue
                        if c.deadline <= now:
                            expired = q
                            break
                        if next_deadline is None or c.deadline < next_deadline:
                            next_deadline = c.deadline
                    if expired is not None:
                        err = AckTimeoutError(expired, self.ack_timeout)
                        self._die_locked(err)
                        break
                    self._cond.wait(None if next_deadline is None else next_deadline - now)
                if self.err is not None:
                    err = self.err
                    self._out = bytearray()
                    buf = None
                else:
                    buf, self._out = bytes(self._out), bytearray()
            if buf is None:
                self._after_death(err)
                return
            self._send(buf)

    def _send(self, buf: bytes) -> None:
        """Writes buf within the write timeout or kills the client."""
        deadline = time.monotonic() + self.write_timeout
        view = memoryview(buf)
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLOUT)
        while view:
            try:
                n = self._sock.send(view, socket.MSG_DONTWAIT)
                view = view[n:]
                continue
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as e:
                self._die(ConnError("write", self.path, e))
                return
            left = deadline - time.monotonic()
            if left <= 0:
                self._die(ConnError("write", self.path, "stalled for %gs: the hub stopped reading" % self.write_timeout))
                return
            poller.poll(left * 1000)
            if self.done.is_set():
                return

    def _read_loop(self) -> None:
        dec = _frame.Decoder()
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLIN)
        heard = time.monotonic()
        try:
            while True:
                if dec.partial_since is not None:
                    left = dec.partial_since + self.frame_timeout - time.monotonic()
                    if left <= 0 or not poller.poll(left * 1000):
                        if not self.done.is_set():
                            self._die(ConnError("read", self.path, "a frame from the hub stalled: %d bytes of it in %gs (frame timeout)" % (dec.buffered(), self.frame_timeout)))
                        return
                else:
                    left = heard + self.silence_timeout - time.monotonic()
                    if left <= 0 or not poller.poll(left * 1000):
                        if not self.done.is_set():
                            self._die(ConnError("read", self.path, "no frame from the hub for %gs (silence timeout; it re-sends its status every few seconds): frozen or wedged" % self.silence_timeout))
                        return
                try:
                    data = self._sock.recv(_READ_SIZE)
                except OSError as e:
                    if not self.done.is_set():
                        self._die(ConnError("read", self.path, e))
                    return
                if not data:
                    if not self.done.is_set():
                        why = "unexpected EOF (inside a frame)" if dec.buffered() else "EOF: the hub closed the connection"
                        self._die(ConnError("read", self.path, why))
                    return
                heard = time.monotonic()
                dec.feed(data)
                try:
                    for m in dec.messages():
                        if not self._handle(m):
                            return
                except _frame.FrameError as e:
                    self._die(ConnError("read", self.path, e))
                    return
        finally:
            self._writer.join()
            self._sock.close()

    def _handle(self, m: dict[str, Any]) -> bool:
        """Processes one frame; False once the client is dead."""
        t = m["t"]
        q: Any = m.get("q")  # a str, or what a broken hub sent
        if not self._greeted:
            self._greeted = True
            if t == "nack":
                # A nack before anything else is the hub's refusal of this
                # connection (docs/protocol.md); it closes it next.
                self._die(RefusedError(self.path, m.get("error") or "no reason given"))
                return False
            with self._mu:
                self._cond.notify_all()  # the writer may start
        if t == "ack":
            with self._mu:
                c, unsub = _subs.ack(self._subs, q)
                if c is None:
                    log.debug("listenhub client: ack without a pending sub: %r", q)
                else:
                    self._resolve(c, None)
                    if unsub:
                        self._queue(_frame.unsub(q))
        elif t == "nack":
            reason = m.get("error") or ""
            with self._mu:
                q = _subs.nacked_name(self._subs, q, m.get("q64"))
            if _frame.invalid_name_reason(reason) or _frame.limit_reason(reason):
                err_type = LimitError if _frame.limit_reason(reason) else InvalidNameError
                with self._mu:
                    c = _subs.refuse(self._subs, q)
                    if c is not None:
                        self._resolve(c, err_type(q, reason))
            else:
                with self._mu:
                    pending = _subs.pending(self._subs, q)
                if pending:
                    self._die(NackError(q, reason))
                    return False
                log.debug("listenhub client: nack without a pending sub: %r %s", q, reason)
        elif t == "wake":
            with self._mu:
                held = q in self._subs
            if held and isinstance(q, str):
                p = m.get("p")
                return self._deliver(make_wake(q, p if isinstance(p, str) else None))
        elif t == "status":
            healthy = bool(m.get("healthy"))
            with self._mu:
                was, self._healthy, self._saw_status = self._healthy, healthy, True
                if healthy and not was:
                    # Postgres is back: every sub still waiting gets a
                    # whole ack timeout from now.
                    deadline = time.monotonic() + self.ack_timeout
                    for s in self._subs.values():
                        if s.call is not None and not s.call.done.is_set():
                            s.call.deadline = deadline
                self._cond.notify_all()
            return self._deliver(Status(healthy))
        else:
            log.debug("listenhub client: skipping unknown frame type %r", t)
        return not self.done.is_set()

    def _deliver(self, ev: _Event) -> bool:
        cb = self._sink.callback(ev)
        if cb is None:
            if not self._sink.put(ev):
                self._die(SlowConsumerError("listenhub: more than %d events not taken from events()" % self._sink.max_pending))
                return False
            return not self.done.is_set()
        arg = ev if isinstance(ev, Wake) else ev.healthy
        with self._dispatch:
            self._in_handler = True
            try:
                if self._closing:
                    return False
                try:
                    cb(arg)
                except Exception:  # a callback's bug must not kill the reader silently
                    log.exception("listenhub client: callback raised")
            finally:
                self._in_handler = False
        return not self.done.is_set()


def connect(path: str, **kwargs: Any) -> Client:
    """Connects to the hub at path and returns a Client (see Client for the
    options). Raises ConnError when there is no hub (ENOENT, ECONNREFUSED) or
    its peer is not our user."""
    return Client(path, **kwargs)


__all__ = ["Client", "connect", "Wake", "Status", "ListenhubError"]
