"""Failover against a real hub and a real Postgres: the hub is killed, the
client goes on with its own LISTEN connection."""

import os
import threading
import time
import unittest

import listenhub
from listenhub import Wake

from hubtest import count_refused_failbacks, DATABASE_URL, TIMEOUT, DB, Collector, FakeHub, Hub, other_database_url, require_env, scratch_dir, wait_for

PREFIX, SUFFIX = "lh.", ".ev"
# Needs quoting (a dot, a capital, a double quote): the local LISTEN must
# send it as a quoted identifier with the quote doubled.
ODD = 'Mixed"Case.q'


class LaterProxy:
    """A TCP port where nothing listens yet (Postgres down, as a refused
    connection); up() starts forwarding it to the test's server."""

    def __init__(self, test):
        import socket as socketlib
        from urllib.parse import urlsplit

        self._s = socketlib
        ln = socketlib.socket()
        ln.bind(("127.0.0.1", 0))
        self.port = ln.getsockname()[1]
        ln.close()
        u = urlsplit(DATABASE_URL)
        self.target = (u.hostname, u.port or 5432)
        self.test = test

    def via(self, url):
        from urllib.parse import urlsplit, urlunsplit

        u = urlsplit(url)
        auth = u.netloc.rsplit("@", 1)[0] + "@" if "@" in u.netloc else ""
        return urlunsplit(u._replace(netloc=auth + "127.0.0.1:%d" % self.port))

    def up(self):
        s = self._s
        srv = s.socket()
        srv.setsockopt(s.SOL_SOCKET, s.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.port))
        srv.listen(16)
        self.test.addCleanup(srv.close)

        def pipe(a, b):
            try:
                while True:
                    data = a.recv(65536)
                    if not data:
                        break
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for x in (a, b):
                    try:
                        x.shutdown(s.SHUT_RDWR)
                    except OSError:
                        pass

        def accept():
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                t = s.create_connection(self.target)
                threading.Thread(target=pipe, args=(c, t), daemon=True).start()
                threading.Thread(target=pipe, args=(t, c), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()


class FailoverTest(unittest.TestCase):
    def setUp(self):
        require_env()
        self.name = self.id().rsplit(".", 1)[-1]
        self.db = DB()
        self.addCleanup(self.db.close)
        self.col = Collector()

    def hub(self):
        h = Hub(self.name, prefix=PREFIX, suffix=SUFFIX)
        self.addCleanup(h.close)
        return h

    def failover(self, socket_path, **kw):
        self.app = ("lhpy-local-" + self.name)[:60]
        kw.setdefault("database_url", DATABASE_URL)
        f = listenhub.Failover(
            socket_path,
            channel_prefix=PREFIX,
            channel_suffix=SUFFIX,
            application_name=self.app,
            on_wake=self.col.on_wake,
            on_status=self.col.on_status,
            **kw,
        )
        self.addCleanup(f.close)
        return f

    def notify(self, q, payload=""):
        self.db.notify(PREFIX + q + SUFFIX, payload)

    def test_hub_killed_fails_over_to_local_listen(self):
        h = self.hub()
        reasons = []
        f = self.failover(h.socket, on_failover=reasons.append)
        f.subscribe("jobs")
        f.subscribe(ODD)
        self.assertEqual(f.mode, listenhub.HUB)
        self.assertEqual(self.db.backends(self.app), 0)
        self.notify("jobs", "via-hub")
        self.col.wait("a wake through the hub", lambda s: Wake("jobs", "via-hub", False) in s.wakes)

        h.kill()
        wait_for("local mode", lambda: f.mode == listenhub.LOCAL)
        # One durable wake per recorded name after the swap.
        self.col.wait(
            "a durable wake per name",
            lambda s: Wake("jobs", None, True) in s.wakes and Wake(ODD, None, True) in s.wakes,
        )
        self.assertEqual(self.col.count(Wake("jobs", None, True)), 1)
        self.assertEqual(self.col.count(Wake(ODD, None, True)), 1)
        self.assertEqual(len(reasons), 1)
        self.assertIsInstance(reasons[0], listenhub.ConnError)
        self.assertIsInstance(f.reason, listenhub.ConnError)
        self.assertEqual(self.db.backends(self.app), 1)
        self.assertTrue(f.healthy)

        # Later NOTIFYs come through the local connection, mapped back.
        self.notify("jobs", "via-local")
        self.notify(ODD, "odd")
        self.col.wait(
            "wakes through the local listener",
            lambda s: Wake("jobs", "via-local", False) in s.wakes and Wake(ODD, "odd", False) in s.wakes,
        )
        # Subscribe and unsubscribe in local mode.
        f.subscribe("later")
        f.unsubscribe("jobs")
        f.subscribe("sync-point")  # LISTEN/UNLISTEN run in call order
        self.notify("jobs", "gone")
        self.notify("later", "new")
        self.col.wait("a wake for a name subscribed in local mode", lambda s: Wake("later", "new", False) in s.wakes)
        self.assertNotIn(Wake("jobs", "gone", False), self.col.wakes)
        self.assertEqual(f.subscriptions(), {ODD, "later", "sync-point"})

        f.close()
        wait_for("the local backend gone", lambda: self.db.backends(self.app) == 0)

    def test_hub_back_fails_back_and_fails_over_again(self):
        h = self.hub()
        failbacks = []
        f = self.failover(h.socket, min_local=0.2, probe_interval=0.1, on_failback=lambda: failbacks.append(True))
        f.subscribe("jobs")
        h.kill()
        wait_for("local mode", lambda: f.mode == listenhub.LOCAL)
        self.col.wait("the durable wake of the failover", lambda s: s.count(Wake("jobs", None, True)) == 1)
        self.assertEqual(self.db.backends(self.app), 1)
        f.subscribe("while-local")  # recorded: the fail-back subscribes it on the hub too

        # A new hub on the same socket (the old file is stale).
        h2 = Hub(self.name + "-2", prefix=PREFIX, suffix=SUFFIX, socket_path=h.socket)
        self.addCleanup(h2.close)
        wait_for("back on the hub", lambda: f.mode == listenhub.HUB)
        # on_failback runs on the fail-back thread just after the swap
        # (and the local listener's close): wait for it, not race it.
        wait_for("on_failback called", lambda: failbacks == [True])
        self.assertEqual(failbacks, [True])
        self.assertIsNone(f.reason)
        # One durable wake per name after the fail-back as well.
        self.col.wait(
            "the durable wakes of the fail-back",
            lambda s: s.count(Wake("jobs", None, True)) == 2 and s.count(Wake("while-local", None, True)) == 1,
        )
        # Make before break: the local listener is closed after the swap.
        wait_for("the local backend gone", lambda: self.db.backends(self.app) == 0)
        self.notify("while-local", "via-new-hub")
        self.col.wait("a wake through the new hub", lambda s: Wake("while-local", "via-new-hub", False) in s.wakes)
        self.assertTrue(f.healthy)

        # The cycle repeats.
        h2.kill()
        wait_for("local mode again", lambda: f.mode == listenhub.LOCAL)
        self.col.wait("the durable wake of the second failover", lambda s: s.count(Wake("jobs", None, True)) == 3)

    def test_failback_loses_no_notify(self):
        h = self.hub()
        f = self.failover(h.socket, min_local=0.2, probe_interval=0.1)
        f.subscribe("stream")
        h.kill()
        wait_for("local mode", lambda: f.mode == listenhub.LOCAL)
        # NOTIFYs committed back to back across the whole fail-back.
        stop = threading.Event()
        sent = []

        def pump():
            db = DB()
            try:
                i = 0
                while not stop.is_set():
                    db.notify(PREFIX + "stream" + SUFFIX, str(i))
                    sent.append(str(i))
                    i += 1
            finally:
                db.close()

        t = threading.Thread(target=pump)
        t.start()
        try:
            h2 = Hub(self.name + "-2", prefix=PREFIX, suffix=SUFFIX, socket_path=h.socket)
            self.addCleanup(h2.close)
            wait_for("back on the hub", lambda: f.mode == listenhub.HUB)
            n = len(sent)
            wait_for("NOTIFYs after the fail-back", lambda: len(sent) > n + 100)
        finally:
            stop.set()
            t.join()
        want = set(sent)
        self.col.wait(
            "every committed payload",
            lambda s: want <= {w.payload for w in s.wakes},
        )
        self.assertGreater(len(want), 100)

    def test_failback_exact_through_20(self):
        """Numbered NOTIFYs at 500 a second through 20 fail-backs (the hub
        killed while the sender pauses, so that the failover's own gap is
        not counted; restarted while it sends): each arrives once, in
        commit order."""
        h = self.hub()
        backs = threading.Semaphore(0)
        f = self.failover(h.socket, min_local=0.1, probe_interval=0.05, probe_max_interval=0.2, on_failback=backs.release)
        f.subscribe("seq")
        mu = threading.Lock()
        state = {"sent": 0, "paused": False, "stop": False}

        def pump():
            db = DB()
            try:
                while not state["stop"]:
                    with mu:
                        if not state["paused"]:
                            state["sent"] += 1
                            db.notify(PREFIX + "seq" + SUFFIX, "n%d" % state["sent"])
                    time.sleep(0.002)
            finally:
                db.close()

        def seqs(s):
            return [int(w.payload[1:]) for w in s.wakes if w.name == "seq" and w.payload and w.payload.startswith("n")]

        def upto(n):
            self.col.wait("seq %d" % n, lambda s: max(seqs(s), default=0) >= n)

        t = threading.Thread(target=pump)
        t.start()
        try:
            upto(10)
            for i in range(20):
                with mu:
                    state["paused"] = True
                    at = state["sent"]
                upto(at)
                h.kill()
                wait_for("local mode", lambda: f.mode == listenhub.LOCAL)
                with mu:
                    state["paused"] = False
                upto(at + 10)
                h = Hub(self.name + "-%d" % i, prefix=PREFIX, suffix=SUFFIX, socket_path=h.socket)
                self.addCleanup(h.close)
                self.assertTrue(backs.acquire(timeout=TIMEOUT), "fail-back %d" % (i + 1))
                self.assertEqual(f.mode, listenhub.HUB)
                with mu:
                    n = state["sent"]
                upto(n + 10)
        finally:
            state["stop"] = True
            t.join()
        upto(state["sent"])
        got = seqs(self.col)
        dups = sorted({s for s in got if got.count(s) > 1})
        lost = sorted(set(range(1, state["sent"] + 1)) - set(got))
        self.assertEqual(dups, [], "delivered twice through 20 fail-backs")
        self.assertEqual(lost, [], "lost through 20 fail-backs")
        self.assertEqual(got, sorted(got), "out of commit order")

    def test_hub_on_another_database_is_refused_at_start(self):
        """A hub serving another database acks every subscribe and delivers
        none of this one's NOTIFYs: the Failover finds out at start (a
        NOTIFY of a private name that does not come back through the hub),
        says so at ERROR, and listens on its own connection."""
        url = other_database_url(self, "lhpy_other_%d" % os.getpid())
        h = Hub(self.name, prefix=PREFIX, suffix=SUFFIX, args=("--database-url", url))
        self.addCleanup(h.close)
        with self.assertLogs("listenhub", level="ERROR") as logs:
            f = self.failover(h.socket)
        self.assertEqual(f.mode, listenhub.LOCAL)
        self.assertIsInstance(f.reason, listenhub.OtherDatabaseError)
        self.assertIn("does not deliver the notifications of", "\n".join(logs.output))
        f.subscribe("jobs")
        DB().notify(PREFIX + "jobs" + SUFFIX, "through-our-own")
        self.col.wait("the wake through the local listener", lambda s: Wake("jobs", "through-our-own", False) in s.wakes)

    def test_refused_failbacks_lose_nothing(self):
        """A hub on another database on the socket: every fail-back
        attempt's marker passes the local listener and never the hub, and
        the local wakes held after the marker are delivered when the
        attempt is given up. Numbered NOTIFYs through 10 refused attempts:
        each arrives once, in commit order."""
        refused = count_refused_failbacks(self)
        sock = os.path.join(scratch_dir(self), "hub.sock")
        f = self.failover(sock, min_local=0.05, probe_interval=0.05, probe_max_interval=0.1, ack_timeout=0.5)
        f.subscribe("seq")
        self.assertEqual(f.mode, listenhub.LOCAL)
        state = {"sent": 0, "stop": False}

        def pump():
            db = DB()
            try:
                while not state["stop"]:
                    state["sent"] += 1
                    db.notify(PREFIX + "seq" + SUFFIX, "n%d" % state["sent"])
                    time.sleep(0.003)
            finally:
                db.close()

        t = threading.Thread(target=pump)
        t.start()
        try:
            url = other_database_url(self, "lhpy_refused_%d" % os.getpid())
            h = Hub(self.name, prefix=PREFIX, suffix=SUFFIX, socket_path=sock, args=("--database-url", url))
            self.addCleanup(h.close)
            wait_for("10 refused fail-back attempts", lambda: len(refused) >= 10, timeout=3 * TIMEOUT)
        finally:
            state["stop"] = True
            t.join()

        def seqs(s):
            return [int(w.payload[1:]) for w in s.wakes if w.name == "seq" and w.payload and w.payload.startswith("n")]

        self.col.wait("the last NOTIFY", lambda s: max(seqs(s), default=0) >= state["sent"])
        self.assertEqual(f.mode, listenhub.LOCAL)
        got = seqs(self.col)
        dups = sorted({s for s in got if got.count(s) > 1})
        lost = sorted(set(range(1, state["sent"] + 1)) - set(got))
        self.assertEqual(lost, [], "lost through %d refused fail-backs" % len(refused))
        self.assertEqual(dups, [], "delivered twice through refused fail-backs")
        self.assertEqual(got, sorted(got), "out of commit order")

    def test_postgres_down_at_start_worker_stays(self):
        """The hub up, its Postgres not (a port where nothing listens yet):
        a Failover stays on the hub, is told healthy false, and its
        subscribe waits past its ack timeout and the hub's old 5 s command
        timeout, instead of failing over to a local listener that cannot
        connect either. Once Postgres is up the sub is acked and a NOTIFY
        arrives through the hub."""
        p = LaterProxy(self)
        down = p.via(DATABASE_URL)
        h = Hub(self.name, prefix=PREFIX, suffix=SUFFIX, args=("--database-url", down), ready=False)
        self.addCleanup(h.close)
        f = self.failover(h.socket, database_url=down, ack_timeout=1.0)
        self.assertEqual(f.mode, listenhub.HUB)
        result = {}

        def sub():
            try:
                f.subscribe("a")
                result["ok"] = True
            except BaseException as e:  # noqa: BLE001 - reported below
                result["err"] = e

        t = threading.Thread(target=sub, daemon=True)
        t.start()
        t.join(7.0)  # seven ack timeouts: the sub must still be waiting
        self.assertTrue(t.is_alive(), "subscribe returned %r while Postgres is down" % result)
        self.assertEqual(f.mode, listenhub.HUB)
        self.assertIsNone(f.err)
        self.assertIn(False, self.col.statuses)
        self.assertNotIn(True, self.col.statuses)
        p.up()
        t.join(TIMEOUT)
        self.assertEqual(result, {"ok": True})
        self.notify("a", "after")
        self.col.wait("the wake through the hub", lambda s: Wake("a", "after", False) in s.wakes)
        self.assertEqual(f.mode, listenhub.HUB)

    def test_unverified_hub_on_another_database_refused_once_up(self):
        """A hub on another database whose Postgres is down when the
        Failover starts cannot be checked then, and is not trusted either:
        its wakes wait until it says healthy and the check runs, which
        finds the other database; the Failover listens on its own
        connection and delivers this database's NOTIFYs, none of the
        other's."""
        import psycopg

        from urllib.parse import urlsplit, urlunsplit

        other = "lhpy_unverified_%d" % os.getpid()
        conninfo = other_database_url(self, other)
        url = urlunsplit(urlsplit(DATABASE_URL)._replace(path="/" + other))
        p = LaterProxy(self)
        h = Hub(self.name, prefix=PREFIX, suffix=SUFFIX, args=("--database-url", p.via(url)), ready=False)
        self.addCleanup(h.close)
        f = self.failover(h.socket, ack_timeout=1.0)
        self.assertEqual(f.mode, listenhub.HUB)
        threading.Thread(target=f.subscribe, args=("a",), daemon=True).start()
        p.up()
        wait_for("local mode once the check ran", lambda: f.mode == listenhub.LOCAL)
        self.assertIsInstance(f.reason, listenhub.OtherDatabaseError)
        wait_for("subscribed", lambda: "a" in f.subscriptions())
        with psycopg.connect(conninfo, autocommit=True) as oc:
            oc.execute("SELECT pg_notify(%s, 'foreign')", (PREFIX + "a" + SUFFIX,))
        self.notify("a", "ours")
        self.col.wait("our NOTIFY", lambda s: Wake("a", "ours", False) in s.wakes)
        self.assertNotIn(Wake("a", "foreign", False), self.col.wakes)

    def test_frozen_hub_fails_over(self):
        """A frozen hub (SIGSTOPped: its socket open, nothing read or
        written) is a dead hub: no frame for silence_timeout, though it
        re-sends its status every 5 status intervals (1 s here), and the
        Failover listens on its own connection; a NOTIFY committed during
        the freeze arrives through it."""
        import signal

        h = self.hub()
        f = self.failover(h.socket, silence_timeout=3.0)
        f.subscribe("a")
        self.assertEqual(f.mode, listenhub.HUB)
        os.kill(h.proc.pid, signal.SIGSTOP)
        self.addCleanup(lambda: h.proc.poll() is None and os.kill(h.proc.pid, signal.SIGCONT))
        wait_for("local mode after the hub froze", lambda: f.mode == listenhub.LOCAL)
        self.assertIn("no frame from the hub", str(f.reason))
        self.notify("a", "during the freeze")
        self.col.wait("the wake through the local listener", lambda s: Wake("a", "during the freeze", False) in s.wakes)

    def test_fallback_is_said_without_logging_configured(self):
        """A program that configured no logging still hears why a Failover
        listens on its own connection: a ListenhubWarning on stderr, which
        a default interpreter prints."""
        import subprocess
        import sys

        path = os.path.join(scratch_dir(self), "absent.sock")
        code = (
            "import listenhub\n"
            "f = listenhub.Failover(%r, database_url=%r)\n"
            "assert f.mode == listenhub.LOCAL\n"
            "f.close()\n" % (path, DATABASE_URL)
        )
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        r = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ListenhubWarning", r.stderr)
        self.assertIn("hub unreachable", r.stderr)
        self.assertIn(path, r.stderr)

    def test_one_way_stays_local(self):
        h = self.hub()
        f = self.failover(h.socket, one_way=True, min_local=0.05, probe_interval=0.05)
        f.subscribe("jobs")
        h.kill()
        wait_for("local mode", lambda: f.mode == listenhub.LOCAL)
        h2 = Hub(self.name + "-2", prefix=PREFIX, suffix=SUFFIX, socket_path=h.socket)
        self.addCleanup(h2.close)
        # Without one_way this fails back within about 0.1 s (the test
        # above); twenty times that without it is the one-way rule.
        time.sleep(2)
        self.assertEqual(f.mode, listenhub.LOCAL)
        self.assertEqual(self.db.backends(self.app), 1)

    def test_eviction_fails_over(self):
        # A small outbound cap: a process that stops reading is evicted by
        # the hub, which it sees as EOF, and fails over.
        h = Hub(self.name, prefix=PREFIX, suffix=SUFFIX, args=["--hard-queue-limit", "16"])
        self.addCleanup(h.close)
        release = threading.Event()
        self.addCleanup(release.set)
        first = threading.Event()

        def on_wake(w):
            self.col.on_wake(w)
            if not first.is_set():
                first.set()
                release.wait(TIMEOUT)  # stop reading: the hub's queue for us grows

        self.app = ("lhpy-local-" + self.name)[:60]
        f = listenhub.Failover(
            h.socket,
            database_url=DATABASE_URL,
            channel_prefix=PREFIX,
            channel_suffix=SUFFIX,
            application_name=self.app,
            on_wake=on_wake,
            on_status=self.col.on_status,
            min_local=60,
        )
        self.addCleanup(f.close)
        f.subscribe("flood")
        # Far more than the socket buffers and the 16-frame cap hold.
        self.db.conn.execute(
            "SELECT pg_notify(%s, i::text) FROM generate_series(1, 50000) i", (PREFIX + "flood" + SUFFIX,)
        )
        self.assertTrue(first.wait(TIMEOUT))
        wait_for("the eviction in the hub's log", lambda: "worker evicted" in h.output())
        release.set()
        wait_for("local mode", lambda: f.mode == listenhub.LOCAL)
        self.assertIsInstance(f.reason, listenhub.ConnError)
        self.col.wait("the durable wake of the failover", lambda s: Wake("flood", None, True) in s.wakes)

    def test_no_hub_at_start_is_local_mode_at_once(self):
        path = os.path.join(scratch_dir(self), "absent.sock")
        f = self.failover(path)
        self.assertEqual(f.mode, listenhub.LOCAL)
        self.assertIsInstance(f.reason, listenhub.ConnError)
        f.subscribe("jobs")
        self.notify("jobs", "x")
        self.col.wait("a local wake", lambda s: Wake("jobs", "x", False) in s.wakes)

    def test_local_listener_reconnects_and_resyncs(self):
        path = os.path.join(scratch_dir(self), "absent.sock")
        f = self.failover(path)
        f.subscribe("jobs")
        wait_for("the local backend", lambda: self.db.backends(self.app) == 1)
        self.db.conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (self.app,))
        # Lost, reconnected and re-LISTENed, then one durable wake.
        self.col.wait("unhealthy then healthy", lambda s: s.statuses[-2:] == [False, True])
        self.col.wait("the durable wake after the reconnect", lambda s: Wake("jobs", None, True) in s.wakes)
        self.assertTrue(f.healthy)
        self.assertEqual(f.mode, listenhub.LOCAL)
        self.notify("jobs", "after")
        self.col.wait("a wake on the new connection", lambda s: Wake("jobs", "after", False) in s.wakes)

    def test_invalid_name_does_not_fail_over(self):
        h = self.hub()
        f = self.failover(h.socket)
        f.subscribe("ok")
        # 60 bytes is a fine name, but with the prefix and suffix the
        # channel is 66 bytes: the hub nacks it as invalid.
        with self.assertRaises(listenhub.InvalidNameError):
            f.subscribe("n" * 60)
        self.assertEqual(f.mode, listenhub.HUB)
        self.assertEqual(f.subscriptions(), {"ok"})

    def test_ack_timeout_fails_over(self):
        fake = FakeHub("silent")
        self.addCleanup(fake.close)
        f = self.failover(fake.socket, ack_timeout=0.3)
        f.subscribe("jobs")  # the ack never comes: answered by the local listener
        self.assertEqual(f.mode, listenhub.LOCAL)
        self.assertIsInstance(f.reason, listenhub.AckTimeoutError)
        self.col.wait("the durable wake after the swap", lambda s: Wake("jobs", None, True) in s.wakes)
        self.notify("jobs", "y")
        self.col.wait("a local wake", lambda s: Wake("jobs", "y", False) in s.wakes)

    def test_nack_not_about_the_name_fails_over(self):
        fake = FakeHub("nack")
        self.addCleanup(fake.close)
        f = self.failover(fake.socket)
        f.subscribe("jobs")
        self.assertEqual(f.mode, listenhub.LOCAL)
        self.assertIsInstance(f.reason, listenhub.NackError)

    def test_events_iterator(self):
        h = self.hub()
        self.app = ("lhpy-local-" + self.name)[:60]
        f = listenhub.Failover(
            h.socket, database_url=DATABASE_URL, channel_prefix=PREFIX, channel_suffix=SUFFIX, application_name=self.app
        )
        self.addCleanup(f.close)
        f.subscribe("it")
        h.kill()
        got = []
        while Wake("it", None, True) not in got:
            ev = f.get(TIMEOUT)
            self.assertIsNotNone(ev, "no event within the timeout; got %r" % got)
            got.append(ev)
        self.assertEqual(f.mode, listenhub.LOCAL)
        self.assertIn(listenhub.Status(False), got)


if __name__ == "__main__":
    unittest.main()
