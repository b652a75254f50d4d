'use strict';

// The hub client: one Unix socket connection to a listenhub hub (node:net).

const fs = require('node:fs');
const net = require('node:net');

const frame = require('./frame');
const { DEFAULT_MAX_PENDING, Sink, wake, status } = require('./events');
const {
  AckTimeoutError,
  ClosedError,
  ConnError,
  InvalidNameError,
  LimitError,
  NackError,
  SlowConsumerError,
} = require('./errors');

// The hub acks once Postgres confirmed the LISTEN (a round trip); nothing
// within 2 s means a wedged hub.
const DEFAULT_ACK_TIMEOUT = 2000;
// Frames to the hub are tiny: a write that cannot finish within 2 s means
// the hub stopped reading.
const DEFAULT_WRITE_TIMEOUT = 2000;
const DEFAULT_CONNECT_TIMEOUT = 2000;

// Refuses a socket that belongs to another user. node:net cannot read the
// peer's credentials (SO_PEERCRED), so this checks the owner of the socket
// file instead: ours, root, or one of allowedUids. The hub creates it with
// mode 0600 and checks our credentials on its side.
function checkOwner(path, allowedUids) {
  if (typeof process.getuid !== 'function') return;
  let st;
  try {
    st = fs.statSync(path);
  } catch (e) {
    throw new ConnError('dial', path, e);
  }
  const me = process.getuid();
  if (st.uid === me || st.uid === 0 || (allowedUids || []).includes(st.uid)) return;
  throw new ConnError('peer', path, `socket owned by uid ${st.uid}, not ours (${me}) or root: not our hub`);
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
class Client {
  constructor(path, socket, opts) {
    this.path = path;
    this.ackTimeout = opts.ackTimeout || DEFAULT_ACK_TIMEOUT;
    this.writeTimeout = opts.writeTimeout || DEFAULT_WRITE_TIMEOUT;
    this._sink = new Sink(opts.onWake, opts.onStatus, opts.maxPending || DEFAULT_MAX_PENDING);
    this._sock = socket;
    this._subs = new Map(); // q -> {active, call, wantUnsub}
    this.err = null;
    this._healthy = false;
    this._closing = false;
    this._writeTimer = null;
    this._dec = new frame.Decoder();
    this.done = new Promise((resolve) => {
      this._resolveDone = resolve;
    });

    socket.on('data', (chunk) => this._onData(chunk));
    socket.on('end', () => {
      const why = this._dec.buffered() ? 'unexpected EOF (inside a frame)' : 'EOF: the hub closed the connection';
      this._die(new ConnError('read', path, why));
    });
    socket.on('error', (e) => this._die(new ConnError(e.code === 'EPIPE' ? 'write' : 'read', path, e)));
    socket.on('close', () => this._die(new ConnError('read', path, 'connection closed')));
    socket.on('drain', () => this._clearWriteTimer());
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

  // Async iterator over the events without a callback, until the client is
  // dead and the queue drained.
  events() {
    return this._sink.events();
  }

  // The next queued event; null after timeoutMs or at the end.
  get(timeoutMs) {
    return this._sink.get(timeoutMs);
  }

  // Kills the client with ClosedError and closes the socket; the hub drops
  // its subscriptions. No callback runs after close(). Idempotent; safe
  // from a callback.
  close() {
    this._closing = true;
    this._die(new ClosedError());
  }

  // Resolves with err once the client is dead.
  wait() {
    return this.done;
  }

  // Writes buf; if bytes are still pending writeTimeout later (the kernel's
  // socket buffer stayed full: the hub stopped reading), the client dies.
  _write(buf) {
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
    if (!c.settled && !this.err) this._die(new AckTimeoutError(q, this.ackTimeout));
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
    this._sock.destroy();
    this._sink.end();
    this._resolveDone(err);
  }

  _onData(chunk) {
    if (this.err) return;
    this._dec.feed(chunk);
    for (;;) {
      let m;
      try {
        m = this._dec.next();
      } catch (e) {
        this._die(new ConnError('read', this.path, e));
        return;
      }
      if (m === null) return;
      this._handle(m);
      if (this.err) return;
    }
  }

  _handle(m) {
    const { t, q } = m;
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
      case 'status':
        this._healthy = !!m.healthy;
        this._deliver(status(this._healthy));
        return;
      default:
      // Unknown types are skipped: a newer hub may send them.
    }
  }

  _deliver(ev) {
    if (this._closing) return;
    const cb = this._sink.callback(ev);
    if (!cb) {
      if (!this._sink.put(ev)) {
        this._die(new SlowConsumerError(`listenhub: more than ${this._sink.maxPending} events not taken from events()`));
      }
      return;
    }
    try {
      cb(ev.type === 'wake' ? ev : ev.healthy);
    } catch (e) {
      process.emitWarning(`listenhub: callback threw: ${e && e.stack ? e.stack : e}`);
    }
  }
}

// Connects to the hub at path and resolves to a Client. Options:
// onWake, onStatus, ackTimeout (ms, 2000), writeTimeout (ms, 2000),
// connectTimeout (ms, 2000), peerCheck (true), allowedUids, maxPending.
// Rejects with ConnError when there is no hub (ENOENT, ECONNREFUSED) or the
// socket is not our user's.
function connect(path, opts = {}) {
  return new Promise((resolve, reject) => {
    if (opts.peerCheck !== false) {
      try {
        checkOwner(path, opts.allowedUids);
      } catch (e) {
        reject(e);
        return;
      }
    }
    const sock = net.createConnection({ path });
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new ConnError('dial', path, 'connect timed out'));
    }, opts.connectTimeout || DEFAULT_CONNECT_TIMEOUT);
    sock.once('error', (e) => {
      clearTimeout(timer);
      reject(new ConnError('dial', path, e));
    });
    sock.once('connect', () => {
      clearTimeout(timer);
      sock.removeAllListeners('error');
      resolve(new Client(path, sock, opts));
    });
  });
}

module.exports = { Client, connect, DEFAULT_ACK_TIMEOUT, DEFAULT_WRITE_TIMEOUT, DEFAULT_CONNECT_TIMEOUT };
