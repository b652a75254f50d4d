"""Test helpers: a real `listenhub serve` per test, NOTIFY through psycopg,
a fake hub for what a healthy hub never does, and waiting with deadlines.

Run by clients/clients_test.go (go test ./clients/), which builds the hub
and starts a throwaway Postgres, with
    LHTEST_HUB_BIN        the listenhub binary
    LHTEST_DATABASE_URL   the database
Both are required; see clients/python/README.md to run these by hand.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import psycopg

from listenhub import _frame

HUB_BIN = os.environ.get("LHTEST_HUB_BIN", "")
DATABASE_URL = os.environ.get("LHTEST_DATABASE_URL", "")
# Generous: the CI machine is shared and loaded.
TIMEOUT = 20.0


def scratch_dir(test, prefix="lhpy-"):
    """A fresh directory removed when test ends (nothing is left in TMPDIR:
    go test ./clients/ checks)."""
    d = tempfile.mkdtemp(prefix=prefix)
    test.addCleanup(shutil.rmtree, d, True)
    return d


def require_env():
    if not HUB_BIN or not DATABASE_URL:
        raise unittest.SkipTest("LHTEST_HUB_BIN and LHTEST_DATABASE_URL are not set (run go test ./clients/)")


def wait_for(what, cond, timeout=TIMEOUT):
    """Polls cond until true; AssertionError naming what after timeout."""
    deadline = time.monotonic() + timeout
    interval = 0.001
    while not cond():
        if time.monotonic() > deadline:
            if cond():
                return
            raise AssertionError("timed out after %gs waiting for %s" % (timeout, what))
        time.sleep(interval)
        interval = min(interval * 2, 0.02)


def clean_env():
    return {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("LISTENHUB_") or k.startswith("PG") or k == "DATABASE_URL")
    }


class Hub:
    """One `listenhub serve` on its own socket in a temporary directory."""

    def __init__(self, name, prefix="", suffix="", socket_path=None, args=(), ready=True):
        require_env()
        self.dir = tempfile.mkdtemp(prefix="lhpy-")
        self.socket = socket_path or os.path.join(self.dir, "hub.sock")
        self.app = ("lhpy-" + name)[:60]
        self.prefix, self.suffix = prefix, suffix
        self.log_path = os.path.join(self.dir, "hub.log")
        self._log = open(self.log_path, "wb")
        argv = [
            HUB_BIN, "serve",
            "--socket", self.socket,
            "--database-url", DATABASE_URL,
            "--application-name", self.app,
            "--status-interval", "200ms",
            "--log-level", "debug",
        ]
        if prefix:
            argv += ["--channel-prefix", prefix]
        if suffix:
            argv += ["--channel-suffix", suffix]
        argv += list(args)
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=clean_env())
        if ready:
            self._ready()
        else:  # a hub that refuses us: listening is all we can wait for
            wait_for("the hub's socket", lambda: os.path.exists(self.socket))

    def _ready(self):
        deadline = time.monotonic() + TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise AssertionError("listenhub exited early (%s):\n%s" % (self.proc.returncode, self.output()))
            if self._healthy(deadline):
                return
            if time.monotonic() > deadline:
                raise AssertionError("listenhub not ready:\n" + self.output())
            time.sleep(0.01)

    def _healthy(self, deadline):
        """Connects and reads until a status healthy:true (the hub accepts
        before its Postgres connection is up and then says false), so that
        tests start from a hub that reports healthy on connect."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(max(0.1, deadline - time.monotonic()))
                s.connect(self.socket)
                dec = _frame.Decoder()
                while True:
                    data = s.recv(65536)
                    if not data:
                        return False
                    dec.feed(data)
                    for m in iter(dec.next, None):
                        if m["t"] == "status" and m.get("healthy") is True:
                            return True
        except OSError:
            return False

    def output(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def channel(self, q):
        return self.prefix + q + self.suffix

    def kill(self):
        """SIGKILL: workers see EOF, nothing is cleaned up (the socket file
        stays, stale: ECONNREFUSED for the next connect)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)

    def close(self):
        self.kill()
        self._log.close()
        shutil.rmtree(self.dir, True)


class DB:
    """A psycopg connection for NOTIFY and pg_stat_activity."""

    def __init__(self):
        require_env()
        self.conn = psycopg.connect(DATABASE_URL, autocommit=True, application_name="lhpy-test")

    def notify(self, channel, payload=""):
        self.conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))

    def backends(self, application_name):
        cur = self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        )
        return cur.fetchone()[0]

    def close(self):
        self.conn.close()


def other_database_url(test, name):
    """A database of its own (dropped at the test's end), beside the
    test's: the URL of a hub that serves another database."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    admin = psycopg.connect(DATABASE_URL, autocommit=True)
    test.addCleanup(admin.close)
    admin.execute("DROP DATABASE IF EXISTS %s" % name)
    admin.execute("CREATE DATABASE %s" % name)
    test.addCleanup(lambda: admin.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name))
    return make_conninfo(DATABASE_URL, dbname=name)


def start_hub_and_db(test):
    """Sets test.hub, a hub named after the test, and test.db; both are
    closed at the test's cleanup."""
    test.hub = Hub(test.id().rsplit(".", 1)[-1])
    test.addCleanup(test.hub.close)
    test.db = DB()
    test.addCleanup(test.db.close)


class Collector:
    """Records what a listener delivers, for the sync callbacks."""

    def __init__(self):
        self.cond = threading.Condition()
        self.wakes = []
        self.statuses = []

    def on_wake(self, w):
        with self.cond:
            self.wakes.append(w)
            self.cond.notify_all()

    def on_status(self, h):
        with self.cond:
            self.statuses.append(h)
            self.cond.notify_all()

    def wait(self, what, pred, timeout=TIMEOUT):
        with self.cond:
            if not self.cond.wait_for(lambda: pred(self), timeout):
                raise AssertionError(
                    "timed out after %gs waiting for %s; wakes %r statuses %r" % (timeout, what, self.wakes, self.statuses)
                )

    def has(self, w):
        with self.cond:
            return w in self.wakes

    def count(self, w):
        with self.cond:
            return self.wakes.count(w)


class FakeHub:
    """A socket that speaks the protocol badly on purpose: sends a healthy
    status, then answers every sub with nothing ("silent") or with a nack
    that is not about the name ("nack"), or never reads at all ("deaf"),
    sends half a frame and stalls ("partial"), sends a 4 MiB frame in
    128-byte writes ("big"); or acks every sub ("ack"); or refuses the
    connection ("refuse"). For the rules a real hub cannot be made to break
    on demand."""

    def __init__(self, mode, dir=None):
        self._own_dir = not dir  # removed by close()
        self.dir = dir or tempfile.mkdtemp(prefix="lhpy-fake-")
        self.socket = os.path.join(self.dir, "fake.sock")
        self.mode = mode
        self.subs = []
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(self.socket)
        self._srv.listen(8)
        self._conns = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._stop:
            try:
                c, _ = self._srv.accept()
            except OSError:
                return
            self._conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            if self.mode == "refuse":
                c.sendall(_frame.encode({"t": "nack", "q": "", "error": "uid 1000 is not allowed (--allow-uid)"}))
                return
            c.sendall(_frame.encode({"t": "status", "healthy": True}))
            if self.mode == "partial":
                c.sendall(_frame.encode({"t": "wake", "q": "a", "p": "x"})[:7])
            if self.mode in ("deaf", "partial"):
                while not self._stop:
                    time.sleep(0.05)
                return
            dec = _frame.Decoder()
            while True:
                data = c.recv(65536)
                if not data:
                    return
                dec.feed(data)
                while True:
                    m = dec.next()
                    if m is None:
                        break
                    if m["t"] == "sub":
                        self.subs.append(m["q"])
                        if self.mode in ("ack", "big"):
                            c.sendall(_frame.encode({"t": "ack", "q": m["q"]}))
                        if self.mode == "big":
                            # One 4 MiB frame in 128-byte writes.
                            f = _frame.encode({"t": "wake", "q": m["q"], "p": "x" * ((4 << 20) - 40)})
                            for i in range(0, len(f), 128):
                                c.sendall(f[i : i + 128])
                        if self.mode == "nack":
                            c.sendall(_frame.encode({"t": "nack", "q": m["q"], "error": "LISTEN failed: listener: no connection within the command timeout"}))
        except OSError:
            return

    def close(self):
        self._stop = True
        self._srv.close()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
        if self._own_dir:
            shutil.rmtree(self.dir, True)



ATTACKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testdata", "attacker.py")


def attack_connects():
    """Connects per attack run: 1,000 in CI, 10,000 with
    LISTENHUB_TEST_LARGE_SET=1 (the size the attack was first reported at)."""
    return 10000 if os.environ.get("LISTENHUB_TEST_LARGE_SET") else 1000


class Attacker:
    """clients/testdata/attacker.py run as nobody (needs root and
    runuser; SkipTest otherwise)."""

    def __init__(self, mode, shared, target, legit=""):
        if os.geteuid() != 0 or not os.path.exists("/usr/sbin/runuser") and not shutil.which("runuser"):
            raise unittest.SkipTest("the attack needs root and runuser (a foreign uid flips the path)")
        with open(ATTACKER) as f:
            src = f.read()
        argv = ["runuser", "-u", "nobody", "--", sys.executable, "-c", src, mode, shared, target]
        if legit:
            argv.append(legit)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise AssertionError("attacker did not start: %r %s" % (line, self.proc.stdout.read()))

    def captures(self):
        out, _ = self.proc.communicate("", timeout=TIMEOUT)
        for line in out.splitlines():
            if line.startswith("captures "):
                return int(line.split()[1])
        raise AssertionError("attacker said: %r" % out)


def sticky_dir():
    """A fresh root-owned directory with mode 1777, like /tmp."""
    d = tempfile.mkdtemp(prefix="lhpy-sticky-")
    os.chmod(d, 0o1777)
    return d


def count_refused_failbacks(test):
    """A list that grows by one record per fail-back refused for a hub on
    another database (the "listenhub" logger at DEBUG), until test ends."""
    import logging

    refused = []

    class Count(logging.Handler):
        def emit(self, record):
            if "does not deliver this database's notifications" in record.getMessage():
                refused.append(record)

    lg = logging.getLogger("listenhub")
    handler, level = Count(level=logging.DEBUG), lg.level
    lg.addHandler(handler)
    lg.setLevel(logging.DEBUG)
    test.addCleanup(lambda: (lg.removeHandler(handler), lg.setLevel(level)))
    return refused
