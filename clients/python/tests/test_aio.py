"""The asyncio API against a real hub and a real Postgres."""

import asyncio
import os
import threading
import time
import unittest

import listenhub
from listenhub import Status, Wake
from listenhub import aio

from hubtest import count_refused_failbacks, DATABASE_URL, TIMEOUT, DB, FakeHub, Hub, other_database_url, require_env, scratch_dir, start_hub_and_db

PREFIX, SUFFIX = "lh.", ".ev"


async def next_matching(source, pred, what):
    """The first event from source.get() that satisfies pred; the events
    skipped on the way are returned too."""
    seen = []

    async def scan():
        while True:
            ev = await source.get()
            if ev is None:
                raise AssertionError("event stream ended waiting for %s; saw %r" % (what, seen))
            seen.append(ev)
            if pred(ev):
                return seen

    try:
        return await asyncio.wait_for(scan(), TIMEOUT)
    except asyncio.TimeoutError:
        raise AssertionError("timed out waiting for %s; saw %r" % (what, seen)) from None


class AsyncClientTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        start_hub_and_db(self)

    async def test_subscribe_acks_then_wakes_with_payload_and_durable(self):
        c = await aio.connect(self.hub.socket)
        self.addCleanup(c.close)
        await c.subscribe("orders")
        self.db.notify("orders", "hello")
        self.db.notify("orders", "")
        got = []

        async def collect():
            async for ev in c.events():
                got.append(ev)
                if len([e for e in got if isinstance(e, Wake)]) == 2:
                    return

        await asyncio.wait_for(collect(), TIMEOUT)
        self.assertEqual(got[0], Status(True))
        self.assertEqual([e for e in got if isinstance(e, Wake)], [Wake("orders", "hello", False), Wake("orders", None, True)])
        self.assertTrue(c.healthy)

    async def test_callbacks_sync_and_async(self):
        wakes, statuses = [], []
        got = asyncio.Event()

        async def on_wake(w):
            wakes.append(w)
            got.set()

        c = await aio.connect(self.hub.socket, on_wake=on_wake, on_status=statuses.append)
        self.addCleanup(c.close)
        await c.subscribe("cb")
        self.db.notify("cb", "x")
        await asyncio.wait_for(got.wait(), TIMEOUT)
        self.assertEqual(wakes, [Wake("cb", "x", False)])
        self.assertEqual(statuses[0], True)

    async def test_invalid_names_are_refused_and_the_client_lives(self):
        c = await aio.connect(self.hub.socket)
        self.addCleanup(c.close)
        with self.assertRaises(listenhub.InvalidNameError):
            await c.subscribe("x" * 64)
        with self.assertRaises(listenhub.InvalidNameError) as cm:
            await c.subscribe("")
        self.assertIn("invalid channel", cm.exception.reason)
        await c.subscribe("fine")
        self.assertIsNone(c.err)

    async def test_unsubscribe_stops_delivery(self):
        c = await aio.connect(self.hub.socket)
        self.addCleanup(c.close)
        await c.subscribe("a")
        await c.subscribe("b")
        c.unsubscribe("a")
        await c.subscribe("c")  # round trip: the unsub was processed
        self.db.notify("a", "lost")
        self.db.notify("b", "kept")
        seen = await next_matching(c, lambda e: e == Wake("b", "kept", False), "the wake of b")
        self.assertFalse(any(isinstance(e, Wake) and e.name == "a" for e in seen), seen)

    async def test_hub_death_kills_the_client(self):
        c = await aio.connect(self.hub.socket)
        await c.subscribe("x")
        self.hub.kill()
        err = await asyncio.wait_for(c.wait(), TIMEOUT)
        self.assertIsInstance(err, listenhub.ConnError)
        self.assertFalse(c.healthy)

    async def test_ack_timeout_kills_the_client(self):
        fake = FakeHub("silent")
        self.addCleanup(fake.close)
        c = await aio.connect(fake.socket, ack_timeout=0.3)
        self.addCleanup(c.close)
        with self.assertRaises(listenhub.AckTimeoutError):
            await c.subscribe("q")
        self.assertIsInstance(c.err, listenhub.AckTimeoutError)


    async def test_stalled_write_kills_the_client(self):
        # Thousands of tasks: debug mode's per-task tracebacks would take
        # seconds.
        asyncio.get_running_loop().set_debug(False)
        fake = FakeHub("deaf")
        self.addCleanup(fake.close)
        c = await aio.connect(fake.socket, write_timeout=0.3, ack_timeout=60)
        self.addCleanup(c.close)
        # Sub frames (about 80 bytes each) that are never answered: far more
        # bytes than the socket buffers hold, for a hub that never reads.
        subs = [asyncio.ensure_future(c.subscribe("n" * 50 + "%05d" % i)) for i in range(3000)]
        err = await asyncio.wait_for(c.wait(), TIMEOUT)
        self.assertIsInstance(err, listenhub.ConnError)
        self.assertEqual(err.op, "write")
        results = await asyncio.gather(*subs, return_exceptions=True)
        self.assertIs(results[0], err)


class AsyncFailoverTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        require_env()
        self.name = self.id().rsplit(".", 1)[-1]
        self.app = ("lhpy-alocal-" + self.name)[:60]
        self.db = DB()
        self.addCleanup(self.db.close)

    async def failover(self, path, **kw):
        f = await aio.AsyncFailover.create(
            path,
            database_url=DATABASE_URL,
            channel_prefix=PREFIX,
            channel_suffix=SUFFIX,
            application_name=self.app,
            **kw,
        )
        self.addCleanup(f.close)
        return f

    def notify(self, q, payload=""):
        self.db.notify(PREFIX + q + SUFFIX, payload)

    async def test_hub_killed_fails_over_to_local_listen(self):
        hub = Hub(self.name, prefix=PREFIX, suffix=SUFFIX)
        self.addCleanup(hub.close)
        f = await self.failover(hub.socket)
        await f.subscribe("jobs")
        await f.subscribe("more")
        self.assertEqual(f.mode, listenhub.HUB)
        self.notify("jobs", "via-hub")
        await next_matching(f, lambda e: e == Wake("jobs", "via-hub", False), "a wake through the hub")

        hub.kill()
        durable = {Wake("jobs", None, True), Wake("more", None, True)}
        seen = []
        while not durable <= set(seen):
            seen += await next_matching(f, lambda e: e in durable, "the durable wakes after the swap")
        self.assertEqual(f.mode, listenhub.LOCAL)
        self.assertIsInstance(f.reason, listenhub.ConnError)
        self.assertIn(Status(False), seen)
        self.assertEqual(self.db.backends(self.app), 1)

        self.notify("jobs", "via-local")
        await next_matching(f, lambda e: e == Wake("jobs", "via-local", False), "a wake through the local listener")
        await f.subscribe("later")
        self.notify("later", "new")
        await next_matching(f, lambda e: e == Wake("later", "new", False), "a wake for a name subscribed in local mode")

    async def test_hub_back_fails_back(self):
        hub = Hub(self.name, prefix=PREFIX, suffix=SUFFIX)
        self.addCleanup(hub.close)
        failbacks = []
        f = await self.failover(hub.socket, min_local=0.2, probe_interval=0.1, on_failback=lambda: failbacks.append(True))
        await f.subscribe("jobs")
        hub.kill()
        await next_matching(f, lambda e: e == Wake("jobs", None, True), "the durable wake of the failover")
        self.assertEqual(f.mode, listenhub.LOCAL)
        hub2 = Hub(self.name + "-2", prefix=PREFIX, suffix=SUFFIX, socket_path=hub.socket)
        self.addCleanup(hub2.close)
        await next_matching(f, lambda e: e == Wake("jobs", None, True), "the durable wake of the fail-back")
        self.assertEqual(f.mode, listenhub.HUB)
        self.assertEqual(failbacks, [True])
        self.notify("jobs", "via-new-hub")
        await next_matching(f, lambda e: e == Wake("jobs", "via-new-hub", False), "a wake through the new hub")
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while self.db.backends(self.app) != 0:
            self.assertLess(asyncio.get_running_loop().time(), deadline, "the local backend is still there")
            await asyncio.sleep(0.02)

    async def test_failback_exact_through_20(self):
        """Numbered NOTIFYs at 500 a second through 20 fail-backs (the hub
        killed while the sender pauses, restarted while it sends): each
        arrives once, in commit order (the marker cut, as the synchronous
        Failover's)."""
        hub = Hub(self.name, prefix=PREFIX, suffix=SUFFIX)
        self.addCleanup(hub.close)
        got = []
        backs = asyncio.Queue()

        def on_wake(w):
            if w.name == "seq" and w.payload and w.payload.startswith("n"):
                got.append(int(w.payload[1:]))

        f = await self.failover(
            hub.socket, min_local=0.1, probe_interval=0.05, probe_max_interval=0.2,
            on_wake=on_wake, on_failback=lambda: backs.put_nowait(True),
        )
        await f.subscribe("seq")
        loop = asyncio.get_running_loop()
        mu = threading.Lock()  # a NOTIFY and its count, or a pause, at a time
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

        async def upto(n):
            deadline = loop.time() + TIMEOUT
            while max(got, default=0) < n:
                self.assertLess(loop.time(), deadline, "seq %d never came" % n)
                await asyncio.sleep(0.01)

        t = threading.Thread(target=pump)
        t.start()
        try:
            await upto(10)
            for i in range(20):
                with mu:
                    state["paused"] = True
                    at = state["sent"]
                await upto(at)
                hub.kill()
                deadline = loop.time() + TIMEOUT
                while f.mode != listenhub.LOCAL:
                    self.assertLess(loop.time(), deadline, "local mode")
                    await asyncio.sleep(0.01)
                with mu:
                    state["paused"] = False
                await upto(at + 10)
                hub = Hub(self.name + "-%d" % i, prefix=PREFIX, suffix=SUFFIX, socket_path=hub.socket)
                self.addCleanup(hub.close)
                await asyncio.wait_for(backs.get(), TIMEOUT)
                self.assertEqual(f.mode, listenhub.HUB)
                await upto(state["sent"] + 10)
        finally:
            state["stop"] = True
            await loop.run_in_executor(None, t.join)
        await upto(state["sent"])
        dups = sorted({s for s in got if got.count(s) > 1})
        lost = sorted(set(range(1, state["sent"] + 1)) - set(got))
        self.assertEqual(dups, [], "delivered twice through 20 fail-backs")
        self.assertEqual(lost, [], "lost through 20 fail-backs")
        self.assertEqual(got, sorted(got), "out of commit order")

    async def test_refused_failbacks_lose_nothing(self):
        """As the synchronous Failover: through 10 fail-back attempts
        refused by a hub on another database, the local wakes each
        attempt's cut held back are delivered; none lost, none twice."""
        refused = count_refused_failbacks(self)
        got = []

        def on_wake(w):
            if w.name == "seq" and w.payload and w.payload.startswith("n"):
                got.append(int(w.payload[1:]))

        sock = os.path.join(scratch_dir(self), "hub.sock")
        f = await self.failover(sock, min_local=0.05, probe_interval=0.05, probe_max_interval=0.1,
                                ack_timeout=0.5, on_wake=on_wake)
        await f.subscribe("seq")
        self.assertEqual(f.mode, listenhub.LOCAL)
        loop = asyncio.get_running_loop()
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
            url = other_database_url(self, "lhpy_arefused_%d" % os.getpid())
            h = Hub(self.name, prefix=PREFIX, suffix=SUFFIX, socket_path=sock, args=("--database-url", url))
            self.addCleanup(h.close)
            deadline = loop.time() + 3 * TIMEOUT
            while len(refused) < 10:
                self.assertLess(loop.time(), deadline, "10 refused fail-back attempts")
                await asyncio.sleep(0.01)
        finally:
            state["stop"] = True
            await loop.run_in_executor(None, t.join)
        deadline = loop.time() + TIMEOUT
        while max(got, default=0) < state["sent"]:
            self.assertLess(loop.time(), deadline, "the last NOTIFY")
            await asyncio.sleep(0.01)
        self.assertEqual(f.mode, listenhub.LOCAL)
        dups = sorted({s for s in got if got.count(s) > 1})
        lost = sorted(set(range(1, state["sent"] + 1)) - set(got))
        self.assertEqual(lost, [], "lost through %d refused fail-backs" % len(refused))
        self.assertEqual(dups, [], "delivered twice through refused fail-backs")
        self.assertEqual(got, sorted(got), "out of commit order")

    async def test_unverified_hub_on_another_database_refused_once_up(self):
        """As the synchronous Failover: a hub on another database whose
        Postgres is down at the start is checked once it says healthy, its
        wakes held until then; found out, the AsyncFailover listens locally
        and delivers this database's NOTIFYs, none of the other's."""
        from urllib.parse import urlsplit, urlunsplit

        import psycopg
        from test_failover import LaterProxy

        other = "lhpy_aunverified_%d" % os.getpid()
        conninfo = other_database_url(self, other)
        url = urlunsplit(urlsplit(DATABASE_URL)._replace(path="/" + other))
        p = LaterProxy(self)
        h = Hub(self.name, prefix=PREFIX, suffix=SUFFIX, args=("--database-url", p.via(url)), ready=False)
        self.addCleanup(h.close)
        got = []
        f = await self.failover(h.socket, ack_timeout=1.0, on_wake=got.append)
        self.assertEqual(f.mode, listenhub.HUB)
        sub = asyncio.ensure_future(f.subscribe("a"))
        p.up()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT
        while f.mode != listenhub.LOCAL:
            self.assertLess(loop.time(), deadline, "local mode once the check ran")
            await asyncio.sleep(0.01)
        self.assertIsInstance(f.reason, listenhub.OtherDatabaseError)
        await asyncio.wait_for(sub, TIMEOUT)
        with psycopg.connect(conninfo, autocommit=True) as oc:
            oc.execute("SELECT pg_notify(%s, 'foreign')", (PREFIX + "a" + SUFFIX,))
        self.notify("a", "ours")
        while Wake("a", "ours", False) not in got:
            self.assertLess(loop.time(), deadline + TIMEOUT, "our NOTIFY")
            await asyncio.sleep(0.01)
        self.assertNotIn(Wake("a", "foreign", False), got)

    async def test_no_hub_at_start_is_local_mode_at_once(self):
        f = await self.failover(os.path.join(scratch_dir(self), "absent.sock"))
        self.assertEqual(f.mode, listenhub.LOCAL)
        await f.subscribe("jobs")
        self.notify("jobs", "x")
        await next_matching(f, lambda e: e == Wake("jobs", "x", False), "a local wake")

    async def test_hub_on_another_database_is_refused_at_start(self):
        """As the synchronous Failover: a hub serving another database is
        found out at start, said at ERROR, and the listener is local."""
        url = other_database_url(self, "lhpy_aother_%d" % os.getpid())
        h = Hub(self.name, prefix=PREFIX, suffix=SUFFIX, args=("--database-url", url))
        self.addCleanup(h.close)
        with self.assertLogs("listenhub", level="ERROR") as logs:
            f = await self.failover(h.socket)
        self.assertEqual(f.mode, listenhub.LOCAL)
        self.assertIsInstance(f.reason, listenhub.OtherDatabaseError)
        self.assertIn("does not deliver the notifications of", "\n".join(logs.output))
        await f.subscribe("jobs")
        self.notify("jobs", "through-our-own")
        await next_matching(f, lambda e: e == Wake("jobs", "through-our-own", False), "the wake through the local listener")

    async def test_ack_timeout_fails_over(self):
        fake = FakeHub("silent")
        self.addCleanup(fake.close)
        f = await self.failover(fake.socket, ack_timeout=0.3)
        await f.subscribe("jobs")
        self.assertEqual(f.mode, listenhub.LOCAL)
        self.assertIsInstance(f.reason, listenhub.AckTimeoutError)
        self.notify("jobs", "y")
        await next_matching(f, lambda e: e == Wake("jobs", "y", False), "a local wake")


if __name__ == "__main__":
    unittest.main()
