"""The client's side of "never silently wrong". Socket identity (the
symlink-flipping attack), fork safety, the hub's refusal, stalled and large
frames, the UTF-8 nack."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from unittest import mock

import listenhub
from listenhub import _frame

from hubtest import DATABASE_URL, TIMEOUT, Attacker, FakeHub, Hub, attack_connects, require_env, sticky_dir, wait_for


def tmpdir(test, mode=0o700):
    d = tempfile.mkdtemp(prefix="lhpy-id-")
    os.chmod(d, mode)
    test.addCleanup(shutil.rmtree, d, True)
    return d


def fake(test, mode, dir=None):
    h = FakeHub(mode, dir=dir)
    test.addCleanup(h.close)
    test.addCleanup(shutil.rmtree, h.dir, True)
    return h


def next_wake(test, listener, what):
    """The next Wake from listener.get(), statuses skipped; fails the test
    with what when none comes within TIMEOUT."""
    while True:
        ev = listener.get(TIMEOUT)
        test.assertIsNotNone(ev, what)
        if isinstance(ev, listenhub.Wake):
            return ev


class IdentityTest(unittest.TestCase):
    """lstat without following links, S_ISSOCK, the directory's owner and
    mode (StrictModes), then SO_PEERCRED."""

    def refused(self, path, want):
        with self.assertRaises(listenhub.ConnError) as cm:
            listenhub.connect(path).close()
        self.assertEqual(cm.exception.op, "peer", cm.exception)
        self.assertIn(want, str(cm.exception))

    def test_symlink_to_a_real_socket_is_refused(self):
        h = fake(self, "ack")
        link = os.path.join(tmpdir(self), "hub.sock")
        os.symlink(h.socket, link)
        self.refused(link, "a symlink")
        listenhub.connect(h.socket).close()  # the socket itself is fine

    def test_missing_directory_says_install(self):
        path = os.path.join(tmpdir(self), "missing", "hub.sock")
        with self.assertRaises(listenhub.ConnError) as cm:
            listenhub.connect(path).close()
        self.assertEqual(cm.exception.op, "dial", cm.exception)
        self.assertIn("install -d -m 0755 " + os.path.dirname(path), str(cm.exception))

    def test_a_file_is_not_a_socket(self):
        path = os.path.join(tmpdir(self), "hub.sock")
        open(path, "w").close()
        self.refused(path, "not a socket")

    def test_directory_writable_by_group_or_other_is_refused(self):
        for mode in (0o770, 0o707):
            d = tmpdir(self)
            h = fake(self, "ack", dir=d)
            os.chmod(d, mode)
            self.refused(h.socket, "writable by group or other")

    def test_directory_above_writable_by_others_is_refused(self):
        # Every directory up to / counts: one above the socket's that
        # another user can write to lets them swap the socket's directory.
        top = tmpdir(self)
        d = os.path.join(top, "run")
        os.mkdir(d, 0o700)
        h = fake(self, "ack", dir=d)
        os.chmod(top, 0o777)
        self.refused(h.socket, top + " above the socket: directory mode 0777 is writable by group or other")
        self.refused(h.socket, "chmod go-w " + top)

    def test_unreachable_directory_names_the_permission(self):
        # A uid that may not search the way to the socket gets the fix,
        # not a bare "permission denied" (run as nobody: root may search
        # anything).
        import subprocess
        import sys

        if os.geteuid() != 0 or shutil.which("runuser") is None:
            self.skipTest("needs root and runuser to run a client as nobody")
        top = tmpdir(self)  # 0700, root's
        path = os.path.join(top, "run", "hub.sock")
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        code = (
            "import sys; sys.path.insert(0, %r)\n"
            "import listenhub\n"
            "try:\n"
            "    listenhub.connect(%r)\n"
            "except listenhub.ConnError as e:\n"
            "    print(e)\n" % (here, path)
        )
        r = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c", code],
                           capture_output=True, text=True, timeout=30)
        self.assertIn("may not reach the socket", r.stdout, r.stderr)
        self.assertIn("search (x) permission", r.stdout)

    def test_sticky_directory_is_accepted(self):
        # Like /tmp: only an entry's owner can replace it.
        d = sticky_dir()
        self.addCleanup(shutil.rmtree, d, True)
        h = fake(self, "ack", dir=d)
        c = listenhub.connect(h.socket)
        c.subscribe("a")
        c.close()

    def test_directory_of_another_owner_is_refused(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to chown")
        d = tmpdir(self)
        h = fake(self, "ack", dir=d)
        os.chown(d, 65534, -1)
        self.refused(h.socket, "directory owned by uid 65534")
        # Naming the uid trusts it.
        listenhub.connect(h.socket, allowed_uids=(65534,)).close()

    def attack(self, mode):
        shared = sticky_dir()
        self.addCleanup(shutil.rmtree, shared, True)
        legit = ""
        if mode == "final":
            target = os.path.join(shared, "hub.sock")
        else:
            legit = tmpdir(self)
            fake(self, "ack", dir=legit)  # the real hub: fake.sock in a trusted directory
            target = os.path.join(shared, "link", "fake.sock")
        atk = Attacker(mode, shared, target, legit)
        n, ok, refused = attack_connects(), 0, 0
        try:
            for _ in range(n):
                try:
                    c = listenhub.connect(target, connect_timeout=1)
                except listenhub.ConnError:
                    refused += 1
                    continue
                try:
                    c.subscribe("probe", timeout=2)
                    ok += 1
                except (listenhub.ListenhubError, TimeoutError):
                    refused += 1
                finally:
                    c.close()
        finally:
            captures = atk.captures()
        print("attack %s: %d connects, %d captures, %d reached the real hub, %d refused" % (mode, n, captures, ok, refused))
        self.assertEqual(captures, 0, "the attacker captured %d of %d connects" % (captures, n))
        return ok, refused

    def test_attack_flipping_the_socket_path(self):
        ok, refused = self.attack("final")
        self.assertEqual(ok, 0)

    def test_attack_flipping_the_directory(self):
        ok, refused = self.attack("dir")
        self.assertGreater(ok, 0, "never reached the real hub: the test did not test")
        self.assertGreater(refused, 0, "never refused: the flipping did not happen")


class RefusalTest(unittest.TestCase):
    def test_hub_tells_a_refused_uid_why(self):
        require_env()
        hub = Hub("refused", args=("--allow-uid", "54321"), ready=False)
        self.addCleanup(hub.close)
        c = listenhub.connect(hub.socket, allowed_uids=())
        self.addCleanup(c.close)
        with self.assertRaises(listenhub.RefusedError) as cm:
            c.subscribe("a")
        self.assertIn("uid %d is not allowed" % os.getuid(), str(cm.exception))
        self.assertIs(c.err, cm.exception)

    def test_refusal_before_status(self):
        h = fake(self, "refuse")
        c = listenhub.connect(h.socket)
        self.assertIsInstance(c.wait(TIMEOUT), listenhub.RefusedError)
        self.assertIn("uid 1000 is not allowed", str(c.err))


class FrameTest(unittest.TestCase):
    def test_stalled_partial_frame_times_out(self):
        h = fake(self, "partial")
        c = listenhub.connect(h.socket, frame_timeout=0.3)
        t0 = time.monotonic()
        err = c.wait(TIMEOUT)
        self.assertIsInstance(err, listenhub.ConnError)
        self.assertIn("frame timeout", str(err))
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        self.assertEqual(listenhub.client.DEFAULT_FRAME_TIMEOUT, 10.0)

    def test_4mib_frame_in_128_byte_writes(self):
        h = fake(self, "big")
        c = listenhub.connect(h.socket)
        self.addCleanup(c.close)
        c.subscribe("big")
        ev = next_wake(self, c, "no 4 MiB wake")
        self.assertEqual(len(ev.payload), (4 << 20) - 40)

    def test_reassembly_is_linear(self):
        f = _frame.encode({"t": "wake", "q": "big", "p": "x" * ((4 << 20) - 40)})
        dec = _frame.Decoder()
        t0 = time.process_time()
        got = None
        for i in range(0, len(f), 128):
            dec.feed(f[i : i + 128])
            got = dec.next() or got
        cpu = time.process_time() - t0
        self.assertIsNotNone(got)
        # Linear: about 0.1 s here. Generous for a loaded machine; a
        # quadratic reassembly takes many seconds.
        self.assertLess(cpu, 3.0, "4 MiB in 128-byte pieces took %.2fs of CPU" % cpu)


class ForkTest(unittest.TestCase):
    def test_client_made_before_fork_raises_in_the_child(self):
        h = fake(self, "ack")
        c = listenhub.connect(h.socket)
        self.addCleanup(c.close)
        c.subscribe("parent")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave without cleanups
            try:
                os.close(r)
                t0 = time.monotonic()
                try:
                    c.subscribe("child", timeout=5)
                    out = "no error"
                except listenhub.ForkedError as e:
                    out = "ForkedError %.3f %s" % (time.monotonic() - t0, e)
                except BaseException as e:  # noqa: BLE001
                    out = "%s %s" % (type(e).__name__, e)
                os.write(w, out.encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            out = f.read()
        os.waitpid(pid, 0)
        self.assertTrue(out.startswith("ForkedError "), out)
        self.assertLess(float(out.split()[1]), 1.0, out)
        self.assertIn("before fork()", out)
        # The parent's connection was not cut by the child.
        c.subscribe("after")
        self.assertIsNone(c.err)

    def test_gunicorn_preload(self):
        gunicorn = shutil.which("gunicorn")
        if gunicorn is None:
            if os.environ.get("CI") == "true":
                self.fail("gunicorn is not installed (CI=true: not skipping; Debian: apt-get install gunicorn)")
            self.skipTest("gunicorn is not installed (Debian: apt-get install gunicorn)")
        h = fake(self, "ack")
        d = tmpdir(self)
        with open(os.path.join(d, "lhapp.py"), "w") as f:
            f.write(textwrap.dedent(
                """
                import listenhub

                client = listenhub.connect(%r)  # at import: in the master, under --preload


                def app(environ, start_response):
                    try:
                        client.subscribe("child", timeout=5)
                        body = b"no error"
                    except Exception as e:
                        body = ("%%s: %%s" %% (type(e).__name__, e)).encode()
                    start_response("200 OK", [("Content-Type", "text/plain")])
                    return [body]
                """ % h.socket))
        bind = os.path.join(d, "g.sock")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([d, os.path.dirname(os.path.dirname(listenhub.__file__))]))
        proc = subprocess.Popen(
            [gunicorn, "--preload", "--workers", "2", "--graceful-timeout", "1", "--bind", "unix:" + bind,
             "--chdir", d, "lhapp:app"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

        def stop():
            # SIGINT: gunicorn's quick shutdown; its whole session goes if
            # that does not end it (the workers hold the client's threads).
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

        self.addCleanup(stop)
        wait_for("gunicorn listening", lambda: os.path.exists(bind))
        t0 = time.monotonic()
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(TIMEOUT)
            wait_for("gunicorn accepting", lambda: s.connect_ex(bind) == 0)
            s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
            with s.makefile("rb") as f:
                resp = f.read()
        self.assertIn(b"ForkedError", resp)
        self.assertLess(time.monotonic() - t0, 4.0, "the worker's subscribe did not fail at once")


class Utf8NackTest(unittest.TestCase):
    def test_nack_for_a_name_that_is_not_utf8_matches_the_sub(self):
        require_env()
        hub = Hub("utf8nack")
        self.addCleanup(hub.close)
        c = listenhub.connect(hub.socket)
        self.addCleanup(c.close)
        q = "a\ud83d"  # a lone surrogate: the client refuses it itself ...
        with self.assertRaises(listenhub.InvalidNameError):
            c.subscribe(q)
        # ... so let it through to the hub, which nacks it with the name as
        # sent ("q64"): the client matches it to its sub and lives. Before
        # q64 the nack named "a\ufffd", matched nothing, and the subscribe
        # ran into its ack timeout (AckTimeoutError), which killed the client.
        with mock.patch.object(_frame, "name_problem", lambda q: None):
            with self.assertRaises(listenhub.InvalidNameError) as cm:
                c.subscribe(q)
        self.assertIn("not valid UTF-8", str(cm.exception))
        self.assertIsNone(c.err)
        c.subscribe("fine")


PGBOUNCER_TRANSACTION_URL = os.environ.get("LHTEST_PGBOUNCER_TRANSACTION_URL", "")
PGBOUNCER_SESSION_URL = os.environ.get("LHTEST_PGBOUNCER_SESSION_URL", "")


class DeliveryCheckTest(unittest.TestCase):
    """The local listener proves that notifications arrive before it counts
    as connected: through a transaction-pooling PgBouncer they do not."""

    def setUp(self):
        require_env()
        if not PGBOUNCER_TRANSACTION_URL:
            self.skipTest("no PgBouncer (LHTEST_PGBOUNCER_*_URL; go test ./clients/ starts them)")

    def test_direct_connection_passes(self):
        loc = listenhub.Local(DATABASE_URL)
        self.addCleanup(loc.close)
        self.assertTrue(loc.healthy)

    def test_transaction_pooler_is_refused(self):
        # Before the check the listener "worked": its LISTEN was acked, and
        # it received nothing.
        with self.assertRaises(listenhub.ListenhubError) as cm:
            listenhub.Local(PGBOUNCER_TRANSACTION_URL)
        msg = str(cm.exception)
        self.assertIn("listenhub: notifications do not arrive on this connection: "
                      "a transaction-pooling PgBouncer? use a direct URL", msg)
        self.assertIn("is not BackendKeyData's", msg)

    def test_session_pooler_delivers(self):
        with self.assertLogs("listenhub", "INFO") as logs:
            loc = listenhub.Local(PGBOUNCER_SESSION_URL)
        self.addCleanup(loc.close)
        self.assertTrue(any("session pooling" in line for line in logs.output), logs.output)
        loc.subscribe("pooled")
        import psycopg
        with psycopg.connect(DATABASE_URL, autocommit=True) as other:
            other.execute("NOTIFY pooled, 'x'")
        ev = next_wake(self, loc, "no wake through the session pooler")
        self.assertEqual((ev.name, ev.payload), ("pooled", "x"))

    def test_pid_mismatch_without_a_notification_fails(self):
        # A fake of the pooler's tell: BackendKeyData's pid is not
        # pg_backend_pid(), and the second session's NOTIFY never arrives.
        from listenhub import local

        import psycopg
        conn = psycopg.connect(DATABASE_URL, autocommit=True)
        self.addCleanup(conn.close)

        class Info:
            backend_pid = 1
            encoding = conn.info.encoding

        class Lying:
            def __getattr__(self, name):
                return getattr(conn, name)

            info = Info()

        with mock.patch.object(local, "_connect", lambda *a: contextlib_null()):
            with self.assertRaises(listenhub.ListenhubError) as cm:
                local.check_delivery(Lying(), DATABASE_URL, "lh-test", 0.3)
        self.assertIn("a transaction-pooling PgBouncer? use a direct URL", str(cm.exception))


class contextlib_null:
    """A second session whose NOTIFY goes nowhere."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, *a):
        pass


if __name__ == "__main__":
    unittest.main()
