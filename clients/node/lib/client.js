'use strict';

// The hub client: one Unix socket connection to a listenhub hub (node:net).

const fs = require('node:fs');
const net = require('node:net');
const pathlib = require('node:path');

const frame = require('./frame');
const { Listener, wake, status } = require('./events');
const {
  AckTimeoutError,
  ClosedError,
  ConnError,
  InvalidNameError,
  LimitError,
  NackError,
  RefusedError,
} = require('./errors');

// The hub acks once Postgres confirmed the LISTEN (a round trip); nothing
// within 2 s means a wedged hub.
const DEFAULT_ACK_TIMEOUT = 2000;
// Frames to the hub are tiny: a write that cannot finish within 2 s means
// the hub stopped reading.
const DEFAULT_WRITE_TIMEOUT = 2000;
const DEFAULT_CONNECT_TIMEOUT = 2000;
// Bound of one frame from the hub, from its first byte to its last: the
// hub's own --frame-timeout default. A hub that stops in the middle of a
// frame is wedged; without it the client would wait forever.
const DEFAULT_FRAME_TIMEOUT = 10000;
// No frame at all for this long means a frozen hub (SIGSTOPped, a wedged
// loop): it re-sends its status every 5 status intervals (5 s by default),
// so this is three of those missed. Raise it above 5 times the hub's
// --status-interval when that is over 3 s.
const DEFAULT_SILENCE_TIMEOUT = 15000;

// O_PATH (Linux; not in fs.constants): opens the directory without needing
// read permission on it, only to pin it.
const O_PATH = 0o10000000;
const S_ISVTX = 0o1000;

// What to do about EACCES on the way to a socket in dir.
function unsearchableFix(dir) {
  return `uid ${process.getuid()} may not reach the socket: every directory of ${dir} needs search (x) permission for it and the socket write permission (the hub's --socket-mode 0660 with --socket-group, this user in that group, and chmod o+x or g+x on the directories)`;
}

// Why a socket directory cannot be trusted (null if it can), OpenSSH's
// StrictModes rule: owned by us, root or an allowed uid, and not writable by
// group or other unless sticky (like /tmp: there only an entry's owner can
// rename or remove it, and the socket's own owner is checked too).
function dirProblem(st, trusted) {
  if (!trusted.has(st.uid)) {
    return `directory owned by uid ${st.uid}, not ours (${process.getuid()}), root or an allowed uid`;
  }
  if (st.mode & 0o022 && !(st.mode & S_ISVTX)) {
    return `directory mode ${(st.mode & 0o7777).toString(8).padStart(4, '0')} is writable by group or other (and not sticky)`;
  }
  return null;
}

// Why a directory above the socket's cannot be trusted, up to / (null if
// none): one that another user can write to lets them swap the socket's
// directory for one of their own. The hub's and the Go client's rule, with
// the fix.
function ancestorsProblem(dir, trusted) {
  let cur = fs.realpathSync(dir);
  for (;;) {
    const parent = pathlib.dirname(cur);
    if (parent === cur) return null;
    cur = parent;
    const st = fs.statSync(cur);
    const problem = dirProblem(st, trusted);
    if (problem) {
      const fix = trusted.has(st.uid) ? `chmod go-w ${cur} (or chmod +t ${cur})` : `chown ${process.getuid()} ${cur} (or root)`;
      return `${cur} above the socket: ${problem} (fix: ${fix})`;
    }
  }
}

// Why the file at the socket path (lstat: a symlink is not followed) is not
// our hub's socket (null if it may be).
function sockProblem(st, trusted) {
  if (!st.isSocket()) {
    return `${st.isSymbolicLink() ? 'a symlink' : 'not a socket'} (mode ${st.mode.toString(8).padStart(6, '0')}): not our hub's socket`;
  }
  if (!trusted.has(st.uid)) {
    return `socket owned by uid ${st.uid}, not ours (${process.getuid()}), root or an allowed uid: not our hub`;
  }
  return null;
}

function openDir(dir) {
  try {
    return fs.openSync(dir, O_PATH | fs.constants.O_DIRECTORY);
  } catch (e) {
    if (e.code !== 'EINVAL') throw e;
    return fs.openSync(dir, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
  }
}

// The socket's identity, checked the same way as by the Go and Python
// clients, except for the last step: the directory is opened (pinned) and
// checked (dirProblem), the name is lstat'ed in it (sockProblem), and the
// connect goes through that open directory (/proc/self/fd/N/name: a symlink
// swapped into the path meanwhile changes nothing). node:net cannot read
// the peer's credentials (SO_PEERCRED); instead, after the connect, the name
// must still be the same socket file (device and inode) with a trusted
// owner: a socket file is owned by whoever bound it, so the listener we
// reached was made by a trusted uid. Returns {fd, via, before}; the caller
// closes fd once connected.
function pinSocket(path, trusted) {
  const dir = pathlib.dirname(path);
  const name = pathlib.basename(path);
  if (!name || name === '.' || name === '..' || path.endsWith('/')) throw new ConnError('dial', path, 'not a socket path');
  let fd;
  try {
    fd = openDir(dir);
  } catch (e) {
    if (e.code === 'ENOENT') {
      throw new ConnError('dial', path, `${e.message}: the socket's directory is missing: start the hub, or create it (install -d -m 0755 ${dir}, owned by the hub's user)`);
    }
    if (e.code === 'EACCES') throw new ConnError('dial', path, `${e.message}: ${unsearchableFix(dir)}`);
    throw new ConnError('dial', path, e);
  }
  try {
    let problem = dirProblem(fs.fstatSync(fd), trusted) || ancestorsProblem(dir, trusted);
    if (problem) throw new ConnError('peer', path, problem);
    let via = `/proc/self/fd/${fd}/${name}`;
    if (!fs.existsSync(`/proc/self/fd/${fd}`) || Buffer.byteLength(via) >= 108) via = path;
    const lpath = via === path ? path : via;
    let before;
    try {
      before = fs.lstatSync(lpath);
    } catch (e) {
      if (e.code === 'EACCES') throw new ConnError('dial', path, `${e.message}: ${unsearchableFix(dir)}`);
      throw new ConnError('dial', path, e);
    }
    problem = sockProblem(before, trusted);
    if (problem) throw new ConnError('peer', path, problem);
    return { fd, via, before };
  } catch (e) {
    fs.closeSync(fd);
    throw e;
  }
}

// After the connect: the same socket file, still with a trusted owner.
function checkSame(path, pin, trusted) {
  let after;
  try {
    after = fs.lstatSync(pin.via);
  } catch (e) {
    throw new ConnError('peer', path, `the socket file went away during the connect: ${e.message}`);
  }
  const problem = sockProblem(after, trusted);
  if (problem) throw new ConnError('peer', path, problem);
  if (after.dev !== pin.before.dev || after.ino !== pin.before.ino) {
    throw new ConnError('peer', path, 'the socket file changed during the connect: not our hub');
  }
}

// A connection to a listenhub hub. Make one with connect().
//
// Alive until its first failure, then dead for good (never reconnects; that
// is Failover's job): err says why (ClosedError, ConnError — EOF, which is
// also what an eviction looks like, a malformed frame, a stalled write —
// AckTimeoutError, or NackError), and the done promise resolves with it.
//
// Wakes and statuses go to onWake(wake)/onStatus(healthy) when given,
// called synchronously from the socket's data handler in wire order (a
// returned promise is not awaited: hand slow work off), or to the async
// iterator events().
class Client extends Listener {
  constructor(path, socket, opts) {
    super();
    this.path = path;
    this.ackTimeout = opts.ackTimeout || DEFAULT_ACK_TIMEOUT;
    this.writeTimeout = opts.writeTimeout || DEFAULT_WRITE_TIMEOUT;
    this.frameTimeout = opts.frameTimeout || DEFAULT_FRAME_TIMEOUT;
    this._frameTimer = null;
    this._frameStart = null;
    this._greeted = false;
    this._held = [];
    this._init(opts);
    this._sock = socket;
    this._sockClosed = new Promise((resolve) => socket.once('close', resolve));
    this._subs = new Map(); // q -> {active, call, wantUnsub}
    this._healthy = false;
    this._sawStatus = false; // a status arrived (see _ackTimeout)
    this._closing = false;
    this._writeTimer = null;
    this._dec = new frame.Decoder();

    socket.on('data', (chunk) => this._onData(chunk));
    socket.on('end', () => {
      const why = this._dec.buffered() ? 'unexpected EOF (inside a frame)' : 'EOF: the hub closed the connection';
      this._die(new ConnError('read', path, why));
    });
    socket.on('error', (e) => this._die(new ConnError(e.code === 'EPIPE' ? 'write' : 'read', path, e)));
    socket.on('close', () => this._die(new ConnError('read', path, 'connection closed')));
    socket.on('drain', () => this._clearWriteTimer());
    this.silenceTimeout = opts.silenceTimeout || DEFAULT_SILENCE_TIMEOUT;
    this._silenceTimer = setTimeout(() => {
      this._die(new ConnError('read', path,
        `no frame from the hub for ${this.silenceTimeout} ms (silence timeout; it re-sends its status every few seconds): frozen or wedged`));
    }, this.silenceTimeout);
    if (this._silenceTimer.unref) this._silenceTimer.unref();
  }

  // Subscribes to q; resolves once the hub acked it: from then on every
  // NOTIFY committed on q's channel is delivered (wakes may also arrive
  // before). A set, not a count: an acked name resolves at once; concurrent
  // calls share one sub frame.
  //
  // Rejects with InvalidNameError (the client stays alive); NackError,
  // AckTimeoutError or ConnError (the client is dead); the client's error
  // when already dead. opts.signal (an AbortSignal) bounds this caller's
  // wait only: the subscription is abandoned (unsubscribed once acked unless
  // another caller waits for it).
  subscribe(q, opts = {}) {
    const problem = frame.nameProblem(q);
    if (problem) return Promise.reject(new InvalidNameError(q, problem));
    if (this.err) return Promise.reject(this.err);
    const { signal } = opts;
    if (signal && signal.aborted) return Promise.reject(signal.reason);
    let s = this._subs.get(q);
    if (!s) {
      s = { active: false, call: null, wantUnsub: false };
      this._subs.set(q, s);
    }
    if (s.active && !s.call) return Promise.resolve();
    let c = s.call;
    if (!c) {
      c = s.call = { waiters: 0, settled: false, listeners: [], timer: null };
      c.promise = new Promise((resolve, reject) => {
        c.resolve = resolve;
        c.reject = reject;
      });
      c.promise.catch(() => {});
      c.timer = setTimeout(() => this._ackTimeout(c, q), this.ackTimeout);
      this._write(frame.sub(q));
    }
    s.wantUnsub = false;
    c.waiters++;
    if (!signal) return c.promise;
    return new Promise((resolve, reject) => {
      const onAbort = () => {
        if (c.settled) return;
        c.waiters--;
        if (c.waiters === 0) s.wantUnsub = true;
        reject(signal.reason);
      };
      signal.addEventListener('abort', onAbort, { once: true });
      c.promise.then(
        (v) => {
          signal.removeEventListener('abort', onAbort);
          resolve(v);
        },
        (e) => {
          signal.removeEventListener('abort', onAbort);
          reject(e);
        },
      );
    });
  }

  // Drops q and tells the hub (no answer). Never blocks. A pending
  // subscribe of q completes, then the client unsubscribes.
  unsubscribe(q) {
    if (this.err) return;
    const s = this._subs.get(q);
    if (!s) return;
    if (s.call) {
      s.wantUnsub = true;
      return;
    }
    this._subs.delete(q);
    this._write(frame.unsub(q));
  }

  // Alive, and the hub's last status said its Postgres connection is
  // healthy (false until the first status, sent on connect).
  healthy() {
    return !this.err && this._healthy;
  }

  // The acked names.
  subscriptions() {
    return new Set([...this._subs].filter(([, s]) => s.active).map(([q]) => q));
  }

  // Kills the client with ClosedError and closes the socket; the hub drops
  // its subscriptions. No handler runs after close(). Resolves once the
  // socket is closed. Idempotent; safe from a handler.
  close() {
    this._closing = true;
    this._die(new ClosedError());
    return this._sockClosed.then(() => {});
  }

  // Writes buf; if bytes are still pending writeTimeout later (the kernel's
  // socket buffer stayed full: the hub stopped reading), the client dies.
  // Nothing is written before the hub's first frame (status, or the
  // refusal of this connection): a write into a connection the hub is
  // refusing fails with EPIPE and loses the reason it sent.
  _write(buf) {
    if (!this._greeted) {
      this._held.push(buf);
      return;
    }
    this._sock.write(buf);
    if (!this._writeTimer && this._sock.writableLength > 0) {
      this._writeTimer = setTimeout(() => {
        this._writeTimer = null;
        if (this._sock.writableLength > 0) {
          this._die(new ConnError('write', this.path, `stalled for ${this.writeTimeout} ms: the hub stopped reading`));
        }
      }, this.writeTimeout);
    }
  }

  _clearWriteTimer() {
    if (this._writeTimer) {
      clearTimeout(this._writeTimer);
      this._writeTimer = null;
    }
  }

  _ackTimeout(c, q) {
    if (c.settled || this.err) return;
    if (this._sawStatus && !this._healthy) {
      // The hub's Postgres is down: the ack comes once it is back (the
      // healthy status restarts the timer); look again later.
      c.timer = setTimeout(() => this._ackTimeout(c, q), this.ackTimeout);
      return;
    }
    this._die(new AckTimeoutError(q, this.ackTimeout));
  }

  _settle(c, err) {
    if (c.settled) return;
    c.settled = true;
    clearTimeout(c.timer);
    if (err) c.reject(err);
    else c.resolve();
  }

  _die(err) {
    if (this.err) return;
    this.err = err;
    for (const s of this._subs.values()) if (s.call) this._settle(s.call, err);
    this._subs.clear();
    this._healthy = false;
    this._clearWriteTimer();
    if (this._frameTimer) clearTimeout(this._frameTimer);
    clearTimeout(this._silenceTimer);
    this._sock.destroy();
    this._ended(err);
  }

  _onData(chunk) {
    if (this.err) return;
    this._silenceTimer.refresh();
    this._dec.feed(chunk);
    for (;;) {
      let m;
      try {
        m = this._dec.next();
      } catch (e) {
        this._die(new ConnError('read', this.path, e));
        return;
      }
      if (m === null) break;
      this._handle(m);
      if (this.err) return;
    }
    this._armFrameTimer();
  }

  // Times the incomplete frame buffered now, from its first byte.
  _armFrameTimer() {
    const since = this._dec.partialSince;
    if (since === this._frameStart) return;
    this._frameStart = since;
    if (this._frameTimer) clearTimeout(this._frameTimer);
    this._frameTimer = null;
    if (since === null) return;
    this._frameTimer = setTimeout(() => {
      this._frameTimer = null;
      this._die(new ConnError('read', this.path,
        `a frame from the hub stalled: ${this._dec.buffered()} bytes of it in ${this.frameTimeout} ms (frame timeout)`));
    }, Math.max(0, since + this.frameTimeout - Date.now()));
    if (this._frameTimer.unref) this._frameTimer.unref();
  }

  _handle(m) {
    const { t } = m;
    let { q } = m;
    if (!this._greeted) {
      this._greeted = true;
      if (t === 'nack') {
        // A nack before anything else is the hub's refusal of this
        // connection (docs/protocol.md); it closes it next.
        this._die(new RefusedError(this.path, typeof m.error === 'string' && m.error ? m.error : 'no reason given'));
        return;
      }
      const held = this._held;
      this._held = null;
      if (held.length) this._write(Buffer.concat(held));
    }
    if (t === 'nack' && typeof m.q64 === 'string') q = this._nackedName(q, m.q64);
    const s = typeof q === 'string' ? this._subs.get(q) : undefined;
    switch (t) {
      case 'ack': {
        if (!s || !s.call) return;
        const c = s.call;
        s.call = null;
        this._settle(c, null);
        if (s.wantUnsub) {
          this._subs.delete(q);
          this._write(frame.unsub(q));
        } else {
          s.active = true;
        }
        return;
      }
      case 'nack': {
        if (!s || !s.call) return;
        const reason = typeof m.error === 'string' ? m.error : '';
        const limit = frame.limitReason(reason);
        if (!limit && !frame.invalidNameReason(reason)) {
          this._die(new NackError(q, reason));
          return;
        }
        const c = s.call;
        s.call = null;
        this._settle(c, new (limit ? LimitError : InvalidNameError)(q, reason));
        if (!s.active) this._subs.delete(q);
        return;
      }
      case 'wake':
        if (s) this._deliver(wake(q, typeof m.p === 'string' ? m.p : null));
        return;
      case 'status': {
        const was = this._healthy;
        this._healthy = !!m.healthy;
        this._sawStatus = true;
        if (this._healthy && !was) {
          // Postgres is back: every sub still waiting gets a whole ack
          // timeout from now.
          for (const [q, s] of this._subs) {
            const c = s.call;
            if (c && !c.settled) {
              clearTimeout(c.timer);
              c.timer = setTimeout(() => this._ackTimeout(c, q), this.ackTimeout);
            }
          }
        }
        this._deliver(status(this._healthy));
        return;
      }
      default:
      // Unknown types are skipped: a newer hub may send them.
    }
  }

  // The name a nack answers. A nack for a name that was not valid UTF-8
  // carries the name's bytes as sent in "q64" ("q" holds U+FFFD in their
  // place): find the pending sub they match.
  _nackedName(q, q64) {
    const sent = Buffer.from(q64, 'base64');
    for (const [name, s] of this._subs) {
      if (s.call && frame.wireBytes(name).equals(sent)) return name;
    }
    return q;
  }

  _deliver(ev) {
    if (this._closing) return;
    if (!this._handOver(ev)) this._die(this._slowConsumer());
  }
}

// Connects to the hub at path and resolves to a Client. Options:
// onWake, onStatus, ackTimeout (ms, 2000), writeTimeout (ms, 2000),
// connectTimeout (ms, 2000), frameTimeout (ms, 10000), silenceTimeout (ms,
// 15000: no frame for this long is a frozen hub), peerCheck (true:
// the socket identity checks of pinSocket), allowedUids, maxPending.
// Rejects with ConnError: op "dial" when there is no hub (ENOENT,
// ECONNREFUSED), op "peer" when the socket is not our hub's.
function connect(path, opts = {}) {
  return new Promise((resolve, reject) => {
    let pin = null;
    let trusted = null;
    if (opts.peerCheck !== false && typeof process.getuid === 'function') {
      trusted = new Set([process.getuid(), 0, ...(opts.allowedUids || [])]);
      try {
        pin = pinSocket(path, trusted);
      } catch (e) {
        reject(e);
        return;
      }
    }
    const unpin = () => {
      if (pin && pin.fd !== null) {
        fs.closeSync(pin.fd);
        pin.fd = null;
      }
    };
    const sock = net.createConnection({ path: pin ? pin.via : path });
    const timer = setTimeout(() => {
      sock.destroy();
      unpin();
      reject(new ConnError('dial', path, 'connect timed out'));
    }, opts.connectTimeout || DEFAULT_CONNECT_TIMEOUT);
    sock.once('error', (e) => {
      clearTimeout(timer);
      unpin();
      reject(new ConnError('dial', path, e));
    });
    sock.once('connect', () => {
      clearTimeout(timer);
      sock.removeAllListeners('error');
      try {
        if (pin) checkSame(path, pin, trusted);
      } catch (e) {
        sock.destroy();
        reject(e);
        return;
      } finally {
        unpin();
      }
      resolve(new Client(path, sock, opts));
    });
  });
}

module.exports = {
  Client,
  connect,
  dirProblem,
  sockProblem,
  DEFAULT_ACK_TIMEOUT,
  DEFAULT_WRITE_TIMEOUT,
  DEFAULT_CONNECT_TIMEOUT,
  DEFAULT_FRAME_TIMEOUT,
  DEFAULT_SILENCE_TIMEOUT,
};
