"""The synchronous Client against a real hub and a real Postgres."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import listenhub
from listenhub import Status, Wake

from hubtest import TIMEOUT, Collector, FakeHub, scratch_dir, start_hub_and_db, wait_for


class ClientTest(unittest.TestCase):
    def setUp(self):
        start_hub_and_db(self)

    def connect(self, **kw):
        c = listenhub.connect(self.hub.socket, **kw)
        self.addCleanup(c.close)
        return c

    def test_subscribe_acks_then_wakes_with_payload_and_durable(self):
        col = Collector()
        c = self.connect(on_wake=col.on_wake, on_status=col.on_status)
        c.subscribe("orders")
        self.assertEqual(c.subscriptions(), {"orders"})
        # Rule 1: committed after the ack, so it must arrive.
        self.db.notify("orders", "hello")
        self.db.notify("orders", "")
        col.wait("both wakes", lambda s: len(s.wakes) >= 2)
        self.assertEqual(col.wakes[:2], [Wake("orders", "hello", False), Wake("orders", None, True)])

    def test_burst_in_one_transaction_reaches_a_reading_client_in_full(self):
        # 20,000 NOTIFYs in one transaction (River's InsertMany over 5,000
        # queues sends as many): far past the hub's 1,024-frame limit, but
        # a client that reads is not evicted, as its own LISTEN would not
        # have dropped them.
        n = 20000
        col = Collector()
        c = self.connect(on_wake=col.on_wake)
        c.subscribe("burst")
        self.db.conn.execute(
            "SELECT pg_notify('burst', 'q' || i) FROM generate_series(1, %s) i", (n,)
        )
        with col.cond:
            if not col.cond.wait_for(lambda: len(col.wakes) >= n, TIMEOUT):
                self.fail("%d of %d wakes arrived; hub log:\n%s" % (len(col.wakes), n, self.hub.output()[-3000:]))
            got = [w.payload for w in col.wakes[:n]]
        self.assertEqual(got, ["q%d" % i for i in range(1, n + 1)])
        # Still connected: a NOTIFY after the burst arrives.
        self.db.notify("burst", "after")
        col.wait("the wake after the burst", lambda s: len(s.wakes) > n)
        self.assertEqual(col.wakes[n], Wake("burst", "after", False))
        self.assertNotIn("worker evicted", self.hub.output())

    def test_status_on_connect_and_healthy(self):
        col = Collector()
        c = self.connect(on_status=col.on_status)
        col.wait("status", lambda s: s.statuses)
        self.assertEqual(col.statuses[0], True)
        self.assertTrue(c.healthy)

    def test_events_iterator_without_callbacks(self):
        c = self.connect()
        c.subscribe("it")
        self.db.notify("it", "p1")
        got = []
        for ev in c.events():
            got.append(ev)
            if isinstance(ev, Wake):
                break
        self.assertIsInstance(got[0], Status)
        self.assertTrue(got[0].healthy)
        self.assertEqual(got[-1], Wake("it", "p1", False))

    def test_invalid_names_are_refused_and_the_client_lives(self):
        c = self.connect()
        # 64 bytes: refused without a round trip.
        with self.assertRaises(listenhub.InvalidNameError):
            c.subscribe("x" * 64)
        # Empty: the hub's nack ("invalid channel: ..."), not a dead hub.
        with self.assertRaises(listenhub.InvalidNameError) as cm:
            c.subscribe("")
        self.assertIn("invalid channel", cm.exception.reason)
        self.assertIsNone(c.err)
        c.subscribe("fine")
        self.assertEqual(c.subscriptions(), {"fine"})

    def test_unsubscribe_stops_delivery(self):
        col = Collector()
        c = self.connect(on_wake=col.on_wake)
        c.subscribe("a")
        c.subscribe("b")
        c.unsubscribe("a")
        # A round trip after the unsub: the hub has processed it.
        c.subscribe("c")
        self.db.notify("a", "lost")
        self.db.notify("b", "kept")
        col.wait("the wake of b", lambda s: Wake("b", "kept", False) in s.wakes)
        self.assertFalse(any(w.name == "a" for w in col.wakes), col.wakes)

    def test_hub_death_kills_the_client(self):
        c = self.connect()
        c.subscribe("x")
        self.hub.kill()
        err = c.wait(TIMEOUT)
        self.assertIsInstance(err, listenhub.ConnError)
        self.assertFalse(c.healthy)
        with self.assertRaises(listenhub.ConnError):
            c.subscribe("y")

    def test_close(self):
        c = self.connect()
        c.subscribe("x")
        c.close()
        self.assertIsInstance(c.err, listenhub.ClosedError)
        with self.assertRaises(listenhub.ClosedError):
            c.subscribe("x")
        c.close()  # idempotent


class FakeHubTest(unittest.TestCase):
    def fake(self, mode):
        f = FakeHub(mode)
        self.addCleanup(f.close)
        return f

    def test_ack_timeout_kills_the_client(self):
        f = self.fake("silent")
        c = listenhub.connect(f.socket, ack_timeout=0.3)
        self.addCleanup(c.close)
        with self.assertRaises(listenhub.AckTimeoutError):
            c.subscribe("q")
        self.assertIsInstance(c.err, listenhub.AckTimeoutError)
        self.assertTrue(c.done.is_set())

    def test_nack_not_about_the_name_kills_the_client(self):
        f = self.fake("nack")
        c = listenhub.connect(f.socket)
        self.addCleanup(c.close)
        with self.assertRaises(listenhub.NackError):
            c.subscribe("q")
        self.assertIsInstance(c.err, listenhub.NackError)

    def test_stalled_write_kills_the_client(self):
        f = self.fake("deaf")
        c = listenhub.connect(f.socket, write_timeout=0.3, ack_timeout=60)
        self.addCleanup(c.close)
        # Each call queues a sub frame (about 80 bytes) and gives up waiting
        # at once: far more bytes than the socket buffers hold, for a hub
        # that never reads.
        for i in range(10000):
            try:
                c.subscribe("n" * 50 + "%05d" % i, timeout=0)
            except TimeoutError:
                pass
            except listenhub.ConnError:
                break  # dead already
        err = c.wait(TIMEOUT)
        self.assertIsInstance(err, listenhub.ConnError)
        self.assertEqual(err.op, "write")

    def test_missing_socket_is_a_dial_error(self):
        with self.assertRaises(listenhub.ConnError) as cm:
            listenhub.connect(os.path.join(scratch_dir(self), "none.sock"))
        self.assertEqual(cm.exception.op, "dial")

    @unittest.skipUnless(os.getuid() == 0, "needs root to run a fake hub as another user")
    def test_peer_of_another_user_is_refused(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        # Sticky, like /tmp: the directory passes, the socket's owner does not.
        os.chmod(d, 0o1777)
        path = os.path.join(d, "other.sock")
        code = (
            "import socket,sys\n"
            "s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1)\n"
            "print('up', flush=True)\n"
            "c,_=s.accept(); c.recv(1)\n"
        )
        p = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, user=65534)
        self.addCleanup(p.stdout.close)
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        self.assertEqual(p.stdout.readline().strip(), b"up")
        with self.assertRaises(listenhub.ConnError) as cm:
            listenhub.connect(path)
        self.assertEqual(cm.exception.op, "peer")
        self.assertIn("uid 65534", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
